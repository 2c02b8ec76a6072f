//go:build unix

package config

import (
	"os"
	"syscall"
)

// openNoWait opens path for reading without waiting: O_NONBLOCK makes
// the open of a named pipe return at once instead of waiting for a
// writer. It changes nothing for a regular file, whose reads do not
// wait either way.
func openNoWait(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
}
