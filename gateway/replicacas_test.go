package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http/httptest"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/gateway/budget"
	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream"
	"github.com/memcgate/memcgate/upstream/op"
	"github.com/memcgate/memcgate/upstream/route"
)

// replRig is a handler over a router of two replicated pools of real
// memcached, each of two nodes and replicas=2: the default pool reads its
// first replica and falls back to the second after a timeout, the pool of
// keys starting "h/" hedges its reads. Values past rigChunk go in chunks.
// Its nodes' connections are mcpipe's pipelined ones, or, with
// pipelineConns 0, gomemcache's pool (MEMCGATE_PIPELINE_CONNS=0), whose
// cas, gets and delete_cas take other paths to memcached. The gateway's
// log is kept (log), for a failed case to show (explain).
type replRig struct {
	*bigRig
	router *route.Router
	opts   route.Options
	byAddr map[string]*memcachedtest.Server
	log    *rigLog
}

// replTimeout is the rig's memcached timeout: a read of a paused first
// replica falls back to the second after it. It tells a node a test holds
// paused for as long as its read takes from one slow on a loaded machine,
// which every other answer of the rig may be: under -race at load average
// 10, answers of nodes that ran came past 300 ms, and reads, PUTs and
// conditional writes answered 504 (docs/benchmarks.md, "The replicated
// CAS tests under load"). Each read of a paused first replica waits it
// out, unless it was hedged.
const replTimeout = time.Second

// replGrace is the rig's BigValueGrace, which bounds a read of a value in
// chunks (its last chunk read within it of its index): room for the
// index and a chunk each read from a paused first replica the gateway
// came to late, then from the second.
const replGrace = 10 * replTimeout

// replRequestTimeout is the rig's RequestTimeout: room for a read of a
// paused first replica that the gateway came to late (one more timeout
// there, decisions/0061 and 0087), then of the second as late.
const replRequestTimeout = 5 * replTimeout

// newReplRig starts a replRig; mod, if given, changes the router's
// options before it starts.
func newReplRig(t *testing.T, pipelineConns int, mod ...func(*route.Options)) *replRig {
	t.Helper()
	mcs := memcachedtest.StartN(t, 4)
	servers := func(ms []*memcachedtest.Server) []upstream.Server {
		var out []upstream.Server
		for _, m := range ms {
			out = append(out, upstream.Server{Host: "127.0.0.1", Port: m.Port})
		}
		return out
	}
	reg := prometheus.NewRegistry()
	logs := &rigLog{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	opts := route.Options{
		Pools: []route.PoolOptions{
			{Name: "main", Replicas: 2, Cluster: upstream.Options{Servers: servers(mcs[:2]), PipelineConns: pipelineConns, Timeout: replTimeout}},
			{Name: "hedged", Prefixes: []string{"h/"}, Replicas: 2, Read: route.ReadHedged,
				Cluster: upstream.Options{Servers: servers(mcs[2:]), PipelineConns: pipelineConns, Timeout: replTimeout}},
		},
		// Every read of the hedged pool may hedge: its reads of a paused
		// first replica are the hedge's, the default pool's fall back
		// after the timeout.
		HedgeMinDelay: 5 * time.Millisecond, HedgeMaxDelay: 5 * time.Millisecond, HedgeMaxPercent: 100,
	}
	for _, m := range mod {
		m(&opts)
	}
	r, err := route.New(opts, log, reg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	g := &bigRig{t: t, mcs: mcs, reg: reg, budget: budget.New(64 << 20)}
	g.h = NewHandler(r, log, reg, Options{MaxValueBytes: rigChunk, BigValueMaxBytes: 1 << 20, BigValueGrace: replGrace, Budget: g.budget, AccessLog: true, RequestTimeout: replRequestTimeout})
	ctx, stop := context.WithCancel(context.Background())
	ran := make(chan error)
	go func() { ran <- g.h.Run(ctx) }()
	t.Cleanup(func() { stop(); <-ran })
	srv := httptest.NewServer(g.h)
	t.Cleanup(srv.Close)
	g.url, g.client = srv.URL, srv.Client()
	rr := &replRig{bigRig: g, router: r, opts: opts, byAddr: map[string]*memcachedtest.Server{}, log: logs}
	for _, m := range mcs {
		rr.byAddr[m.Addr] = m
	}
	return rr
}

// rigLog is the gateway's log in a rig, kept whole. It is safe for
// concurrent use.
type rigLog struct {
	mu  sync.Mutex // guards buf
	buf bytes.Buffer
}

func (l *rigLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// mark is where the log is now, for since.
func (l *rigLog) mark() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Len()
}

// since is what was logged after mark.
func (l *rigLog) since(mark int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(l.buf.Bytes()[mark:])
}

// forTest is the rig for t, a test run beside others on it.
func (g *replRig) forTest(t *testing.T) *replRig {
	b := *g.bigRig
	b.t = t
	r := *g
	r.bigRig = &b
	return &r
}

// explain makes t, a case run on the rig, the rig's test, and has it say,
// if it fails, what the gateway logged while it ran (with the lines of
// cases run beside it) and what key's replicas counted: which of them
// timed out, was written, deleted or ejected, as memcached and the
// gateway saw it.
func (g *replRig) explain(t *testing.T, key string) {
	g.t = t
	mark := g.log.mark()
	first, second := g.replicas(key)
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, r := range []struct {
			name string
			m    *memcachedtest.Server
		}{{"first", first}, {"second", second}} {
			st, err := memcachedtest.Stats(r.m.Addr)
			var counts []string
			for _, name := range []string{"curr_items", "cmd_get", "get_hits", "get_misses", "cmd_set", "cas_hits", "cas_badval", "cas_misses", "delete_hits", "delete_misses"} {
				counts = append(counts, name+"="+st[name])
			}
			t.Logf("%s replica %s (tag %s): %s %v", r.name, r.m.Addr, nodeTagOf(r.m.Addr), strings.Join(counts, " "), err)
			for _, n := range g.router.Nodes() {
				if n.Node == r.m.Addr {
					t.Logf("%s replica in the gateway: up %v since %s (%s), keys written elsewhere %d", r.name, n.Up, n.Since.Format(time.StampMilli), n.Reason, n.WrittenElsewhere)
				}
			}
		}
		t.Logf("the gateway's log while the case ran:\n%s", g.log.since(mark))
	})
}

