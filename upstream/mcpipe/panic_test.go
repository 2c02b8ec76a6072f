package mcpipe

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream/op"
	"github.com/memcgate/memcgate/upstream/panicguard"
)

// panicRoom is a testRoom whose Reserve panics on its nth call, as a
// bug in a caller's budget would, on the connection's reply reader.
type panicRoom struct {
	testRoom
	nth   int64
	calls atomic.Int64
}

func (r *panicRoom) Reserve(n int) bool {
	if r.calls.Add(1) == r.nth {
		panic("planted: Reserve")
	}
	return r.testRoom.Reserve(n)
}

// TestPanicsStopped: a panic in a DoAsync callback ends that callback
// alone: the connection goes on (not closed) and the next call on it is
// answered. A panic on the reply reader (a Room's Reserve, in the middle
// of a multi-key reply) fails the connection, whose place in the stream
// is unknown: its call gets an error rather than waiting for ever, what
// the reply held of the Room and of the server's Share goes back, and
// the next call dials again and is answered. Each panic is counted under
// its where. Without Options.Panics either panic ends the test binary.
func TestPanicsStopped(t *testing.T) {
	srv := memcachedtest.Start(t)
	const size = 10 << 10 // of a two-byte pattern: values of op.LentValue bytes and more, held through the Room
	tests := []struct {
		name   string
		where  string
		closes int64 // connections closed by the panic
		run    func(t *testing.T, c *Client, share *testShare)
	}{
		{"callback", "mcpipe_callback", 0, func(t *testing.T, c *Client, _ *testShare) {
			ran := make(chan struct{})
			err := c.DoAsync(t.Context(), op.Op{Verb: op.Get}, "k0", func(*memcache.Item, uint64, error) {
				close(ran)
				panic("planted: callback")
			})
			if err != nil {
				t.Fatalf("DoAsync = %v", err)
			}
			<-ran
		}},
		{"reader", "mcpipe_reader", 1, func(t *testing.T, c *Client, share *testShare) {
			room := &panicRoom{nth: 2}
			_, _, _, err := c.GetMultiLimit(t.Context(), []string{"k0", "k1", "k2"}, 0, room, false)
			if err == nil {
				t.Fatal("GetMultiLimit whose reader panicked = nil error, want the connection's failure")
			}
			if h := room.held.Load(); h != 0 {
				t.Errorf("Room holds %d bytes after the failed reply, want 0", h)
			}
			if h := share.held.Load(); h != 0 {
				t.Errorf("Share holds %d bytes after the failed reply, want 0", h)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := panicguard.New(slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry())
			share := &testShare{limit: 1 << 30}
			var closed atomic.Int64
			c := New(Options{Conns: 1, Timeout: 5 * time.Second, Share: share, Panics: g, Closed: func() { closed.Add(1) },
				Dial: func(ctx context.Context) (net.Conn, error) {
					var d net.Dialer
					return d.DialContext(ctx, "tcp", srv.Addr)
				}})
			t.Cleanup(func() { c.Close() })
			for _, k := range []string{"k0", "k1", "k2"} {
				if err := set(t.Context(), c, k, bytes.Repeat([]byte(k), size)); err != nil {
					t.Fatal(err)
				}
			}
			tt.run(t, c, share)
			deadline := time.Now().Add(3 * time.Second)
			for g.Stopped(tt.where) != 1 && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			if n := g.Stopped(tt.where); n != 1 {
				t.Errorf("memcgate_panics_total{where=%q} = %v, want 1", tt.where, n)
			}
			if n := closed.Load(); n != tt.closes {
				t.Errorf("%d connections closed by the panic, want %d", n, tt.closes)
			}
			it, _, err := c.Do(t.Context(), op.Op{Verb: op.Get}, "k1")
			if err != nil || !bytes.Equal(it.Value, bytes.Repeat([]byte("k1"), size)) {
				t.Errorf("Get after the panic = %v, want the value", err)
			}
		})
	}
}

// TestEncodePanicFailsConnection: a request whose encoding panics (a bug)
// while send holds the connection's lock lets go of it and fails the
// connection: the panic reaches send's caller, the part of a command it
// left unsent never reaches memcached, and the next call dials again and
// is answered. With the lock kept, every later call on the connection,
// and its reply reader, would wait for ever.
func TestEncodePanicFailsConnection(t *testing.T) {
	srv := memcachedtest.Start(t)
	var closed atomic.Int64
	c := New(Options{Conns: 1, Timeout: 5 * time.Second, Closed: func() { closed.Add(1) },
		Dial: func(ctx context.Context) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", srv.Addr)
		}})
	stuck := false // Close would wait on the lock for ever
	t.Cleanup(func() {
		if !stuck {
			c.Close()
		}
	})
	if err := set(t.Context(), c, "k", []byte("before")); err != nil {
		t.Fatal(err)
	}
	cn, err := c.conn(&c.small)
	if err != nil {
		t.Fatal(err)
	}
	cl := c.newCall()
	cl.kind, cl.verb = op.Stored, "set"
	cl.encode = func(b []byte) []byte {
		b = append(b, "set k 0 0 5\r\nafte"...) // a command cut short
		panic("planted: encode")
	}
	func() {
		defer func() {
			if p := recover(); p != "planted: encode" {
				t.Errorf("send recovered %v, want the planted panic to reach its caller", p)
			}
		}()
		cn.send(cl)
	}()
	failed := make(chan bool, 1)
	go func() { failed <- cn.failed() }()
	select {
	case f := <-failed:
		if !f {
			t.Error("the connection whose request panicked while encoded did not fail")
		}
	case <-time.After(3 * time.Second):
		stuck = true
		t.Fatal("the connection's lock is still held 3 s after the panic")
	}
	it, _, err := c.Do(t.Context(), op.Op{Verb: op.Get}, "k")
	if err != nil || string(it.Value) != "before" {
		t.Errorf("Get after the panic = %v, %v; want the value set before it", it, err)
	}
	if n := closed.Load(); n != 1 {
		t.Errorf("%d connections closed, want 1", n)
	}
}
