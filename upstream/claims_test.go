package upstream

import (
	"bufio"
	"bytes"
	"errors"
	"net"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/memcgate/memcgate/gateway/budget"
	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream/op"
)

// TestClaimFromALiar runs gomemcache's pool (PipelineConns 0) against a
// node that answers a get with a VALUE line and then nothing: gomemcache
// allocates the claimed length before a byte of it comes, which was
// the whole claim (600 MB here; 2 GB, 4 GiB as readily) for one GET. A
// claim past memcached's largest item (1 GiB) is the node's failure (a
// NodeError, 502) and one past what Options.Claims holds is ErrNoFit
// (503), both at the VALUE line, with nothing allocated for them, and
// the claim is given back.
func TestClaimFromALiar(t *testing.T) {
	for _, tt := range []struct {
		name   string
		claim  int64
		claims int64 // Options.Claims' limit; 0: none
		want   func(error) bool
	}{
		{"past memcached's largest item", 2_000_000_000, 0, isNodeFailure},
		{"past memcached's largest item, with claims held", 2_000_000_000, 64 << 20, isNodeFailure},
		{"past the byte budget", 600_000_000, 64 << 20, func(err error) bool { return errors.Is(err, ErrNoFit) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			addr := memcachedtest.StartRaw(t, func(c net.Conn, br *bufio.Reader) {
				for {
					line, err := br.ReadString('\n')
					if err != nil {
						return
					}
					reply := "ERROR\r\n"
					if f := strings.Fields(line); len(f) > 1 && strings.HasPrefix(f[0], "get") {
						// the claim in two writes, so that it spans reads
						c.Write([]byte("VALUE " + f[1] + " 0 " + strconv.FormatInt(tt.claim, 10)[:3]))
						reply = strconv.FormatInt(tt.claim, 10)[3:] + "\r\n"
					}
					if _, err := c.Write([]byte(reply)); err != nil {
						return
					}
				}
			})
			claims := budget.New(tt.claims)
			c := claimCluster(t, addr, func(o *Options) {
				if tt.claims > 0 {
					o.Claims = claims
				}
			})
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			res := c.Do(t.Context(), op.Op{Verb: op.Get, Item: op.Item{Key: "k"}})
			runtime.ReadMemStats(&after)
			if !tt.want(res.Err) {
				t.Errorf("get = %v, want the claim refused", res.Err)
			}
			if n := after.TotalAlloc - before.TotalAlloc; n > 16<<20 {
				t.Errorf("the get allocated %d MiB for a claim of %d MB", n>>20, tt.claim/1e6)
			}
			if n := claims.Used(); n != 0 {
				t.Errorf("%d bytes still held, want none", n)
			}
		})
	}
}

// isNodeFailure: err is the node's failure, not the request's: a
// NodeError that is no timeout, which the gateway answers 502.
func isNodeFailure(err error) bool {
	var ne *NodeError
	return errors.As(err, &ne) && !ne.Timeout() && errors.Is(err, errClaimPastItem)
}

// claimCluster is a cluster of gomemcache's pool, whatever
// -pipeline-conns says, on the node at addr.
func claimCluster(t *testing.T, addr string, mod func(*Options)) *Cluster {
	t.Helper()
	_, p, _ := net.SplitHostPort(addr)
	port, _ := strconv.Atoi(p)
	return newTestClusterWith(t, port, func(o *Options) {
		o.PipelineConns = 0
		o.Timeout = 5 * time.Second // a liar's stalled value times out on main, not here
		if mod != nil {
			mod(o)
		}
	})
}

// newTestClusterWith is newTestCluster on one node at port.
func newTestClusterWith(t *testing.T, port int, mod func(*Options)) *Cluster {
	t.Helper()
	c, _ := newTestCluster(t, []*memcachedtest.Server{{Port: port}}, mod)
	return c
}

