package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/memcgate/memcgate/gateway/budget"
	"github.com/memcgate/memcgate/gateway/chunk"
	"github.com/memcgate/memcgate/gateway/h1"
	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/test/slowreader"
	"github.com/memcgate/memcgate/upstream"
	"github.com/memcgate/memcgate/upstream/op"
)

// rigChunk is the chunk size of bigRig's values: small, so that values of
// a few kilobytes take several chunks.
const rigChunk = 1000

// rigGrace is bigRig's BigValueGrace: retired chunks expire within it.
const rigGrace = 3 * time.Second

// bigRig is a handler that stores large values in chunks, over three real
// memcached nodes, served by net/http (and by h1 too: serveH1).
type bigRig struct {
	t       *testing.T
	mcs     []*memcachedtest.Server
	cluster *upstream.Cluster
	h       *Handler
	reg     *prometheus.Registry
	budget  *budget.Budget
	url     string
	client  *http.Client
}

func newBigRig(t *testing.T, mod func(*Options, *upstream.Cluster)) *bigRig {
	t.Helper()
	return newBigRigArgs(t, nil, mod)
}

// newBigRigArgs is newBigRig with memcached started with args (for
// example "-m", "256" for a test that stores more than its default
// 64 MB).
func newBigRigArgs(t *testing.T, args []string, mod func(*Options, *upstream.Cluster)) *bigRig {
	t.Helper()
	return newBigRigPool(t, 2, args, mod)
}

// newBigRigPool is newBigRigArgs with pipelineConns pipelined
// connections per node (0: gomemcache's pool).
func newBigRigPool(t *testing.T, pipelineConns int, args []string, mod func(*Options, *upstream.Cluster)) *bigRig {
	t.Helper()
	return newBigRigUpstream(t, upstream.Options{PipelineConns: pipelineConns, Timeout: time.Second}, args, mod)
}

// newBigRigUpstream is newBigRigArgs with the cluster's options up (its
// Servers are the rig's).
func newBigRigUpstream(t *testing.T, up upstream.Options, args []string, mod func(*Options, *upstream.Cluster)) *bigRig {
	t.Helper()
	mcs := memcachedtest.StartN(t, 3, args...)
	for _, m := range mcs {
		up.Servers = append(up.Servers, upstream.Server{Host: "127.0.0.1", Port: m.Port})
	}
	reg := prometheus.NewRegistry()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	c, err := upstream.New(up, log, reg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	g := &bigRig{t: t, mcs: mcs, cluster: c, reg: reg, budget: budget.New(64 << 20)}
	opts := Options{MaxValueBytes: rigChunk, BigValueMaxBytes: 1 << 20, BigValueGrace: rigGrace, Budget: g.budget}
	if mod != nil {
		mod(&opts, c)
	}
	g.h = NewHandler(c, log, reg, opts)
	ctx, stop := context.WithCancel(context.Background())
	ran := make(chan error)
	go func() { ran <- g.h.Run(ctx) }() // asynchronous writes
	t.Cleanup(func() { stop(); <-ran })
	srv := httptest.NewServer(g.h)
	t.Cleanup(srv.Close)
	g.url, g.client = srv.URL, srv.Client()
	return g
}

// answer is a response read whole, or as far as it came (err).
type answer struct {
	status int
	hdr    http.Header
	body   []byte
	err    error // reading the body
}

// do sends a request; a body of type io.Reader other than *bytes.Reader
// goes chunked (no Content-Length). hdr are name, value pairs.
func (g *bigRig) do(method, path string, body io.Reader, hdr ...string) answer {
	g.t.Helper()
	req, err := http.NewRequest(method, g.url+path, body)
	if err != nil {
		g.t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1]) // a name twice is two field lines
	}
	resp, err := g.client.Do(req)
	if err != nil {
		g.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, hdr: resp.Header, body: b, err: err}
}

func (g *bigRig) put(path string, v []byte, hdr ...string) answer {
	g.t.Helper()
	return g.do("PUT", path, bytes.NewReader(v), hdr...)
}

// mustPut stores v under path and fails the test unless it got 201.
func (g *bigRig) mustPut(path string, v []byte, hdr ...string) {
	g.t.Helper()
	if a := g.put(path, v, hdr...); a.status != http.StatusCreated {
		g.t.Fatalf("PUT %s (%d bytes) = %d %q, want 201", path, len(v), a.status, a.body)
	}
}

// item reads key's item as memcached holds it.
func (g *bigRig) item(key string) (op.Item, error) {
	res := g.cluster.Do(g.t.Context(), op.Op{Verb: op.Get, Item: op.Item{Key: key}})
	return res.Item, res.Err
}

// index reads key's index.
func (g *bigRig) index(key string) chunk.Index {
	g.t.Helper()
	it, err := g.item(key)
	if err != nil {
		g.t.Fatalf("get %q: %v", key, err)
	}
	x, ok, err := chunk.Parse(it)
	if !ok || err != nil {
		g.t.Fatalf("%q holds no index (flags %#x, %d bytes): %v", key, it.Flags, len(it.Value), err)
	}
	return x
}

// ttls asks every node for key with memcached's meta get: the remaining
// seconds (-1: never) of each node that has it.
func (g *bigRig) ttls(key string) map[string]int {
	g.t.Helper()
	out := map[string]int{}
	for _, m := range g.mcs {
		c, err := net.Dial("tcp", m.Addr)
		if err != nil {
			g.t.Fatal(err)
		}
		fmt.Fprintf(c, "mg %s t\r\n", key)
		line, err := bufio.NewReader(c).ReadString('\n')
		c.Close()
		if err != nil {
			g.t.Fatal(err)
		}
		if ttl, ok := strings.CutPrefix(strings.TrimSpace(line), "HD t"); ok {
			out[m.Addr], _ = strconv.Atoi(ttl)
		}
	}
	return out
}

