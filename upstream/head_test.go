package upstream

import (
	"bufio"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream/op"
)

// TestHead: a head answers an item's flags, CAS and size without its
// value, in both pools (make test runs this package with gomemcache's
// too), and a miss as a get does.
func TestHead(t *testing.T) {
	mcs := memcachedtest.StartN(t, 2)
	c, _ := newTestCluster(t, mcs, func(o *Options) { o.KeyPrefix = "app:" })
	ctx := t.Context()
	for _, size := range []int{0, 3, 100 << 10} {
		key := "k" + strings.Repeat("x", size%7)
		if err := c.Set(ctx, Item{Key: key, Value: make([]byte, size), Flags: 9}); err != nil {
			t.Fatal(err)
		}
		got, err := c.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		res := c.Do(ctx, op.Op{Verb: op.Head, Item: op.Item{Key: key}})
		if res.Err != nil || res.N != uint64(size) || res.Item.Flags != 9 || res.Item.CAS != got.CAS || res.Item.Value != nil || res.Item.Key != key {
			t.Errorf("head of %d bytes = %+v size %d, %v; want flags 9, CAS %d, no value", size, res.Item, res.N, res.Err, got.CAS)
		}
	}
	if res := c.Do(ctx, op.Op{Verb: op.Head, Item: op.Item{Key: "absent"}}); !errors.Is(res.Err, ErrNotFound) {
		t.Errorf("head of a missing key: %v, want ErrNotFound", res.Err)
	}
	// head_touch answers as head does, and sets the expiration: -1
	// expires the item at once.
	res := c.Do(ctx, op.Op{Verb: op.HeadTouch, Item: op.Item{Key: "k", Expiration: -1}})
	if res.Err != nil || res.N != 0 || res.Item.Flags != 9 || res.Item.Value != nil {
		t.Errorf("head_touch = %+v size %d, %v; want flags 9, size 0", res.Item, res.N, res.Err)
	}
	if _, err := c.Get(ctx, "k"); !errors.Is(err, ErrNotFound) {
		t.Errorf("get after head_touch with expiration -1: %v, want ErrNotFound", err)
	}
	if res := c.Do(ctx, op.Op{Verb: op.HeadTouch, Item: op.Item{Key: "absent", Expiration: 60}}); !errors.Is(res.Err, ErrNotFound) {
		t.Errorf("head_touch of a missing key: %v, want ErrNotFound", res.Err)
	}
	var hits float64
	for _, n := range c.topo.Load().nodes {
		hits += testutil.ToFloat64(n.m.ops[verbOp(op.Head)][resOK])
	}
	if hits != 3 {
		t.Errorf("head hits counted = %v, want 3", hits)
	}
}

// TestHeadWithoutMeta: a node that answers mg with ERROR (memcached
// before 1.6) answers a head with a get of the whole value, and is asked
// with mg only once.
func TestHeadWithoutMeta(t *testing.T) {
	var mgs atomic.Int64
	srv := memcachedtest.StartScripted(t, func(line string, _ *bufio.Reader) (string, bool) {
		switch f := strings.Fields(line); f[0] {
		case "mg":
			mgs.Add(1)
		case "gets":
			return memcachedtest.Value(f[1], "abc", 5, 77) + "END\r\n", true
		case "version":
			return "VERSION 1.5.22\r\n", true
		}
		return "ERROR\r\n", true
	})
	c, _ := newTestCluster(t, []*memcachedtest.Server{{Addr: srv.Addr, Port: srv.Port}}, nil)
	for range 3 {
		res := c.Do(t.Context(), op.Op{Verb: op.Head, Item: op.Item{Key: "k"}})
		if res.Err != nil || res.N != 3 || res.Item.Flags != 5 || res.Item.CAS != 77 || res.Item.Value != nil {
			t.Fatalf("head = %+v size %d, %v; want flags 5, CAS 77, size 3, no value", res.Item, res.N, res.Err)
		}
	}
	if n := mgs.Load(); n > 1 {
		t.Errorf("%d mg commands, want at most one", n)
	}
}

