package mcpipe

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream/op"
)

// countingConn counts the writes made on a connection.
type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

func newClient(addr string, conns int, writes *atomic.Int64) *Client {
	return New(Options{
		Conns:   conns,
		Timeout: 500 * time.Millisecond,
		Dial: func(ctx context.Context) (net.Conn, error) {
			var d net.Dialer
			c, err := d.DialContext(ctx, "tcp", addr)
			if err != nil || writes == nil {
				return c, err
			}
			return countingConn{c, writes}, nil
		},
	})
}

// client is the method set both implementations share.
type client interface {
	Get(key string) (*memcache.Item, error)
	GetMulti(keys []string) (map[string]*memcache.Item, error)
	Set(*memcache.Item) error
	Add(*memcache.Item) error
	Replace(*memcache.Item) error
	Append(*memcache.Item) error
	Prepend(*memcache.Item) error
	CompareAndSwap(*memcache.Item) error
	Delete(key string) error
	Touch(key string, seconds int32) error
	Increment(key string, delta uint64) (uint64, error)
	Decrement(key string, delta uint64) (uint64, error)
}

// TestSameAsGomemcache runs one script of operations through gomemcache
// and through mcpipe, each against its own real memcached, and compares
// every result and error text.
func TestSameAsGomemcache(t *testing.T) {
	servers := memcachedtest.StartN(t, 2)
	gm := memcache.New(servers[0].Addr)
	mp := newClient(servers[1].Addr, 2, nil)
	defer mp.Close()
	big := bytes.Repeat([]byte("x"), 2<<20) // over memcached's 1 MiB item limit
	type step struct {
		name string
		run  func(c client) string
	}
	item := func(k, v string) *memcache.Item {
		return &memcache.Item{Key: k, Value: []byte(v), Flags: 42, Expiration: 300}
	}
	show := func(it *memcache.Item, err error) string {
		if err != nil {
			return "err " + err.Error()
		}
		return fmt.Sprintf("%s=%q flags=%d", it.Key, it.Value, it.Flags)
	}
	e := func(err error) string {
		if err == nil {
			return "ok"
		}
		return "err " + err.Error()
	}
	n := func(v uint64, err error) string { return fmt.Sprintf("%d %s", v, e(err)) }
	var cas uint64
	steps := []step{
		{"get miss", func(c client) string { return show(c.Get("k1")) }},
		{"set", func(c client) string { return e(c.Set(item("k1", "v1"))) }},
		{"get hit", func(c client) string { return show(c.Get("k1")) }},
		{"set empty", func(c client) string { return e(c.Set(item("empty", ""))) }},
		{"get empty", func(c client) string { return show(c.Get("empty")) }},
		{"binary value", func(c client) string { return e(c.Set(item("bin", "a\r\nEND\r\nb\x00"))) }},
		{"get binary", func(c client) string { return show(c.Get("bin")) }},
		{"add exists", func(c client) string { return e(c.Add(item("k1", "x"))) }},
		{"add new", func(c client) string { return e(c.Add(item("k2", "v2"))) }},
		{"replace missing", func(c client) string { return e(c.Replace(item("nope", "x"))) }},
		{"replace", func(c client) string { return e(c.Replace(item("k2", "v2b"))) }},
		{"append", func(c client) string { return e(c.Append(item("k2", "+a"))) }},
		{"prepend", func(c client) string { return e(c.Prepend(item("k2", "p+"))) }},
		{"append missing", func(c client) string { return e(c.Append(item("nope", "x"))) }},
		{"get k2", func(c client) string { return show(c.Get("k2")) }},
		{"multi", func(c client) string {
			m, err := c.GetMulti([]string{"k1", "nope", "k2"})
			return fmt.Sprintf("%d %q %q %s", len(m), m["k1"].Value, m["k2"].Value, e(err))
		}},
		{"cas conflict", func(c client) string {
			it, err := c.Get("k1")
			if err != nil {
				return e(err)
			}
			cas = it.CasID
			_ = c.Set(item("k1", "changed"))
			it.Value = []byte("cas")
			return e(c.CompareAndSwap(it))
		}},
		{"cas ok", func(c client) string {
			it, err := c.Get("k1")
			if err != nil {
				return e(err)
			}
			it.Value = []byte("cas")
			return e(c.CompareAndSwap(it)) + fmt.Sprint(cas != 0)
		}},
		{"cas missing", func(c client) string {
			return e(c.CompareAndSwap(&memcache.Item{Key: "nope", Value: []byte("x"), CasID: 1}))
		}},
		{"incr missing", func(c client) string { return n(c.Increment("ctr", 1)) }},
		{"incr", func(c client) string { _ = c.Set(item("ctr", "41")); return n(c.Increment("ctr", 1)) }},
		{"decr below zero", func(c client) string { return n(c.Decrement("ctr", 100)) }},
		{"incr non-numeric", func(c client) string { return n(c.Increment("k1", 1)) }},
		{"touch", func(c client) string { return e(c.Touch("k1", 100)) }},
		{"touch missing", func(c client) string { return e(c.Touch("nope", 100)) }},
		{"delete", func(c client) string { return e(c.Delete("k1")) }},
		{"delete missing", func(c client) string { return e(c.Delete("k1")) }},
		{"too large", func(c client) string {
			return e(c.Set(&memcache.Item{Key: "big", Value: big}))
		}},
		{"after too large", func(c client) string { return show(c.Get("k2")) }},
		{"malformed key", func(c client) string { return e(c.Set(item("a b", "x"))) }},
		{"long key", func(c client) string { return show(c.Get(strings.Repeat("k", 251))) }},
		{"250-byte key", func(c client) string {
			k := strings.Repeat("k", 250)
			_ = c.Set(item(k, "long"))
			return show(c.Get(k))
		}},
	}
	for _, s := range steps {
		got, want := s.run(mp), s.run(gm)
		if got != want {
			t.Errorf("%s: mcpipe %s, gomemcache %s", s.name, got, want)
		}
	}
}

// TestConcurrent has many goroutines write and read their own keys through
// two connections, and checks every value and that requests shared writes.
func TestConcurrent(t *testing.T) {
	srv := memcachedtest.Start(t)
	var writes atomic.Int64
	c := newClient(srv.Addr, 2, &writes)
	defer c.Close()
	const workers, rounds = 64, 50
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for i := range rounds {
				k := fmt.Sprintf("w%d-%d", w, i)
				v := []byte(strings.Repeat(k, i%7+1))
				if err := c.Set(&memcache.Item{Key: k, Value: v, Flags: uint32(i)}); err != nil {
					errs <- fmt.Errorf("set %s: %w", k, err)
					return
				}
				it, err := c.Get(k)
				if err != nil || !bytes.Equal(it.Value, v) || it.Flags != uint32(i) {
					errs <- fmt.Errorf("get %s: %v %+v, want %q", k, err, it, v)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	reqs := int64(workers * rounds * 2)
	if got := writes.Load(); got >= reqs {
		t.Errorf("%d writes for %d requests: requests did not share writes", got, reqs)
	} else {
		t.Logf("%d requests in %d writes", reqs, got)
	}
}

// TestKilledAndRestarted: requests fail with a network error while the
// server is gone, and the client dials again once it is back.
func TestKilledAndRestarted(t *testing.T) {
	srv := memcachedtest.Start(t)
	c := newClient(srv.Addr, 1, nil)
	defer c.Close()
	if err := c.Set(&memcache.Item{Key: "k", Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	for range 2 { // the broken connection, then a refused dial
		_, err := c.Get("k")
		var ne net.Error
		if !errors.As(err, &ne) && !errors.Is(err, net.ErrClosed) && err == nil {
			t.Fatalf("get from a killed server: %v, want a network error", err)
		}
		if errors.Is(err, memcache.ErrCacheMiss) {
			t.Fatalf("get from a killed server: a miss")
		}
	}
	srv.Restart()
	if _, err := c.Get("k"); !errors.Is(err, memcache.ErrCacheMiss) {
		t.Fatalf("get after restart: %v, want a miss (empty cache)", err)
	}
}

// TestPausedTimesOut: a stopped server makes requests fail with a timeout
// after about the client's timeout, all of them, and the client recovers
// after SIGCONT.
func TestPausedTimesOut(t *testing.T) {
	srv := memcachedtest.Start(t)
	c := New(Options{Timeout: 200 * time.Millisecond, Dial: func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", srv.Addr)
	}})
	defer c.Close()
	if err := c.Set(&memcache.Item{Key: "k", Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	srv.Pause()
	start := time.Now()
	var wg sync.WaitGroup
	var timeouts atomic.Int32
	for range 10 {
		wg.Go(func() {
			_, err := c.Get("k")
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				timeouts.Add(1)
			} else {
				t.Errorf("get from a paused server: %v, want a timeout", err)
			}
		})
	}
	wg.Wait()
	if took := time.Since(start); took > time.Second {
		t.Errorf("timeouts took %v, want about 200ms", took)
	}
	srv.Resume()
	if it, err := c.Get("k"); err != nil || string(it.Value) != "v" {
		t.Fatalf("get after resume: %v %v", it, err)
	}
}

// TestPausedUnderTrickle: later writes do not put off the reply the
// first written request is owed. A stopped server sent a request every
// few milliseconds (each write lands in the socket buffer at once) still
// fails the first one after about the timeout, not when the trickle ends.
func TestPausedUnderTrickle(t *testing.T) {
	srv := memcachedtest.Start(t)
	const timeout = 200 * time.Millisecond
	c := New(Options{Timeout: timeout, Dial: func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", srv.Addr)
	}})
	defer c.Close()
	if err := c.Set(&memcache.Item{Key: "k", Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	srv.Pause()
	defer srv.Resume()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				wg.Go(func() { _, _ = c.Get("k") })
			}
		}
	})
	start := time.Now()
	_, err := c.Get("k")
	took := time.Since(start)
	close(stop)
	wg.Wait()
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Errorf("get from a paused server under a trickle of gets: %v, want a timeout", err)
	}
	if took > 10*timeout { // moved by each write, it would wait for the trickle's end
		t.Errorf("the first get failed after %v, want about %v", took, timeout)
	}
}

