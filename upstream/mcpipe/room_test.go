package mcpipe

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream/op"
)

// slowClient is a Client of one connection to srv through a relay that
// passes about rate bytes a second, with small socket buffers on the way,
// so that what is queued stays in the Client rather than in the kernel.
func slowClient(t *testing.T, srv *memcachedtest.Server, rate int) *Client {
	t.Helper()
	addr := slowRelay(t, srv.Addr, rate)
	c := New(Options{Conns: 1, Timeout: 2 * time.Second, Dial: func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		nc, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			_ = nc.(*net.TCPConn).SetWriteBuffer(16 << 10)
		}
		return nc, err
	}})
	t.Cleanup(func() { c.Close() })
	// Dial now, so that DoAsync has a connection.
	if err := c.Set(&memcache.Item{Key: "warm", Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	return c
}

// roomState is the room accounting of c's only connection.
func roomState(c *Client) (values, waiters int) {
	cn := c.small.slots[0].c.Load()
	cn.mu.Lock()
	defer cn.mu.Unlock()
	return cn.values, len(cn.waiters)
}

// queuedKeys counts the calls for keys queued on c's only connection
// and not yet answered, and the large values waiting for room there,
// both at one instant.
func queuedKeys(c *Client, keys ...string) (queued, waiters int) {
	cn := c.small.slots[0].c.Load()
	cn.mu.Lock()
	defer cn.mu.Unlock()
	for _, cl := range cn.queue {
		calls := cl.peer
		if len(calls) == 0 {
			calls = []*call{cl}
		}
		for _, p := range calls {
			if slices.Contains(keys, p.key) || slices.Contains(keys, p.skey) {
				queued++
			}
		}
	}
	return queued, len(cn.waiters)
}

// waitFor polls cond until it holds, failing the test after 5 seconds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("still waiting for %s", what)
		}
	}
}

func set(ctx context.Context, c *Client, key string, value []byte) error {
	_, _, err := c.Do(ctx, op.Op{Verb: op.Set, Item: op.Item{Value: value}}, key)
	return err
}

