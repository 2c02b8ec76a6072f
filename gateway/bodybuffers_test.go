package gateway

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/gateway/budget"
	"github.com/memcgate/memcgate/gateway/bufpool/bufpooltest"
	"github.com/memcgate/memcgate/gateway/h1"
	"github.com/memcgate/memcgate/upstream"
	"github.com/memcgate/memcgate/upstream/op"
)

// lendingStore is a fake Store that checks with its lender that every
// value it is given is still lent to its request, and whose DoAsync keeps
// only a copy and answers later, as upstream's does.
type lendingStore struct {
	*fakeStore
	l     *bufpooltest.Lender
	async bool        // DoAsync takes the call; else it declines
	seen  func(op.Op) // if set, sees every Do's operation
}

func (s *lendingStore) Do(ctx context.Context, o op.Op) op.Result {
	s.l.Using("Do", o.Item.Value)
	if s.seen != nil {
		s.seen(o)
	}
	return lend(o, s.fakeStore.Do(ctx, o))
}

// lend answers a read of o with its value held by o.Room while it is
// read and in a buffer the Room lends, as upstream's pipelined pools do.
func lend(o op.Op, res op.Result) op.Result {
	if v := res.Item.Value; o.Room != nil && res.Err == nil && len(v) >= op.LentValue {
		if !o.Room.Reserve(len(v)) {
			return op.Result{Err: upstream.ErrNoFit}
		}
		res.Item.Value = append(o.Room.Lend(len(v)), v...)
		res.Lent = true
		o.Room.Release(len(v))
	}
	return res
}

func (s *lendingStore) DoAsync(ctx context.Context, o op.Op, done func(op.Result)) bool {
	if !s.async {
		return false
	}
	s.l.Using("DoAsync", o.Item.Value)
	o.Item.Value = bytes.Clone(o.Item.Value)
	go func() {
		time.Sleep(time.Millisecond)
		done(lend(o, s.fakeStore.Do(ctx, o)))
	}()
	return true
}

// startLending serves a gateway over s on h1, wired as memcgate wires
// them: bodies read ahead and taken without a copy, and lent by l to
// both, under bg.
func startLending(t *testing.T, s *lendingStore, bg *budget.Budget) string {
	t.Helper()
	opts := Options{Budget: bg, Buffers: s.l, TakeBody: h1.TakeAhead, MaxValueBytes: 1 << 20}
	if s.async {
		opts.Async = s
	}
	h := NewHandler(s, slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry(), opts)
	quiet := log.New(io.Discard, "", 0)
	srv := &h1.Server{Handler: h, Detached: h.ServeDetached, Fallback: &http.Server{Handler: h, ErrorLog: quiet}, ErrorLog: quiet, NewContext: h.NewContext,
		BodyLimit: h.BodyLimit, Budget: bg, Buffers: s.l}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	ctx, cancel := context.WithCancel(context.Background())
	go h.Run(ctx) // the queue of Prefer: respond-async writes
	t.Cleanup(func() {
		srv.Close()
		cancel()
	})
	return ln.Addr().String()
}