// TestGarbageReply: a server that answers outside the protocol fails the
// requests on that connection instead of handing one request another's
// reply.
func TestGarbageReply(t *testing.T) {
	addr, _ := scriptedServer(t, "VALUE k 0 notanumber\r\n")
	c := newClient(addr, 1, nil)
	defer c.Close()
	_, err := c.Get("k")
	if !errors.Is(err, errProtocol) {
		t.Fatalf("get with a garbage reply: %v, want errProtocol", err)
	}
}

// scriptedServer listens on a loopback port and, on each connection it
// accepts, reads the first request line, answers reply and then holds the
// connection open, silent, until the test ends. It returns the address,
// and a channel that receives once per reply written.
func scriptedServer(t *testing.T, reply string) (string, <-chan struct{}) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	stop, answered := make(chan struct{}), make(chan struct{}, 16)
	t.Cleanup(func() { close(stop); ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
					return
				}
				c.Write([]byte(reply))
				select {
				case answered <- struct{}{}:
				default:
				}
				<-stop
			}()
		}
	}()
	return ln.Addr().String(), answered
}

// BenchmarkParallelGet compares gomemcache (one request per connection,
// 64 connections) with mcpipe (2 pipelined connections) on one memcached
// with 64 goroutines.
func BenchmarkParallelGet(b *testing.B) {
	srv := memcachedtest.Start(b)
	value := bytes.Repeat([]byte("v"), 400)
	key := strings.Repeat("k", 96)
	gm := memcache.New(srv.Addr)
	gm.MaxIdleConns = 64
	if err := gm.Set(&memcache.Item{Key: key, Value: value}); err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name string
		c    interface {
			Get(string) (*memcache.Item, error)
		}
	}{
		{"gomemcache", gm},
		{"mcpipe", newClient(srv.Addr, 2, nil)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetParallelism(64)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := bc.c.Get(key); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// TestFailedDialIsShared: callers queued behind a dial that fails get its
// error instead of dialling one after another (a black-holed node would
// otherwise cost the last caller a dial timeout per caller ahead of it).
func TestFailedDialIsShared(t *testing.T) {
	const callers = 20
	var dials, started atomic.Int32
	refused := errors.New("dial: no route")
	c := New(Options{Timeout: time.Second, Dial: func(ctx context.Context) (net.Conn, error) {
		// The first dial fails slowly, like a dial timeout: once every
		// caller has started, so the others are queued behind it.
		if dials.Add(1) == 1 {
			for started.Load() < callers {
				runtime.Gosched()
			}
		}
		return nil, refused
	}})
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			started.Add(1)
			if _, err := c.Get("k"); !errors.Is(err, refused) {
				t.Errorf("get: %v, want the dial error", err)
			}
		})
	}
	wg.Wait()
	// Each caller dialling in turn makes 20; one that had started but
	// not yet queued when the first dial failed dials again, with any
	// queued behind it.
	if n := dials.Load(); n > callers/4 {
		t.Errorf("%d callers made %d dials, want them to share the first one's failure", callers, n)
	}
}

func TestParseValueLine(t *testing.T) {
	tests := []struct {
		line           string
		wantKey        string
		wantFlags      uint32
		wantSize       int
		wantCAS        uint64
		wantProtoError bool
	}{
		{line: "VALUE k 0 5\r\n", wantKey: "k", wantSize: 5},
		{line: "VALUE key 42 400 77\r\n", wantKey: "key", wantFlags: 42, wantSize: 400, wantCAS: 77},
		{line: "VALUE k 4294967295 0 18446744073709551615\r\n", wantKey: "k", wantFlags: 1<<32 - 1, wantCAS: 1<<64 - 1},
		{line: "VALUE k 0\r\n", wantProtoError: true},
		{line: "VALUE k 0 5 1 extra\r\n", wantProtoError: true},
		{line: "VALUE k x 5\r\n", wantProtoError: true},
		{line: "VALUE k 0 -5\r\n", wantProtoError: true},
		{line: "VALUE k 4294967296 5\r\n", wantProtoError: true},
		{line: "VALUE  0 5\r\n", wantProtoError: true},
		{line: "VALUE k 0 5 \r\n", wantProtoError: true},
	}
	for _, tt := range tests {
		it, _, size, err := parseValueLine([]byte(tt.line), &keyCursor{})
		if tt.wantProtoError {
			if !errors.Is(err, errProtocol) {
				t.Errorf("parseValueLine(%q) error = %v, want errProtocol", tt.line, err)
			}
			continue
		}
		if err != nil || it.Key != tt.wantKey || it.Flags != tt.wantFlags || size != tt.wantSize || it.CasID != tt.wantCAS {
			t.Errorf("parseValueLine(%q) = %+v, %d, %v; want key %q flags %d size %d cas %d",
				tt.line, it, size, err, tt.wantKey, tt.wantFlags, tt.wantSize, tt.wantCAS)
		}
	}
}

// TestReadReplyLimit: a get reply keeps values up to the limit and reads
// the rest off the stream without keeping them, leaving the stream at the
// next reply.
func TestReadReplyLimit(t *testing.T) {
	stream := "VALUE a 0 3 1\r\naaa\r\nVALUE b 0 5 2\r\nbbbbb\r\nVALUE c 0 2 3\r\ncc\r\nEND\r\nSTORED\r\n"
	tests := []struct {
		limit       int
		wantKept    []string
		wantDropped []string
	}{
		{0, []string{"a", "b", "c"}, nil},
		{10, []string{"a", "b", "c"}, nil},
		{8, []string{"a", "b"}, []string{"c"}},
		{5, []string{"a", "c"}, []string{"b"}},
		{1, nil, []string{"a", "b", "c"}},
	}
	for _, tt := range tests {
		br := bufio.NewReader(strings.NewReader(stream))
		r, err := readReply(br, op.Items, "gets", nil, nil, replyLimit{bytes: tt.limit}, nil, nil, nil, nil)
		if err != nil || r.err != nil {
			t.Fatalf("limit %d: %v, %v", tt.limit, err, r.err)
		}
		var kept []string
		for _, it := range r.items {
			kept = append(kept, it.Key)
		}
		if !slices.Equal(kept, tt.wantKept) || !slices.Equal(r.dropped, tt.wantDropped) {
			t.Errorf("limit %d: kept %v, dropped %v; want %v, %v", tt.limit, kept, r.dropped, tt.wantKept, tt.wantDropped)
		}
		if next, err := readReply(br, op.Stored, "set", nil, nil, replyLimit{}, nil, nil, nil, nil); err != nil || next.err != nil {
			t.Errorf("limit %d: the next reply: %v, %v", tt.limit, err, next.err)
		}
	}
}