// replPoolNames name the rig's pools, by the prefix of their keys, in
// the tests' names.
var replPoolNames = map[string]string{"": "default", "h/": "hedged"}

// replConns are the rig's connections the tests run over: mcpipe's
// pipelined ones and gomemcache's pool.
var replConns = []int{2, 0}

// replicas are key's first and second replica, in read order.
func (g *replRig) replicas(key string) (first, second *memcachedtest.Server) {
	g.t.Helper()
	nodes := g.router.Placement(key).ReplicaNodes
	if len(nodes) != 2 {
		g.t.Fatalf("%q has replicas %v, want 2", key, nodes)
	}
	return g.byAddr[nodes[0]], g.byAddr[nodes[1]]
}

// mcConn is one connection to memcached, for requests sent one after
// another.
type mcConn struct {
	t    *testing.T
	addr string
	c    net.Conn
	rd   *bufio.Reader
}

// dialMC connects to the memcached at addr; the caller closes it.
func dialMC(t *testing.T, addr string) *mcConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return &mcConn{t: t, addr: addr, c: c, rd: bufio.NewReader(c)}
}

// cmd sends req, which holds n requests, in one write and returns their
// answers' lines, each answer up to the line that ends it.
func (m *mcConn) cmd(req string, n int) []string {
	m.t.Helper()
	_ = m.c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(m.c, req); err != nil {
		m.t.Fatal(err)
	}
	var lines []string
	for n > 0 {
		line, err := m.rd.ReadString('\n')
		if err != nil {
			m.t.Fatalf("%s: %q: %v (read %q)", m.addr, req, err, lines)
		}
		line = strings.TrimRight(line, "\r\n")
		lines = append(lines, line)
		if head, ok := strings.CutPrefix(line, "VALUE "); ok {
			f := strings.Fields(head)
			size, _ := strconv.Atoi(f[2])
			b := make([]byte, size+2)
			if _, err := io.ReadFull(m.rd, b); err != nil {
				m.t.Fatal(err)
			}
			lines = append(lines, string(b[:size]))
			continue
		}
		n--
	}
	return lines
}

// mcCmd sends one request to memcached at addr, on a connection of its
// own, and returns its answer's lines, up to the line that ends it.
func mcCmd(t *testing.T, addr, req string) []string {
	t.Helper()
	m := dialMC(t, addr)
	defer m.c.Close()
	return m.cmd(req, 1)
}

