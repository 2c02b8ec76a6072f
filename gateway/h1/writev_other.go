//go:build !linux

package h1

import "syscall"

// writev is not used where connections are not parked: Detach needs the
// poller.
func writev(uintptr, []syscall.Iovec) (int, error) { return 0, syscall.EINVAL }