// testRoom is an op.Room for tests: a budget of limit bytes (0: none)
// that counts what it holds and the values it was asked about, lending
// with lend (nil: new buffers).
type testRoom struct {
	limit int64
	held  atomic.Int64
	asked atomic.Int64 // Reserve calls
	fits  atomic.Int64 // Fits calls
	lend  func(n int) []byte
}

func (r *testRoom) Reserve(n int) bool {
	r.asked.Add(1)
	if h := r.held.Add(int64(n)); r.limit > 0 && h > r.limit {
		r.held.Add(-int64(n))
		return false
	}
	return true
}

func (r *testRoom) Fits(n int) bool {
	r.fits.Add(1)
	return r.limit <= 0 || r.held.Load()+int64(n) <= r.limit
}

func (r *testRoom) Release(n int) { r.held.Add(-int64(n)) }

func (r *testRoom) Holds(n int) int { return n }

func (r *testRoom) Lend(n int) []byte {
	if r.lend != nil {
		return r.lend(n)
	}
	return make([]byte, 0, n)
}

// TestReadReplyRooms: each value of a shared gets line is asked of the
// Room of the call whose place on the line it answers (as keyCursor
// finds it), never of another call's, and what the reply's values hold
// adds up until the reply is handed out; a refused value leaves the
// stream at the next reply; share then fails with ErrNoFit exactly the
// calls whose own value was refused, and hands every other call the
// value sent for its own place, so a call without a Room on the line of
// a refusing call for the same key still gets its value.
func TestReadReplyRooms(t *testing.T) {
	big := strings.Repeat("v", bigValue)
	value := func(key string, v string) string {
		return fmt.Sprintf("VALUE %s 0 %d 1\r\n%s\r\n", key, len(v), v)
	}
	refuse := &testRoom{limit: 1}
	upTo2 := &testRoom{limit: 2 * int64(len(big))} // room for two
	tests := []struct {
		name      string
		lineKeys  []string
		rooms     []*testRoom
		reply     string
		wantKept  []string
		wantNoFit []int   // places on the line
		wantErr   []error // share's per call, when lineKeys are a shared line
	}{
		{"own refuses", nil, []*testRoom{refuse}, value("a", big), nil, []int{0}, nil},
		{"own small", nil, []*testRoom{refuse}, value("a", "x"), []string{"a"}, nil, nil},
		{"multi-key, none", nil, []*testRoom{nil}, value("a", big) + value("b", big), []string{"a", "b"}, nil, nil},
		{"first refuses", []string{"a", "b"}, []*testRoom{refuse, nil}, value("a", big) + value("b", big),
			[]string{"b"}, []int{0}, []error{ErrNoFit, nil}},
		{"second refuses", []string{"a", "b"}, []*testRoom{nil, refuse}, value("a", big) + value("b", big),
			[]string{"a"}, []int{1}, []error{nil, ErrNoFit}},
		{"first missed", []string{"a", "b"}, []*testRoom{refuse, nil}, value("b", big),
			[]string{"b"}, nil, []error{memcache.ErrCacheMiss, nil}},
		{"repeated key, refusing first", []string{"a", "b", "a"}, []*testRoom{refuse, nil, nil}, value("a", big) + value("b", big) + value("a", big),
			[]string{"b", "a"}, []int{0}, []error{ErrNoFit, nil, nil}},
		{"repeated key, refusing last", []string{"a", "b", "a"}, []*testRoom{nil, nil, refuse}, value("a", big) + value("b", big) + value("a", big),
			[]string{"a", "b"}, []int{2}, []error{nil, nil, ErrNoFit}},
		{"repeated key, both refuse", []string{"a", "a"}, []*testRoom{refuse, refuse}, value("a", big) + value("a", big),
			nil, []int{0, 1}, []error{ErrNoFit, ErrNoFit}},
		{"the reply's earlier values count", []string{"a", "b", "c", "d"}, []*testRoom{upTo2, upTo2, nil, upTo2},
			value("a", big) + value("b", big) + value("c", big) + value("d", big),
			[]string{"a", "b", "c"}, []int{3}, []error{nil, nil, nil, ErrNoFit}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			br := bufio.NewReader(strings.NewReader(tt.reply + "END\r\nSTORED\r\n"))
			rooms := make([]op.Room, len(tt.rooms))
			for i, rm := range tt.rooms {
				if rm != nil {
					rooms[i] = rm
				}
			}
			var holds []held
			r, err := readReply(br, op.Items, "gets", tt.lineKeys, nil, replyLimit{}, rooms, &holds, nil, nil)
			if err != nil || r.err != nil {
				t.Fatalf("readReply: %v, %v", err, r.err)
			}
			var kept []string
			for _, it := range r.items {
				kept = append(kept, it.Key)
			}
			if !slices.Equal(kept, tt.wantKept) || !slices.Equal(r.nofit, tt.wantNoFit) {
				t.Errorf("kept %v, refused %v; want %v, %v", kept, r.nofit, tt.wantKept, tt.wantNoFit)
			}
			if next, err := readReply(br, op.Stored, "set", nil, nil, replyLimit{}, nil, nil, nil, nil); err != nil || next.err != nil {
				t.Errorf("the next reply: %v, %v", err, next.err)
			}
			// What the kept values hold is the reply's to release.
			for _, h := range holds {
				h.room.Release(h.n)
			}
			for i, rm := range tt.rooms {
				if rm != nil && rm.held.Load() != 0 {
					t.Errorf("room %d holds %d bytes after the reply's release", i, rm.held.Load())
				}
			}
			if tt.lineKeys == nil {
				return
			}
			calls := make([]*call, len(tt.lineKeys))
			for i, k := range tt.lineKeys {
				calls[i] = &call{kind: op.Items, key: k, room: rooms[i]}
			}
			share(calls, r)
			for i, cl := range calls {
				it, _, err := cl.result()
				if !errors.Is(err, tt.wantErr[i]) || (err == nil) != (it != nil) {
					t.Errorf("call %d (%s): %v, %v; want %v", i, cl.key, it, err, tt.wantErr[i])
				}
			}
		})
	}
}

// TestKeyCursor: the keys of a shared line's reply come, in order and
// with misses left out, from the line's own key strings; any other key is
// copied.
func TestKeyCursor(t *testing.T) {
	line := []string{"a", "b", "a", "c"}
	kc := keyCursor{keys: line}
	for i, tt := range []struct {
		reply string
		from  int // index in line of the string returned; -1: a copy
	}{
		{"a", 0}, {"a", 2}, {"c", 3}, {"b", -1}, {"z", -1},
	} {
		got, at := kc.key([]byte(tt.reply))
		if got != tt.reply || at != tt.from {
			t.Fatalf("reply key %d: key(%q) = %q, %d; want index %d", i, tt.reply, got, at, tt.from)
		}
		shared := tt.from >= 0 && unsafe.StringData(got) == unsafe.StringData(line[tt.from])
		if (tt.from >= 0) != shared {
			t.Errorf("reply key %d (%q): the line's string %d: %v, want %v", i, tt.reply, tt.from, shared, tt.from >= 0)
		}
	}
}

// TestSharedGetLines: concurrent single-key Gets, hits, misses and
// repeated keys, share command lines (fewer writes than Gets) and each
// gets exactly its own answer.
func TestSharedGetLines(t *testing.T) {
	srv := memcachedtest.Start(t)
	var writes atomic.Int64
	c := newClient(srv.Addr, 1, &writes)
	defer c.Close()
	for i := range 50 {
		k := fmt.Sprintf("k%d", i)
		if err := c.Set(&memcache.Item{Key: k, Value: []byte("v-" + k), Flags: uint32(i)}); err != nil {
			t.Fatal(err)
		}
	}
	writes.Store(0)
	const workers, rounds = 64, 40
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range rounds {
				n := (w*7 + i) % 60 // 50..59 are misses; keys repeat across workers
				k := fmt.Sprintf("k%d", n)
				it, err := c.Get(k)
				switch {
				case n >= 50 && !errors.Is(err, memcache.ErrCacheMiss):
					t.Errorf("Get(%s) = %+v, %v; want a miss", k, it, err)
				case n < 50 && (err != nil || string(it.Value) != "v-"+k || it.Flags != uint32(n) || it.Key != k):
					t.Errorf("Get(%s) = %+v, %v; want v-%s flags %d", k, it, err, k, n)
				}
			}
		})
	}
	wg.Wait()
	if got := writes.Load(); got >= workers*rounds {
		t.Errorf("%d writes for %d Gets: no lines were shared", got, workers*rounds)
	} else {
		t.Logf("%d Gets in %d writes", workers*rounds, got)
	}
	// A Get behind a store on the same connection still sees the store.
	if err := c.Set(&memcache.Item{Key: "k1", Value: []byte("new")}); err != nil {
		t.Fatal(err)
	}
	if it, err := c.Get("k1"); err != nil || string(it.Value) != "new" {
		t.Fatalf("Get after Set = %+v, %v; want new", it, err)
	}
}

