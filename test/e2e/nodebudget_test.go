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

	"github.com/memcgate/memcgate/test/memcachedtest"
)

// claimed is the size of the values the lying node claims and never
// sends; budgetBytes the gateway's MEMCGATE_MAX_BUFFERED_BYTES in these
// tests: two claims fill it but for 194,304 bytes.
const (
	claimed     = 2_000_000
	budgetBytes = 4 << 20
)

// stallingNode starts a node that passes its health checks (version) and
// answers the first get on each data connection with the VALUE line of
// its first key, claiming a value of claimed bytes, and then sends
// nothing more: the gateway holds the claimed size of its byte budget
// from that line until its timeout. valueLines counts the VALUE lines
// sent, one per connection.
func stallingNode(t *testing.T) (addr string, valueLines *atomic.Int64) {
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

// heldByReads waits until the gateway has taken in every VALUE line the
// stalling node sent (n of them): each either holds claimed bytes of the
// budget or was refused by the node's share. It returns the bytes held
// and the share's refusals.
func heldByReads(t *testing.T, g *gateway, n int) (held, refused float64) {
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
		if held+claimed*refused >= float64(n*claimed) {
			return held, refused
		}
		if time.Now().After(deadline) {
			t.Fatalf("the budget holds %.0f bytes and the node's share refused %.0f values, %d VALUE lines after they were sent", held, refused, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestStalledNodeHoldsItsShareOfTheBudget runs the binary with a real
// memcached beside a node that claims a 2 MB value on each of its data
// connections and sends none of it. Many clients read its keys, so that
// every connection to it is stuck on such a value. Its reads may hold
// only their share of MEMCGATE_MAX_BUFFERED_BYTES: half of it here (its
// fair part), and the values past that are refused (503) and counted,
// so a client's PUT and GET of a 300 KB value on the healthy node are
// answered 201 and 200. Without the share, the node's two claims held
// all of the 4 MiB budget but 194,304 bytes, and the healthy GET got
// 503 (the PUT's body waited for room).
func TestStalledNodeHoldsItsShareOfTheBudget(t *testing.T) {
	mc := memcachedtest.Start(t)
	bad, valueLines := stallingNode(t)
	g := startGateway(t, map[string]string{
		"MEMCGATE_SERVERS":            mc.Addr + "," + bad,
		"MEMCGATE_MAX_BUFFERED_BYTES": fmt.Sprint(budgetBytes),
		"MEMCGATE_PIPELINE_CONNS":     "2",
		"MEMCGATE_TIMEOUT":            "60s", // the stalled values stay held for the whole test
		"MEMCGATE_REQUEST_TIMEOUT":    "120s",
		"MEMCGATE_HEALTH_TIMEOUT":     "5s",
		"MEMCGATE_ACCESS_LOG":         "false",
	})
	var badKeys, goodKeys []string
	for i := 0; len(badKeys) < 8 || len(goodKeys) < 2; i++ {
		k := fmt.Sprint("nb", i)
		if g.owner(k) == bad {
			badKeys = append(badKeys, k)
		} else {
			goodKeys = append(goodKeys, k)
		}
	}
	value := bytes.Repeat([]byte("h"), 300_000)
	if err := memcache.New(mc.Addr).Set(&memcache.Item{Key: goodKeys[0], Value: value}); err != nil {
		t.Fatal(err)
	}
	stallGets(t, g, badKeys, valueLines, 2)
	held, refused := heldByReads(t, g, 2)
	t.Logf("the stalled node's reads hold %.0f bytes of %d; %.0f values refused past its share", held, budgetBytes, refused)
	if held > budgetBytes/2 {
		t.Errorf("the stalled node's reads hold %.0f bytes, more than half of the %d-byte budget", held, budgetBytes)
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
	// The refusals say nothing against the node: it is still up.
	fams, err := g.Families(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if f := fams["memcgate_upstream_node_up"]; f == nil || f.Sum != 2 {
		t.Errorf("memcgate_upstream_node_up sums to %v, want both nodes up", f)
	}
}

// TestLoneNodeTakesTheWholeBudget: while no other node is up (it is the
// only one, or the other is down) a node's reads may hold all of the
// budget: there is nobody to keep it for. The stalling node's two
// claims are all held, none refused.
func TestLoneNodeTakesTheWholeBudget(t *testing.T) {
	for _, other := range []string{"none", "down"} {
		t.Run(other, func(t *testing.T) {
			bad, valueLines := stallingNode(t)
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
			held, refused := heldByReads(t, g, 2)
			if refused != 0 || held < 2*claimed {
				t.Errorf("the lone node's reads hold %.0f bytes with %.0f values refused by its share, want both claims (%d bytes) held", held, refused, 2*claimed)
			}
		})
	}
}
