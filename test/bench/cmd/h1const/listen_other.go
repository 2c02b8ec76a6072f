//go:build !linux

package main

// listenerKeepAlive: elsewhere Go sets keep-alive on each connection.
const listenerKeepAlive = false

const tcpDeferAccept = 0 // not set, nor read, here

func setListenerOptions(fd, sndbuf int) error { return nil }