// chunkTTLs is ttls of every chunk of x, key's value: each chunk's node
// and remaining seconds.
func (g *bigRig) chunkTTLs(key string, x chunk.Index) []map[string]int {
	var out []map[string]int
	for i := range x.Count() {
		out = append(out, g.ttls(chunk.Key(key, x.Version, i)))
	}
	return out
}

// counter is the value of a counter series of the rig's registry.
func (g *bigRig) counter(name, label, value string) float64 {
	g.t.Helper()
	mfs, err := g.reg.Gather()
	if err != nil {
		g.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if hasLabel(m, label, value) {
				return m.GetCounter().GetValue()
			}
		}
	}
	g.t.Fatalf("no series %s{%s=%q}", name, label, value)
	return 0
}

func hasLabel(m *dto.Metric, name, value string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == name && l.GetValue() == value {
			return true
		}
	}
	return false
}

func (g *bigRig) chunksRead() float64 { return g.counter("memcgate_chunks_total", "event", "read") }

// value is n bytes that say which value they belong to, all through:
// bytes of two values mixed match neither.
//
// The pieces are appended, not printed: fmt under the race detector took
// 100 ms per 250 kB value, and the package's tests make hundreds of them
// and some of 16 MiB.
func value(n int, tag string) []byte {
	b := make([]byte, 0, n+len(tag)+24)
	for i := 0; len(b) < n; i++ {
		b = append(b, tag...)
		b = append(b, '/')
		b = strconv.AppendInt(b, int64(i), 10)
		b = append(b, ';')
	}
	return b[:n]
}

// tagOf is the tag of a value made by value.
func tagOf(v []byte) string {
	tag, _, _ := strings.Cut(string(v[:min(len(v), 64)]), "/")
	return tag
}

// chunkedBody hides its length from the client, which then sends it
// chunked, without Content-Length.
type chunkedBody struct{ r io.Reader }

func (c chunkedBody) Read(p []byte) (int, error) { return c.r.Read(p) }

func TestBigValueRoundTrip(t *testing.T) {
	g := newBigRig(t, nil)
	tests := []struct {
		name    string
		size    int
		chunked bool // sent without Content-Length
		chunks  int  // 0: stored whole
	}{
		{name: "one byte over a chunk", size: rigChunk + 1, chunks: 2},
		{name: "three whole chunks", size: 3 * rigChunk, chunks: 3},
		{name: "three chunks and a bit", size: 3*rigChunk + 7, chunks: 4},
		{name: "a hundred chunks", size: 100*rigChunk + 3, chunks: 101},
		{name: "chunked transfer, large", size: 5*rigChunk + 1, chunked: true, chunks: 6},
		{name: "chunked transfer, exactly one item", size: rigChunk, chunked: true},
		{name: "chunked transfer, small", size: 10, chunked: true},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := "rt/" + strconv.Itoa(i)
			v := value(tt.size, key)
			var body io.Reader = bytes.NewReader(v)
			if tt.chunked {
				body = chunkedBody{bytes.NewReader(v)}
			}
			if a := g.do("PUT", "/"+key+"?flags=7&exptime=100", body); a.status != 201 {
				t.Fatalf("PUT = %d %q", a.status, a.body)
			}
			it, err := g.item(key)
			if err != nil {
				t.Fatal(err)
			}
			x, isIndex, err := chunk.Parse(it)
			if err != nil || isIndex != (tt.chunks > 0) || isIndex && x.Count() != tt.chunks {
				t.Fatalf("stored: index %v (%+v, %v), want %d chunks", isIndex, x, err, tt.chunks)
			}
			a := g.do("GET", "/"+key, nil)
			if a.status != 200 || a.err != nil || !bytes.Equal(a.body, v) {
				t.Fatalf("GET = %d, %d bytes (%v), want 200 and the %d bytes written", a.status, len(a.body), a.err, len(v))
			}
			want := map[string]string{"Content-Length": strconv.Itoa(tt.size), "X-Memcached-Flags": "7", "Etag": formatETag(it.CAS, it.CASNode), "Content-Type": "application/octet-stream"}
			if isIndex {
				want["Accept-Ranges"] = "bytes"
			}
			for k, w := range want {
				if got := a.hdr.Get(k); got != w {
					t.Errorf("GET %s: %q, want %q", k, got, w)
				}
			}
			if h := g.do("HEAD", "/"+key, nil); h.status != 200 || h.hdr.Get("Content-Length") != strconv.Itoa(tt.size) || len(h.body) != 0 {
				t.Errorf("HEAD = %d, Content-Length %q, %d body bytes", h.status, h.hdr.Get("Content-Length"), len(h.body))
			}
			if !isIndex {
				return
			}
			// Every chunk is on the index's node (docs/decisions/0009),
			// expiring the grace period after it.
			owner := g.ttls(key)
			if len(owner) != 1 {
				t.Fatalf("index on %d nodes", len(owner))
			}
			for i, on := range g.chunkTTLs(key, x) {
				for node, ttl := range on {
					if owner[node] == 0 || len(on) != 1 || ttl < 100 || ttl > 100+int(rigGrace/time.Second) {
						t.Errorf("chunk %d on %v, index on %v (want the index's node, TTL 100 to 103)", i, on, owner)
					}
				}
			}
		})
	}
}

