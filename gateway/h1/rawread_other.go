//go:build !unix

package h1

import "syscall"

// rawReads is false where sockets are not file descriptors: inbuf then
// reads with net.Conn.Read (and holds its buffer while it waits).
const rawReads = false

func sysRead(uintptr, []byte) (int, error) { return 0, syscall.EINVAL }

// sysDrop is never called here: only Linux sockets drop uncopied
// (sock.dropsUncopied).
func sysDrop(uintptr, int) (int, error) { return 0, syscall.EINVAL }