// mcGets is key's value and CAS on the memcached at addr; ok false if it
// has none.
func mcGets(t *testing.T, addr, key string) (val string, cas uint64, ok bool) {
	t.Helper()
	lines := mcCmd(t, addr, "gets "+key+"\r\n")
	if len(lines) < 3 {
		return "", 0, false
	}
	f := strings.Fields(lines[0])
	cas, _ = strconv.ParseUint(f[4], 10, 64)
	return lines[1], cas, true
}

// bump sets a key of its own n times (n > 0) on m's memcached, the sets
// and a gets after them in one write, and returns the last CAS value
// that node gave out: its counter, which each set moves on by one.
func (m *mcConn) bump(n uint64) uint64 {
	m.t.Helper()
	const set = "set replcas-bump 0 0 1\r\nx\r\n"
	lines := m.cmd(strings.Repeat(set, int(n))+"gets replcas-bump\r\n", int(n)+1)
	for i, l := range lines[:n] {
		if l != "STORED" {
			m.t.Fatalf("%s: set %d of %d: %q", m.addr, i+1, n, l)
		}
	}
	f := strings.Fields(lines[n])
	if len(f) != 5 || f[0] != "VALUE" {
		m.t.Fatalf("%s: gets after %d sets: %q", m.addr, n, lines[n:])
	}
	cas, err := strconv.ParseUint(f[4], 10, 64)
	if err != nil {
		m.t.Fatalf("%s: gets after %d sets: %q: %v", m.addr, n, lines[n], err)
	}
	return cas
}

// mcCounter sets a key of its own on the memcached at addr and returns
// its CAS: the last CAS value that node gave out.
func mcCounter(t *testing.T, addr string) uint64 {
	t.Helper()
	m := dialMC(t, addr)
	defer m.c.Close()
	return m.bump(1)
}

// bumpTo writes the memcached at addr until the last CAS it gave out is
// cas: on one connection, each round as many sets as the counter is
// short, sent together (one round, unless another client wrote there
// meanwhile).
func bumpTo(t *testing.T, addr string, cas uint64) {
	t.Helper()
	m := dialMC(t, addr)
	defer m.c.Close()
	for c := m.bump(1); c != cas; c = m.bump(cas - c) {
		if c > cas {
			t.Fatalf("%s: counter at %d, past %d", addr, c, cas)
		}
	}
}

// readVia reads key through the gateway while its first replica is
// paused, so that its second answers (after the first times out, or as a
// hedge), and returns the CAS as the read gave it out: the ETag of a GET
// or HEAD, the cas of a multi-get.
func (g *replRig) readVia(key, how string) (cas, body string) {
	g.t.Helper()
	first, _ := g.replicas(key)
	first.Pause()
	defer first.Resume()
	switch how {
	case "GET", "HEAD":
		a := g.do(how, "/"+key, nil)
		if a.status != 200 || a.hdr.Get("ETag") == "" {
			g.t.Fatalf("%s %s with its first replica paused = %d %q", how, key, a.status, a.body)
		}
		return a.hdr.Get("ETag"), string(a.body)
	}
	a := g.do("GET", "/?key="+key, nil)
	var res struct {
		Results []struct {
			Status int    `json:"status"`
			Value  string `json:"value"`
			CAS    string `json:"cas"`
		} `json:"results"`
	}
	if err := json.Unmarshal(a.body, &res); err != nil || len(res.Results) != 1 || res.Results[0].Status != 200 {
		g.t.Fatalf("multi-get %s with its first replica paused = %d %s (%v)", key, a.status, a.body, err)
	}
	return res.Results[0].CAS, res.Results[0].Value
}

// condWrite sends a conditional write of key naming cas (as readVia gave
// it) and returns its status.
func (g *replRig) condWrite(key, how, cas string, v []byte) int {
	g.t.Helper()
	etag := cas
	if !strings.HasPrefix(etag, `"`) {
		etag = `"` + etag + `"`
	}
	switch how {
	case "PUT":
		return g.put("/"+key, v, "If-Match", etag).status
	case "DELETE":
		return g.do("DELETE", "/"+key, nil, "If-Match", etag).status
	}
	o := map[string]any{"op": "cas", "key": key, "cas": cas, "value": string(v)}
	if how == "batch delete" {
		o = map[string]any{"op": "delete", "key": key, "cas": cas}
	}
	body, _ := json.Marshal(map[string]any{"ops": []any{o}})
	a := g.do("POST", "/", bytes.NewReader(body))
	var res struct {
		Results []struct {
			Status int `json:"status"`
		} `json:"results"`
	}
	if err := json.Unmarshal(a.body, &res); err != nil || len(res.Results) != 1 {
		g.t.Fatalf("batch %s = %d %s (%v)", body, a.status, a.body, err)
	}
	return res.Results[0].Status
}

