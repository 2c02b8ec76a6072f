//go:build !linux

package h1

// Gone reports that the client is there: only Linux peeks at the socket
// (gone_linux.go). It is NewContext's client.
func (c *conn) Gone() bool { return false }