// TestBigValueOverwrite: each write replaces the value whole, whatever
// the sizes; the chunks of a value replaced are retired (expire within
// the grace period); a small write over a large value stores it whole.
func TestBigValueOverwrite(t *testing.T) {
	g := newBigRig(t, nil)
	grace := int(rigGrace / time.Second)
	sizes := []int{5*rigChunk + 5, 2*rigChunk + 1, 9 * rigChunk, 50, 3*rigChunk + 99}
	var prev *chunk.Index
	for i, n := range sizes {
		small := n <= rigChunk
		v := value(n, "ow"+strconv.Itoa(i))
		g.mustPut("/ow", v)
		if a := g.do("GET", "/ow", nil); !bytes.Equal(a.body, v) || a.err != nil {
			t.Fatalf("write %d (%d bytes): GET = %d, %d bytes (%v)", i, n, a.status, len(a.body), a.err)
		}
		if prev != nil {
			// A small value retires them too: memcached's set says
			// nothing of what it replaced, so the gateway, which wrote
			// the index, reads it first.
			for c, on := range g.chunkTTLs("ow", *prev) {
				for _, ttl := range on {
					if retired := ttl >= 0 && ttl <= grace; !retired {
						t.Errorf("write %d (%d bytes): chunk %d of the value replaced has TTL %d, not retired", i, n, c, ttl)
					}
				}
			}
		}
		prev = nil
		if !small {
			x := g.index("ow")
			prev = &x
			for c, on := range g.chunkTTLs("ow", x) {
				for _, ttl := range on {
					if ttl != -1 {
						t.Errorf("write %d: chunk %d has TTL %d, want none (-1)", i, c, ttl)
					}
				}
			}
		} else if it, _ := g.item("ow"); chunk.IsIndex(it.Flags, it.Value) {
			t.Errorf("write %d of %d bytes left an index", i, n)
		}
	}
}

func TestBigValueDelete(t *testing.T) {
	g := newBigRig(t, nil)
	g.mustPut("/del", value(4*rigChunk, "del"))
	x := g.index("del")
	if a := g.do("DELETE", "/del", nil); a.status != 204 {
		t.Fatalf("DELETE = %d %q", a.status, a.body)
	}
	if a := g.do("GET", "/del", nil); a.status != 404 {
		t.Errorf("GET after DELETE = %d, want 404", a.status)
	}
	for c, on := range g.chunkTTLs("del", x) {
		for _, ttl := range on {
			if ttl < 0 || ttl > int(rigGrace/time.Second) {
				t.Errorf("chunk %d has TTL %d after DELETE, want 0 to %v", c, ttl, rigGrace)
			}
		}
	}
	if a := g.do("DELETE", "/del", nil); a.status != 404 {
		t.Errorf("second DELETE = %d, want 404", a.status)
	}
	// Asynchronously too.
	g.mustPut("/del", value(4*rigChunk, "del2"))
	x = g.index("del")
	if a := g.do("DELETE", "/del", nil, "Prefer", "respond-async"); a.status != 202 {
		t.Fatalf("DELETE, respond-async = %d %q", a.status, a.body)
	}
	waitFor(t, "the async DELETE", func() bool { _, err := g.item("del"); return errors.Is(err, upstream.ErrNotFound) })
	waitFor(t, "the chunks retired", func() bool {
		for _, on := range g.chunkTTLs("del", x) {
			for _, ttl := range on {
				if ttl < 0 {
					return false
				}
			}
		}
		return true
	})
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited 5s for %s", what)
		}
	}
}

// TestBigValueExpiry: the index expires with the value's exptime, and
// the value with it; the chunks live the grace period longer, then go.
func TestBigValueExpiry(t *testing.T) {
	g := newBigRig(t, nil)
	g.mustPut("/exp?exptime=1", value(3*rigChunk, "exp"))
	x := g.index("exp")
	// memcached counts whole seconds on a clock of its own: one of them
	// may pass between the PUT and the look.
	for node, ttl := range g.ttls("exp") {
		if ttl < 0 || ttl > 1 {
			t.Errorf("index on %s has TTL %d, want 1 (or 0)", node, ttl)
		}
	}
	want := 1 + int(rigGrace/time.Second)
	for c, on := range g.chunkTTLs("exp", x) {
		for _, ttl := range on {
			if ttl < want-1 || ttl > want {
				t.Errorf("chunk %d has TTL %d, want %d (or %d)", c, ttl, want, want-1)
			}
		}
	}
	start := time.Now()
	waitFor(t, "the value to expire", func() bool { return g.do("GET", "/exp", nil).status == 404 })
	t.Logf("expired after %v", time.Since(start).Round(10*time.Millisecond))
	waitFor(t, "its chunks to expire", func() bool {
		for _, on := range g.chunkTTLs("exp", x) {
			if len(on) > 0 {
				return false
			}
		}
		return true
	})
}

// slowBody yields a chunk's worth of bytes at a time, each after a pause:
// a client uploading a value slowly.
type slowBody struct {
	r     io.Reader
	pause time.Duration
}

func (s slowBody) Read(p []byte) (int, error) {
	time.Sleep(s.pause)
	return s.r.Read(p[:min(len(p), rigChunk)])
}

// TestBigValueSlowUpload: chunks written while the body was still
// arriving expire the grace period after the index, not the upload's
// time before that: otherwise a value whose body took longer than the
// grace period to come would lose its first chunks while its index still
// named them, a miss before its exptime.
func TestBigValueSlowUpload(t *testing.T) {
	g := newBigRig(t, nil)
	const chunks, pause = 5, 700 * time.Millisecond // the upload takes longer than rigGrace
	v := value(chunks*rigChunk, "slowup")
	if a := g.do("PUT", "/slowup?exptime=100", chunkedBody{slowBody{bytes.NewReader(v), pause}}); a.status != 201 {
		t.Fatalf("PUT = %d %q", a.status, a.body)
	}
	x := g.index("slowup")
	idx := -1
	for _, ttl := range g.ttls("slowup") {
		idx = ttl
	}
	want := idx + int(rigGrace/time.Second) - 1 // a second of memcached's clock may pass
	for c, on := range g.chunkTTLs("slowup", x) {
		for _, ttl := range on {
			if ttl < want {
				t.Errorf("chunk %d has TTL %d, the index %d: it would expire %ds before the index's grace period ends", c, ttl, idx, want+1-ttl)
			}
		}
	}
	if a := g.do("GET", "/slowup", nil); a.status != 200 || !bytes.Equal(a.body, v) || a.err != nil {
		t.Errorf("GET = %d, %d bytes (%v)", a.status, len(a.body), a.err)
	}
}