// casWrites are the ways a CAS read goes back in: how it is read, and the
// conditional write that names it. A value in chunks has two: each chunk
// of a default pool's GET waits out the paused first replica's timeout.
var casWrites = []struct {
	name       string
	read, cond string
	size       int
}{
	{name: "GET then PUT", read: "GET", cond: "PUT", size: 10},
	{name: "HEAD then DELETE", read: "HEAD", cond: "DELETE", size: 10},
	{name: "multi-get then batch cas", read: "multi", cond: "batch cas", size: 10},
	{name: "GET then batch delete", read: "GET", cond: "batch delete", size: 10},
	{name: "chunked GET then DELETE", read: "GET", cond: "DELETE", size: 2 * rigChunk},
	{name: "chunked HEAD then PUT", read: "HEAD", cond: "PUT", size: 2 * rigChunk},
}

// TestReplicaCASNamesANewerVersion: on a replicated pool (the default
// pool, read first, and a named pool that hedges) whose replicas' CAS
// counters differ, a CAS read from the second replica (the first paused)
// is the very CAS the first replica gives a later write of the key. A
// conditional write with it must not act on that version, which its
// client never read: 412, and the newer value stays on both replicas.
func TestReplicaCASNamesANewerVersion(t *testing.T) {
	for _, conns := range replConns {
		// Each kind of connection on a rig of its own, beside the other:
		// the reads from the second replica mostly wait out replTimeout.
		t.Run("conns="+strconv.Itoa(conns), func(t *testing.T) {
			t.Parallel()
			rig := newReplRig(t, conns)
			for _, pool := range []string{"", "h/"} {
				// Each pool beside the other: their nodes are apart, and
				// the default pool's reads wait out replTimeout, the
				// hedged pool's but its multi-get's do not.
				t.Run(replPoolNames[pool], func(t *testing.T) {
					t.Parallel()
					g := rig.forTest(t)
					for _, tt := range casWrites {
						t.Run(tt.name, func(t *testing.T) {
							key := pool + "newer-" + strings.ReplaceAll(tt.name, " ", "-") + "-" + strconv.Itoa(conns)
							g.explain(t, key)
							first, second := g.replicas(key)
							// The second replica's count runs well ahead of the
							// first's: writes that reached only it.
							bumpTo(t, second.Addr, mcCounter(t, first.Addr)+50)
							before := mcCounter(t, first.Addr)
							g.mustPut("/"+key, value(tt.size, "v1"))
							_, casV1, _ := mcGets(t, first.Addr, key)
							perWrite := casV1 - before // CAS values a PUT of this size takes on a node
							got, _ := g.readVia(key, tt.read)
							c, err := strconv.ParseUint(strings.Trim(strings.SplitN(got, "@", 2)[0], `"`), 10, 64)
							if err != nil {
								t.Fatalf("CAS %q read: %v", got, err)
							}
							// Another client's write of v2 is given, on the first
							// replica, the CAS the read gave out.
							bumpTo(t, first.Addr, c-perWrite)
							v2 := value(tt.size, "v2")
							g.mustPut("/"+key, v2)
							if _, now, _ := mcGets(t, first.Addr, key); now != c {
								t.Fatalf("scenario: v2 has CAS %d on the first replica, want %d (the CAS read from the second)", now, c)
							}
							if st := g.condWrite(key, tt.cond, got, value(tt.size, "v3")); st != 412 {
								t.Errorf("%s naming %s (read from the second replica) = %d, want 412: it acted on v2, which the client never read", tt.cond, got, st)
							}
							if a := g.do("GET", "/"+key, nil); a.status != 200 || !bytes.Equal(a.body, v2) {
								t.Errorf("GET after = %d, %d bytes, want v2", a.status, len(a.body))
							}
							if tt.size <= rigChunk {
								for _, m := range []*memcachedtest.Server{first, second} {
									if v, _, ok := mcGets(t, m.Addr, key); !ok || v != string(v2) {
										t.Errorf("%s holds %q (%v), want v2", m.Addr, v, ok)
									}
								}
							}
						})
					}
				})
			}
		})
	}
}

