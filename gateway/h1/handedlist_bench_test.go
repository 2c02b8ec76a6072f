package h1

import (
	"net"
	"net/http"
	"testing"
	"time"
)

// BenchmarkHandedLists is a handed connection's way through the lists
// of handed connections, as net/http's hook moves it: handed over
// working, idle, a request, closed; with 64 others in each list, and the
// search for the slowest and the oldest idle that a hand-over at the cap
// makes. It allocates nothing.
func BenchmarkHandedLists(b *testing.B) {
	var l handedConns
	now := time.Now()
	others := make([]*replayConn, 128)
	for i := range others {
		others[i] = &replayConn{list: &l}
		l.set(others[i], i%2 == 0, now)
	}
	c1, c2 := net.Pipe()
	defer c1.Close()
	defer c2.Close()
	r := &replayConn{Conn: c1, list: &l}
	b.ReportAllocs()
	for b.Loop() {
		l.set(r, false, now)
		l.state(r, http.StateIdle)
		l.state(r, http.StateActive)
		if v := l.slowest(now); v != nil {
			l.set(v, false, now)
		}
		if v := l.oldestIdle(); v != nil {
			l.set(v, true, time.Time{})
		}
		l.drop(r)
	}
}