// TestBigValueSlowUploadAnswered: a PUT whose body takes longer to
// arrive than the server's write timeout, which runs from the request's
// head, is still answered once its value is stored: the client is told
// 201, not a connection closed without a word on a value that was stored.
func TestBigValueSlowUploadAnswered(t *testing.T) {
	const writeTimeout = 400 * time.Millisecond
	g := newBigRig(t, func(o *Options, _ *upstream.Cluster) { o.WriteTimeout = writeTimeout })
	std := httptest.NewUnstartedServer(g.h)
	std.Config.WriteTimeout = writeTimeout
	std.Start()
	t.Cleanup(std.Close)
	tests := []struct {
		name string
		addr string
	}{
		{name: "net/http", addr: strings.TrimPrefix(std.URL, "http://")},
		{name: "h1", addr: g.serveH1Write(writeTimeout)},
	}
	v := value(4*rigChunk, "answered")
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := "answered" + strconv.Itoa(i)
			c, err := net.Dial("tcp", tt.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			fmt.Fprintf(c, "PUT /%s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", key, len(v))
			for b := v; len(b) > 0; b = b[min(len(b), rigChunk):] { // 3 × the write timeout
				time.Sleep(3 * writeTimeout / 4)
				if _, err := c.Write(b[:min(len(b), rigChunk)]); err != nil {
					t.Fatal(err)
				}
			}
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil || resp.StatusCode != http.StatusCreated {
				t.Errorf("PUT answered %v (%v), want 201", resp, err)
			}
			if a := g.do("GET", "/"+key, nil); a.status != 200 || !bytes.Equal(a.body, v) {
				t.Errorf("GET = %d, %d bytes", a.status, len(a.body))
			}
		})
	}
}

// TestBigValueTouchPast: a touch with an expiration in the past expires
// a value in chunks as it expires a small one (204, then a miss), and
// retires its chunks, as DELETE does; a GET ?touch= in the past answers
// the value, then it is gone.
func TestBigValueTouchPast(t *testing.T) {
	g := newBigRig(t, nil)
	for _, exptime := range []string{"-1", "1000000000"} {
		v := value(4*rigChunk, "gat"+exptime)
		g.mustPut("/gatpast", v)
		if a := g.do("GET", "/gatpast?touch="+exptime, nil); a.status != 200 || !bytes.Equal(a.body, v) || a.err != nil {
			t.Errorf("GET ?touch=%s = %d, %d bytes (%v), want the value as for a small one", exptime, a.status, len(a.body), a.err)
		}
		if a := g.do("GET", "/gatpast", nil); a.status != 404 {
			t.Errorf("GET after GET ?touch=%s = %d, want 404", exptime, a.status)
		}
	}
	g.mustPut("/small", []byte("small"))
	if a := g.do("POST", "/small?op=touch&exptime=-1", nil); a.status != 204 {
		t.Fatalf("touch of a small value = %d %q, want 204", a.status, a.body)
	}
	for _, exptime := range []string{"-1", "1000000000"} { // at once; a Unix time past
		g.mustPut("/past", value(4*rigChunk, "past"))
		x := g.index("past")
		if a := g.do("POST", "/past?op=touch&exptime="+exptime, nil); a.status != 204 {
			t.Errorf("touch to %s = %d %q, want 204 as for a small value", exptime, a.status, a.body)
		}
		if a := g.do("GET", "/past", nil); a.status != 404 {
			t.Errorf("GET after the touch to %s = %d, want 404", exptime, a.status)
		}
		for c, on := range g.chunkTTLs("past", x) {
			for _, ttl := range on {
				if ttl < 0 || ttl > int(rigGrace/time.Second) {
					t.Errorf("chunk %d has TTL %d after the touch to %s, want 0 to %v", c, ttl, exptime, rigGrace)
				}
			}
		}
	}
}

// TestBigValueMissingChunk: a chunk evicted, expired or damaged loses the
// value: a miss if it is the first one a read needs, else the response
// is cut short; either way the index is dropped, so the next read is a
// miss at once, and no other bytes ever take the chunk's place.
func TestBigValueMissingChunk(t *testing.T) {
	g := newBigRig(t, nil)
	v := value(5*rigChunk, "miss")
	break1 := func(key string, i int, damage bool) {
		t.Helper()
		x := g.index(key)
		o := op.Op{Verb: op.Delete, Item: op.Item{Key: chunk.Key(key, x.Version, i)}, HashKey: key}
		if damage {
			o = op.Op{Verb: op.Set, Item: op.Item{Key: chunk.Key(key, x.Version, i), Value: bytes.Repeat([]byte("x"), x.ChunkLen(i))}, HashKey: key}
		}
		if res := g.cluster.Do(t.Context(), o); res.Err != nil {
			t.Fatal(res.Err)
		}
	}
	tests := []struct {
		name     string
		chunk    int
		damage   bool
		rng      string
		status   int
		short    bool // the body is cut short
		lost     bool // the value is gone after
		wantBody []byte
	}{
		{name: "first chunk gone", chunk: 0, status: 404, lost: true},
		{name: "middle chunk gone", chunk: 2, status: 200, short: true, lost: true},
		{name: "last chunk damaged", chunk: 4, damage: true, status: 200, short: true, lost: true},
		{name: "first chunk damaged", chunk: 0, damage: true, status: 404, lost: true},
		{name: "a range that does not need it", chunk: 4, rng: "bytes=0-1999", status: 206, wantBody: v[:2000]},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := "miss" + strconv.Itoa(i)
			g.mustPut("/"+key, v)
			break1(key, tt.chunk, tt.damage)
			missing := g.counter("memcgate_chunks_total", "event", "missing")
			var hdr []string
			if tt.rng != "" {
				hdr = []string{"Range", tt.rng}
			}
			a := g.do("GET", "/"+key, nil, hdr...)
			if a.status != tt.status || (a.err != nil) != tt.short {
				t.Fatalf("GET = %d, %d bytes, read error %v; want %d, cut short %v", a.status, len(a.body), a.err, tt.status, tt.short)
			}
			if tt.short && (len(a.body) >= len(v) || !bytes.Equal(a.body, v[:len(a.body)])) {
				t.Errorf("cut short after %d bytes, not a prefix of the value", len(a.body))
			}
			if tt.wantBody != nil && !bytes.Equal(a.body, tt.wantBody) {
				t.Errorf("body of %d bytes, want %d", len(a.body), len(tt.wantBody))
			}
			_, err := g.item(key)
			if lost := errors.Is(err, upstream.ErrNotFound); lost != tt.lost {
				t.Errorf("index gone: %v (%v), want %v", lost, err, tt.lost)
			}
			if got := g.counter("memcgate_chunks_total", "event", "missing") - missing; got != map[bool]float64{true: 1}[tt.lost] {
				t.Errorf("memcgate_chunks_total{event=missing} grew by %v", got)
			}
			if tt.lost {
				if a := g.do("GET", "/"+key, nil); a.status != 404 {
					t.Errorf("GET again = %d, want 404", a.status)
				}
			}
		})
	}
}