// TestReplicaCASFromTheSecond: a CAS read from the second replica (the
// first paused, then back) makes a conditional write that succeeds, and
// every replica gets its value (or loses the item).
func TestReplicaCASFromTheSecond(t *testing.T) {
	for _, conns := range replConns {
		// Each kind of connection on a rig of its own, beside the other:
		// the reads from the second replica mostly wait out replTimeout.
		t.Run("conns="+strconv.Itoa(conns), func(t *testing.T) {
			t.Parallel()
			rig := newReplRig(t, conns)
			for _, pool := range []string{"", "h/"} {
				// Each pool beside the other: their nodes are apart, and
				// the default pool's reads wait out replTimeout, the
				// hedged pool's but its multi-get's do not.
				t.Run(replPoolNames[pool], func(t *testing.T) {
					t.Parallel()
					g := rig.forTest(t)
					for _, tt := range casWrites {
						t.Run(tt.name, func(t *testing.T) {
							key := pool + "second-" + strings.ReplaceAll(tt.name, " ", "-") + "-" + strconv.Itoa(conns)
							g.explain(t, key)
							first, second := g.replicas(key)
							// The replicas' counters differ: a CAS checked on the
							// wrong one fails.
							bumpTo(t, second.Addr, mcCounter(t, first.Addr)+50)
							g.mustPut("/"+key, value(tt.size, "v1"))
							got, body := g.readVia(key, tt.read)
							if tt.read != "HEAD" && body != string(value(tt.size, "v1")) {
								t.Fatalf("read %q, want v1", body)
							}
							v3 := value(tt.size, "v3")
							want, deleted := 201, strings.Contains(tt.cond, "DELETE") || strings.Contains(tt.cond, "delete")
							if deleted {
								want = 204
							}
							if st := g.condWrite(key, tt.cond, got, v3); st != want {
								t.Fatalf("%s naming %s (read from the second replica) = %d, want %d", tt.cond, got, st, want)
							}
							a := g.do("GET", "/"+key, nil)
							switch {
							case deleted && a.status != 404:
								t.Errorf("GET after = %d, want 404", a.status)
							case !deleted && (a.status != 200 || !bytes.Equal(a.body, v3)):
								t.Errorf("GET after = %d, %d bytes, want v3", a.status, len(a.body))
							}
							if tt.size > rigChunk {
								return
							}
							for _, m := range []*memcachedtest.Server{first, second} {
								v, _, ok := mcGets(t, m.Addr, key)
								switch {
								case deleted && ok:
									t.Errorf("%s still holds %q", m.Addr, v)
								case !deleted && v != string(v3):
									t.Errorf("%s holds %q (%v), want v3", m.Addr, v, ok)
								}
							}
						})
					}
				})
			}
		})
	}
}

