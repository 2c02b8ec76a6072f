package procs

import (
	"syscall"
	"time"
	"unsafe"
)

// processCPU returns the user and system CPU time of the process. The
// call cannot block, so it is made without telling the scheduler, which
// would wake sysmon on an idle gateway (decision 0014).
func processCPU() (time.Duration, bool) {
	var ru syscall.Rusage
	if _, _, e := syscall.RawSyscall(syscall.SYS_GETRUSAGE, uintptr(syscall.RUSAGE_SELF), uintptr(unsafe.Pointer(&ru)), 0); e != 0 {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
