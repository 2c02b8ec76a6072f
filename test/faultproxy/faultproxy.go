// Package faultproxy provides fault-injecting relays for integration tests:
// a TCP proxy and a UDP relay that sit between the gateway and a real
// memcached process and add one-way latency, blackholes, resets and refused
// connections at run time, because the test machines have no netem.
//
// It owns only the relays and their sockets; it does not start memcached or
// know anything about the memcached protocol. Everything listens on
// 127.0.0.1 and is meant for tests, not for production traffic.
package faultproxy

import (
	"time"
)

// packet is one chunk (TCP) or datagram (UDP) in a delay line: data may not
// be delivered before due. Every direction of every relay is a FIFO of
// packets stamped when they were read, drained by one goroutine that waits
// for each stamp in turn. So a delay adds d to each packet's trip without
// serialising packets behind each other's waits: n packets read at about the
// same time all leave about d later.
type packet struct {
	data []byte
	due  time.Time
	eof  bool // TCP only: the sender half-closed here; pass the FIN on
}

// waitUntil blocks until due or until done is closed, reusing t, which must
// be stopped (or fired and drained) on entry and is again on return. It
// reports whether due was reached.
func waitUntil(t *time.Timer, due time.Time, done <-chan struct{}) bool {
	d := time.Until(due)
	if d <= 0 {
		select {
		case <-done:
			return false
		default:
			return true
		}
	}
	t.Reset(d)
	select {
	case <-t.C:
		return true
	case <-done:
		t.Stop()
		return false
	}
}

// stoppedTimer returns a timer for waitUntil. Since Go 1.23 a stopped timer
// delivers no stale value after Reset, so it needs no draining.
func stoppedTimer() *time.Timer {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return t
}

// clampLatency turns a requested delay into a stored one: negative means 0.
func clampLatency(d time.Duration) int64 {
	if d < 0 {
		return 0
	}
	return int64(d)
}
