package mcpipe

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/memcgate/memcgate/upstream/op"
)

// cutConn is a connection whose first write is cut short by an error, as
// a write deadline cuts a value that memcached reads too slowly. It
// counts the writes tried after that one and before Close: each would
// put bytes after a request cut short, which memcached reads as the rest
// of that request's value, and then as commands.
type cutConn struct {
	net.Conn // not used; the methods mcpipe calls are below
	mu       sync.Mutex
	cut      bool
	closed   chan struct{}
	once     sync.Once
	after    *atomic.Int64 // writes tried after the cut, before Close
}

func (f *cutConn) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cut {
		select {
		case <-f.closed:
		default:
			f.after.Add(1)
		}
		return 0, errors.New("cut")
	}
	f.cut = true
	return len(p) / 2, errors.New("cut")
}

func (f *cutConn) Read([]byte) (int, error)         { <-f.closed; return 0, net.ErrClosed }
func (f *cutConn) Close() error                     { f.once.Do(func() { close(f.closed) }); return nil }
func (f *cutConn) SetWriteDeadline(time.Time) error { return nil }
func (f *cutConn) SetReadDeadline(time.Time) error  { return nil }

// TestNoWriteAfterFailedWrite: once a write fails, nothing more is
// written on the connection. A request queued while the writer was
// failing the connection made its sender the next writer, which wrote
// (under a new deadline) after the bytes the failed write left cut short.
func TestNoWriteAfterFailedWrite(t *testing.T) {
	var after atomic.Int64
	c := New(Options{Conns: 1, Timeout: time.Second, Dial: func(context.Context) (net.Conn, error) {
		return &cutConn{closed: make(chan struct{}), after: &after}, nil
	}})
	defer c.Close()
	end := time.Now().Add(time.Second)
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) && after.Load() == 0 {
				c.Do(context.Background(), op.Op{Verb: op.Set, Item: op.Item{Value: []byte("v")}}, "k")
			}
		}()
	}
	wg.Wait()
	if n := after.Load(); n > 0 {
		t.Fatalf("%d writes on a connection after a write on it failed", n)
	}
}