// TestHeadOnThePool: with gomemcache's pool (PipelineConns 0) a head
// asks mg for the size, flags and CAS on a connection of its own, as the
// pipelined client does, and memcached sends no value: a get of the
// whole value made 4 clients looping HEADs of 1 MB values reset at once
// draw 18 GB from memcached in 15 s. Its connections are kept for the
// next heads.
func TestHeadOnThePool(t *testing.T) {
	var mgs, gets atomic.Int64
	srv := memcachedtest.StartScripted(t, func(line string, _ *bufio.Reader) (string, bool) {
		switch f := strings.Fields(line); f[0] {
		case "mg":
			mgs.Add(1)
			if f[1] == "absent" {
				return "EN\r\n", true
			}
			return "HD s1000000 f5 c77\r\n", true
		case "get", "gets":
			gets.Add(1)
			return memcachedtest.Value(f[1], strings.Repeat("v", 1000000), 5, 77) + "END\r\n", true
		case "version":
			return "VERSION 1.6.21\r\n", true
		}
		return "ERROR\r\n", true
	})
	c := claimCluster(t, srv.Addr, nil)
	for range 3 {
		res := c.Do(t.Context(), op.Op{Verb: op.Head, Item: op.Item{Key: "k"}})
		if res.Err != nil || res.N != 1000000 || res.Item.Flags != 5 || res.Item.CAS != 77 || res.Item.Value != nil {
			t.Fatalf("head = %+v size %d, %v; want flags 5, CAS 77, size 1000000, no value", res.Item, res.N, res.Err)
		}
	}
	if res := c.Do(t.Context(), op.Op{Verb: op.Head, Item: op.Item{Key: "absent"}}); !errors.Is(res.Err, ErrNotFound) {
		t.Errorf("head of a missing key = %v, want ErrNotFound", res.Err)
	}
	if n, g := mgs.Load(), gets.Load(); n != 4 || g != 0 {
		t.Errorf("%d mg and %d gets sent, want 4 mg and no get", n, g)
	}
	if n := c.topo.Load().nodes[0].conns.Load(); n != 1 {
		t.Errorf("%d connections open, want 1: the heads' one, kept", n)
	}
}

// TestAppendCAS: append_cas and prepend_cas, sent with the key prefix,
// append while the item's CAS is the one a head read, and are refused
// as a cas is otherwise; gomemcache's pool (make test runs this package
// with it too) has no meta commands and refuses them unsent.
func TestAppendCAS(t *testing.T) {
	mcs := memcachedtest.StartN(t, 2)
	c, _ := newTestCluster(t, mcs, func(o *Options) { o.KeyPrefix = "app:" })
	ctx := t.Context()
	tests := []struct {
		name string
		verb op.Verb
		key  string // set to "abc" unless "absent"
		cas  func(head uint64) uint64
		err  error // with pipelined connections; gomemcache's: ErrNoMeta
		want string
	}{
		{name: "append", verb: op.AppendCAS, key: "a", cas: func(h uint64) uint64 { return h }, want: "abc+"},
		{name: "prepend", verb: op.PrependCAS, key: "p", cas: func(h uint64) uint64 { return h }, want: "+abc"},
		{name: "changed since", verb: op.AppendCAS, key: "c", cas: func(h uint64) uint64 { return h + 1 }, err: ErrCASConflict, want: "abc"},
		{name: "absent", verb: op.AppendCAS, key: "absent", cas: func(uint64) uint64 { return 1 }, err: ErrNotFound},
	}
	// A head of a key that exists on every node: each learns that its
	// memcached speaks 1.6.10's meta protocol (a miss's EN does not say).
	for i := range 8 {
		k := "head" + strconv.Itoa(i)
		if err := c.Set(ctx, Item{Key: k, Value: []byte("v")}); err != nil {
			t.Fatal(err)
		}
		c.Do(ctx, op.Op{Verb: op.Head, Item: op.Item{Key: k}})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.key != "absent" {
				if err := c.Set(ctx, Item{Key: tt.key, Value: []byte("abc"), Flags: 3}); err != nil {
					t.Fatal(err)
				}
			}
			head := c.Do(ctx, op.Op{Verb: op.Head, Item: op.Item{Key: tt.key}})
			err, want := tt.err, tt.want
			if *pipelineConns == 0 { // refused: nothing changes
				err = ErrNoMeta
				if want != "" {
					want = "abc"
				}
			}
			res := c.Do(ctx, op.Op{Verb: tt.verb, Item: op.Item{Key: tt.key, Value: []byte("+"), CAS: tt.cas(head.Item.CAS)}})
			if !errors.Is(res.Err, err) || err == nil && res.Err != nil {
				t.Errorf("%v = %v, want %v", tt.verb, res.Err, err)
			}
			got, gerr := c.Get(ctx, tt.key)
			switch {
			case want == "" && !errors.Is(gerr, ErrNotFound):
				t.Errorf("get after = %q, %v; want ErrNotFound", got.Value, gerr)
			case want != "" && (gerr != nil || string(got.Value) != want || got.Flags != 3):
				t.Errorf("get after = %q flags %d, %v; want %q flags 3", got.Value, got.Flags, gerr, want)
			}
		})
	}
}

