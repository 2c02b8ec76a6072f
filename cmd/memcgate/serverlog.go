package main

import (
	"context"
	"log"
	"log/slog"
	"strings"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/upstream/loggate"
)

// handshakeError starts the line net/http logs for each connection to a
// TLS listener whose handshake failed.
const handshakeError = "http: TLS handshake error from "

// serverLog is what an HTTP server's ErrorLog writes to: each line goes
// to the log at warn level, but for failed TLS handshakes. Any client
// makes one of those per connection, at the rate it likes (a port scan, a
// load balancer's TCP check, plain HTTP to the HTTPS port: connecting and
// closing is enough), and a warning each would fill the room the log
// keeps for warnings and errors (logbuf's reserve). They are counted, and
// logged a line a second at most, saying how many failed since the last
// line without one (nginx logs them at info).
type serverLog struct {
	log        *slog.Logger
	listener   string             // the listener label: data or admin
	handshakes prometheus.Counter // failed handshakes
	accepts    *atomic.Uint64     // accept errors net/http retried; nil: not counted
	logGate    loggate.Gate       // failed handshakes logged
}

// newServerLog returns an ErrorLog for the server of listener, which
// logs to lg, counts failed handshakes in handshakes and, if accepts is
// not nil, the accept errors net/http waits out and retries in accepts.
func newServerLog(lg *slog.Logger, listener string, handshakes *prometheus.CounterVec, accepts *atomic.Uint64) *log.Logger {
	return log.New(&serverLog{log: lg, listener: listener, handshakes: handshakes.WithLabelValues(listener), accepts: accepts}, "", 0)
}

// acceptError starts the line net/http logs for each accept failure it
// waits out and retries (mostly EMFILE): its only trace, which the fast
// path counts in memcgate_http_accept_errors_total.
const acceptError = "http: Accept error: "

// newHandshakeErrors returns memcgate_http_tls_handshake_errors_total,
// registered on reg, every listener's series exported from 0.
func newHandshakeErrors(reg prometheus.Registerer) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "memcgate_http_tls_handshake_errors_total",
		Help: "Connections to a TLS listener whose handshake failed (logged a line a second at most), by listener.",
	}, []string{"listener"})
	c.WithLabelValues("data")
	c.WithLabelValues("admin")
	reg.MustRegister(c)
	return c
}

// Write logs one line: log.Logger calls it once per line.
func (s *serverLog) Write(p []byte) (int, error) {
	msg := strings.TrimSuffix(string(p), "\n")
	if !strings.HasPrefix(msg, handshakeError) {
		if s.accepts != nil && strings.HasPrefix(msg, acceptError) {
			s.accepts.Add(1)
		}
		s.log.Warn(msg)
		return len(p), nil
	}
	s.handshakes.Inc()
	unlogged, ok := s.logGate.Pass()
	if !ok {
		return len(p), nil
	}
	s.log.LogAttrs(context.Background(), slog.LevelWarn, msg, slog.String("listener", s.listener), slog.Uint64("unlogged_before", unlogged))
	return len(p), nil
}