// TestPooledValues: PUT values of every size class, from many clients at
// once, through h1 with its read ahead and the handler's routed and
// detached paths, and with the Store failing: memcached (the fake
// Store) always gets the bytes sent, every value reaches it in a buffer
// still lent to its request, each buffer is given back once, and the
// budget holds nothing afterwards. A write queued with Prefer:
// respond-async keeps its buffer.
func TestPooledValues(t *testing.T) {
	tests := []struct {
		name   string
		async  bool  // the Store takes detached writes (DoAsync)
		fail   error // what the Store answers
		prefer bool  // Prefer: respond-async
	}{
		{name: "routed"},
		{name: "detached", async: true},
		{name: "store fails", fail: upstream.ErrNoNodes},
		{name: "respond-async", prefer: true},
	}
	sizes := []int{10, 3000, 5000, 16 << 10, 20_000, 100_000, 300_000}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := bufpooltest.New()
			bg := budget.New(64 << 20)
			s := &lendingStore{fakeStore: newFake(), l: l, async: tt.async}
			s.Err = tt.fail
			addr := startLending(t, s, bg)
			const clients = 8
			var wg sync.WaitGroup
			for i := range clients {
				wg.Go(func() {
					c, err := net.Dial("tcp", addr)
					if err != nil {
						t.Error(err)
						return
					}
					defer c.Close()
					c.SetDeadline(time.Now().Add(5 * time.Second))
					br := bufio.NewReader(c)
					for j, size := range sizes {
						key := fmt.Sprintf("k%d-%d", i, j)
						value := strings.Repeat(string(rune('a'+i)), size)
						prefer := ""
						if tt.prefer {
							prefer = "Prefer: respond-async\r\n"
						}
						// The head, then the body in two writes: most of it
						// arrives after the head, and is read ahead.
						fmt.Fprintf(c, "PUT /%s HTTP/1.1\r\nHost: a\r\n%sContent-Length: %d\r\n\r\n%s", key, prefer, size, value[:size/2])
						io.WriteString(c, value[size/2:])
						resp, err := http.ReadResponse(br, nil)
						if err != nil {
							t.Errorf("PUT %s: %v", key, err)
							return
						}
						io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						want := http.StatusCreated
						switch {
						case tt.fail != nil:
							want = http.StatusServiceUnavailable
						case tt.prefer:
							want = http.StatusAccepted
						}
						if resp.StatusCode != want {
							t.Errorf("PUT %s: %s, want %d", key, resp.Status, want)
						}
					}
				})
			}
			wg.Wait()
			if tt.fail == nil {
				waitFor(t, fmt.Sprintf("%d values stored", clients*len(sizes)), func() bool {
					s.Mu.Lock()
					defer s.Mu.Unlock()
					return len(s.Items) == clients*len(sizes)
				})
				s.Mu.Lock()
				for i := range clients {
					for j, size := range sizes {
						key := fmt.Sprintf("k%d-%d", i, j)
						want := strings.Repeat(string(rune('a'+i)), size)
						if got := string(s.Items[key].Value); got != want {
							t.Errorf("%s holds %d bytes %.20q…, want %d of %q", key, len(got), got, size, want[:1])
						}
					}
				}
				s.Mu.Unlock()
			}
			waitFor(t, "the budget to hold nothing", func() bool { return bg.Used() == 0 })
			if n := l.Lent(); !tt.prefer && n != 0 {
				t.Errorf("%d buffers not given back", n)
			}
			l.Check(t)
		})
	}
}

// TestAsyncValuesFit: a write queued with Prefer: respond-async keeps
// its value in a buffer at most an eighth larger than the value (or of
// the allocator's smallest size), as the
// queue and the budget count only the value: bodies with Content-Length
// and chunked ones (read into at least 16 KiB), of every size class. A
// copied value's buffer is given back.
func TestAsyncValuesFit(t *testing.T) {
	sizes := []int{0, 1, 10, 3000, 4096, 5000, 16 << 10, 20_000, 100_000, 300_000}
	for _, chunked := range []bool{false, true} {
		t.Run(map[bool]string{false: "Content-Length", true: "chunked"}[chunked], func(t *testing.T) {
			l := bufpooltest.New()
			bg := budget.New(64 << 20)
			var mu sync.Mutex
			kept := map[string][2]int{} // key → len, cap of the value applied
			s := &lendingStore{fakeStore: newFake(), l: l, seen: func(o op.Op) {
				mu.Lock()
				kept[o.Item.Key] = [2]int{len(o.Item.Value), cap(o.Item.Value)}
				mu.Unlock()
			}}
			addr := startLending(t, s, bg)
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(5 * time.Second))
			br := bufio.NewReader(c)
			for _, size := range sizes {
				value := strings.Repeat("v", size)
				if chunked {
					fmt.Fprintf(c, "PUT /k%d HTTP/1.1\r\nHost: a\r\nPrefer: respond-async\r\nTransfer-Encoding: chunked\r\n\r\n", size)
					if size > 0 {
						fmt.Fprintf(c, "%x\r\n%s\r\n", size, value)
					}
					io.WriteString(c, "0\r\n\r\n")
				} else {
					fmt.Fprintf(c, "PUT /k%d HTTP/1.1\r\nHost: a\r\nPrefer: respond-async\r\nContent-Length: %d\r\n\r\n%s", size, size, value)
				}
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusAccepted {
					t.Fatalf("PUT of %d bytes: %s", size, resp.Status)
				}
			}
			waitFor(t, "every write applied", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return len(kept) == len(sizes)
			})
			for _, size := range sizes {
				lc := kept[fmt.Sprint("k", size)]
				if lc[0] != size || lc[1] > max(size+size/8, 16) { // 16: the allocator's smallest size class
					t.Errorf("a value of %d bytes was queued as %d bytes in a buffer of %d", size, lc[0], lc[1])
				}
			}
			waitFor(t, "the budget to hold nothing", func() bool { return bg.Used() == 0 })
			l.Check(t)
		})
	}
}

