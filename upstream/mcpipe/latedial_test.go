package mcpipe

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream/op"
)

// TestLateDialIsDialledAgain: a dial that timed out well after its
// deadline (its goroutine did not run meanwhile, as in a gateway
// stopped or starved of CPU: here it sleeps half the timeout past the
// deadline before it dials, with the expired context, a real memcached)
// is dialled once more, and the request on it is answered; a dial that
// times out at its deadline (a server that does not answer, here a dial
// that waits out its context) fails the request with the timeout, as
// before, dialled once.
func TestLateDialIsDialledAgain(t *testing.T) {
	const timeout = 200 * time.Millisecond
	srv := memcachedtest.Start(t)
	cases := []struct {
		name    string
		stall   func(ctx context.Context) // before the first dial
		want    error                     // nil: answered
		timeout bool                      // the answer is a timeout
		dials   int64
	}{
		{"late", func(context.Context) { time.Sleep(timeout + timeout/2) }, memcache.ErrCacheMiss, false, 2},
		{"on time", func(ctx context.Context) { <-ctx.Done() }, nil, true, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var dials atomic.Int64
			c := New(Options{Conns: 1, Timeout: timeout, Dial: func(ctx context.Context) (net.Conn, error) {
				if dials.Add(1) == 1 {
					tc.stall(ctx)
				}
				return (&net.Dialer{}).DialContext(ctx, "tcp", srv.Addr)
			}})
			defer c.Close()
			_, _, err := c.Do(context.Background(), op.Op{Verb: op.Get}, "latedial")
			var ne net.Error
			switch {
			case tc.timeout && !(errors.As(err, &ne) && ne.Timeout()):
				t.Errorf("Do = %v, want the dial's timeout", err)
			case !tc.timeout && !errors.Is(err, tc.want):
				t.Errorf("Do = %v, want %v", err, tc.want)
			}
			if n := dials.Load(); n != tc.dials {
				t.Errorf("%d dials, want %d", n, tc.dials)
			}
		})
	}
}