// TestCloseWhileReading: Close fails a connection whose reader is in the
// middle of a Get's reply. The Get gets ErrClosed, and its call, back in
// the pool and reused by the next Get, is no longer read by the old
// reader (the race detector checks that part).
func TestCloseWhileReading(t *testing.T) {
	addr, answered := scriptedServer(t, "VALUE a 0 5\r\nxx") // the rest never comes
	cl := newClient(addr, 1, nil)
	for i := range 4 {
		done := make(chan error, 1)
		go func() {
			_, err := cl.Get("a")
			done <- err
		}()
		<-answered
		time.Sleep(10 * time.Millisecond) // most likely the reader waits for the value now
		cl.Close()
		if err := <-done; !errors.Is(err, ErrClosed) {
			t.Fatalf("Get %d while the connection was closed: error %v, want %v", i, err, ErrClosed)
		}
	}
}

// TestAsync: GetAsync and SetAsync complete exactly once with what Get and
// Set return, hits, misses and stores alike, interleaved with blocking
// calls on the same connection. They never dial, but use any connection
// open.
func TestAsync(t *testing.T) {
	srv := memcachedtest.Start(t)
	var dials atomic.Int32
	c := New(Options{Conns: 2, Dial: func(ctx context.Context) (net.Conn, error) {
		dials.Add(1)
		var d net.Dialer
		return d.DialContext(ctx, "tcp", srv.Addr)
	}})
	defer c.Close()
	if err := getAsync(c, "k", func(*memcache.Item, error) { t.Error("callback of a GetAsync with no connection") }); !errors.Is(err, ErrNoConn) || dials.Load() != 0 {
		t.Fatalf("GetAsync on a new Client = %v after %d dials, want ErrNoConn and none", err, dials.Load())
	}
	if _, err := c.Get("k"); !errors.Is(err, memcache.ErrCacheMiss) { // dials one of the two
		t.Fatalf("Get = %v, want a miss", err)
	}
	const n = 200
	var wg sync.WaitGroup
	stored := make(chan error, n)
	for i := range n {
		wg.Add(1)
		it := &memcache.Item{Key: fmt.Sprint("k", i), Value: []byte(fmt.Sprint("v", i)), Flags: uint32(i)}
		if err := setAsync(c, it, func(err error) { stored <- err; wg.Done() }); err != nil {
			t.Fatalf("SetAsync(%s) = %v, want nil", it.Key, err)
		}
		it.Value = []byte("overwritten after SetAsync returned")
	}
	wg.Wait()
	for range n {
		if err := <-stored; err != nil {
			t.Fatalf("SetAsync completed with %v, want nil", err)
		}
	}
	type got struct {
		i   int
		it  *memcache.Item
		err error
	}
	results := make(chan got, 2*n)
	for i := range 2 * n { // the second half misses
		wg.Add(1)
		if err := getAsync(c, fmt.Sprint("k", i), func(it *memcache.Item, err error) { results <- got{i, it, err}; wg.Done() }); err != nil {
			t.Fatalf("GetAsync = %v, want nil", err)
		}
		if i%50 == 0 { // a blocking call in between
			if _, err := c.Get("k0"); err != nil {
				t.Fatalf("Get between GetAsyncs = %v", err)
			}
		}
	}
	wg.Wait()
	close(results)
	seen := 0
	for r := range results {
		seen++
		switch {
		case r.i < n && (r.err != nil || string(r.it.Value) != fmt.Sprint("v", r.i) || r.it.Flags != uint32(r.i) || r.it.CasID == 0):
			t.Errorf("GetAsync(k%d) = %+v, %v; want v%d with flags %d and a CAS", r.i, r.it, r.err, r.i, r.i)
		case r.i >= n && (r.it != nil || !errors.Is(r.err, memcache.ErrCacheMiss)):
			t.Errorf("GetAsync(k%d) = %+v, %v; want a miss", r.i, r.it, r.err)
		}
	}
	if seen != 2*n {
		t.Errorf("%d callbacks, want %d", seen, 2*n)
	}
	if d := dials.Load(); d > 2 {
		t.Errorf("%d dials, want at most one per connection", d)
	}
	if err := getAsync(c, "bad key", func(*memcache.Item, error) { t.Error("callback of a refused GetAsync") }); !errors.Is(err, memcache.ErrMalformedKey) {
		t.Errorf("GetAsync(bad key) = %v, want ErrMalformedKey", err)
	}
}

// TestAsyncFailures: with no connection open GetAsync and SetAsync return
// ErrNoConn and their callbacks never run; calls on a connection that fails complete with the
// failure, each once, and never under the connection's lock (a callback
// that sends a blocking request to the same Client would deadlock).
func TestAsyncFailures(t *testing.T) {
	srv := memcachedtest.Start(t)
	c := newClient(srv.Addr, 1, nil)
	defer c.Close()
	if err := c.Set(&memcache.Item{Key: "k", Value: []byte("v")}); err != nil { // opens the connection
		t.Fatal(err)
	}
	srv.Pause()
	var wg sync.WaitGroup
	var calls atomic.Int32
	for range 10 {
		wg.Add(1)
		err := getAsync(c, "k", func(it *memcache.Item, err error) {
			defer wg.Done()
			calls.Add(1)
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() {
				t.Errorf("GetAsync from a paused server completed with %v, want a timeout", err)
			}
			// Completed unlocked: a goroutine may use the Client while
			// this callback waits for it.
			done := make(chan struct{})
			go func() { c.Close(); close(done) }()
			<-done
		})
		if err != nil {
			t.Fatalf("GetAsync = %v, want it sent", err)
		}
	}
	wg.Wait()
	if got := calls.Load(); got != 10 {
		t.Errorf("%d callbacks, want 10", got)
	}
	srv.Resume()
	srv.Kill()
	c.Close()
	err := setAsync(c, &memcache.Item{Key: "k"}, func(error) { t.Error("callback of a SetAsync with no connection") })
	if !errors.Is(err, ErrNoConn) {
		t.Errorf("SetAsync to a killed server = %v, want ErrNoConn", err)
	}
}

// TestReleaseKeepsNoPeers: a call that owned a shared gets line goes back
// to the pool holding none of that line's calls, and a peer array grown
// past maxPooledPeers is dropped. Stale pointers in a pooled array kept a
// 2048-client burst's calls alive, a chain through each one's array, and
// every GC after the burst marked them (1.25 MB, mark phases twice as long).
func TestReleaseKeepsNoPeers(t *testing.T) {
	for _, tc := range []struct {
		name      string
		peers     int
		wantArray bool
	}{
		{"alone", 0, true},
		{"small line", 11, true},
		{"at the limit", maxPooledPeers, true},
		{"burst line", maxSharedKeys, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &Client{}
			cl := &call{done: make(chan struct{}, 1)}
			for range tc.peers {
				cl.peer = append(cl.peer, &call{})
			}
			c.release(cl)
			switch {
			case !tc.wantArray && cl.peer != nil:
				t.Errorf("pooled call kept a peer array of cap %d; want none", cap(cl.peer))
			case tc.wantArray && tc.peers > 0 && cap(cl.peer) == 0:
				t.Errorf("pooled call dropped its peer array; want it kept for the next line")
			case len(cl.peer) != 0:
				t.Errorf("pooled call has %d peers; want 0", len(cl.peer))
			}
			for i, p := range cl.peer[:cap(cl.peer)] {
				if p != nil {
					t.Errorf("pooled peer array still holds a call at %d", i)
				}
			}
			if cl.done == nil {
				t.Error("pooled call lost its done channel")
			}
		})
	}
}

