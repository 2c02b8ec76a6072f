//go:build !linux

package main

// listenerKeepAlive: elsewhere Go sets keep-alive on each connection.
const listenerKeepAlive = false

func setListenerOptions(fd, sndbuf int) error { return nil }
