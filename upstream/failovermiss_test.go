package upstream

import (
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream/op"
)

// TestReadFailoverMissIsNoAnswer: a read whose owner, in service, fails
// it with a transport failure (here a timeout: the owner stopped longer
// than Options.Timeout, as a gateway paused longer than it makes its
// connection look) is tried on the next node, which never held the key:
// its miss says nothing of the key, which the owner still holds, so the
// read fails with the owner's error (a 5xx), never ErrNotFound (a 404
// for a value memcached holds). A value the next node does hold is
// still its answer, and the owner, back, answers as ever. Each read
// goes the synchronous way (Do) and the asynchronous one (DoAsync, whose
// retry runs on the next node only).
func TestReadFailoverMissIsNoAnswer(t *testing.T) {
	mcs := memcachedtest.StartN(t, 2)
	c, _ := newTestCluster(t, mcs, func(o *Options) {
		o.Timeout = 200 * time.Millisecond
		o.Health.PassiveFails = 0 // the owner stays in service: no health checks run either
	})
	ctx := t.Context()
	// A key of node 0, and one of node 0 that node 1 holds a copy of.
	var key, copied string
	for i := 0; copied == ""; i++ {
		k := fmt.Sprint("fo", i)
		if o, _ := c.Owner(k); o != 0 {
			continue
		}
		if key == "" {
			key = k
		} else {
			copied = k
		}
	}
	for _, k := range []string{key, copied} {
		if err := c.Set(ctx, Item{Key: k, Value: []byte("owner's")}); err != nil {
			t.Fatal(err)
		}
	}
	rawSet(t, mcs[1].Addr, copied, "next node's")

	reads := []struct {
		name string
		get  func(key string) op.Result
	}{
		{"Do", func(key string) op.Result { return c.Do(ctx, op.Op{Verb: op.Get, Item: op.Item{Key: key}}) }},
		{"DoAsync", func(key string) op.Result {
			o := op.Op{Verb: op.Get, Item: op.Item{Key: key}}
			done := make(chan op.Result, 1)
			if !c.DoAsync(ctx, o, func(r op.Result) { done <- r }) {
				return c.Do(ctx, o) // gomemcache's pool (-pipeline-conns=0): Do alone
			}
			return <-done
		}},
	}
	for _, r := range reads {
		t.Run(r.name, func(t *testing.T) {
			if res := r.get(key); res.Err != nil || string(res.Item.Value) != "owner's" {
				t.Fatalf("GET %s with its owner running = %q, %v", key, res.Item.Value, res.Err)
			}
			mcs[0].Pause()
			res := r.get(key)
			got := r.get(copied)
			mcs[0].Resume()
			var ne *NodeError
			if !errors.As(res.Err, &ne) || !ne.Timeout() {
				t.Errorf("GET %s while its owner, in service, times out = %q, %v; want the owner's timeout (*NodeError), not the next node's miss", key, res.Item.Value, res.Err)
			}
			if got.Err != nil || string(got.Item.Value) != "next node's" {
				t.Errorf("GET %s, which the next node holds, while its owner times out = %q, %v; want the next node's value", copied, got.Item.Value, got.Err)
			}
			if res := r.get(key); res.Err != nil || string(res.Item.Value) != "owner's" {
				t.Errorf("GET %s once its owner runs again = %q, %v", key, res.Item.Value, res.Err)
			}
		})
	}
}

// rawSet stores key=value on the memcached at addr itself, past the
// cluster's ring.
func rawSet(t *testing.T, addr, key, value string) {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := fmt.Fprintf(nc, "set %s 0 0 %d\r\n%s\r\n", key, len(value), value); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	n, err := nc.Read(buf)
	if err != nil || string(buf[:n]) != "STORED\r\n" {
		t.Fatalf("set %s on %s: %q, %v", key, addr, buf[:n], err)
	}
}
