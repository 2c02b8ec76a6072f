//go:build unix

package config

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestFilesRegularOnly: a file the configuration names that is not a
// regular file is refused at once, with its kind named. A named pipe's
// open waited for a writer, for good.
func TestFilesRegularOnly(t *testing.T) {
	dir := t.TempDir()
	pipe := filepath.Join(dir, "pipe")
	if err := syscall.Mkfifo(pipe, 0o600); err != nil {
		t.Skipf("no named pipes here: %v", err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(pipe, link); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ name, path, kind string }{
		{"named pipe", pipe, "a named pipe"},
		{"symbolic link to a named pipe", link, "a named pipe"},
		{"directory", dir, "a directory"},
		{"device", os.DevNull, "a device"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ReadFile(tt.path)
			if err == nil || !strings.Contains(err.Error(), "is not a regular file ("+tt.kind+")") {
				t.Errorf("ReadFile(%s) = %v, want it refused as %s", tt.path, err, tt.kind)
			}
		})
	}
}
