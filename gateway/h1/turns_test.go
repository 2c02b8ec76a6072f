package h1

import (
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// TestPipelinedTakesTurns: clients pipelining requests as fast as they
// can do not keep a request on another connection waiting: a connection's
// goroutine lets the others run before each request pipelined behind the
// one it served. (With one processor and 50 pipelining clients a GET
// waited 11-16 ms at the median; a goroutine that served every buffered
// request until the scheduler preempted it, every 10 ms, held it 0.2 s,
// 1.5 s with the race detector.) The test asks the scheduler, not the
// clock, which a loaded machine slows: with one processor, a goroutine
// that a handler starts runs before the request pipelined behind it is
// served only if the connection's goroutine lets it.
func TestPipelinedTakesTurns(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	var started, ran atomic.Int32
	var mu sync.Mutex
	var checks, turns int // /check requests, and those served after /start's goroutine ran
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/start":
			started.Add(1)
			go ran.Add(1)
		case "/check":
			mu.Lock()
			checks++
			if ran.Load() == started.Load() {
				turns++
			}
			mu.Unlock()
		}
		io.WriteString(w, "ok")
	})
	_, addr := startH1(t, h, nil)
	const pairs = 40
	c, br := dial(t, addr)
	pair := "GET /start HTTP/1.1\r\nHost: a\r\n\r\nGET /check HTTP/1.1\r\nHost: a\r\n\r\n"
	if _, err := io.WriteString(c, strings.Repeat(pair, pairs)); err != nil {
		t.Fatal(err)
	}
	for i := range 2 * pairs {
		if r, err := readWireResponse(br, "GET"); err != nil || r.body != "ok" {
			t.Fatalf("response %d: %v, %v", i, r, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d of %d pipelined requests served after the goroutine the one before started", turns, checks)
	// The scheduler takes from its global queue, where a goroutine that
	// yields waits, first every 61st time, and a read may end between a
	// pair's requests: a few may be served first.
	if checks != pairs || turns < pairs*3/4 {
		t.Errorf("%d of %d pipelined requests served after the goroutine the one before started, want %d at least: the connection's goroutine does not take turns", turns, checks, pairs*3/4)
	}
}