// TestReplicaCASForms: the ETag and cas forms of replicated and one-copy
// pools. A replicated pool's ETag names the replica that gave its CAS out
// ("<cas>@<8 hex digits>"); a read's If-None-Match and If-Range compare
// it whole; a plain "<cas>" names no replica there and fails a condition
// (412, nothing written), as one naming a replica fails on a pool of one
// copy, whose ETags stay "<cas>".
func TestReplicaCASForms(t *testing.T) {
	// Each read's ETag is compared with the one before, so every read
	// is answered by the replica that answered the first: the hedged
	// pool hedges only after a timeout's wait. A hedge that came first
	// names the other replica (a 200 to If-Range or If-None-Match, by
	// design): at 5 ms, under load, If-Range answered 200.
	g := newReplRig(t, 2, func(o *route.Options) { o.HedgeMinDelay, o.HedgeMaxDelay = replTimeout, replTimeout })
	g.explain(t, "forms")
	for _, pool := range []string{"", "h/"} {
		key := pool + "forms"
		g.mustPut("/"+key, []byte("v1"))
		a := g.do("GET", "/"+key, nil)
		etag := a.hdr.Get("ETag")
		if !replicaETag.MatchString(etag) {
			t.Fatalf("GET %s: ETag %q, want \"<cas>@<8 hex digits>\"", key, etag)
		}
		if h := g.do("HEAD", "/"+key, nil); h.hdr.Get("ETag") != etag {
			t.Errorf("HEAD %s: ETag %q, GET's %q", key, h.hdr.Get("ETag"), etag)
		}
		if a := g.do("GET", "/"+key, nil, "If-None-Match", etag); a.status != 304 {
			t.Errorf("GET %s, If-None-Match its ETag = %d, want 304", key, a.status)
		}
		plain, _, _ := strings.Cut(etag, "@")
		plain += `"`
		if a := g.do("GET", "/"+key, nil, "If-None-Match", plain); a.status != 200 {
			t.Errorf("GET %s, If-None-Match %s = %d, want 200", key, plain, a.status)
		}
		if a := g.do("GET", "/"+key, nil, "Range", "bytes=1-", "If-Range", etag); a.status != 206 {
			t.Errorf("GET %s, If-Range its ETag = %d, want 206", key, a.status)
		}
		if a := g.do("GET", "/"+key, nil, "Range", "bytes=1-", "If-Range", plain); a.status != 200 {
			t.Errorf("GET %s, If-Range %s = %d, want 200", key, plain, a.status)
		}
		for _, cond := range []string{"PUT", "DELETE", "batch cas", "batch delete"} {
			if st := g.condWrite(key, cond, plain, []byte("v2")); st != 412 {
				t.Errorf("%s %s naming %s (no replica) = %d, want 412", cond, key, plain, st)
			}
		}
		if a := g.do("GET", "/"+key, nil); string(a.body) != "v1" {
			t.Errorf("GET %s after = %d %q, want v1", key, a.status, a.body)
		}
		m := g.do("GET", "/?key="+key, nil)
		if !strings.Contains(string(m.body), `"cas":"`+strings.Trim(etag, `"`)+`"`) {
			t.Errorf("multi-get %s = %s, want the cas %s", key, m.body, strings.Trim(etag, `"`))
		}
		if st := g.condWrite(key, "PUT", etag, []byte("v2")); st != 201 {
			t.Errorf("PUT %s, If-Match %s = %d, want 201", key, etag, st)
		}
	}

	one := newBigRig(t, nil)
	one.mustPut("/k", []byte("v1"))
	etag := one.do("GET", "/k", nil).hdr.Get("ETag")
	if !oneCopyETag.MatchString(etag) {
		t.Fatalf("one copy: ETag %q, want \"<cas>\"", etag)
	}
	named := strings.TrimSuffix(etag, `"`) + `@0a1b2c3d"`
	for _, tt := range []struct{ method, hdr string }{{"PUT", named}, {"DELETE", named}} {
		if a := one.do(tt.method, "/k", strings.NewReader("v2"), "If-Match", tt.hdr); a.status != 412 {
			t.Errorf("one copy: %s If-Match %s = %d %q, want 412", tt.method, tt.hdr, a.status, a.body)
		}
	}
	if a := one.do("GET", "/k", nil); string(a.body) != "v1" {
		t.Errorf("one copy: GET after = %d %q, want v1", a.status, a.body)
	}
}

var (
	replicaETag = regexp.MustCompile(`^"[0-9]+@[0-9a-f]{8}"$`)
	oneCopyETag = regexp.MustCompile(`^"[0-9]+"$`)
)

// TestReplicaCASNodeGone: a CAS value read from a replica that a reload
// took out of the pool names no replica of the key: its conditional write
// answers 412 and writes nothing, though the item is unchanged.
func TestReplicaCASNodeGone(t *testing.T) {
	g := newReplRig(t, 2)
	key := "gone"
	first, second := g.replicas(key)
	bumpTo(t, second.Addr, mcCounter(t, first.Addr)+50)
	g.mustPut("/"+key, []byte("v1"))
	etag, _ := g.readVia(key, "GET")
	c, _ := strconv.ParseUint(strings.Trim(strings.SplitN(etag, "@", 2)[0], `"`), 10, 64)
	// The second replica leaves the pool, a new node comes in its place.
	fresh := memcachedtest.Start(t)
	g.byAddr[fresh.Addr] = fresh
	opts := g.opts
	opts.Pools = slices.Clone(opts.Pools)
	var servers []upstream.Server
	for _, s := range opts.Pools[0].Cluster.Servers {
		if net.JoinHostPort(s.Host, strconv.Itoa(s.Port)) != second.Addr {
			servers = append(servers, s)
		}
	}
	opts.Pools[0].Cluster.Servers = append(servers, upstream.Server{Host: "127.0.0.1", Port: fresh.Port})
	if _, err := g.router.Reconfigure(t.Context(), opts); err != nil {
		t.Fatal(err)
	}
	// Both replicas hold v1 again, the first under the very CAS read
	// from the node gone.
	now, _ := g.replicas(key)
	bumpTo(t, now.Addr, c-1)
	g.mustPut("/"+key, []byte("v1"))
	if _, got, _ := mcGets(t, now.Addr, key); got != c {
		t.Fatalf("scenario: v1 has CAS %d on the first replica, want %d", got, c)
	}
	for _, cond := range []string{"PUT", "DELETE", "batch cas", "batch delete"} {
		if st := g.condWrite(key, cond, etag, []byte("v2")); st != 412 {
			t.Errorf("%s naming %s, read from %s, gone = %d, want 412", cond, etag, second.Addr, st)
		}
	}
	// The 412 says why: not a change of the item, which a read would
	// show, but a replica that is no longer one.
	if a := g.put("/"+key, []byte("v2"), "If-Match", etag); a.status != 412 || !strings.Contains(string(a.body), "names a node that does not hold the key") {
		t.Errorf("PUT naming %s, gone = %d %q, want a 412 that says the node does not hold the key", etag, a.status, a.body)
	}
	if a := g.do("GET", "/"+key, nil); string(a.body) != "v1" {
		t.Errorf("GET after = %d %q, want v1", a.status, a.body)
	}
}

