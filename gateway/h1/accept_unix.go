//go:build unix

package h1

import (
	"errors"
	"syscall"
)

// resourceShortage reports whether err is a lack of descriptors or
// memory, which passes once connections close.
func resourceShortage(err error) bool {
	for _, e := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
