package h1

import (
	"io"
	"strings"
	"testing"
	"time"
)

// TestSlowHeadsKeepTheirTimeouts: a head sent slowly is cut at the
// header and read timeouts counted from the request's start, whether the
// fast path keeps it until it is whole (one longer than the fast path
// takes, 431 short of net/http's limit) or hands it over to Fallback
// before (a folded line, which net/http reads on past and GuardConn
// refuses only once the head ends): Fallback does not get its own
// ReadHeaderTimeout afresh from the handover. A client that sends part
// of its head for half the timeout, a line more, and the head's end just
// after the timeout gets its connection closed unanswered, as net/http
// alone closes it at its header timeout.
func TestSlowHeadsKeepTheirTimeouts(t *testing.T) {
	// The head's end comes a quarter of d past the timeout and a quarter
	// before the handover's plus the timeout: half a second either way
	// for a loaded machine's late timer. The cases run in parallel, so
	// that the timeout is waited for about once.
	const d = 2 * time.Second
	timeouts := []struct {
		name    string
		hdr, rd time.Duration
	}{
		{"header timeout", d, 10 * time.Second},
		{"read timeout", 0, d}, // no header timeout of its own: the read timeout bounds the head
	}
	heads := []struct {
		name   string
		middle string // sent at half the timeout
		handed bool   // the head is Fallback's from the middle on
	}{
		{"folded line, handed over", " folded\r\n", true},
		{"longer than the fast path takes", "X-Big: " + strings.Repeat("b", 2*readBufSize) + "\r\n", false},
	}
	for _, l := range streamListeners {
		for _, to := range timeouts {
			for _, h := range heads {
				t.Run(l.name+"/"+to.name+"/"+h.name, func(t *testing.T) {
					t.Parallel()
					s, addr := startH1On(t, l.listen(t), testHandler(), func(s *Server) {
						s.ReadHeaderTimeout, s.ReadTimeout = to.hdr, to.rd
						s.Fallback.ReadHeaderTimeout, s.Fallback.ReadTimeout = to.hdr, to.rd
					})
					c, br := dial(t, addr)
					io.WriteString(c, "GET /echo HTTP/1.1\r\nHost: a\r\nX-A: 1\r\n")
					start := connCreated(t, s)
					sleepUntil(start.Add(d / 2))
					io.WriteString(c, h.middle)
					if h.handed && !eventually(func() bool { return s.handed.Load() == 1 }) {
						t.Fatal("the head is not handed over")
					}
					sleepUntil(start.Add(d + d/4)) // past the timeout, well before the handover's plus the timeout
					io.WriteString(c, "\r\n")
					if r, _ := readWireResponse(br, "GET"); r.status != "" {
						t.Fatalf("head ended after the timeout: %q %q; want the connection closed unanswered", r.status, r.body)
					}
					waitClosed(t, br)
					if !h.handed && s.handed.Load() != 0 {
						t.Error("the head was handed over")
					}
				})
			}
		}
	}
}

// sleepUntil sleeps until t has passed.
func sleepUntil(t time.Time) {
	for now := time.Now(); !now.After(t); now = time.Now() {
		time.Sleep(t.Sub(now) + time.Millisecond)
	}
}
