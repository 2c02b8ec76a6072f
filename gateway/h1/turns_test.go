package h1

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"
)

// TestPipelinedTakesTurns: clients pipelining requests as fast as they
// can do not keep a request on another connection waiting: a connection's
// goroutine lets the others run before each request pipelined behind the
// one it served. With one processor and 50 pipelining clients the probe
// waits 11-16 ms at the median (the runtime's network poll); a goroutine
// that served every buffered request until the scheduler preempted it,
// every 10 ms, held it 0.2 s (1.5 s with the race detector).
func TestPipelinedTakesTurns(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	_, addr := startH1(t, h, nil)
	const pipeliners = 50
	batch := bytes.Repeat([]byte("GET /flood HTTP/1.1\r\nHost: a\r\n\r\n"), 1000)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(stop)
	for range pipeliners {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() { // reads every answer, so the server never waits to write
			io.Copy(io.Discard, c)
		})
		wg.Go(func() {
			defer c.Close()
			for {
				select {
				case <-stop:
					return
				default:
				}
				c.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
				if _, err := c.Write(batch); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
					return
				}
			}
		})
	}
	time.Sleep(100 * time.Millisecond) // the flood under way
	probe, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Close()
	br := bufio.NewReader(probe)
	var took []time.Duration
	for range 5 {
		start := time.Now()
		if _, err := io.WriteString(probe, "GET /probe HTTP/1.1\r\nHost: a\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		took = append(took, time.Since(start))
	}
	slices.Sort(took)
	t.Logf("a GET beside %d pipelining clients, one processor: %v", pipeliners, took)
	if took[len(took)/2] > 100*time.Millisecond {
		t.Errorf("median %v, want under 100 ms: the pipelining clients' goroutines do not take turns", took[len(took)/2])
	}
}