// TestBigValueConcurrentWriters: writers of values of different sizes
// to one key, and readers of it, all at once: every read that completes
// is one value written, byte for byte; none mixes two.
func TestBigValueConcurrentWriters(t *testing.T) {
	g := newBigRig(t, nil)
	const writers, writes, readers = 4, 8, 4
	var wg sync.WaitGroup
	var done atomic.Bool
	written := sync.Map{} // tag → size
	for w := range writers {
		wg.Go(func() {
			for s := range writes {
				tag := fmt.Sprintf("w%d-%d", w, s)
				n := rigChunk + 1 + (w*writes+s)*997%(12*rigChunk)
				written.Store(tag, n)
				if a := g.put("/race", value(n, tag)); a.status != 201 {
					t.Errorf("PUT %s = %d %q", tag, a.status, a.body)
				}
			}
		})
	}
	var reads, complete, cut atomic.Int64
	var rg sync.WaitGroup
	for range readers {
		rg.Go(func() {
			for !done.Load() {
				a := g.do("GET", "/race", nil)
				reads.Add(1)
				switch {
				case a.status == 404:
					continue
				case a.status != 200:
					t.Errorf("GET = %d %q", a.status, a.body)
					return
				case a.err != nil:
					cut.Add(1)
					continue
				}
				complete.Add(1)
				tag := tagOf(a.body)
				n, ok := written.Load(tag)
				if !ok || n.(int) != len(a.body) || !bytes.Equal(a.body, value(len(a.body), tag)) {
					t.Errorf("read %d bytes tagged %q: not a value written", len(a.body), tag)
					return
				}
			}
		})
	}
	wg.Wait()
	done.Store(true)
	rg.Wait()
	t.Logf("%d reads: %d complete, %d cut short", reads.Load(), complete.Load(), cut.Load())
	if cut.Load() > 0 {
		t.Errorf("%d reads cut short: chunks of a value replaced must outlive its readers", cut.Load())
	}
	a := g.do("GET", "/race", nil)
	if n, ok := written.Load(tagOf(a.body)); !ok || n.(int) != len(a.body) || !bytes.Equal(a.body, value(len(a.body), tagOf(a.body))) {
		t.Errorf("final value (%d bytes) is not one written", len(a.body))
	}
}