// TestLentValuesGoBack: GET, ranged GET and HEAD values of every size class, from
// many clients at once, on the routed and detached paths: a value of
// op.LentValue bytes or more is read into a buffer lent for it, every
// response has the stored value's bytes (a buffer given back before its
// response was written is poisoned and lent again at once), and every
// lent buffer is given back once.
func TestLentValuesGoBack(t *testing.T) {
	sizes := []int{10, 5000, op.LentValue - 1, op.LentValue, 20_000, 100_000, 300_000}
	for _, async := range []bool{false, true} {
		t.Run(map[bool]string{false: "routed", true: "detached"}[async], func(t *testing.T) {
			l := bufpooltest.New()
			bg := budget.New(64 << 20)
			s := &lendingStore{fakeStore: newFake(), l: l, async: async}
			for j, size := range sizes {
				s.Items[fmt.Sprint("v", j)] = op.Item{Value: bytes.Repeat([]byte{byte('a' + j)}, size)}
			}
			addr := startLending(t, s, bg)
			const clients, rounds = 8, 4
			var wg sync.WaitGroup
			for i := range clients {
				wg.Go(func() {
					c, err := net.Dial("tcp", addr)
					if err != nil {
						t.Error(err)
						return
					}
					defer c.Close()
					c.SetDeadline(time.Now().Add(5 * time.Second))
					br := bufio.NewReader(c)
					for r := range rounds {
						for j, size := range sizes {
							method, rng := "GET", ""
							switch (i + r + j) % 4 {
							case 0:
								method = "HEAD"
							case 1:
								rng = "Range: bytes=1-\r\n" // a slice of the lent buffer
							}
							fmt.Fprintf(c, "%s /v%d HTTP/1.1\r\nHost: a\r\n%s\r\n", method, j, rng)
							resp, err := http.ReadResponse(br, &http.Request{Method: method})
							if err != nil {
								t.Errorf("%s v%d: %v", method, j, err)
								return
							}
							got, err := io.ReadAll(resp.Body)
							resp.Body.Close()
							want, status, cl := bytes.Repeat([]byte{byte('a' + j)}, size), 200, size
							switch {
							case method == "HEAD":
								want = nil
							case rng != "":
								want, status, cl = want[1:], 206, size-1
							}
							if err != nil || resp.StatusCode != status || resp.ContentLength != int64(cl) || !bytes.Equal(got, want) {
								t.Errorf("%s%s v%d = %s, %d bytes %.20q…, %v; want %d and %d bytes of %q", method, rng, j, resp.Status, len(got), got, err, status, len(want), rune('a'+j))
								return
							}
						}
					}
				})
			}
			wg.Wait()
			waitFor(t, "the budget to hold nothing", func() bool { return bg.Used() == 0 })
			waitFor(t, "every lent buffer back", func() bool { return l.Lent() == 0 })
			l.Check(t)
		})
	}
}

// TestBodyHeldWhole: a body read by the handler itself (not read ahead
// by h1: net/http's connections) holds the budget for all of its
// Content-Length once its first firstBodyBuf bytes and an eighth of it
// have come, or is refused then with 503 before the rest is read.
func TestBodyHeldWhole(t *testing.T) {
	const cl, first = 300 << 10, 80 << 10 // first: more than an eighth, past the 64 KiB buffer that doubling reaches by then
	tests := []struct {
		name   string
		budget int64
		want   int
	}{
		{"fits", 1 << 20, http.StatusCreated},
		{"does not fit", 256 << 10, http.StatusServiceUnavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bg := budget.New(tt.budget)
			log := slog.New(slog.NewTextHandler(io.Discard, nil))
			h := NewHandler(newFake(), log, prometheus.NewRegistry(), Options{Budget: bg, MaxValueBytes: 1 << 20})
			pr, pw := io.Pipe()
			req := httptest.NewRequest(http.MethodPut, "/k", pr)
			req.ContentLength = cl
			w := httptest.NewRecorder()
			done := make(chan struct{})
			go func() {
				defer close(done)
				h.ServeHTTP(w, req)
				pr.CloseWithError(errors.New("handler returned"))
			}()
			// The first bytes: the handler may refuse before it has
			// read all of them, which then fails this write.
			firstErr := make(chan error, 1)
			go func() {
				_, err := pw.Write(bytes.Repeat([]byte("v"), first))
				firstErr <- err
			}()
			if tt.want == http.StatusCreated {
				if err := <-firstErr; err != nil {
					t.Fatal(err)
				}
				waitFor(t, "the whole body to be held", func() bool { return bg.Used() >= cl })
				if _, err := pw.Write(bytes.Repeat([]byte("v"), cl-first)); err != nil {
					t.Fatal(err)
				}
			}
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				t.Fatalf("no answer with %d of %d bytes sent; budget holds %d", first, cl, bg.Used())
			}
			if w.Code != tt.want {
				t.Errorf("%d %s, want %d", w.Code, w.Body, tt.want)
			}
			if u := bg.Used(); u != 0 {
				t.Errorf("budget holds %d bytes after the request", u)
			}
		})
	}
}
