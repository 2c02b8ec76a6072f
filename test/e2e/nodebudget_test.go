package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/memcgate/memcgate/test/gatewaytest"
	"github.com/memcgate/memcgate/test/memcachedtest"
)

// budgetBytes is the gateway's MEMCGATE_MAX_BUFFERED_BYTES in these
// tests: two claims of 2,000,000 bytes, or four of 1,000,000, fill it
// but for 194,304 bytes.
const budgetBytes = 4 << 20

// stallingNode starts a node that passes its health checks (version) and
// answers the first get on each data connection with the VALUE line of
// its first key, claiming a value of claimed bytes, and then sends
// nothing more: the gateway holds the claimed size of its byte budget
// from that line until its timeout. valueLines counts the VALUE lines
// sent, one per connection.
func stallingNode(t *testing.T, claimed int) (addr string, valueLines *atomic.Int64) {
	valueLines = new(atomic.Int64)
	addr = memcachedtest.StartRaw(t, func(c net.Conn, br *bufio.Reader) {
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return
			}
			f := strings.Fields(line)
			switch {
			case len(f) >= 2 && (f[0] == "gets" || f[0] == "get"):
				fmt.Fprintf(c, "VALUE %s 0 %d 1\r\n", f[1], claimed)
				valueLines.Add(1)
				io.Copy(io.Discard, br) // and never a byte of the value
				return
			case len(f) == 1 && f[0] == "version":
				c.Write([]byte("VERSION 1.6.21\r\n"))
			default:
				c.Write([]byte("ERROR\r\n"))
			}
		}
	})
	return addr, valueLines
}

// stallGets sends GETs of keys (the stalling node's) in waves, each
// request waiting on its own until the test ends, until the node has
// sent want VALUE lines: as many of the gateway's data connections to it
// are then stuck on one, a small one's and, once the first VALUE line
// made a key known large, a large one's (the lane its reads then go on).
// The GETs refused meanwhile (503) are not waited for.
func stallGets(t *testing.T, g *gateway, keys []string, valueLines *atomic.Int64, want int64) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() }) // before the gateway stops
	for wave := 0; valueLines.Load() < want; wave++ {
		if wave == 500 {
			t.Fatalf("the stalling node sent %d VALUE lines after %d waves of GETs, want %d", valueLines.Load(), wave, want)
		}
		for _, k := range keys {
			wg.Go(func() {
				req, err := http.NewRequestWithContext(ctx, http.MethodGet, g.URL+"/"+k, nil)
				if err != nil {
					return
				}
				if resp, err := http.DefaultClient.Do(req); err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			})
		}
		time.Sleep(20 * time.Millisecond) // the next wave, as keys become known large
	}
}

