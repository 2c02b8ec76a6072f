package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// listenUnix opens a Unix socket at path with permissions mode for the
// data API. A socket file that a process which ended left there is
// replaced; a socket some process still listens on, or a file that is
// not a socket, is an error. Closing the listener removes the file.
//
// The socket has the permissions the umask gives between its creation
// and the chmod that follows: the directory it is in is what keeps
// others out meanwhile (docs/php.md, "Over a Unix socket").
func listenUnix(ctx context.Context, path string, mode os.FileMode) (net.Listener, error) {
	if err := removeStaleSocket(ctx, path); err != nil {
		return nil, err
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "unix", path)
	if errors.Is(err, fs.ErrNotExist) {
		// bind's ENOENT names the socket, which is not meant to exist
		// yet: what is missing is its directory.
		return nil, fmt.Errorf("%w: the directory %s does not exist (memcgate creates the socket, not its directory)", err, filepath.Dir(path))
	}
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, mode); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// staleProbe bounds the connection attempt that tells a stale socket file
// from a live one.
const staleProbe = time.Second

// removeStaleSocket removes the socket file at path if no process listens
// on it: connecting is refused.
func removeStaleSocket(ctx context.Context, path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("%s exists and is not a socket (memcgate replaces only a stale socket file)", path)
	}
	ctx, cancel := context.WithTimeout(ctx, staleProbe)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err == nil {
		c.Close()
		return fmt.Errorf("%s: a process listens on it already (another memcgate?)", path)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("%s exists and may be in use: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove stale socket: %w", err)
	}
	return nil
}