// TestRoomForLargeValues: large values queue on a connection only while
// their bytes not yet written stay within maxQueuedValues; the rest wait
// for room, in order, as long as their context allows; small operations
// and DoAsync never wait for it.
func TestRoomForLargeValues(t *testing.T) {
	srv := memcachedtest.Start(t, "-I", "2m")
	big := bytes.Repeat([]byte("b"), 600<<10) // two do not fit in the bound
	tests := []struct {
		name string
		rate int
		run  func(t *testing.T, c *Client)
	}{
		{"values wait for room and all get stored", 4 << 20, func(t *testing.T, c *Client) {
			var wg sync.WaitGroup
			var done atomic.Int32
			for i := range 4 {
				wg.Go(func() {
					defer done.Add(1)
					if err := set(t.Context(), c, "w"+string(rune('0'+i)), big); err != nil {
						t.Errorf("set w%d: %v", i, err)
					}
				})
			}
			sawWaiter := false
			for done.Load() < 4 {
				values, waiters := roomState(c)
				sawWaiter = sawWaiter || waiters > 0
				if values > max(maxQueuedValues, len(big)) {
					t.Errorf("%d bytes of values queued, want at most %d", values, max(maxQueuedValues, len(big)))
				}
				time.Sleep(time.Millisecond)
			}
			wg.Wait()
			if !sawWaiter {
				t.Error("no value waited for room")
			}
			for i := range 4 {
				if it, err := c.Get("w" + string(rune('0'+i))); err != nil || !bytes.Equal(it.Value, big) {
					t.Errorf("get w%d: %v", i, err)
				}
			}
		}},
		{"a wait ends with the caller's deadline and sends nothing", 1 << 20, func(t *testing.T, c *Client) {
			first := make(chan error, 1)
			go func() { first <- set(context.Background(), c, "d1", big) }()
			waitFor(t, "the first value to queue", func() bool { v, _ := roomState(c); return v > 0 })
			ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
			defer cancel()
			start := time.Now()
			err := set(ctx, c, "d2", big)
			if !errors.Is(err, ErrNoRoom) || !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("set with a deadline = %v, want ErrNoRoom and context.DeadlineExceeded", err)
			}
			if took := time.Since(start); took > time.Second {
				t.Errorf("the wait took %v, want about 100ms", took)
			}
			if err := <-first; err != nil {
				t.Errorf("first set: %v", err)
			}
			waitFor(t, "the room to be given back", func() bool { v, w := roomState(c); return v == 0 && w == 0 })
			if _, err := c.Get("d2"); !errors.Is(err, memcache.ErrCacheMiss) {
				t.Errorf("get d2 = %v, want a miss: nothing was sent", err)
			}
		}},
		{"small operations and DoAsync do not wait", 2 << 20, func(t *testing.T, c *Client) {
			var wg sync.WaitGroup
			wg.Go(func() {
				if err := set(t.Context(), c, "s1", big); err != nil {
					t.Errorf("set s1: %v", err)
				}
			})
			waitFor(t, "the first value to queue", func() bool { v, _ := roomState(c); return v > 0 })
			wg.Go(func() {
				if err := set(t.Context(), c, "s2", big); err != nil {
					t.Errorf("set s2: %v", err)
				}
			})
			waitFor(t, "the second value to wait", func() bool { _, w := roomState(c); return w == 1 })
			// ErrNoRoom is the proof it did not wait: a DoAsync that waited
			// for room would be queued once s1's bytes were written.
			err := c.DoAsync(context.Background(), op.Op{Verb: op.Set, Item: op.Item{Value: big}}, "a1", func(*memcache.Item, uint64, error) {
				t.Error("a refused DoAsync called back")
			})
			if !errors.Is(err, ErrNoRoom) {
				t.Errorf("large DoAsync while a value waits = %v, want ErrNoRoom", err)
			}
			// Sent while s1 is being written, they queue at once, ahead of
			// s2, which waits for s1's bytes to be written. (Their replies
			// may still come with s2's: memcached sends the replies to
			// requests it read together with a set's command line once it
			// has read that set's value, so whether they come first
			// depends on where TCP cut the bytes.)
			var small sync.WaitGroup
			small.Go(func() {
				if err := set(t.Context(), c, "small", []byte("v")); err != nil {
					t.Errorf("small set: %v", err)
				}
			})
			small.Go(func() {
				if _, err := c.Get("warm"); err != nil {
					t.Errorf("get: %v", err)
				}
			})
			waiting := -1
			waitFor(t, "the small set and get to queue", func() bool {
				var n int
				n, waiting = queuedKeys(c, "small", "warm")
				return n == 2
			})
			if waiting != 1 {
				t.Error("a small set and get waited behind a value waiting for room")
			}
			small.Wait()
			asyncDone := make(chan error, 1)
			if err := setAsync(c, &memcache.Item{Key: "a2", Value: []byte("v")}, func(err error) { asyncDone <- err }); err != nil {
				t.Errorf("small DoAsync while a value waits: %v", err)
			} else if err := <-asyncDone; err != nil {
				t.Errorf("small DoAsync: %v", err)
			}
			wg.Wait()
		}},
		{"DoAsync takes room when there is some", 4 << 20, func(t *testing.T, c *Client) {
			value := bytes.Clone(big)
			asyncDone := make(chan error, 1)
			if err := setAsync(c, &memcache.Item{Key: "a3", Value: value}, func(err error) { asyncDone <- err }); err != nil {
				t.Fatalf("large DoAsync on an idle connection: %v", err)
			}
			clear(value) // DoAsync keeps no value
			if err := <-asyncDone; err != nil {
				t.Errorf("large DoAsync: %v", err)
			}
			if it, err := c.Get("a3"); err != nil || !bytes.Equal(it.Value, big) {
				t.Errorf("get a3: %v", err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := slowClient(t, srv, tt.rate)
			tt.run(t, c)
			if v, w := roomState(c); v != 0 || w != 0 {
				t.Errorf("after the test %d bytes of room taken and %d waiters, want none", v, w)
			}
		})
	}
}

// plainConn hides the *net.TCPConn it wraps, so that net.Buffers writes
// piece by piece instead of with writev.
type plainConn struct{ net.Conn }

// TestSegmentsWriteExactBytes: requests queued together, their large
// values written from the callers' buffers, reach the server byte for
// byte as op.Encode encodes them, through writev and through a
// connection that has no writev, with values at the thresholds (bigValue,
// writeSlice) and values that contain "\r\n".
func TestSegmentsWriteExactBytes(t *testing.T) {
	value := func(n int) []byte {
		v := bytes.Repeat([]byte("ab\r\nEND\r\n"), n/9+1)[:n]
		if n > 0 {
			v[n-1] = byte(n) // tell values of different sizes apart
		}
		return v
	}
	head := len(op.Encode(nil, &op.Op{Verb: op.Set, Item: op.Item{Value: make([]byte, writeSlice)}}, "k0"))
	head -= writeSlice + 2
	tests := []struct {
		name  string
		sizes []int // a set of a value of each size, then a delete, all in one write
	}{
		{"small only", []int{0, 1, 100}},
		{"around bigValue", []int{bigValue - 1, bigValue, bigValue + 1}},
		{"around writeSlice", []int{writeSlice - 1, writeSlice, writeSlice + 1}},
		{"a value ending at a slice's end", []int{writeSlice - head}},
		{"a head split by a slice's end", []int{writeSlice - head - 2, bigValue}},
		{"large among small", []int{10, 3*writeSlice + 7, 5, bigValue, 0, 2 << 20}},
	}
	for _, tt := range tests {
		for _, wrap := range []bool{false, true} {
			name := tt.name + "/writev"
			if wrap {
				name = tt.name + "/no writev"
			}
			t.Run(name, func(t *testing.T) {
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				defer ln.Close()
				got := make(chan []byte, 1)
				go func() {
					sc, err := ln.Accept()
					if err != nil {
						got <- nil
						return
					}
					defer sc.Close()
					b, _ := io.ReadAll(sc)
					got <- b
				}()
				nc, err := net.Dial("tcp", ln.Addr().String())
				if err != nil {
					t.Fatal(err)
				}
				if wrap {
					nc = plainConn{nc}
				}
				c := newConn(nc, 5*time.Second)
				var want []byte
				ops := make([]op.Op, 0, len(tt.sizes)+1)
				for i, n := range tt.sizes {
					ops = append(ops, op.Op{Verb: op.Set, Item: op.Item{Key: "k" + strconv.Itoa(i), Value: value(n), Flags: uint32(i)}})
				}
				ops = append(ops, op.Op{Verb: op.Delete, Item: op.Item{Key: "last"}})
				c.mu.Lock()
				c.writing = true // all but the last queue behind a write in progress
				c.mu.Unlock()
				for i := range ops {
					want = op.Encode(want, &ops[i], ops[i].Item.Key)
					if i == len(ops)-1 {
						c.mu.Lock()
						c.writing = false // the last one becomes the writer of all
						c.mu.Unlock()
					}
					o := ops[i]
					if err := c.send(&call{o: o, skey: o.Item.Key, kind: o.Verb.Reply()}); err != nil {
						t.Fatalf("send: %v", err)
					}
				}
				if c.failed() {
					t.Fatalf("the connection failed: %v", c.err)
				}
				nc.Close()
				if b := <-got; !bytes.Equal(b, want) {
					i := 0
					for i < min(len(b), len(want)) && b[i] == want[i] {
						i++
					}
					t.Errorf("server read %d bytes, want %d; first difference at %d", len(b), len(want), i)
				}
			})
		}
	}
}

// TestReplyOwedFromTheWrite: the timeout for a reply runs from when its
// request is written, not from when it was queued. A writer may wait
// long for the CPU between the two (runtime.Gosched took 400 ms with 64
// handlers and memcached on one CPU); memcached is not late meanwhile,
// and counting that wait against it failed the connection and ejected
// the node. The test reads the deadline set rather than racing a short
// timeout against memcached's answer: on a loaded machine memcached
// took longer than 100 ms to answer.
func TestReplyOwedFromTheWrite(t *testing.T) {
	srv := memcachedtest.Start(t)
	nc, err := net.Dial("tcp", srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	const timeout = 10 * time.Second // never reached
	c := newConn(nc, timeout)
	defer c.fail(ErrClosed)
	go c.readLoop()
	c.mu.Lock()
	c.writing = true // the writer has yielded the CPU: send only queues
	c.mu.Unlock()
	cl := &call{kind: op.Items, verb: "gets", key: "absent", done: make(chan struct{}, 1)}
	if err := c.send(cl); err != nil {
		t.Fatal(err)
	}
	const wait = 100 * time.Millisecond
	time.Sleep(wait) // the writer waits for the CPU
	written := time.Now()
	c.writeTurn()
	<-cl.done
	c.mu.Lock()
	armed := c.armedAt // when the reply's deadline was set: the answer leaves it
	c.mu.Unlock()
	if armed.Before(written) {
		t.Errorf("get queued %v before its write: its reply's deadline set %v before the write, want at the write", wait, written.Sub(armed))
	}
	if cl.err != nil || len(cl.items) != 0 {
		t.Errorf("get queued %v before its write = %v, %d items; want a miss", wait, cl.err, len(cl.items))
	}
}
