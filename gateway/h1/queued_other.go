//go:build !linux || !(amd64 || arm64 || 386 || arm || riscv64 || s390x || loong64)

package h1

// queued would return the bytes the socket holds unread; here it cannot
// tell, and a body read ahead grows by doubling alone.
func (c *conn) queued() int { return 0 }