// TestDeleteCAS: delete_cas, sent with the key prefix, deletes the item
// only while its CAS is the one read (or, with none, any item there),
// on both pools: gomemcache's (make test runs this package with it too)
// sends the md on a connection of its own, as it does a head's mg. Its
// outcomes are counted under its own op label.
func TestDeleteCAS(t *testing.T) {
	mcs := memcachedtest.StartN(t, 2)
	c, _ := newTestCluster(t, mcs, func(o *Options) { o.KeyPrefix = "app:" })
	ctx := t.Context()
	tests := []struct {
		name    string
		key     string // set to "abc" unless "absent"
		cas     func(read uint64) uint64
		err     error
		deleted bool
	}{
		{name: "unchanged", key: "u", cas: func(r uint64) uint64 { return r }, deleted: true},
		{name: "changed since", key: "c", cas: func(r uint64) uint64 { return r + 1000 }, err: ErrCASConflict},
		{name: "absent", key: "absent", cas: func(uint64) uint64 { return 1 }, err: ErrNotFound},
		{name: "any item", key: "any", cas: func(uint64) uint64 { return 0 }, deleted: true},
		{name: "any item, absent", key: "absent", cas: func(uint64) uint64 { return 0 }, err: ErrNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var read uint64
			if tt.key != "absent" {
				if err := c.Set(ctx, Item{Key: tt.key, Value: []byte("abc")}); err != nil {
					t.Fatal(err)
				}
				it, err := c.Get(ctx, tt.key)
				if err != nil {
					t.Fatal(err)
				}
				read = it.CAS
			}
			res := c.Do(ctx, op.Op{Verb: op.DeleteCAS, Item: op.Item{Key: tt.key, CAS: tt.cas(read)}})
			if !errors.Is(res.Err, tt.err) || tt.err == nil && res.Err != nil {
				t.Errorf("delete_cas = %v, want %v", res.Err, tt.err)
			}
			_, err := c.Get(ctx, tt.key)
			if gone := errors.Is(err, ErrNotFound); gone != (tt.deleted || tt.key == "absent") {
				t.Errorf("get after = %v; want deleted %v", err, tt.deleted)
			}
		})
	}
	var counted float64
	for _, n := range c.topo.Load().nodes {
		for _, r := range n.m.ops[verbOp(op.DeleteCAS)] {
			counted += testutil.ToFloat64(r)
		}
	}
	if counted != float64(len(tests)) {
		t.Errorf("delete_cas operations counted = %v, want %d", counted, len(tests))
	}
}

// TestDeleteCASWithoutMetaOnThePool: with gomemcache's pool, a node that
// answers md with ERROR (memcached before 1.6) refuses each delete_cas
// with ErrNoMeta, deletes nothing, and keeps the connection the md went
// on: md has no data block, so the connection is in step. Closed after
// the ERROR, every conditional DELETE a client sent cost memcached a new
// connection (100 DELETEs, 100 connections), and the gateway a socket
// in TIME_WAIT.
func TestDeleteCASWithoutMetaOnThePool(t *testing.T) {
	var mds, deletes atomic.Int64
	srv := memcachedtest.StartScripted(t, func(line string, _ *bufio.Reader) (string, bool) {
		switch f := strings.Fields(line); f[0] {
		case "md":
			mds.Add(1)
		case "delete":
			deletes.Add(1)
			return "DELETED\r\n", true
		case "version":
			return "VERSION 1.5.22\r\n", true
		}
		return "ERROR\r\n", true
	})
	c := claimCluster(t, srv.Addr, nil)
	before := srv.Conns.Load()
	const n = 20
	for range n {
		res := c.Do(t.Context(), op.Op{Verb: op.DeleteCAS, Item: op.Item{Key: "k", CAS: 5}})
		if !errors.Is(res.Err, ErrNoMeta) {
			t.Fatalf("delete_cas = %v, want ErrNoMeta", res.Err)
		}
	}
	if m, d := mds.Load(), deletes.Load(); m != n || d != 0 {
		t.Errorf("%d md and %d delete sent, want %d md and no delete", m, d, n)
	}
	if opened := srv.Conns.Load() - before; opened > 1 {
		t.Errorf("%d connections opened for %d refused md, want one, kept", opened, n)
	}
}