// TestETagForms: the CAS forms a client sends back, as If-Match and as a
// batch's cas: each read as the value and node it names, or refused with
// 400 saying why; nothing but the CAS's digits reaches memcached's line.
func TestETagForms(t *testing.T) {
	const tag = "0a1b2c3d"
	tests := []struct {
		in   string
		cas  uint64
		node uint32
		why  string // in the 400's message; "" if accepted
	}{
		{in: "12", cas: 12},
		{in: "0001", cas: 1},
		{in: "18446744073709551615", cas: 1<<64 - 1},
		{in: "12@" + tag, cas: 12, node: 0x0a1b2c3d},
		{in: "12@ffffffff", cas: 12, node: 0xffffffff},
		{in: "12@00000001", cas: 12, node: 1},
		{in: "18446744073709551616", why: "is not"},
		{in: "18446744073709551616@" + tag, why: "not a decimal number"},
		{in: "@" + tag, why: "not a decimal number"},
		{in: "12@", why: "8 lowercase hex digits"},
		{in: "12@0A1B2C3D", why: "8 lowercase hex digits"},
		{in: "12@0a1b2c3", why: "8 lowercase hex digits"},
		{in: "12@0a1b2c3d0", why: "8 lowercase hex digits"},
		{in: "12@0a1b2c3d@0a1b2c3d", why: "8 lowercase hex digits"},
		{in: "12@+a1b2c3d", why: "8 lowercase hex digits"},
		{in: "12@ 0a1b2c3", why: "8 lowercase hex digits"},
		{in: "12@00000000", why: "no node is named 00000000"},
		{in: "12 @" + tag, why: "not a decimal number"},
		{in: "+12@" + tag, why: "not a decimal number"},
		{in: "12\r\nflush_all@" + tag, why: "not a decimal number"},
	}
	for _, tt := range tests {
		var it op.Item
		err := parseETag(`"`+tt.in+`"`, &it)
		var bit op.Item
		raw, _ := json.Marshal(tt.in)
		berr := parseCAS(raw, &bit)
		switch {
		case tt.why == "" && (err != nil || berr != nil):
			t.Errorf("%q: %v, batch %v; want CAS %d node %#x", tt.in, err, berr, tt.cas, tt.node)
		case tt.why == "":
			if it.CAS != tt.cas || it.CASNode != tt.node || bit.CAS != tt.cas || bit.CASNode != tt.node {
				t.Errorf("%q: CAS %d node %#x, batch %d %#x; want %d %#x", tt.in, it.CAS, it.CASNode, bit.CAS, bit.CASNode, tt.cas, tt.node)
			}
			line := string(op.EncodeHead(nil, &op.Op{Verb: op.DeleteCAS, Item: it}, "k"))
			if want := "md k C" + strconv.FormatUint(tt.cas, 10) + "\r\n"; line != want {
				t.Errorf("%q: sent %q, want %q", tt.in, line, want)
			}
		case err == nil || berr == nil:
			t.Errorf("%q: accepted (%v, batch %v), want 400 saying %q", tt.in, err, berr, tt.why)
		default:
			_, msg, _ := errorStatus(err)
			_, bmsg, _ := errorStatus(berr)
			if st, _, _ := errorStatus(err); st != 400 || !strings.Contains(msg, tt.why) || !strings.Contains(bmsg, tt.why) {
				t.Errorf("%q: %d %q, batch %q; want 400 saying %q", tt.in, st, msg, bmsg, tt.why)
			}
		}
	}
	// What a read gives out reads back as what it names.
	for _, node := range []uint32{0, 1, 0x0a1b2c3d, 0xffffffff} {
		for _, cas := range []uint64{1, 12345, 1<<64 - 1} {
			var it op.Item
			if err := parseETag(formatETag(cas, node), &it); err != nil || it.CAS != cas || it.CASNode != node {
				t.Errorf("%s: CAS %d node %#x (%v), want %d %#x", formatETag(cas, node), it.CAS, it.CASNode, err, cas, node)
			}
		}
	}
	if got := formatETag(12345, 0); got != `"12345"` {
		t.Errorf("one copy's ETag %s, want \"12345\"", got)
	}
}