// TestReplyToAnOpenLine: a reply that arrives while its gets line is still
// open (not even written, so send may still add keys to it) fails the
// connection, instead of completing a call whose line others may join
// after it is back in the pool. Only a server outside the protocol does
// that.
func TestReplyToAnOpenLine(t *testing.T) {
	client, server := net.Pipe()
	defer server.Close()
	c := newConn(client, time.Second)
	cl := &call{kind: op.Items, verb: "gets", key: "k", done: make(chan struct{}, 1)}
	c.mu.Lock()
	c.wbuf = append(c.wbuf, "gets k"...)
	cl.peer = append(cl.peer, cl)
	c.open = cl
	c.queue = append(c.queue, cl)
	c.unsent = 1
	c.writing = true // the writer is in its Gosched: the line stays open
	c.mu.Unlock()
	go c.readLoop()
	go server.Write([]byte("END\r\n"))
	// The writer's turn ends (its write failed or it found nothing more
	// to write): it completes the calls the failure left to it.
	for !c.failed() {
		time.Sleep(time.Millisecond)
	}
	c.mu.Lock()
	c.stopWritingLocked()
	select {
	case <-cl.done:
	case <-time.After(5 * time.Second):
		t.Fatal("the call was never answered")
	}
	if !errors.Is(cl.err, errProtocol) {
		t.Errorf("call answered with %v, %d items; want errProtocol", cl.err, len(cl.items))
	}
}

// getAsync and setAsync are DoAsync for one Get or Set. getAsync's done
// gets a copy of the item, which it may keep.
func getAsync(c *Client, key string, done func(*memcache.Item, error)) error {
	return c.DoAsync(context.Background(), op.Op{Verb: op.Get}, key, func(it *memcache.Item, _ uint64, err error) { done(copied(it), err) })
}

// copied is a copy of it (nil: nil), for a DoAsync callback that keeps the
// item it gets past its return.
func copied(it *memcache.Item) *memcache.Item {
	if it == nil {
		return nil
	}
	c := *it
	return &c
}

func setAsync(c *Client, it *memcache.Item, done func(error)) error {
	o := op.Op{Verb: op.Set, Item: op.Item{Value: it.Value, Flags: it.Flags, Expiration: it.Expiration}}
	return c.DoAsync(context.Background(), o, it.Key, func(_ *memcache.Item, _ uint64, err error) { done(err) })
}

// slowRelay relays a client to addr, passing the client's bytes at about
// rate bytes per second (memcached reading slowly but steadily) and the
// replies unchanged. It returns the address to dial.
func slowRelay(t *testing.T, addr string, rate int) string {
	t.Helper()
	return relay(t, addr, rate, false)
}

// queued is how many calls the connection has sent or is sending.
func (c *conn) queued() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.queue)
}

// unwritten reports whether large values are queued or granted room and
// not yet written.
func (c *conn) unwritten() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.values > 0 || len(c.waiters) > 0
}

// relay relays a client to addr, passing the client's bytes (or, if
// replies, memcached's) at about rate bytes per second and the other
// direction unchanged. It returns the address to dial.
func relay(t *testing.T, addr string, rate int, replies bool) string {
	t.Helper()
	return startRelay(t, addr, relaySpec{rate: rate, replies: replies})
}

// relaySpec is what a test relay does to the direction it throttles.
type relaySpec struct {
	rate    int  // bytes per second passed, about, in pieces of 16 KiB
	replies bool // throttle memcached's replies, not the client's bytes
}

// startRelay relays a client to addr as r says. It returns the address
// to dial.
//
// The client's side has a small receive buffer, so that what the relay
// has not passed on stays with the client rather than in the kernel. It
// is set on the listener, before any handshake, as tcp(7) asks; the
// accepted sockets inherit it. Set on an accepted socket, it would shrink
// the buffer below the window already offered to the client: when the
// relay reads late (a busy machine), the kernel drops segments that
// arrive within that window (nstat: TcpExtRcvPruned, TcpExtTCPRcvQDrop),
// and the client sends them again only after its retransmission timeout,
// 200 ms at least. memcached then gets no byte for that long, twice
// before one reply is more than TestSlowSteadyWrites's timeout, and the
// test would see a stall that only the relay made.
func startRelay(t *testing.T, addr string, r relaySpec) string {
	t.Helper()
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 16<<10)
		}); err != nil {
			return err
		}
		return os.NewSyscallError("setsockopt", serr)
	}}
	ln, err := lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", addr)
			if err != nil {
				c.Close()
				return
			}
			t.Cleanup(func() { c.Close(); up.Close() })
			from, to := net.Conn(c), net.Conn(up)
			if r.replies {
				from, to = up, c
			}
			go func() { _, _ = io.Copy(from, to) }()
			go func() {
				const piece = 16 << 10
				b := make([]byte, piece)
				for {
					n, err := from.Read(b)
					if n > 0 {
						if _, werr := to.Write(b[:n]); werr != nil {
							return
						}
						time.Sleep(time.Duration(n) * time.Second / time.Duration(r.rate))
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// TestSlowSteadyWrites: sets queued faster than memcached reads them take
// longer than the timeout to write in all, but memcached makes progress
// within every timeout, so none fails: the write deadline bounds a stall,
// not the size of the queue.
func TestSlowSteadyWrites(t *testing.T) {
	srv := memcachedtest.Start(t)
	// Each set's reply comes well within the timeout; the 12 MB queued,
	// more than the kernel's socket buffers take, take longer than it to
	// write.
	addr := slowRelay(t, srv.Addr, 16<<20)
	const timeout = 400 * time.Millisecond
	c := New(Options{Conns: 1, Timeout: timeout, Dial: func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	}})
	defer c.Close()
	// How long values stay unwritten: if the kernel took the queue
	// faster than the timeout, no write waited and the test proves
	// nothing.
	start := time.Now()
	var writing time.Duration // since start, when values were last seen unwritten
	stop, watched := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watched)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			if cn := c.small.slots[0].c.Load(); cn != nil && cn.unwritten() {
				writing = time.Since(start)
			}
		}
	}()
	value := bytes.Repeat([]byte("v"), 500<<10)
	var wg sync.WaitGroup
	for i := range 24 {
		wg.Go(func() {
			if err := c.Set(&memcache.Item{Key: fmt.Sprint("big", i), Value: value}); err != nil {
				t.Errorf("set big%d: %v", i, err)
			}
		})
	}
	wg.Wait()
	close(stop)
	<-watched
	if writing < timeout {
		t.Errorf("the values were written within %v, under the timeout %v: the kernel's buffers took the queue", writing, timeout)
	}
	for i := range 24 {
		if it, err := c.Get(fmt.Sprint("big", i)); err != nil || !bytes.Equal(it.Value, value) {
			t.Errorf("get big%d: %v", i, err)
		}
	}
}

// smallSendBuffer dials addr with a send buffer of 16 KiB, so that what
// memcached has not read stays in the client, where its writes see it
// move, rather than in the kernel. With the kernel's own (autotuned, up
// to tcp_wmem's maximum: 4 MiB) a 1 MiB value goes into it at once, and
// its reply is owed from there (Options.Timeout). If wrap, the socket
// is wrapped, as TLS would wrap it, and written with its Write.
func smallSendBuffer(addr string, wrap bool) func(context.Context) (net.Conn, error) {
	return func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		nc, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		if err := nc.(*net.TCPConn).SetWriteBuffer(16 << 10); err != nil {
			nc.Close()
			return nil, fmt.Errorf("set the send buffer: %w", err)
		}
		if wrap {
			return countingConn{nc, new(atomic.Int64)}, nil
		}
		return nc, nil
	}
}

