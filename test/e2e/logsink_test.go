package e2e

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/gatewaytest"
	"github.com/memcgate/memcgate/test/memcachedtest"
)

// TestLogDestinationStalled runs a gateway whose stderr is a pipe that
// nobody reads, as a container runtime or a `| logger` that has fallen
// behind would be: the pipe takes 64 KiB and then blocks every write. The
// gateway must go on answering at full speed, dropping the access log
// lines that do not fit its backlog and counting them; once the pipe is
// read again, a warning says how many were dropped, as many as the
// metric counts.
func TestLogDestinationStalled(t *testing.T) {
	g, r := stalledLogGateway(t)

	// 40,000 access log lines of about 200 bytes: twice the backlog.
	const conns, batches, perBatch = 8, 50, 100
	req := strings.Repeat("GET /logged HTTP/1.1\r\nHost: x\r\n\r\n", perBatch)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var slowest time.Duration
	for range conns {
		c, br := dialRaw(t, g.DataAddr)
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		wg.Go(func() {
			for range batches {
				start := time.Now()
				if _, err := io.WriteString(c, req); err != nil {
					t.Error(err)
					return
				}
				for range perBatch {
					resp, err := http.ReadResponse(br, nil)
					if err != nil {
						t.Errorf("after %v: %v", time.Since(start), err)
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						t.Errorf("GET = %d", resp.StatusCode)
						return
					}
				}
				mu.Lock()
				slowest = max(slowest, time.Since(start))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	// The pipe is not read before every batch is answered: a request that
	// waited for the log would wait for ever, and the connection's
	// deadline fails the test above. The batches' times are for the log.
	t.Logf("slowest batch of %d pipelined GETs: %v", perBatch, slowest)
	if n := metricValue(t, g, "memcgate_log_lines_dropped_total"); n == 0 {
		t.Fatalf("memcgate_log_lines_dropped_total = 0 with %d access log lines sent to a pipe nobody reads", conns*batches*perBatch)
	}

	// Read the pipe again: the warnings follow, and count what the metric
	// counts.
	lines := make(chan string, 1024)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(r)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "log lines dropped") {
				lines <- sc.Text()
			}
		}
	}()
	var reported float64
	deadline := time.After(10 * time.Second)
	for {
		select {
		case line := <-lines:
			var rec struct {
				Level string  `json:"level"`
				Lines float64 `json:"lines"`
			}
			if err := json.Unmarshal([]byte(line), &rec); err != nil || rec.Level != "ERROR" || rec.Lines <= 0 {
				t.Fatalf("warning line %q: %v", line, err)
			}
			reported += rec.Lines
		case <-time.After(time.Second):
			// No warning for a second: the log has caught up.
			if reported == 0 {
				continue
			}
			if n := metricValue(t, g, "memcgate_log_lines_dropped_total"); reported != n {
				t.Errorf("warnings report %v dropped lines, the metric %v", reported, n)
			}
			return
		case <-deadline:
			t.Fatalf("no warning of dropped lines within 10 s of reading the log again (reported %v)", reported)
		}
	}
}

// TestLogDestinationStalledShutdown stops a gateway whose stderr is a
// pipe nobody reads, with lines waiting: it must exit soon after SIGTERM,
// not wait for the pipe forever.
func TestLogDestinationStalledShutdown(t *testing.T) {
	t.Parallel() // its own gateway and memcached; it mostly waits for the exit
	g, _ := stalledLogGateway(t)
	c, br := dialRaw(t, g.DataAddr)
	const n = 2000 // about 400 KB of access log lines, more than the pipe takes
	if _, err := io.WriteString(c, strings.Repeat("GET /logged HTTP/1.1\r\nHost: x\r\n\r\n", n)); err != nil {
		t.Fatal(err)
	}
	for range n {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	time.Sleep(500 * time.Millisecond) // past a tick: the writer is stuck in the pipe
	start := time.Now()
	g.Signal(syscall.SIGTERM)
	// The drain delay is 0: what is left is the wait for the last lines,
	// at most 5 s.
	if _, ok := g.Wait(15 * time.Second); !ok {
		t.Fatalf("still running %v after SIGTERM, its stderr a pipe nobody reads", time.Since(start).Round(time.Second))
	}
	t.Logf("exited %v after SIGTERM", time.Since(start).Round(time.Millisecond))
}

// TestLogDestinationGone closes the only reader of the gateway's stderr,
// as when a log collector is killed: the gateway must go on serving,
// counting the lines it cannot write, not die of SIGPIPE.
func TestLogDestinationGone(t *testing.T) {
	g, r := stalledLogGateway(t)
	r.Close()
	for i := range 200 {
		if resp := g.do("GET", "/logged", nil); resp.status != http.StatusOK {
			t.Fatalf("GET %d after the log's reader went away = %d %s", i, resp.status, resp.body)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for metricValue(t, g, "memcgate_log_lines_dropped_total") < 200 {
		if time.Now().After(deadline) {
			t.Fatalf("memcgate_log_lines_dropped_total = %v 10 s after 200 requests logged to a broken pipe", metricValue(t, g, "memcgate_log_lines_dropped_total"))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if exit, ok := g.Wait(0); ok {
		t.Fatalf("the gateway exited: %v", exit)
	}
}

// stalledLogGateway starts a gateway whose stdout and stderr are a pipe
// nobody reads until the test reads r, with the key /logged stored.
func stalledLogGateway(t *testing.T) (*gateway, *os.File) {
	t.Helper()
	mc := memcachedtest.Start(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); w.Close() })
	gw := gatewaytest.New(t, binary, map[string]string{"MEMCGATE_SERVERS": mc.Addr, "MEMCGATE_DRAIN_DELAY": "0s"})
	gw.SetOutput(w)
	gw.Start(t)
	g := &gateway{Gateway: gw, t: t, URL: "http://" + gw.DataAddr, Admin: "http://" + gw.AdminAddr}
	if resp := g.do("PUT", "/logged", []byte("v")); resp.status != http.StatusCreated {
		t.Fatalf("PUT = %d %s", resp.status, resp.body)
	}
	return g, r
}
