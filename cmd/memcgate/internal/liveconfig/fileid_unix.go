//go:build unix

package liveconfig

import (
	"os"
	"syscall"
)

// fileID is the device and inode of the file at path: a file written in
// place keeps them, one replaced by a rename does not. It is zero if
// path cannot be stat'ed.
func fileID(path string) [2]uint64 {
	fi, err := os.Stat(path)
	if err != nil {
		return [2]uint64{}
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return [2]uint64{}
	}
	return [2]uint64{uint64(st.Dev), uint64(st.Ino)} // Dev is int32 on some systems
}
