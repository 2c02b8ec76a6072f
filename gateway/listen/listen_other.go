//go:build !linux

package listen

// inheritsKeepAlive reports that keep-alive options set on a listening
// socket do not carry over everywhere: elsewhere Go sets them on each
// accepted connection.
const inheritsKeepAlive = false

// SetOptions sets nothing outside Linux.
func SetOptions(fd, sndbuf int) error { return nil }

// IPv6Only reports no IPv6-only socket outside Linux: an inherited
// socket's families are not checked there.
func IPv6Only(fd int) (bool, error) { return false, nil }

// OpenFileLimit reports no open-file limit outside Linux: MAX_CLIENT_CONNS
// then has no default.
func OpenFileLimit() uint64 { return 0 }
