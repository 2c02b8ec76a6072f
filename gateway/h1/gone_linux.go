package h1

import "syscall"

// Gone reports, without waiting, whether the client has closed or reset
// the connection: one recv(2) with MSG_PEEK|MSG_DONTWAIT on its socket,
// which finds the end of the stream (a close, or a half-close: nothing
// more will come) or an error (a reset). Bytes the client sent after the
// request, a request it pipelines, say, stay unread and mean it is
// there, as does a socket with nothing to read. A connection Close or
// the end of the request already closed is gone. It is NewContext's
// client; any goroutine may call it while the request runs.
func (c *conn) Gone() bool {
	if c.in.rc == nil {
		return false
	}
	gone := true // Control fails only on a closed socket
	c.in.rc.Control(func(fd uintptr) {
		for {
			n, errno := peek(fd)
			if errno == syscall.EINTR {
				continue
			}
			gone = errno == 0 && n == 0 || errno != 0 && errno != syscall.EAGAIN
			return
		}
	})
	return gone
}