// TestWarmHitETag: a value a warm-up pool answers, in front of a cold pool
// of one copy, carries an ETag naming the warm node ("<cas>@<node>"),
// whose conditional writes answer 412 in the cold pool, saying the ETag
// names no replica; a read from the cold pool itself answers "<cas>".
func TestWarmHitETag(t *testing.T) {
	cold, warm := memcachedtest.Start(t), memcachedtest.Start(t)
	one := func(m *memcachedtest.Server) upstream.Options {
		return upstream.Options{Servers: []upstream.Server{{Host: "127.0.0.1", Port: m.Port}}, PipelineConns: 2, Timeout: replTimeout}
	}
	reg := prometheus.NewRegistry()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	r, err := route.New(route.Options{Pools: []route.PoolOptions{
		{Name: "main", Warm: "old", Cluster: one(cold)},
		{Name: "old", Cluster: one(warm)},
	}, WarmDefaultTTL: time.Minute}, log, reg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	g := &bigRig{t: t, reg: reg, budget: budget.New(64 << 20)}
	g.h = NewHandler(r, log, reg, Options{MaxValueBytes: rigChunk, BigValueMaxBytes: 1 << 20, BigValueGrace: rigGrace, Budget: g.budget})
	srv := httptest.NewServer(g.h)
	t.Cleanup(srv.Close)
	g.url, g.client = srv.URL, srv.Client()
	for range 20 { // the warm node's count runs ahead of the cold one's
		mcCounter(t, warm.Addr)
	}
	if l := mcCmd(t, warm.Addr, "set w 0 0 2\r\nv1\r\n"); l[0] != "STORED" {
		t.Fatalf("set on the warm node: %q", l)
	}
	var warmTag string
	for _, method := range []string{"HEAD", "GET"} { // a HEAD copies nothing into the cold pool, a GET does
		a := g.do(method, "/w", nil)
		etag := a.hdr.Get("ETag")
		if a.status != 200 || !replicaETag.MatchString(etag) || warmTag != "" && etag != warmTag {
			t.Fatalf("%s of a warm hit = %d, ETag %q, want \"<cas>@<8 hex digits>\" (HEAD's %q)", method, a.status, etag, warmTag)
		}
		warmTag = etag
	}
	waitFor(t, "the GET's copy into the cold pool", func() bool {
		_, _, ok := mcGets(t, cold.Addr, "w")
		return ok
	})
	if p := g.put("/w", []byte("v2"), "If-Match", warmTag); p.status != 412 || !strings.Contains(string(p.body), "names a node that does not hold the key") {
		t.Errorf("PUT If-Match %s (a warm hit's) = %d %q, want a 412 saying the node does not hold the key", warmTag, p.status, p.body)
	}
	// The GET copied the value into the cold pool: read from there, its
	// ETag is the cold node's own, and a cas with it stores.
	var etag string
	if a := g.do("GET", "/w", nil); !oneCopyETag.MatchString(a.hdr.Get("ETag")) {
		t.Fatalf("GET of a cold hit: ETag %q, want \"<cas>\"", a.hdr.Get("ETag"))
	} else {
		etag = a.hdr.Get("ETag")
	}
	if p := g.put("/w", []byte("v3"), "If-Match", etag); p.status != 201 {
		t.Errorf("PUT If-Match %s (a cold hit's) = %d %q, want 201", etag, p.status, p.body)
	}
}
