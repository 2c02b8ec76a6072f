package gateway

import (
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream"
)

// TestRefusedGetsAreCounted: a GET whose value the byte budget cannot
// take, dropped unread by its op.Op.Room, is a refusal of the budget
// like any other: memcgate_buffered_refusals_total (and the
// MemcgateBufferedBytesExhausted alert on it) counts it, on the routed
// path and on the detached one. Once its value was seen large, the GET
// is refused before memcached is asked (mcpipe's size hints).
func TestRefusedGetsAreCounted(t *testing.T) {
	const size, limit = 20_000, 200_000
	g := newBigRig(t, func(o *Options, c *upstream.Cluster) {
		o.MaxValueBytes = 64 << 10 // the value is one item
		o.Async = c                // detached responses on h1
	})
	v := value(size, "fit")
	g.mustPut("/fit", v)
	g.budget.SetLimit(limit)
	tests := []struct {
		name     string
		url      string
		detached bool // served by detached responses
	}{
		{"routed", g.url, false},
		{"detached", "http://" + g.serveH1(), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g.budget.Force(limit - size/2) // room for half the value
			before := g.counterPlain("memcgate_buffered_refusals_total")
			detached := g.counterPlain("memcgate_http_detached_responses_total")
			gets := g.memcachedGets()
			for i := range 3 {
				resp, err := http.Get(tt.url + "/fit")
				if err != nil {
					t.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
					t.Fatalf("GET %d with the budget full = %s, want 503 with Retry-After", i, resp.Status)
				}
			}
			if got := g.counterPlain("memcgate_buffered_refusals_total") - before; got != 3 {
				t.Errorf("3 GETs refused for the budget counted %v refusals, want 3", got)
			}
			if n := g.memcachedGets() - gets; n > 1 {
				t.Errorf("3 GETs refused for the budget asked memcached %d times, want at most once (before the value's size was known)", n)
			}
			if got := g.counterPlain("memcgate_http_detached_responses_total") > detached; got != tt.detached {
				t.Errorf("detached responses: %v, want %v (the test did not take the path it tests)", got, tt.detached)
			}
			g.budget.Release(limit - size/2)
			resp, err := http.Get(tt.url + "/fit")
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || string(b) != string(v) {
				t.Errorf("GET with room = %s, %d bytes; want 200 and the value", resp.Status, len(b))
			}
			for deadline := time.Now().Add(5 * time.Second); g.budget.Used() != 0; time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("%d bytes still held 5s after the GETs", g.budget.Used())
				}
			}
		})
	}
}

// memcachedGets is the number of get commands the rig's memcached
// servers have served.
func (g *bigRig) memcachedGets() int {
	g.t.Helper()
	return memcachedtest.SumStat(g.t, "cmd_get", g.mcs...)
}
