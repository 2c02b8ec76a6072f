package h1

// Gone reports, without waiting, whether the client has closed or reset
// the connection, by the same peek at its socket as an idle connection's
// (peerGone): the end of the stream (a close, or a half-close: nothing
// more will come) or an error (a reset) is gone. Bytes the client sent
// after the request, a request it pipelines, say, stay unread and mean
// it is there, as does a socket with nothing to read. A connection Close
// or the end of the request already closed is gone. It is NewContext's
// client; any goroutine may call it while the request runs.
func (c *conn) Gone() bool {
	if c.in.rc == nil {
		return false // no socket to peek at (a net.Conn of a test's own)
	}
	return c.peerGone()
}
