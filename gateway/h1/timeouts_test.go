package h1

import (
	"io"
	"strings"
	"testing"
	"time"
)

// TestConnStatsTimeouts: the connections the Server closes at a timeout
// before any handler saw a request on them are counted in ConnStats, by
// timeout: a silent new connection and a head cut short at the header
// timeout, one between requests at the idle timeout. One lingering after
// a 400 (a BadRequest) and one its client closed are not timeouts.
func TestConnStatsTimeouts(t *testing.T) {
	const timeout = 200 * time.Millisecond
	s, addr := startH1(t, testHandler(), func(s *Server) {
		s.ReadHeaderTimeout, s.IdleTimeout, s.lingerIdle = timeout, timeout, timeout
	})

	_, silent := dial(t, addr)
	waitClosed(t, silent)

	partial, partialBR := dial(t, addr)
	io.WriteString(partial, "GET /small HTTP/1.1\r\nHo")
	waitClosed(t, partialBR)

	idle, idleBR := dial(t, addr)
	roundTrip(t, idle, idleBR, "/small")
	waitClosed(t, idleBR)

	bad, badBR := dial(t, addr)
	io.WriteString(bad, "POST /small HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n")
	if r, err := readWireResponse(badBR, "POST"); err != nil || !strings.Contains(r.status, "400") {
		t.Fatalf("Content-Length with Transfer-Encoding: %+v, %v; want a 400", r, err)
	}
	waitClosed(t, badBR) // after lingering

	gone, goneBR := dial(t, addr)
	roundTrip(t, gone, goneBR, "/small")
	gone.Close()

	st := s.ConnStats()
	if st.HeaderTimeouts != 2 || st.IdleTimeouts != 1 || st.BadRequests != 1 {
		t.Errorf("HeaderTimeouts %d, IdleTimeouts %d, BadRequests %d; want 2, 1, 1", st.HeaderTimeouts, st.IdleTimeouts, st.BadRequests)
	}
}