// TestBigValueRanges: one range is answered 206 from the chunks it
// covers and no others; a range past the end 416; what RFC 9110 lets a
// server ignore, 200 with the whole value.
func TestBigValueRanges(t *testing.T) {
	g := newBigRig(t, nil)
	const size = 5*rigChunk + 17
	v := value(size, "rng")
	g.mustPut("/rng", v)
	small := value(100, "small")
	g.mustPut("/small", small)
	etag := g.do("HEAD", "/rng", nil).hdr.Get("Etag")
	tests := []struct {
		name    string
		key     string
		method  string
		hdr     []string
		status  int
		from    int // the body is v[from:to]
		to      int
		crange  string
		fetched int // chunks read
	}{
		{name: "first byte", hdr: []string{"Range", "bytes=0-0"}, status: 206, to: 1, crange: "bytes 0-0/5017", fetched: 1},
		{name: "last byte", hdr: []string{"Range", "bytes=5016-5016"}, status: 206, from: 5016, to: size, crange: "bytes 5016-5016/5017", fetched: 1},
		{name: "last byte, open", hdr: []string{"Range", "bytes=5016-"}, status: 206, from: 5016, to: size, crange: "bytes 5016-5016/5017", fetched: 1},
		{name: "suffix of one", hdr: []string{"Range", "bytes=-1"}, status: 206, from: 5016, to: size, crange: "bytes 5016-5016/5017", fetched: 1},
		{name: "suffix over three chunks", hdr: []string{"Range", "bytes=-1500"}, status: 206, from: 3517, to: size, crange: "bytes 3517-5016/5017", fetched: 3},
		{name: "suffix longer than the value", hdr: []string{"Range", "bytes=-9999"}, status: 206, to: size, crange: "bytes 0-5016/5017", fetched: 6},
		{name: "across a chunk boundary", hdr: []string{"Range", "bytes=990-1010"}, status: 206, from: 990, to: 1011, crange: "bytes 990-1010/5017", fetched: 2},
		{name: "one whole chunk", hdr: []string{"Range", "bytes=2000-2999"}, status: 206, from: 2000, to: 3000, crange: "bytes 2000-2999/5017", fetched: 1},
		{name: "end past the end", hdr: []string{"Range", "bytes=5000-99999"}, status: 206, from: 5000, to: size, crange: "bytes 5000-5016/5017", fetched: 1},
		{name: "start at the end", hdr: []string{"Range", "bytes=5017-"}, status: 416, crange: "bytes */5017"},
		{name: "start past the end", hdr: []string{"Range", "bytes=9000-9001"}, status: 416, crange: "bytes */5017"},
		{name: "empty suffix", hdr: []string{"Range", "bytes=-0"}, status: 416, crange: "bytes */5017"},
		{name: "last before first: ignored", hdr: []string{"Range", "bytes=10-5"}, status: 200, to: size, fetched: 6},
		{name: "two ranges: ignored", hdr: []string{"Range", "bytes=0-1,3-4"}, status: 200, to: size, fetched: 6},
		{name: "other unit: ignored", hdr: []string{"Range", "items=0-1"}, status: 200, to: size, fetched: 6},
		{name: "first past int64", hdr: []string{"Range", "bytes=99999999999999999999-"}, status: 416, crange: "bytes */5017"},
		{name: "last past int64", hdr: []string{"Range", "bytes=5000-99999999999999999999"}, status: 206, from: 5000, to: size, crange: "bytes 5000-5016/5017", fetched: 1},
		{name: "suffix past int64", hdr: []string{"Range", "bytes=-99999999999999999999"}, status: 206, to: size, crange: "bytes 0-5016/5017", fetched: 6},
		{name: "negative first: ignored", hdr: []string{"Range", "bytes=-5-10"}, status: 200, to: size, fetched: 6},
		{name: "no spec: ignored", hdr: []string{"Range", "bytes="}, status: 200, to: size, fetched: 6},
		{name: "sign: ignored", hdr: []string{"Range", "bytes=+1-2"}, status: 200, to: size, fetched: 6},
		{name: "If-Range with the ETag", hdr: []string{"Range", "bytes=100-199", "If-Range", etag}, status: 206, from: 100, to: 200, crange: "bytes 100-199/5017", fetched: 1},
		{name: "If-Range with another ETag", hdr: []string{"Range", "bytes=100-199", "If-Range", `"1"`}, status: 200, to: size, fetched: 6},
		{name: "If-Range with a date", hdr: []string{"Range", "bytes=100-199", "If-Range", "Wed, 21 Oct 2015 07:28:00 GMT"}, status: 200, to: size, fetched: 6},
		{name: "HEAD ignores Range", method: "HEAD", hdr: []string{"Range", "bytes=0-0"}, status: 200},
		{name: "If-None-Match", hdr: []string{"Range", "bytes=0-0", "If-None-Match", etag}, status: 304},
		{name: "small value: range", key: "small", hdr: []string{"Range", "bytes=10-19"}, status: 206, from: 10, to: 20, crange: "bytes 10-19/100"},
		{name: "small value: suffix", key: "small", hdr: []string{"Range", "bytes=-5"}, status: 206, from: 95, to: 100, crange: "bytes 95-99/100"},
		{name: "small value: past the end", key: "small", hdr: []string{"Range", "bytes=100-"}, status: 416, crange: "bytes */100"},
		{name: "small value: last past int64", key: "small", hdr: []string{"Range", "bytes=90-99999999999999999999"}, status: 206, from: 90, to: 100, crange: "bytes 90-99/100"},
		{name: "small value: two ranges", key: "small", hdr: []string{"Range", "bytes=0-1,5-6"}, status: 200, to: 100},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key, want, method := "rng", v, "GET"
			if tt.key != "" {
				key, want = tt.key, small
			}
			if tt.method != "" {
				method = tt.method
			}
			before := g.chunksRead()
			a := g.do(method, "/"+key, nil, tt.hdr...)
			if a.status != tt.status || a.err != nil {
				t.Fatalf("%s = %d %q (%v), want %d", method, a.status, a.body, a.err, tt.status)
			}
			if got := a.hdr.Get("Content-Range"); got != tt.crange {
				t.Errorf("Content-Range %q, want %q", got, tt.crange)
			}
			if tt.status < 300 && method == "GET" && !bytes.Equal(a.body, want[tt.from:tt.to]) {
				t.Errorf("body of %d bytes, want bytes %d to %d", len(a.body), tt.from, tt.to)
			}
			if got := g.chunksRead() - before; int(got) != tt.fetched {
				t.Errorf("%v chunks fetched, want %d", got, tt.fetched)
			}
		})
	}
}