// TestSlowSteadyValue: one value that memcached reads steadily but slowly
// (a slow link) takes several timeouts to write, and its set succeeds:
// the timeout bounds a stall, not the size of a value. Its write and
// the wait for its reply are measured from the last bytes it moved;
// measured from the start of its write, the set failed with an i/o
// timeout after one timeout, and the node counted a failure. A wrapped
// socket's Write is seen to progress only per writeSlice (256 KiB, about
// 130 ms here), hence its longer timeout.
func TestSlowSteadyValue(t *testing.T) {
	srv := memcachedtest.Start(t, "-I", "4m")
	for _, tc := range []struct {
		name    string
		wrap    bool
		rate    int // bytes a second the relay passes
		size    int
		timeout time.Duration
	}{
		// 1 MiB at 2 MiB/s: about 500 ms, in pieces of 16 KiB each 8 ms.
		{"socket", false, 2 << 20, 1 << 20, 100 * time.Millisecond},
		// A wrapped connection shows progress only per written slice
		// (256 KiB, about 250 ms here): a timeout of eight slices leaves
		// room for a relay slowed by -race on a loaded machine (four
		// were passed at a load of 15: one slice took over a second),
		// and the value, 3.25 MiB, takes longer than one and a half of
		// them.
		{"wrapped", true, 1 << 20, 13 << 18, 2 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := slowRelay(t, srv.Addr, tc.rate)
			value := bytes.Repeat([]byte("v"), tc.size)
			c := New(Options{Conns: 1, Timeout: tc.timeout, Dial: smallSendBuffer(addr, tc.wrap)})
			defer c.Close()
			start := time.Now()
			if err := c.Set(&memcache.Item{Key: tc.name, Value: value}); err != nil {
				t.Fatalf("set of %d bytes read steadily at %d B/s, timeout %v: %v after %v", tc.size, tc.rate, tc.timeout, err, time.Since(start))
			}
			took := time.Since(start)
			t.Logf("set: %v", took)
			if took < tc.timeout*3/2 {
				t.Errorf("the set took %v, under 1.5 timeouts of %v: the value did not go slowly and the test proves nothing", took, tc.timeout)
			}
			if it, err := c.Get(tc.name); err != nil || !bytes.Equal(it.Value, value) {
				t.Errorf("get after the slow set: %v", err)
			}
		})
	}
}

// TestSlowValueKeepsDeadlines: progress keeps a slow value going past
// the timeout, but no longer than its caller's deadline, and a call
// queued behind it is not kept waiting for it past its own: both fail
// with a timeout at about the set's deadline, where without the bound
// they would wait about 8 s for the value to pass: seconds from the
// bound either way, which a loaded machine's delays do not bridge.
func TestSlowValueKeepsDeadlines(t *testing.T) {
	srv := memcachedtest.Start(t, "-I", "8m")
	// 4 MiB at 512 KiB/s: about 8 s.
	addr := slowRelay(t, srv.Addr, 512<<10)
	// The relay runs in this process: on a loaded machine it can stop
	// passing bytes for 100 ms and more, a stall of memcached's link as
	// the client sees it. A timeout of 500 ms is rarely bridged so, and
	// the deadline, three of them, still seconds short of the 8 s.
	c := New(Options{Conns: 1, Timeout: 500 * time.Millisecond, Dial: smallSendBuffer(addr, false)})
	defer c.Close()
	const deadline = 1500 * time.Millisecond
	start := time.Now()
	var setErr error
	var setTook time.Duration
	var wg sync.WaitGroup
	wg.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		defer cancel()
		_, _, setErr = c.Do(ctx, op.Op{Verb: op.Set, Item: op.Item{Value: bytes.Repeat([]byte("v"), 4<<20)}}, "big")
		setTook = time.Since(start)
	})
	// The get goes once the set is queued: on a starved machine a fixed
	// sleep could let the get go first, and it would be answered at once.
	for cn := c.small.slots[0].c.Load(); cn == nil || cn.queued() == 0; cn = c.small.slots[0].c.Load() {
		if time.Since(start) > 5*time.Second {
			t.Fatal("the set was never queued")
		}
		time.Sleep(time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	_, _, getErr := c.Do(ctx, op.Op{Verb: op.Get}, "small")
	getTook := time.Since(start)
	wg.Wait()
	t.Logf("set: %v after %v; get behind it: %v after %v", setErr, setTook, getErr, getTook)
	for _, r := range []struct {
		what string
		err  error
		took time.Duration
	}{{"the slow set", setErr, setTook}, {"the get behind it", getErr, getTook}} {
		var ne net.Error
		if !errors.As(r.err, &ne) || !ne.Timeout() {
			t.Errorf("%s: %v, want a timeout", r.what, r.err)
		}
		if !errors.Is(r.err, ErrBehind) {
			t.Errorf("%s: %v, want ErrBehind: memcached was reading the value all along, no stall of its own", r.what, r.err)
		}
		if r.took > deadline+2*time.Second {
			t.Errorf("%s returned %v after the set began, past its deadline of %v", r.what, r.took, deadline)
		}
	}
}

// TestBehindSpentDeadline: a reply that starts when its caller has less
// than the timeout left, and streams for longer, fails at the deadline
// set before it began, which progress cannot move past the caller's: the
// callers get ErrBehind, a timeout that health checks ignore, not a stall
// of memcached, which was sending all along. (Counted as stalls, a queue
// of large values for clients that read slowly ejected a healthy node.)
func TestBehindSpentDeadline(t *testing.T) {
	srv := memcachedtest.Start(t, "-I", "16m")
	direct := New(Options{Conns: 1, Timeout: 5 * time.Second, Dial: func(ctx context.Context) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "tcp", srv.Addr)
	}})
	defer direct.Close()
	if err := direct.Set(&memcache.Item{Key: "big", Value: bytes.Repeat([]byte("v"), 8<<20)}); err != nil {
		t.Fatal(err)
	}
	// 8 MiB of reply at 1 MiB/s: about eight seconds of steady progress,
	// so that a reply waited for to its end is far past the bound below;
	// and progressBytes in a quarter of a second, with more than a second
	// and a half of the 2 s timeout to spare for a starved relay.
	c := New(Options{Conns: 1, Timeout: 2 * time.Second, Dial: smallSendBuffer(relay(t, srv.Addr, 1<<20, true), false)})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	_, _, err := c.Do(ctx, op.Op{Verb: op.Get}, "big")
	took := time.Since(start)
	t.Logf("GET of 8 MiB at 1 MiB/s with 1 s to go and a 2 s timeout: %v after %v", err, took)
	if !errors.Is(err, ErrBehind) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("got %v, want ErrBehind (wrapping context.DeadlineExceeded): the value was moving", err)
	}
	if took > 5*time.Second {
		t.Errorf("failed after %v, want about the 2 s timeout set at the write, not the whole reply's 8 s", took)
	}
}

// TestStoppedMidValue: a memcached that stops reading in the middle of a
// value fails the set with a timeout once it stopped: progress moves the
// deadlines, and a stall still ends them. memcached, whose receive
// buffer is small as the client's send buffer is, reads when the test
// tells it, not at a relay's pace: a relay, in the test's process, was
// starved on a loaded machine for longer than the timeout, a stall of its
// own making. The set's caller allows far longer than the timeout: a
// stall that did not end the deadlines would reach the caller's deadline
// (ErrBehind), which a loaded machine's delays do not, rather than fail
// a bound on how late the failure may come.
func TestStoppedMidValue(t *testing.T) {
	const timeout = 2 * time.Second
	addr, read := absorbingMC(t, 1<<20)
	c := New(Options{Conns: 1, Timeout: timeout, Dial: smallSendBuffer(addr, false)})
	defer c.Close()
	setErr := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _, err := c.Do(ctx, op.Op{Verb: op.Set, Item: op.Item{Value: bytes.Repeat([]byte("v"), 1<<20)}}, "k")
		setErr <- err
	}()
	var cn *conn
	for ; cn == nil; cn = c.small.slots[0].c.Load() {
		time.Sleep(time.Millisecond)
	}
	var owed time.Time
	for owed.IsZero() { // the set's write has begun
		cn.mu.Lock()
		owed = cn.readBy
		cn.mu.Unlock()
		time.Sleep(time.Millisecond)
	}
	// Progress counts an eighth of the timeout after the deadline was set
	// (moved): memcached reads once that has passed.
	time.Sleep(timeout/8 + 10*time.Millisecond)
	read(256 << 10)
	for moved := false; !moved; time.Sleep(time.Millisecond) {
		select {
		case err := <-setErr:
			t.Fatalf("the set ended (%v) while memcached read it", err)
		default:
		}
		cn.mu.Lock()
		moved = cn.readBy.After(owed)
		cn.mu.Unlock()
	}
	// memcached reads no more.
	err := <-setErr
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("set to a memcached that stopped reading mid-value: %v, want a timeout", err)
	}
	if errors.Is(err, ErrBehind) {
		t.Errorf("set to a memcached that stopped reading mid-value: %v, want a stall, not ErrBehind: the deadlines moved with nothing moving", err)
	}
}