// TestHonestClaimsRead: gomemcache's pool still reads memcached's
// values of every size: 1 MB, one exactly what Options.Claims can hold,
// and a multi-get of values that together fill it. One byte more than
// the claims can hold is ErrNoFit, and the node's next reads go on; the
// claims are given back once each reply is read.
func TestHonestClaimsRead(t *testing.T) {
	const room = 3 << 20
	mc := memcachedtest.Start(t, "-I", "4m", "-m", "64")
	claims := budget.New(room)
	c := claimCluster(t, mc.Addr, func(o *Options) { o.Claims = claims })
	ctx := t.Context()
	value := func(n int) []byte { return bytes.Repeat([]byte{byte('a' + n%26)}, n) }
	sizes := map[string]int{"small": 100, "edge": defaultUnheldClaim, "held": defaultUnheldClaim + 1, "1MB": 1_000_000, "room": room, "past": room + 1}
	for k, n := range sizes {
		if res := c.Do(ctx, op.Op{Verb: op.Set, Item: op.Item{Key: k, Value: value(n)}}); res.Err != nil {
			t.Fatalf("set %s: %v", k, res.Err)
		}
	}
	for _, k := range []string{"small", "edge", "held", "1MB", "room", "past", "1MB", "room"} {
		res := c.Do(ctx, op.Op{Verb: op.Get, Item: op.Item{Key: k}})
		switch {
		case k == "past":
			if !errors.Is(res.Err, ErrNoFit) {
				t.Errorf("get %s (%d bytes, %d of room) = %v, want ErrNoFit", k, sizes[k], room, res.Err)
			}
		case res.Err != nil:
			t.Errorf("get %s: %v", k, res.Err)
		case !bytes.Equal(res.Item.Value, value(sizes[k])):
			t.Errorf("get %s: %d bytes, want %d of %q", k, len(res.Item.Value), sizes[k], value(sizes[k])[:1])
		}
		if n := claims.Used(); n != 0 {
			t.Errorf("after get %s: %d bytes held, want none", k, n)
		}
	}
	items, errs := c.GetMulti(ctx, []string{"small", "edge", "held", "1MB"}, 0, nil)
	if len(errs) > 0 || len(items) != 4 {
		t.Errorf("multi-get: %d items, errors %v; want 4 and none", len(items), errs)
	}
	for k, it := range items {
		if !bytes.Equal(it.Value, value(sizes[k])) {
			t.Errorf("multi-get %s: %d bytes, want %d", k, len(it.Value), sizes[k])
		}
	}
	if n := claims.Used(); n != 0 {
		t.Errorf("after the multi-get: %d bytes held, want none", n)
	}
}

// TestClaimScan feeds claimConn.scan replies cut at every byte: it
// holds each VALUE line's claim past 64 KiB from the line's end to the
// reply's, never reads a value's bytes as lines (a value holding a VALUE
// line that claims 2 GB), and fails the read that ends a claim's digits
// past 1 GiB however the line is cut.
func TestClaimScan(t *testing.T) {
	big := strings.Repeat("x", defaultUnheldClaim+1)
	for _, tt := range []struct {
		name   string
		reply  string
		peak   int64 // most held at once
		failAt int   // index of the byte whose read fails; -1: none
	}{
		{"a miss", "END\r\n", 0, -1},
		{"a small value", "VALUE k 3 5 17\r\nhello\r\nEND\r\n", 0, -1},
		{"a value with a VALUE line in it", "VALUE k 0 25\r\nVALUE k 0 2000000000\r\nab\r\nEND\r\n", 0, -1},
		{"a held value", "VALUE k 0 " + strconv.Itoa(len(big)) + " 9\r\n" + big + "\r\nEND\r\n", int64(len(big)), -1},
		{"two held values", "VALUE a 0 " + strconv.Itoa(len(big)) + "\r\n" + big + "\r\nVALUE b 1 " + strconv.Itoa(len(big)) + "\r\n" + big + "\r\nEND\r\n", 2 * int64(len(big)), -1},
		{"an incr", "42\r\n", 0, -1},
		{"a claim past 1 GiB", "VALUE k 0 1073741825\r\n", 0, len("VALUE k 0 1073741825") - 1},
		{"a claim past 1 GiB with leading zeros", "VALUE k 0 0001073741825\r\n", 0, len("VALUE k 0 0001073741825") - 1},
		{"1 GiB claimed", "VALUE k 0 1073741824\r\n", 1 << 30, -1},
		{"a size that is no number", "VALUE k 0 12x3456789012\r\n", 0, -1},
	} {
		for cut := 1; cut <= len(tt.reply); cut++ {
			if cut > 64 && cut < len(tt.reply)-64 && cut%997 != 0 {
				continue // every cut near the lines, some in the values
			}
			claims := &peakClaims{Budget: budget.New(0)}
			c := &claimConn{claims: claims, unheld: defaultUnheldClaim}
			failed := -1
			for i, b := 0, []byte(tt.reply); i < len(b) && failed < 0; i += cut {
				chunk := b[i:min(i+cut, len(b))]
				if err := c.scan(chunk); err != nil {
					if !errors.Is(err, errClaimPastItem) {
						t.Fatalf("%s, cut %d: %v", tt.name, cut, err)
					}
					failed = i
					if tt.failAt >= 0 && (tt.failAt < i || tt.failAt >= i+len(chunk)) {
						t.Errorf("%s, cut %d: the read of bytes %d to %d failed, want the one with byte %d", tt.name, cut, i, i+len(chunk), tt.failAt)
					}
				}
			}
			if tt.failAt >= 0 && failed < 0 {
				t.Errorf("%s, cut %d: no read failed", tt.name, cut)
			}
			if tt.failAt < 0 && failed >= 0 {
				t.Errorf("%s, cut %d: the read at %d failed", tt.name, cut, failed)
			}
			if claims.peak != tt.peak {
				t.Errorf("%s, cut %d: %d bytes held at most, want %d", tt.name, cut, claims.peak, tt.peak)
			}
		}
	}
}

