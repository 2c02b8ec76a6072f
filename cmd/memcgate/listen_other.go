//go:build !linux

package main

// listenerKeepAlive reports that keep-alive options set on a listening
// socket do not carry over everywhere: elsewhere Go sets them on each
// accepted connection.
const listenerKeepAlive = false

// setListenerOptions sets nothing outside Linux.
func setListenerOptions(fd, sndbuf int) error { return nil }

// ipv6Only reports no IPv6-only socket outside Linux: an inherited
// socket's families are not checked there.
func ipv6Only(fd int) (bool, error) { return false, nil }

// openFileLimit reports no open-file limit outside Linux: MAX_CLIENT_CONNS
// then has no default.
func openFileLimit() uint64 { return 0 }
