package gateway

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/memcgate/memcgate/upstream/op"
)

// accessRecords is a slog handler that keeps the access log's lines,
// path included (debug level), by request ID.
type accessRecords struct {
	mu   sync.Mutex
	recs map[string]string // request_id → "method path status"
}

func (a *accessRecords) Enabled(context.Context, slog.Level) bool { return true }
func (a *accessRecords) WithAttrs([]slog.Attr) slog.Handler       { return a }
func (a *accessRecords) WithGroup(string) slog.Handler            { return a }
func (a *accessRecords) Handle(_ context.Context, r slog.Record) error {
	var id, method, path, status string
	r.Attrs(func(at slog.Attr) bool {
		switch at.Key {
		case "request_id":
			id = at.Value.String()
		case "method":
			method = at.Value.String()
		case "path":
			path = at.Value.String()
		case "status":
			status = at.Value.String()
		}
		return true
	})
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, dup := a.recs[id]; dup {
		a.recs[id] = "logged twice"
	} else {
		a.recs[id] = method + " " + path + " " + status
	}
	return nil
}

// TestReleasedRequestsNotReadAfterReuse (issue #20): the detached path
// gives its requests back to h1 (ReleaseRequest), which reuses them on
// any connection once they end. Clients pipeline GETs of 1 MB values
// (answered on a goroutine of their own after the handler returned),
// misses, small hits, ranges of the large values and HEADs (routed, not
// given back), each with an ID of its own; every answer must be its
// request's, byte for byte, and every access log line (written at the
// request's end from the request's method, path and ID) its request's.
// Run under -race, a read of a reused request after its end is also a
// data race with its next request's parse.
func TestReleasedRequestsNotReadAfterReuse(t *testing.T) {
	recs := &accessRecords{recs: map[string]string{}}
	addr, cl := startStack(t, func(o *Options) {
		o.AccessLog, o.AccessLogger = true, slog.New(recs)
	})
	values := map[string][]byte{}
	for i := range 3 {
		small := []byte(fmt.Sprintf("small-%d-", i) + strings.Repeat(strconv.Itoa(i), 380))
		large := make([]byte, 1_000_000)
		rng := rand.New(rand.NewPCG(uint64(i), 7))
		for j := range large {
			large[j] = byte(rng.IntN(256))
		}
		values[fmt.Sprintf("small%d", i)], values[fmt.Sprintf("large%d", i)] = small, large
	}
	for k, v := range values {
		if res := cl.Do(t.Context(), op.Op{Verb: op.Set, Item: op.Item{Key: k, Value: v}}); res.Err != nil {
			t.Fatal(res.Err)
		}
	}
	keys := []string{"small0", "small1", "small2", "large0", "large1", "large2", "miss0", "miss1"}

	type sent struct {
		method, key, rng, id string
	}
	const conns, rounds, depth = 6, 6, 10
	var wg sync.WaitGroup
	var mu sync.Mutex
	want := map[string]string{} // request_id → access log line
	for ci := range conns {
		wg.Go(func() {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(30 * time.Second))
			br := bufio.NewReader(c)
			rng := rand.New(rand.NewPCG(uint64(ci), 1))
			for round := range rounds {
				var batch []sent
				var out bytes.Buffer
				for j := range depth {
					s := sent{method: "GET", key: keys[rng.IntN(len(keys))], id: fmt.Sprintf("c%d-r%d-%d", ci, round, j)}
					switch rng.IntN(5) {
					case 0:
						s.method = "HEAD"
					case 1:
						if !strings.HasPrefix(s.key, "large") {
							break
						}
						s.rng = fmt.Sprintf("bytes=%d-%d", 100*j, 100*j+rng.IntN(5000))
					}
					fmt.Fprintf(&out, "%s /%s HTTP/1.1\r\nHost: x\r\nX-Request-Id: %s\r\n", s.method, s.key, s.id)
					if s.rng != "" {
						fmt.Fprintf(&out, "Range: %s\r\n", s.rng)
					}
					out.WriteString("\r\n")
					batch = append(batch, s)
				}
				if _, err := c.Write(out.Bytes()); err != nil {
					t.Error(err)
					return
				}
				for _, s := range batch {
					resp, err := http.ReadResponse(br, &http.Request{Method: s.method})
					if err != nil {
						t.Errorf("%s /%s (%s): %v", s.method, s.key, s.id, err)
						return
					}
					body, err := io.ReadAll(resp.Body)
					resp.Body.Close()
					if err != nil {
						t.Errorf("%s /%s (%s): body: %v", s.method, s.key, s.id, err)
						return
					}
					v, hit := values[s.key]
					status, wantBody := http.StatusOK, v
					switch {
					case !hit:
						status, wantBody = http.StatusNotFound, nil
					case s.rng != "":
						var from, to int
						fmt.Sscanf(s.rng, "bytes=%d-%d", &from, &to)
						status, wantBody = http.StatusPartialContent, v[from:min(to+1, len(v))]
					}
					if s.method == "HEAD" {
						wantBody = nil
					}
					if resp.StatusCode != status || (hit || s.method == "HEAD") && !bytes.Equal(body, wantBody) {
						t.Errorf("%s /%s Range %q (%s) = %d with %d bytes, want %d with %d bytes (equal: %v)",
							s.method, s.key, s.rng, s.id, resp.StatusCode, len(body), status, len(wantBody), bytes.Equal(body, wantBody))
						return
					}
					mu.Lock()
					want[s.id] = s.method + " /" + s.key + " " + strconv.Itoa(status)
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	// The access log's line is written before finish, which lets the
	// client's answer end: poll for the last lines.
	deadline := time.Now().Add(5 * time.Second)
	for {
		recs.mu.Lock()
		n := len(recs.recs)
		recs.mu.Unlock()
		if n >= len(want) || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	recs.mu.Lock()
	defer recs.mu.Unlock()
	for id, w := range want {
		if got := recs.recs[id]; got != w {
			t.Errorf("access log of request %s: %q, want %q", id, got, w)
		}
	}
	if len(recs.recs) != len(want) {
		t.Errorf("%d access log lines for %d requests", len(recs.recs), len(want))
	}
}