// absorbingMC is a memcached for one set of a value of size bytes, on a
// socket with a small receive buffer, so that the client's kernel holds
// most of the value. It reads the value only when told: read(n) returns
// once it has read n more bytes of it; read(-1) once it has read the
// rest and answered STORED.
func absorbingMC(t *testing.T, size int) (addr string, read func(n int)) {
	t.Helper()
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 16<<10) })
	}}
	ln, err := lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	asks, dones := make(chan int), make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		br := bufio.NewReaderSize(c, 1024)
		left := int64(size) + 2 // the value and its CRLF
		line := false
		for {
			var n int
			select {
			case n = <-asks:
			case <-t.Context().Done():
				return
			}
			if !line {
				_, err = br.ReadString('\n') // the set's line
				line = true
			}
			if err == nil && n >= 0 {
				_, err = io.CopyN(io.Discard, br, int64(n))
				left -= int64(n)
			} else if err == nil {
				if _, err = io.CopyN(io.Discard, br, left); err == nil {
					_, err = c.Write([]byte("STORED\r\n"))
				}
			}
			dones <- err
		}
	}()
	return ln.Addr().String(), func(n int) {
		t.Helper()
		asks <- n
		if err := <-dones; err != nil {
			t.Fatalf("memcached reading the set: %v", err)
		}
	}
}

// TestRoomDropsValues: a read whose op.Op.Room refuses its value fails
// with ErrNoFit without the value being kept, alone or on a shared gets
// line, and the connection stays in step. The Room is the caller's own:
// on a shared line a read without one (a chunk of a large value, whose
// bytes its request already holds) gets its value whatever the others'
// say. Values under op.LentValue, misses and multi-key gets never ask,
// and whatever a reply reserved is released once it is handed out.
func TestRoomDropsValues(t *testing.T) {
	srv := memcachedtest.Start(t)
	c := New(Options{
		Timeout: 2 * time.Second,
		Dial: func(ctx context.Context) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", srv.Addr)
		},
	})
	defer c.Close()
	values := map[string]int{"huge": 100_000, "large": 20_000, "small": 100, "edge": bigValue - 1}
	for k, n := range values {
		if err := c.Set(&memcache.Item{Key: k, Value: bytes.Repeat([]byte(k[:1]), n)}); err != nil {
			t.Fatal(err)
		}
	}
	under50k := &testRoom{limit: 50_000 - 1}
	tests := []struct {
		key     string
		verb    op.Verb
		wantErr error
		asked   bool
	}{
		{"huge", op.Get, ErrNoFit, true},
		{"huge", op.GAT, ErrNoFit, true},
		{"large", op.Get, nil, true},
		{"large", op.GAT, nil, true},
		{"small", op.Get, nil, false},
		{"edge", op.Get, nil, false},
		{"missing", op.Get, memcache.ErrCacheMiss, false},
	}
	ctx := context.Background()
	for range 2 { // the connection is still in step after each refusal
		for _, tt := range tests {
			under50k.asked.Store(0)
			under50k.fits.Store(0)
			it, _, err := c.Do(ctx, op.Op{Verb: tt.verb, Room: under50k, Item: op.Item{Expiration: 60}}, tt.key)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("%s %s: %v, want %v", tt.verb, tt.key, err, tt.wantErr)
			}
			if err == nil && len(it.Value) != values[tt.key] {
				t.Fatalf("%s %s: %d bytes, want %d", tt.verb, tt.key, len(it.Value), values[tt.key])
			}
			// Asked to Reserve it, or, for a value refused before
			// (TestRefusedUnsent), whether it Fits.
			if got := under50k.asked.Load()+under50k.fits.Load() > 0; got != tt.asked {
				t.Errorf("%s %s: Room asked %v, want %v", tt.verb, tt.key, got, tt.asked)
			}
			if h := under50k.held.Load(); h != 0 {
				t.Errorf("%s %s: %d bytes still reserved after the reply", tt.verb, tt.key, h)
			}
		}
	}
	// Concurrent Gets share lines: a refusing caller gets ErrNoFit (or
	// the value, if another caller's read of the same key kept it); a
	// caller without a Room always gets the value.
	refuse := &testRoom{limit: 1}
	var wg sync.WaitGroup
	for w := range 64 {
		wg.Go(func() {
			key := []string{"huge", "large", "small"}[w%3]
			o := op.Op{Verb: op.Get}
			if w%2 == 0 {
				o.Room = refuse
			}
			it, _, err := c.Do(ctx, o, key)
			switch {
			case err == nil && len(it.Value) == values[key]:
			case errors.Is(err, ErrNoFit) && o.Room != nil && values[key] >= op.LentValue:
			default:
				t.Errorf("concurrent Get(%s), refusing Room %v: %v", key, o.Room != nil, err)
			}
		})
	}
	wg.Wait()
	items, err := c.GetMulti([]string{"huge", "small"})
	if err != nil || len(items["huge"].Value) != values["huge"] {
		t.Errorf("GetMulti: %d items, %v; want both", len(items), err)
	}
}

// TestLendOwnBuffers: a read with an op.Op.Room gets a value of
// LentValue bytes or more in a buffer its own Room lent, and no other
// read is answered with that buffer: Gets of the same key on one shared
// line each get their own. Smaller values and reads without a Room
// borrow nothing.
func TestLendOwnBuffers(t *testing.T) {
	srv := memcachedtest.Start(t)
	c := New(Options{
		Conns:   1, // one connection: concurrent Gets share lines
		Timeout: 2 * time.Second,
		Dial: func(ctx context.Context) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", srv.Addr)
		},
	})
	defer c.Close()
	values := map[string]int{"big": 100_000, "edge": op.LentValue, "under": op.LentValue - 1}
	for k, n := range values {
		if err := c.Set(&memcache.Item{Key: k, Value: bytes.Repeat([]byte(k[:1]), n)}); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	var mu sync.Mutex
	lentTo := map[*byte]int{} // first byte of each lent buffer → the reader it was lent to
	var wg sync.WaitGroup
	for w := range 96 {
		wg.Go(func() {
			key := []string{"big", "edge", "under"}[w%3]
			o := op.Op{Verb: op.Get}
			if w%2 == 0 {
				if w%4 == 0 {
					o.Verb, o.Item.Expiration = op.GAT, 600
				}
				o.Room = &testRoom{lend: func(n int) []byte {
					b := make([]byte, 0, n+w%7) // a capacity of its own, as a pool's class
					mu.Lock()
					lentTo[&b[:1][0]] = w
					mu.Unlock()
					return b
				}}
			}
			it, _, err := c.Do(ctx, o, key)
			if err != nil || len(it.Value) != values[key] || it.Value[0] != key[0] || it.Value[len(it.Value)-1] != key[0] {
				t.Errorf("%s %s: %v", o.Verb, key, err)
				return
			}
			mu.Lock()
			owner, lent := lentTo[&it.Value[:1][0]]
			mu.Unlock()
			switch want := o.Room != nil && values[key] >= op.LentValue; {
			case want && (!lent || owner != w):
				t.Errorf("%s %s by reader %d: in a buffer lent to reader %d (lent: %v)", o.Verb, key, w, owner, lent)
			case !want && lent:
				t.Errorf("%s %s by reader %d, Room %v: in a lent buffer", o.Verb, key, w, o.Room != nil)
			}
		})
	}
	wg.Wait()
}

// TestSlowSteadyReplies: replies that take longer than the timeout to
// arrive in all, a single 3 MB value or a gets line of several large
// values, while memcached sends steadily, fail nothing: the read
// deadline bounds a stall, not the size of a reply, and the node's
// connection stays up. (Each 256 KiB comes in an eighth of the timeout,
// a wide margin on a loaded machine.)
func TestSlowSteadyReplies(t *testing.T) {
	srv := memcachedtest.Start(t, "-I", "4m")
	addr := relay(t, srv.Addr, 2<<20, true) // 3 MB take 1.5 s
	c := New(Options{Conns: 1, Timeout: time.Second, Dial: func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	}})
	defer c.Close()
	big, mid := bytes.Repeat([]byte("b"), 3<<20), bytes.Repeat([]byte("m"), 1<<20)
	for k, v := range map[string][]byte{"big": big, "mid": mid} {
		if err := c.Set(&memcache.Item{Key: k, Value: v}); err != nil {
			t.Fatal(err)
		}
	}
	if it, err := c.Get("big"); err != nil || !bytes.Equal(it.Value, big) {
		t.Fatalf("get of a 3 MB value arriving over 1.5 s, timeout 1 s: %v", err)
	}
	// Concurrent Gets share lines: one reply of several values, 3 MB
	// in all.
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			if it, err := c.Get("mid"); err != nil || !bytes.Equal(it.Value, mid) {
				t.Errorf("concurrent get: %v", err)
			}
		})
	}
	wg.Wait()
}

