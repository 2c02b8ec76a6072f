//go:build !unix

package config

import "os"

// openNoWait opens path for reading. Where named pipes are not files
// (Windows), an open does not wait for a writer.
func openNoWait(path string) (*os.File, error) {
	return os.Open(path)
}
