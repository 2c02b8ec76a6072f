package main

import (
	"log/slog"
	"math"
	"net"
	"sync/atomic"
	"time"
)

// Of the open-file limit, what MAX_CLIENT_CONNS=0 keeps from clients for
// the process's other descriptors: memcached connections (PIPELINE_CONNS
// and a probe per node, up to MAX_CONNS_PER_NODE without pipelining),
// the admin listener's clients, files. A quarter, but no more than
// reserveMax: a limit of 1024 leaves 768 client connections, one of
// 1048576 all but 4096.
const reserveMax = 4096

// clientConnCap is the cap on client connections for the MAX_CLIENT_CONNS
// setting, given the open-file limit nofile (0: unknown or unlimited): the
// setting if positive, none (0) for -1, and for 0 nofile less its reserve.
func clientConnCap(setting int, nofile uint64) int {
	switch {
	case setting > 0:
		return setting
	case setting < 0 || nofile == 0:
		return 0
	}
	return int(min(nofile-min(nofile/4, reserveMax), math.MaxInt32)) // RLIM_INFINITY too, on 32-bit
}

// warnConnCap logs a warning if maxConns, the cap on client connections
// (0: none), leaves less than clientConnCap's reserve of the open-file
// limit nofile (0: unknown or unlimited) to the other descriptors.
func warnConnCap(log *slog.Logger, maxConns int, nofile uint64) {
	if nofile > 0 && uint64(maxConns) > nofile-min(nofile/4, reserveMax) {
		log.Warn("MEMCGATE_MAX_CLIENT_CONNS leaves few descriptors of the open-file limit for memcached and the admin listener: while clients hold them all, memcached connections cannot be opened; raise the limit (ulimit -n, LimitNOFILE=) or lower the cap",
			"max_client_conns", maxConns, "open_file_limit", nofile)
	}
}

// connCap caps the client connections of the data listeners that Go's
// net/http serves alone (TLS, FAST_PATH=false), which h1.Server.MaxConns
// does on the fast path: a connection accepted over the cap is closed at
// once. net/http offers no way to answer it without reading its request
// (over TLS, without a handshake) nor to close an idle connection of its
// choice, so the fast path's reclaiming and 503 are not done here.
type connCap struct {
	max     atomic.Int64 // 0: no cap (a reload may set one)
	open    atomic.Int64
	refused atomic.Uint64
	log     *slog.Logger // refusals, a line a second at most; nil: none
	lastLog atomic.Int64 // when a refusal was last logged, in Unix nanoseconds
}

// listener returns ln with the cap on its connections, which all of one
// connCap's listeners share.
func (c *connCap) listener(ln net.Listener) net.Listener { return &capListener{Listener: ln, cap: c} }

type capListener struct {
	net.Listener
	cap *connCap
}

// Accept returns the next connection under the cap, closing those over it.
func (l *capListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		n, m := l.cap.open.Add(1), l.cap.max.Load()
		if m <= 0 || n <= m {
			return &cappedConn{Conn: c, cap: l.cap}, nil
		}
		l.cap.open.Add(-1)
		l.cap.refusal(m)
		c.Close()
	}
}

// refusal counts a connection closed at the cap m, and logs it as the
// fast path logs its refusals: a line a second at most, with the count,
// as any client can open connections at will.
func (c *connCap) refusal(m int64) {
	n := c.refused.Add(1)
	if c.log == nil {
		return
	}
	if now, last := time.Now().UnixNano(), c.lastLog.Load(); now-last >= int64(time.Second) && c.lastLog.CompareAndSwap(last, now) {
		c.log.Warn("client connections open at MEMCGATE_MAX_CLIENT_CONNS, the most allowed: closed a new connection unserved (net/http cannot answer it)",
			"max_client_conns", m, "refused_so_far", n)
	}
}

// cappedConn is a connection under a connCap; its first Close frees its
// place.
type cappedConn struct {
	net.Conn
	cap    *connCap
	closed atomic.Bool
}

// Close closes the connection; the first call frees its place.
func (c *cappedConn) Close() error {
	if !c.closed.Swap(true) {
		c.cap.open.Add(-1)
	}
	return c.Conn.Close()
}