// TestReadReplyLimitReleases: a value a reply's limit drops is not held
// of its Room. readReply asked the Room before it looked at the limit,
// so a value the Room reserved and the limit then dropped was held
// forever: nothing in holds said to give it back, and the budget shrank
// by the value's size on every such reply until it refused everything.
func TestReadReplyLimitReleases(t *testing.T) {
	big := strings.Repeat("v", bigValue)
	value := func(key string) string { return fmt.Sprintf("VALUE %s 0 %d 1\r\n%s\r\n", key, len(big), big) }
	rm := &testRoom{}
	br := bufio.NewReader(strings.NewReader(value("a") + value("b") + "END\r\n"))
	var holds []held
	r, err := readReply(br, op.Items, "gets", nil, nil, replyLimit{bytes: len(big)}, []op.Room{rm}, &holds, nil, nil)
	if err != nil || r.err != nil {
		t.Fatalf("readReply: %v, %v", err, r.err)
	}
	if len(r.items) != 1 || r.items[0].Key != "a" || !slices.Equal(r.dropped, []string{"b"}) {
		t.Fatalf("kept %d items, dropped %v; want a kept, b dropped", len(r.items), r.dropped)
	}
	for _, h := range holds {
		h.room.Release(h.n)
	}
	if n := rm.held.Load(); n != 0 {
		t.Errorf("the room holds %d bytes after the reply's release; want 0", n)
	}
}

// TestGetMultiLimitRoom: with a Room, a multi-key get asks it for every
// value before reading it, small ones too; a value it refuses is read
// off and its key returned in nofit, never in items; the command goes
// on the large lane, so that small requests do not wait behind its
// reply; and once a key's value is known to be large, it is refused
// unsent while the Room could not take that size.
func TestGetMultiLimitRoom(t *testing.T) {
	srv := memcachedtest.Start(t)
	c := newClient(srv.Addr, 1, nil)
	defer c.Close()
	values := map[string][]byte{
		"small": []byte("vv"),
		"mid":   bytes.Repeat([]byte("m"), 4000),
		"big":   bytes.Repeat([]byte("b"), bigValue),
	}
	for k, v := range values {
		if err := c.Set(&memcache.Item{Key: k, Value: v}); err != nil {
			t.Fatal(err)
		}
	}
	keys := []string{"small", "mid", "big", "absent"}
	tests := []struct {
		name      string
		limit     int64 // the room's
		wantItems []string
		wantNoFit []string
		wantAsked int64 // Reserve calls
	}{
		{"room for all", 0, []string{"big", "mid", "small"}, nil, 3},
		{"room for the small ones", 5000, []string{"mid", "small"}, []string{"big"}, 3},
		{"room for none", 1, nil, []string{"big", "mid", "small"}, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c.hints.Forget("big") // each case reads it afresh
			rm := &testRoom{limit: tt.limit}
			items, dropped, nofit, err := c.GetMultiLimit(t.Context(), keys, 0, rm, false)
			if err != nil || len(dropped) > 0 {
				t.Fatalf("GetMultiLimit: %v, dropped %v", err, dropped)
			}
			got := slices.Sorted(maps.Keys(items))
			slices.Sort(nofit)
			if !slices.Equal(got, tt.wantItems) || !slices.Equal(nofit, tt.wantNoFit) {
				t.Fatalf("items %v, nofit %v; want %v, %v", got, nofit, tt.wantItems, tt.wantNoFit)
			}
			for k, it := range items {
				if !bytes.Equal(it.Value, values[k]) {
					t.Errorf("%s: %d bytes, want %d", k, len(it.Value), len(values[k]))
				}
			}
			if n := rm.asked.Load(); n != tt.wantAsked {
				t.Errorf("the room was asked %d times, want %d (every value found)", n, tt.wantAsked)
			}
			if n := rm.held.Load(); n != 0 {
				t.Errorf("the room holds %d bytes once the reply is handed out; want 0", n)
			}
			if c.large.slots[0].c.Load() == nil {
				t.Errorf("no connection of the large lane was dialled: the command went on the small lane")
			}
		})
	}
	// "big" is now known to be large: a room that cannot take it is not
	// asked for it again, and memcached is not asked for it at all.
	rm := &testRoom{limit: 5000}
	gets := func() int {
		st, err := srv.Stats()
		if err != nil {
			t.Fatal(err)
		}
		n, _ := strconv.Atoi(st["cmd_get"])
		return n
	}
	before := gets()
	items, _, nofit, err := c.GetMultiLimit(t.Context(), []string{"big", "small"}, 0, rm, false)
	if err != nil || len(items) != 1 || !slices.Equal(nofit, []string{"big"}) {
		t.Fatalf("GetMultiLimit with a known large value: %v, %d items, nofit %v; want small only, big refused", err, len(items), nofit)
	}
	if n := rm.asked.Load(); n != 1 {
		t.Errorf("the room was asked %d times, want 1 (small only)", n)
	}
	if n := gets() - before; n != 1 {
		t.Errorf("memcached was asked for %d keys, want 1 (small; big refused unsent)", n)
	}
}

// TestQueueStartsAgainInPlace (issue #20): a connection whose queue every
// reply empties, as one request at a time leaves it, queues the next
// request at the front of the array it used, not in a new one per
// request, and that array holds no answered call.
func TestQueueStartsAgainInPlace(t *testing.T) {
	m := memcachedtest.Start(t)
	c := newClient(m.Addr, 1, nil)
	t.Cleanup(func() { c.Close() })
	if err := c.Set(&memcache.Item{Key: "k", Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	cn := c.small.slots[0].c.Load()
	front := func() **call {
		cn.mu.Lock()
		defer cn.mu.Unlock()
		if cap(cn.qfront) == 0 {
			return nil
		}
		for _, cl := range cn.qfront[:cap(cn.qfront)] {
			if cl != nil {
				t.Errorf("the queue's array holds a call with nothing queued")
			}
		}
		return unsafe.SliceData(cn.qfront)
	}
	first := front()
	if first == nil {
		t.Fatal("no queue array kept after a request")
	}
	for i := range 10 {
		if _, err := c.Get("k"); err != nil {
			t.Fatal(err)
		}
		if got := front(); got != first {
			t.Fatalf("request %d queued in a new array", i+2)
		}
	}
}

// TestReplyItemsInLinedArray (issue #20): a shared line's items go in
// the reader's array when it has room for them, which share empties
// again, and a reply of its own's, which its call keeps, never do.
func TestReplyItemsInLinedArray(t *testing.T) {
	value := "VALUE a 0 1 1\r\nx\r\nVALUE b 0 1 2\r\ny\r\nEND\r\n"
	tests := []struct {
		name          string
		lineKeys      []string
		asked         []string
		lined         int
		wantInLined   bool
		wantItemsKeys []string
	}{
		{"shared line, room", []string{"a", "b"}, nil, 4, true, []string{"a", "b"}},
		{"shared line, too small", []string{"a", "b"}, nil, 1, false, []string{"a", "b"}},
		{"reply of its own", nil, []string{"a", "b"}, 4, false, []string{"a", "b"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lined := linedItems{items: make([]*memcache.Item, 0, tt.lined), vals: make([]memcache.Item, tt.lined)}
			br := bufio.NewReader(strings.NewReader(value))
			r, err := readReply(br, op.Items, "gets", tt.lineKeys, tt.asked, replyLimit{}, nil, nil, nil, &lined)
			if err != nil || r.err != nil {
				t.Fatalf("readReply: %v, %v", err, r.err)
			}
			var keys []string
			for _, it := range r.items {
				keys = append(keys, it.Key)
			}
			if !slices.Equal(keys, tt.wantItemsKeys) {
				t.Errorf("items %v, want %v", keys, tt.wantItemsKeys)
			}
			if in := unsafe.SliceData(r.items) == unsafe.SliceData(lined.items); in != tt.wantInLined {
				t.Errorf("items in the reader's array: %v, want %v", in, tt.wantInLined)
			}
			for i, it := range r.items {
				if in := it == &lined.vals[min(i, len(lined.vals)-1)]; in != tt.wantInLined {
					t.Errorf("item %d in the reader's array of items: %v, want %v", i, in, tt.wantInLined)
				}
			}
		})
	}
}
