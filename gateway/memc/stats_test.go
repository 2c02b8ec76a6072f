package memc

import (
	"bufio"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/gateway"
	"github.com/memcgate/memcgate/gateway/budget"
	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream"
)

// hostileStats listens on a free loopback port as a memcached node that
// answers every stats with about 1 MB of STAT lines (memcached's are
// some 3 KB), just under what the gateway reads of one reply; it returns
// the port and the reply's size.
func hostileStats(t *testing.T) (port, size int) {
	t.Helper()
	var reply strings.Builder
	for i := 0; reply.Len() < 1_000_000; i++ {
		reply.WriteString("STAT padding_" + strconv.Itoa(i) + " " + strings.Repeat("x", 64) + "\r\n")
	}
	reply.WriteString("END\r\n")
	addr := memcachedtest.StartRaw(t, func(c net.Conn, br *bufio.Reader) {
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return
			}
			if line == "stats\r\n" {
				_, _ = io.WriteString(c, reply.String())
			} else {
				_, _ = io.WriteString(c, "ERROR\r\n")
			}
		}
	})
	_, p, _ := net.SplitHostPort(addr)
	port, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return port, reply.Len()
}

// stalledWriter is a ResponseWriter whose first Write of the body
// reports the budget's use at that moment and waits for release, as a
// client that does not read holds the answer being written.
type stalledWriter struct {
	*httptest.ResponseRecorder
	bg      *budget.Budget
	used    chan int64
	release chan struct{}
	stalled bool
}

func (s *stalledWriter) Write(p []byte) (int, error) {
	if !s.stalled {
		s.stalled = true
		s.used <- s.bg.Used()
		<-s.release
	}
	return s.ResponseRecorder.Write(p)
}

// TestMemcStatsHoldsTheBudget: /memc?cmd=stats holds every node's reply
// and the answer made of them against the byte budget while it is
// written, as the module's get holds its value, so that a node answering
// stats with a megabyte cannot make the gateway hold megabytes per
// request past the budget: with room, the answer and the bytes held
// while it is written; without, 503 with Retry-After naming the budget,
// and nothing held afterwards either way.
func TestMemcStatsHoldsTheBudget(t *testing.T) {
	port, size := hostileStats(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	c, err := upstream.New(upstream.Options{Servers: []upstream.Server{{Host: "127.0.0.1", Port: port}}, PipelineConns: 2, Timeout: 5 * time.Second}, log, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	tests := []struct {
		name       string
		budget     int64
		wantStatus int
	}{
		{"the budget has room", 8 << 20, http.StatusOK},
		{"the budget has room for the replies only once", int64(size) * 3 / 2, http.StatusServiceUnavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bg := budget.New(tt.budget)
			access := new(gateway.Access)
			rt, _ := New(Options{Path: "/memc", Store: c, Cluster: c, Access: access})
			h := gateway.NewHandler(c, log, prometheus.NewRegistry(), gateway.Options{Access: access, Routes: []gateway.Route{rt}, Budget: bg})
			w := &stalledWriter{ResponseRecorder: httptest.NewRecorder(), bg: bg, used: make(chan int64, 1), release: make(chan struct{})}
			done := make(chan struct{})
			go func() {
				defer close(done)
				h.ServeHTTP(w, httptest.NewRequest("GET", "/memc?cmd=stats", nil))
			}()
			select {
			case used := <-w.used:
				if tt.wantStatus == http.StatusOK && used < 2*int64(size) {
					t.Errorf("the budget holds %d bytes while a stats answer of %d bytes is written, want at least %d (the replies and the answer)", used, size, 2*size)
				}
			case <-done:
			}
			close(w.release)
			<-done
			if w.Code != tt.wantStatus {
				t.Fatalf("status %d, want %d (%.200q)", w.Code, tt.wantStatus, w.Body.String())
			}
			switch w.Code {
			case http.StatusOK:
				if w.Body.Len() != size || !strings.HasSuffix(w.Body.String(), "\r\nEND\r\n") {
					t.Errorf("%d bytes ending %q, want the node's %d", w.Body.Len(), w.Body.String()[max(0, w.Body.Len()-20):], size)
				}
			case http.StatusServiceUnavailable:
				if w.Header().Get("Retry-After") == "" || !strings.Contains(w.Body.String(), "MEMCGATE_MAX_BUFFERED_BYTES") {
					t.Errorf("503 with Retry-After %q and body %q, want Retry-After and the budget named", w.Header().Get("Retry-After"), w.Body)
				}
			}
			if used := bg.Used(); used != 0 {
				t.Errorf("the budget holds %d bytes after the request", used)
			}
		})
	}
}
