//go:build unix && !linux

package h1

import "syscall"

// rawReads reports whether inbuf reads sockets with read(2) through their
// RawConn, waiting without a buffer.
const rawReads = true

// sysRead is read(2) on a socket descriptor.
func sysRead(fd uintptr, p []byte) (int, error) { return syscall.Read(int(fd), p) }

// sysDrop is never called here: only Linux sockets drop uncopied
// (sock.dropsUncopied).
func sysDrop(uintptr, int) (int, error) { return 0, syscall.EINVAL }