// peakClaims is a budget that remembers the most it held at once.
type peakClaims struct {
	*budget.Budget
	peak int64
}

func (p *peakClaims) Acquire(n int64) error {
	err := p.Budget.Acquire(n)
	p.peak = max(p.peak, p.Used())
	return err
}

// TestClaimPastTheNodesShare: with another node up, gomemcache's pool
// holds a claim only within the node's share of the budget, as the
// pipelined client does (readshare.go): a liar's claim of 40 MB, past
// the fair part of two nodes and more than would stay free, is ErrNoFit
// at its VALUE line, counted as the share's refusal, nothing held. It
// was held whole, until the read timed out.
func TestClaimPastTheNodesShare(t *testing.T) {
	liar := memcachedtest.StartRaw(t, func(c net.Conn, br *bufio.Reader) {
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return
			}
			if f := strings.Fields(line); len(f) > 1 && strings.HasPrefix(f[0], "get") {
				c.Write([]byte("VALUE " + f[1] + " 0 40000000\r\n")) // and nothing more
				continue
			}
			reply := "ERROR\r\n"
			if strings.TrimSpace(line) == "version" {
				reply = "VERSION 1.6.21\r\n" // its probes pass
			}
			if _, err := c.Write([]byte(reply)); err != nil {
				return
			}
		}
	})
	_, p, _ := net.SplitHostPort(liar)
	port, _ := strconv.Atoi(p)
	claims := budget.New(64 << 20)
	c, _ := newTestCluster(t, []*memcachedtest.Server{{Port: port}, memcachedtest.Start(t)}, func(o *Options) {
		o.PipelineConns, o.Timeout, o.Claims, o.UnheldClaim = 0, 5*time.Second, claims, 1<<20
	})
	c.ShareBytes(claims)
	key := ""
	for i := 0; key == ""; i++ {
		if k := "k" + strconv.Itoa(i); func() bool { o, _ := c.Owner(k); return o == 0 }() {
			key = k
		}
	}
	res := c.Do(t.Context(), op.Op{Verb: op.Get, Item: op.Item{Key: key}})
	if !errors.Is(res.Err, ErrNoFit) {
		t.Errorf("get of the liar's key = %v, want ErrNoFit", res.Err)
	}
	n := c.topo.Load().nodes[0]
	if got := testutil.ToFloat64(c.m.shareRefused.WithLabelValues(n.name)); got != 1 {
		t.Errorf("the share refused %v claims, want 1", got)
	}
	if used, held := claims.Used(), n.reads.held.Load(); used != 0 || held != 0 {
		t.Errorf("%d bytes held in the budget and %d in the node's share, want none", used, held)
	}
}

// TestClaimUnaskedBytes: gomemcache puts a connection back in its pool
// after a reply it takes as a cache error (a delete's NOT_FOUND) with
// whatever came after it still in its reader: the next request's reply
// is read from there. A node that sends a VALUE line after the NOT_FOUND
// had its claim held while the connection sat idle, and given back when
// the next request was written, before gomemcache read the line and
// allocated its claim unheld (40 MB here, of a budget that then showed
// none held). The next request on such a connection fails as the node's,
// without allocating the claim, and nothing stays held.
func TestClaimUnaskedBytes(t *testing.T) {
	const claim = 40_000_000
	node := memcachedtest.StartScripted(t, func(line string, br *bufio.Reader) (string, bool) {
		switch f := strings.Fields(line); {
		case len(f) > 0 && f[0] == "delete":
			return "NOT_FOUND\r\nVALUE x 0 " + strconv.Itoa(claim) + "\r\n", true // one write, one read
		case len(f) > 0 && strings.HasPrefix(f[0], "get"):
			br.ReadByte() // stalls until the client closes
			return "", false
		}
		return "ERROR\r\n", true
	})
	claims := budget.New(64 << 20)
	c := claimCluster(t, node.Addr, func(o *Options) {
		o.Claims, o.MaxConns, o.MaxIdleConns = claims, 1, 1
		o.Timeout = time.Second // a stalled get's
	})
	if res := c.Do(t.Context(), op.Op{Verb: op.Delete, Item: op.Item{Key: "k"}}); !errors.Is(res.Err, ErrNotFound) {
		t.Fatalf("delete = %v, want ErrNotFound", res.Err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	res := c.Do(t.Context(), op.Op{Verb: op.Get, Item: op.Item{Key: "k"}})
	runtime.ReadMemStats(&after)
	var ne *NodeError
	if !errors.As(res.Err, &ne) || ne.Timeout() {
		t.Errorf("get after the unasked VALUE line = %v, want the node's failure, no timeout", res.Err)
	}
	if n := after.TotalAlloc - before.TotalAlloc; n > 16<<20 {
		t.Errorf("the get allocated %d MiB for an unasked claim of %d MB", n>>20, claim/1_000_000)
	}
	if n := claims.Used(); n != 0 {
		t.Errorf("%d bytes still held, want none", n)
	}
}