// TestBigValueOtherReaders: what cannot stream a value in chunks says so
// precisely, never serving the index as the value; what changes the
// item sees its chunks.
func TestBigValueOtherReaders(t *testing.T) {
	g := newBigRig(t, nil)
	g.mustPut("/big", value(3*rigChunk, "big"))
	g.mustPut("/small", []byte("hi"))
	grace := int(rigGrace / time.Second)

	type result struct {
		Key    string  `json:"key"`
		Status int     `json:"status"`
		Value  *string `json:"value"`
		Error  string  `json:"error"`
	}
	results := func(a answer) []result {
		t.Helper()
		var out struct{ Results []result }
		if err := json.Unmarshal(a.body, &out); err != nil {
			t.Fatalf("%d %q: %v", a.status, a.body, err)
		}
		return out.Results
	}
	// Multi-get: 507 for the chunked key, with what to do.
	mg := results(g.do("GET", "/?key=big&key=small", nil))
	if mg[0].Status != 507 || mg[0].Value != nil || !strings.Contains(mg[0].Error, "read it on its own with GET /{key}") || mg[1].Status != 200 {
		t.Errorf("multi-get = %+v", mg)
	}
	// Batch: get 507, append 409, touch and delete apply to the chunks.
	x := g.index("big")
	b := results(g.do("POST", "/", strings.NewReader(`{"ops":[{"op":"get","key":"big"},{"op":"append","key":"big","value":"x"},{"op":"touch","key":"big","exptime":500}]}`)))
	if b[0].Status != 507 || b[1].Status != 409 || b[2].Status != 204 {
		t.Errorf("batch = %+v", b)
	}
	for c, on := range g.chunkTTLs("big", x) {
		for _, ttl := range on {
			// memcached counts TTLs down by its clock's whole seconds:
			// one may tick between the touch and this read.
			if ttl < 500+grace-2 || ttl > 500+grace {
				t.Errorf("after touch 500: chunk %d TTL %d, want %d (less a tick or two)", c, ttl, 500+grace)
			}
		}
	}
	// The REST verbs that change a value in place.
	tests := []struct {
		method, target, body string
		status               int
		msg                  string
	}{
		{"POST", "/big?op=append", "x", 409, "append and prepend cannot change"},
		{"POST", "/big?op=prepend", "x", 409, "append and prepend cannot change"},
		{"POST", "/big?op=incr", "", 409, "not a decimal number"},
		{"POST", "/big?op=touch&exptime=600", "", 204, ""},
		{"GET", "/big?touch=700", "", 200, "big/0;"},
		{"GET", "/%25~abc", "", 400, "reserved for the chunks of large values"},
		{"PUT", "/%25~abc", "v", 400, "reserved for the chunks of large values"},
		{"GET", "/?key=%25~abc", "", 400, "reserved"},
	}
	for _, tt := range tests {
		var body io.Reader
		if tt.body != "" {
			body = strings.NewReader(tt.body)
		}
		a := g.do(tt.method, tt.target, body)
		if a.status != tt.status || !strings.Contains(string(a.body), tt.msg) {
			t.Errorf("%s %s = %d %.60q, want %d %q", tt.method, tt.target, a.status, a.body, tt.status, tt.msg)
		}
	}
	for c, on := range g.chunkTTLs("big", x) {
		for _, ttl := range on {
			if ttl < 700+grace-2 || ttl > 700+grace { // less a tick or two, as above
				t.Errorf("after GET ?touch=700: chunk %d TTL %d, want %d", c, ttl, 700+grace)
			}
		}
	}
	if a := g.do("GET", "/big", nil); a.status != 200 || !bytes.Equal(a.body, value(3*rigChunk, "big")) {
		t.Errorf("GET after the refused changes = %d, %d bytes", a.status, len(a.body))
	}
	// The batch delete retires the chunks.
	if b := results(g.do("POST", "/", strings.NewReader(`[{"op":"delete","key":"big"}]`))); b[0].Status != 204 {
		t.Errorf("batch delete = %+v", b)
	}
	for c, on := range g.chunkTTLs("big", x) {
		for _, ttl := range on {
			if ttl < 0 || ttl > grace {
				t.Errorf("after the batch delete: chunk %d TTL %d, want 0 to %d", c, ttl, grace)
			}
		}
	}
}

// TestBigValueLimits: the answer at each limit, and what is left behind.
func TestBigValueLimits(t *testing.T) {
	const max = 20 * rigChunk
	g := newBigRig(t, func(o *Options, _ *upstream.Cluster) { o.BigValueMaxBytes = max })
	written := func() float64 { return g.counter("memcgate_chunks_total", "event", "written") }
	t.Run("declared over the maximum", func(t *testing.T) {
		before := written()
		a := g.put("/lim", value(max+1, "x"))
		if a.status != 413 || string(a.body) != "request body is 20001 bytes; at most 20000 are accepted (MEMCGATE_BIG_VALUE_MAX_BYTES)\n" {
			t.Errorf("PUT = %d %q", a.status, a.body)
		}
		if written() != before {
			t.Errorf("chunks written for a body refused before it was read")
		}
	})
	t.Run("chunked over the maximum", func(t *testing.T) {
		before, cleaned := written(), g.counter("memcgate_chunks_total", "event", "cleaned")
		a := g.do("PUT", "/lim", chunkedBody{bytes.NewReader(value(max+1, "x"))})
		if a.status != 413 || !strings.HasPrefix(string(a.body), "request body is more than 20000 bytes") {
			t.Errorf("PUT = %d %q", a.status, a.body)
		}
		if w, c := written()-before, g.counter("memcgate_chunks_total", "event", "cleaned")-cleaned; w != c || w == 0 {
			t.Errorf("%v chunks written, %v cleaned up; want as many", w, c)
		}
		if _, err := g.item("lim"); !errors.Is(err, upstream.ErrNotFound) {
			t.Errorf("the key after a refused write: %v, want not found", err)
		}
	})
	t.Run("at the maximum", func(t *testing.T) {
		g.mustPut("/lim", value(max, "x"))
	})
	t.Run("chunked at the maximum", func(t *testing.T) {
		v := value(max, "y")
		if a := g.do("PUT", "/lim", chunkedBody{bytes.NewReader(v)}); a.status != 201 {
			t.Fatalf("PUT = %d %q, want 201", a.status, a.body)
		}
		if a := g.do("GET", "/lim", nil); !bytes.Equal(a.body, v) {
			t.Errorf("GET = %d, %d bytes, want the %d written", a.status, len(a.body), len(v))
		}
	})
	t.Run("conditions", func(t *testing.T) {
		v := value(3*rigChunk, "cond")
		before := written()
		steps := []struct {
			hdr    []string
			status int
		}{
			{[]string{"If-Match", "*"}, 412}, // replace, missing
			{[]string{"If-Match", `"12345"`}, 412},
			{[]string{"If-None-Match", "*"}, 201}, // add
			{[]string{"If-None-Match", "*"}, 412},
		}
		for _, s := range steps {
			if a := g.put("/cond", v, s.hdr...); a.status != s.status {
				t.Errorf("PUT %v = %d %q, want %d", s.hdr, a.status, a.body, s.status)
			}
		}
		if got := written() - before; got != 3 {
			t.Errorf("%v chunks written, want 3: a condition that fails writes none", got)
		}
		etag := g.do("HEAD", "/cond", nil).hdr.Get("Etag")
		if a := g.put("/cond", value(4*rigChunk, "cond2"), "If-Match", etag); a.status != 201 {
			t.Errorf("PUT If-Match current ETag = %d %q", a.status, a.body)
		}
		if a := g.put("/cond", v, "If-Match", etag); a.status != 412 {
			t.Errorf("PUT If-Match old ETag = %d %q", a.status, a.body)
		}
		if a := g.put("/cond", value(2*rigChunk, "cond3"), "If-Match", "*"); a.status != 201 {
			t.Errorf("PUT If-Match * = %d %q", a.status, a.body)
		}
	})
	t.Run("respond-async is not honoured", func(t *testing.T) {
		v := value(3*rigChunk, "async")
		if a := g.put("/async", v, "Prefer", "respond-async"); a.status != 201 {
			t.Errorf("PUT = %d %q, want 201", a.status, a.body)
		}
		if a := g.do("GET", "/async", nil); !bytes.Equal(a.body, v) {
			t.Errorf("GET = %d, %d bytes", a.status, len(a.body))
		}
	})
	t.Run("budget", func(t *testing.T) {
		// Chunks of 8 KiB: the budget counts holds from 4 KiB.
		const size = 8 << 10
		g := newBigRig(t, func(o *Options, _ *upstream.Cluster) { o.MaxValueBytes = size })
		g.mustPut("/bud", value(3*size, "bud"))
		g.budget.SetLimit(2*size - 1) // a read holds two chunks
		if a := g.do("GET", "/bud", nil); a.status != 503 || a.hdr.Get("Retry-After") == "" {
			t.Errorf("GET = %d %q, Retry-After %q; want 503 with Retry-After", a.status, a.body, a.hdr.Get("Retry-After"))
		}
		if a := g.do("GET", "/bud", nil, "Range", "bytes=0-9"); a.status != 206 {
			t.Errorf("GET of a range in one chunk = %d %q, want 206", a.status, a.body)
		}
		if used := g.budget.Used(); used != 0 {
			t.Errorf("%d bytes of the budget still held", used)
		}
	})
	t.Run("off", func(t *testing.T) {
		off := newBigRig(t, func(o *Options, _ *upstream.Cluster) { o.BigValueMaxBytes = 0 })
		if a := off.put("/k", value(rigChunk+1, "x")); a.status != 413 {
			t.Errorf("PUT = %d %q, want 413", a.status, a.body)
		}
	})
}

