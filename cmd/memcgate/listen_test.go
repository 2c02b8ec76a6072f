package main

import (
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestListenUnix: the socket file gets its mode, a stale one is replaced,
// a live one or another file is left alone with an error, and closing the
// listener removes the file.
func TestListenUnix(t *testing.T) {
	tests := []struct {
		name    string
		before  func(t *testing.T, path string) // what is at path first
		wantErr string                          // "" = listens
	}{
		{"nothing there", func(*testing.T, string) {}, ""},
		{"stale socket", func(t *testing.T, path string) {
			ln, err := net.Listen("unix", path)
			if err != nil {
				t.Fatal(err)
			}
			ln.(*net.UnixListener).SetUnlinkOnClose(false) // as a process that was killed
			ln.Close()
		}, ""},
		{"live socket", func(t *testing.T, path string) {
			ln, err := net.Listen("unix", path)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ln.Close() })
		}, "a process listens on it already"},
		{"regular file", func(t *testing.T, path string) {
			if err := os.WriteFile(path, []byte("keep me"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, "exists and is not a socket"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "memcgate.sock")
			tt.before(t, path)
			ln, err := listenUnix(t.Context(), path, 0o600)
			if tt.wantErr != "" {
				if err == nil {
					ln.Close()
					t.Fatalf("listenUnix over a %s = nil error, want %q", tt.name, tt.wantErr)
				}
				if !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("listenUnix over a %s = %v, want %q", tt.name, err, tt.wantErr)
				}
				if _, err := os.Lstat(path); err != nil {
					t.Errorf("after the error, %s: %v; want it left in place", path, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("listenUnix: %v", err)
			}
			fi, err := os.Lstat(path)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Type() != fs.ModeSocket || fi.Mode().Perm() != 0o600 {
				t.Errorf("socket file mode %v, want a socket with 0600", fi.Mode())
			}
			c, err := net.Dial("unix", path)
			if err != nil {
				t.Fatalf("dial: %v", err)
			}
			c.Close()
			ln.Close()
			if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("after Close, %s: %v; want it removed", path, err)
			}
		})
	}
}

// TestListenUnixNoDirectory: a socket path whose directory is missing is
// refused naming the directory; bind's own error names only the socket,
// which is not meant to exist before the start.
func TestListenUnixNoDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run", "memcgate")
	ln, err := listenUnix(t.Context(), filepath.Join(dir, "memcgate.sock"), 0o600)
	if err == nil {
		ln.Close()
		t.Fatal("listenUnix in a missing directory = nil error")
	}
	if want := "the directory " + dir + " does not exist"; !strings.Contains(err.Error(), want) {
		t.Errorf("listenUnix in a missing directory = %v, want %q", err, want)
	}
}