// heldByReads waits until the gateway has taken in the n VALUE lines the
// stalling nodes sent, each claiming claimed bytes: each either holds
// them of the budget or was refused by its node's share. It returns the
// bytes held and the shares' refusals.
func heldByReads(t *testing.T, g *gateway, claimed, n int) (held, refused float64) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		fams, err := g.Families(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		held, refused = 0, 0
		if f := fams["memcgate_buffered_bytes"]; f != nil {
			held = f.Sum
		}
		if f := fams["memcgate_upstream_buffered_share_refusals_total"]; f != nil {
			refused = f.Sum
		}
		if held+float64(claimed)*refused >= float64(n*claimed) {
			return held, refused
		}
		if time.Now().After(deadline) {
			t.Fatalf("the budget holds %.0f bytes and the node's share refused %.0f values, %d VALUE lines after they were sent", held, refused, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestStalledNodeHoldsItsShareOfTheBudget runs the binary with a real
// memcached beside one or two nodes that claim a large value on each of
// their data connections and send none of it. Clients read their keys
// until every connection to them is stuck on such a value. A node's reads
// may hold only their share of MEMCGATE_MAX_BUFFERED_BYTES (their fair
// part, the budget over the nodes, and past it only while the budget
// keeps as much free as the node would hold), and the values past that
// are refused (503) and counted, so a client's PUT and GET of a 300 KB
// value on the healthy node are answered 201 and 200. Without the share,
// the stalled claims held all of the 4 MiB budget but 194,304 bytes, and
// the healthy GET got 503 (the PUT's body waited for room); with a fixed
// half of the budget for each node, two stalling nodes held it between
// them all the same.
func TestStalledNodeHoldsItsShareOfTheBudget(t *testing.T) {
	tests := []struct {
		name     string
		stalling int
		claimed  int // by each VALUE line
		lines    int // VALUE lines each stalling node sends (connections stuck)
		maxHeld  int // of the budget by the stalling nodes' reads
	}{
		// 2,000,000 is within the fair part of two nodes; a second
		// claim is refused.
		{"one node", 1, 2_000_000, 2, budgetBytes / 2},
		// Of three nodes: the first node's second claim comes while the
		// budget keeps as much free as it would hold; the second node's
		// does not.
		{"two nodes", 2, 1_000_000, 2, 3_000_000},
		// One claim of most of the budget: past the fair part, and it
		// would leave less free than it holds.
		{"one claim of most of the budget", 1, 4_000_000, 1, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mc := memcachedtest.Start(t)
			servers := []string{mc.Addr}
			var lines []*atomic.Int64
			for range tt.stalling {
				addr, valueLines := stallingNode(t, tt.claimed)
				servers, lines = append(servers, addr), append(lines, valueLines)
			}
			g := startGateway(t, map[string]string{
				"MEMCGATE_SERVERS":            strings.Join(servers, ","),
				"MEMCGATE_MAX_BUFFERED_BYTES": fmt.Sprint(budgetBytes),
				"MEMCGATE_PIPELINE_CONNS":     "2",
				"MEMCGATE_TIMEOUT":            "60s", // the stalled values stay held for the whole test
				"MEMCGATE_REQUEST_TIMEOUT":    "120s",
				"MEMCGATE_HEALTH_TIMEOUT":     "5s",
				"MEMCGATE_ACCESS_LOG":         "false",
			})
			keysOf := map[string][]string{}
			for i := 0; ; i++ {
				k := fmt.Sprint("nb", i)
				o := g.owner(k)
				keysOf[o] = append(keysOf[o], k)
				enough := len(keysOf[mc.Addr]) >= 2
				for _, s := range servers[1:] {
					enough = enough && len(keysOf[s]) >= 8
				}
				if enough {
					break
				}
			}
			goodKeys := keysOf[mc.Addr]
			value := bytes.Repeat([]byte("h"), 300_000)
			if err := memcache.New(mc.Addr).Set(&memcache.Item{Key: goodKeys[0], Value: value}); err != nil {
				t.Fatal(err)
			}
			// One stalling node after the other, each until tt.lines of
			// its connections are stuck.
			for i, s := range servers[1:] {
				stallGets(t, g, keysOf[s], lines[i], int64(tt.lines))
				heldByReads(t, g, tt.claimed, tt.lines*(i+1))
			}
			held, refused := heldByReads(t, g, tt.claimed, tt.lines*tt.stalling)
			t.Logf("the stalled nodes' reads hold %.0f bytes of %d; %.0f values refused past their share", held, budgetBytes, refused)
			if held > float64(tt.maxHeld) {
				t.Errorf("the stalled nodes' reads hold %.0f bytes of the %d-byte budget, want at most %d", held, budgetBytes, tt.maxHeld)
			}

			if r := g.do("GET", "/"+goodKeys[0], nil); r.status != http.StatusOK || r.body != string(value) {
				t.Errorf("GET of a 300 KB value on the healthy node = %d %.100q, want 200 and its value", r.status, r.body)
			}
			put, err := http.NewRequestWithContext(t.Context(), http.MethodPut, g.URL+"/"+goodKeys[1], bytes.NewReader(value))
			if err != nil {
				t.Fatal(err)
			}
			client := &http.Client{Timeout: 30 * time.Second} // a body waits up to REQUEST_TIMEOUT for room
			resp, err := client.Do(put)
			if err != nil {
				t.Fatalf("PUT of 300 KB on the healthy node: %v", err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusCreated {
				t.Errorf("PUT of 300 KB on the healthy node = %d, want 201", resp.StatusCode)
			}
			if r := g.do("GET", "/"+goodKeys[1], nil); r.status != http.StatusOK || r.body != string(value) {
				t.Errorf("GET of the value just PUT on the healthy node = %d %.100q, want 200 and its value", r.status, r.body)
			}
			// The refusals say nothing against the nodes: all still up.
			fams, err := g.Families(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if f := fams["memcgate_upstream_node_up"]; f == nil || f.Sum != float64(len(servers)) {
				t.Errorf("memcgate_upstream_node_up sums to %v, want all %d nodes up", f, len(servers))
			}
		})
	}
}

// TestLoneNodeTakesTheWholeBudget: while no other node is up (it is the
// only one, or the other is down) a node's reads may hold all of the
// budget: there is nobody to keep it for. The stalling node's two
// claims are all held, none refused.
func TestLoneNodeTakesTheWholeBudget(t *testing.T) {
	for _, other := range []string{"none", "down"} {
		t.Run(other, func(t *testing.T) {
			const claimed = 2_000_000
			bad, valueLines := stallingNode(t, claimed)
			servers := bad
			if other == "down" {
				servers += fmt.Sprintf(",127.0.0.1:%d", memcachedtest.DeadPort(t))
			}
			g := startGateway(t, map[string]string{
				"MEMCGATE_SERVERS":            servers,
				"MEMCGATE_MAX_BUFFERED_BYTES": fmt.Sprint(budgetBytes),
				"MEMCGATE_PIPELINE_CONNS":     "2",
				"MEMCGATE_TIMEOUT":            "60s",
				"MEMCGATE_REQUEST_TIMEOUT":    "120s",
				"MEMCGATE_HEALTH_TIMEOUT":     "1s",
				"MEMCGATE_FAILOVER":           "fail",
				"MEMCGATE_ACCESS_LOG":         "false",
			})
			var keys []string
			for i := 0; len(keys) < 8; i++ {
				if k := fmt.Sprint("lone", i); g.owner(k) == bad {
					keys = append(keys, k)
				}
			}
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
				fams, err := g.Families(t.Context())
				if err != nil {
					t.Fatal(err)
				}
				if f := fams["memcgate_upstream_node_up"]; f != nil && f.Sum == 1 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the dead node was not taken down within 30s")
				}
			}
			stallGets(t, g, keys, valueLines, 2)
			held, refused := heldByReads(t, g, claimed, 2)
			if refused != 0 || held < 2*claimed {
				t.Errorf("the lone node's reads hold %.0f bytes with %.0f values refused by its share, want both claims (%d bytes) held", held, refused, 2*claimed)
			}
		})
	}
}

// TestDerivedBudgetBelowTwoValues: with MAX_BUFFERED_BYTES unset, the
// budget is a quarter of the memory limit (GOMEMLIMIT here), at least one
// value: 16 MiB of 64 MiB, for values up to 10 MB. Below two values a
// node's share refuses a healthy node's larger values while another node
// is up (a GET of 9 MB, nothing else held, is 503), as with a budget set
// that low, and the same configuration warning is logged at start.
func TestDerivedBudgetBelowTwoValues(t *testing.T) {
	t.Parallel()
	mcs := []*memcachedtest.Server{memcachedtest.Start(t, "-I", "16m"), memcachedtest.Start(t, "-I", "16m")}
	g := startGateway(t, map[string]string{
		"MEMCGATE_SERVERS":         memcachedtest.Addrs(mcs),
		"MEMCGATE_MAX_VALUE_BYTES": "10000000",
		"GOMEMLIMIT":               "64MiB",
	})
	value := bytes.Repeat([]byte("v"), 9_000_000)
	if r := g.do("PUT", "/nine-mb", value); r.status != http.StatusCreated {
		t.Fatalf("PUT of 9 MB = %d %s", r.status, r.body)
	}
	if r := g.do("GET", "/nine-mb", nil); r.status != http.StatusServiceUnavailable {
		t.Errorf("GET of 9 MB past the node's share of a 16 MiB budget = %d, want 503", r.status)
	}
	// The log is written in batches (every 200ms at most).
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(g.Logs(), "less than two values of MEMCGATE_MAX_VALUE_BYTES"); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no configuration warning about the derived budget at start:\n%s", gatewaytest.Tail(g.Logs(), 2000))
		}
	}
}