// TestBigValueDetached: a value in chunks read through h1 with detached
// responses streams at the client's pace: a client that does not read
// makes the gateway hold two chunks, not the value.
func TestBigValueDetached(t *testing.T) {
	const chunkSize = 256 << 10
	g := newBigRig(t, func(o *Options, c *upstream.Cluster) {
		o.MaxValueBytes, o.BigValueMaxBytes = chunkSize, 64<<20
		o.BigValueGrace = time.Minute // what is measured is memory: a loaded machine must not make the read pass its grace period
		o.Async = c
	})
	v := value(16<<20, "det")
	g.mustPut("/det", v)

	c := slowreader.Dial(t, g.serveH1(), 32<<10)
	fmt.Fprintf(c, "GET /det HTTP/1.1\r\nHost: x\r\n\r\n")
	peak := int64(0)
	for range 30 { // the client reads nothing for 300 ms
		time.Sleep(10 * time.Millisecond)
		peak = max(peak, g.budget.Used())
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil || !bytes.Equal(body, v) {
		t.Fatalf("GET = %d, %d bytes (%v)", resp.StatusCode, len(body), err)
	}
	if detached := g.counterPlain("memcgate_http_detached_responses_total"); detached < 1 {
		t.Errorf("no detached response: the test did not take the path it tests")
	}
	t.Logf("budget used at most %d bytes while the client did not read", peak)
	if peak > 2*chunkSize+64<<10 {
		t.Errorf("budget used %d bytes while the client did not read, want at most two chunks (%d)", peak, 2*chunkSize)
	}
}

// serveH1 serves the rig's handler with h1 as the gateway does (net/http
// its fallback), and returns its address.
func (g *bigRig) serveH1() string {
	g.t.Helper()
	return g.serveH1Write(10 * time.Second)
}

// serveH1Write is serveH1 with the server's WriteTimeout.
func (g *bigRig) serveH1Write(writeTimeout time.Duration) string {
	g.t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		g.t.Fatal(err)
	}
	std := &http.Server{Handler: g.h}
	srv := &h1.Server{Handler: g.h, Detached: g.h.ServeDetached, Fallback: std, Budget: g.budget, BodyLimit: g.h.BodyLimit, NewContext: g.h.NewContext, WriteTimeout: writeTimeout}
	go srv.Serve(ln)
	g.t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// counterPlain is the value of a counter without labels.
func (g *bigRig) counterPlain(name string) float64 {
	g.t.Helper()
	mfs, err := g.reg.Gather()
	if err != nil {
		g.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	g.t.Fatalf("no counter %s", name)
	return 0
}

// TestBigValueBody: a large body that fails on its way in stores
// nothing and leaves the previous value whole.
func TestBigValueBody(t *testing.T) {
	g := newBigRig(t, nil)
	old := value(2*rigChunk+5, "old")
	g.mustPut("/body", old)
	// A body that ends early: Content-Length says more than comes.
	c, err := net.Dial("tcp", strings.TrimPrefix(g.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "PUT /body HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", 5*rigChunk, value(3*rigChunk+10, "new"))
	c.(*net.TCPConn).CloseWrite()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	c.Close()
	if err != nil || resp.StatusCode != 400 {
		t.Fatalf("PUT of a body cut short = %v, %v; want 400", resp, err)
	}
	if a := g.do("GET", "/body", nil); !bytes.Equal(a.body, old) {
		t.Errorf("GET after the failed write = %d, %d bytes; want the old value", a.status, len(a.body))
	}
	if got := g.counter("memcgate_chunked_writes_total", "result", "failed"); got != 1 {
		t.Errorf("memcgate_chunked_writes_total{result=failed} = %v, want 1", got)
	}
	if w, c := g.counter("memcgate_chunks_total", "event", "written"), g.counter("memcgate_chunks_total", "event", "cleaned"); w != 3+3 || c != 3 {
		t.Errorf("chunks written %v, cleaned %v; want 6 (3 of them the old value's) and 3", w, c)
	}
}
