package upstream

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/memcgate/memcgate/test/faultproxy"
	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream/op"
)

// TestPanicModeReadsWhereTheWriteWent: in panic mode a key written to
// the next node while its own was down is read, and written, where that
// write went, not on its down node, which may still answer with the
// value the write replaced until its re-admission deletes the key there
// (decision 0090); once panic ends, the node still down, the key reads
// what was last written. A key its down node recorded no write of is
// routed to that node, as panic mode routes. Without the change the
// read in panic returned the replaced value (v1), and the write made in
// panic went to the down node, so that once panic ended the next node's
// older copy (v2) was read.
func TestPanicModeReadsWhereTheWriteWent(t *testing.T) {
	mcs := memcachedtest.StartN(t, 4)
	c, _ := newTestCluster(t, mcs, func(o *Options) { o.Health.PanicPercent = 50 })
	ctx := t.Context()
	byName := map[string]*node{}
	for _, n := range c.topo.Load().nodes {
		byName[n.name] = n
	}
	const key = "k"
	chain := c.Placement(key).Chain
	owner := byName[chain[0].Node]
	other := "" // another key of the same owner, written nowhere else
	for i := 0; other == ""; i++ {
		if k := fmt.Sprint("other-", i); c.Placement(k).Chain[0].Node == owner.name {
			other = k
		}
	}
	set := func(k, v string) {
		t.Helper()
		if r := c.Do(ctx, op.Op{Verb: op.Set, Item: op.Item{Key: k, Value: []byte(v)}}); r.Err != nil {
			t.Fatalf("set %s=%s: %v", k, v, r.Err)
		}
	}
	get := func(k string) string {
		t.Helper()
		it, err := c.Get(ctx, k)
		if err != nil {
			return "error: " + err.Error()
		}
		return string(it.Value)
	}
	set(key, "v1")
	set(other, "o1")
	owner.eject("probe", errors.New("down"), false) // memcached runs on, holding v1
	set(key, "v2")                                  // to the next node, recorded on the owner
	for _, ch := range chain[2:] {
		byName[ch.Node].eject("probe", errors.New("down"), false)
	}
	if !c.panicking(c.topo.Load()) {
		t.Fatal("not panicking with 1 of 4 nodes up and PanicPercent 50")
	}
	if got := get(key); got != "v2" {
		t.Errorf("in panic mode, get of a key written elsewhere while its node was down = %q, want v2", got)
	}
	if found, _ := c.GetMulti(ctx, []string{key}, 0, nil); string(found[key].Value) != "v2" {
		t.Errorf("in panic mode, multi-get of it = %q, want v2", found[key].Value)
	}
	if rs := c.Replicas(&op.Op{Item: op.Item{Key: key}}, 1); len(rs.Replicas) == 0 || rs.Replicas[0].n.name != chain[1].Node {
		t.Errorf("in panic mode, the replica set of it = %v, want the node its write went to (%s) first", rs.Replicas, chain[1].Node)
	}
	if got := get(other); got != "o1" {
		t.Errorf("in panic mode, get of a key of the down node written nowhere else = %q, want o1 (from that node)", got)
	}
	set(key, "v3") // in panic mode
	for _, ch := range chain[2:] {
		byName[ch.Node].admit()
	}
	if c.panicking(c.topo.Load()) {
		t.Fatal("still panicking with 3 of 4 nodes up")
	}
	if got := get(key); got != "v3" {
		t.Errorf("after panic mode, its node still down, get of the key written in panic mode = %q, want v3", got)
	}
}

// TestPanicModeReadsWhereTheWriteWentWhileItsNodeIsReadmitted: the
// deletes before a node's re-admission take its keys written elsewhere
// off its set at their start; until the node serves, a key taken is
// still read, in panic mode, where its write went. Without the change
// the set was empty for as long as the deletes ran (here one round trip
// of 400 ms to a node behind a slow link; a round trip per 32 keys of a
// long outage's thousands), and a read in panic mode went to the down
// node: the value the write replaced, or, once deleted there, a miss,
// where the next node held the value written.
func TestPanicModeReadsWhereTheWriteWentWhileItsNodeIsReadmitted(t *testing.T) {
	r := newSlowOwnerRig(t)
	px, c, ctx, owner, key, chain, byName, set := r.px, r.c, t.Context(), r.owner, r.key, r.chain, r.byName, r.set
	get := func() string {
		t.Helper()
		it, err := c.Get(ctx, key)
		if err != nil {
			return "error: " + err.Error()
		}
		return string(it.Value)
	}
	set("v1")
	owner.eject("probe", errors.New("down"), false) // memcached runs on, holding v1
	set("v2")                                       // to the next node, recorded on the owner
	for _, ch := range chain[2:] {
		byName[ch.Node].eject("probe", errors.New("down"), false)
	}
	if !c.panicking(c.topo.Load()) {
		t.Fatal("not panicking with 1 of 4 nodes up and PanicPercent 50")
	}
	px.SetLatency(200 * time.Millisecond)
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.readmit(ctx, owner)
	}()
	waitFor(t, 5*time.Second, "the deletes before the re-admission to start", func() bool { return owner.stale.len() == 0 })
	if owner.available() {
		t.Fatal("the owner serves already: the test's link is not slow enough to see its deletes")
	}
	if got := get(); got != "v2" {
		t.Errorf("in panic mode, while the owner's deletes run, get of a key written elsewhere while it was down = %q, want v2", got)
	}
	<-done
	if !owner.available() {
		t.Fatalf("the owner was not re-admitted: %s", owner.status().Reason)
	}
	if got := get(); got == "v1" {
		t.Errorf("after the re-admission, get = %q, the value the write replaced", got)
	}
}

// TestPanicModeAfterFailedDeletesWritesWhereTheWriteWent: deletes before
// a re-admission that fail leave the node down with every key they took
// recorded again, those deleted too. Without that, a key deleted on the
// node was no longer recorded: in panic mode its next write went to the
// down node, and once panic ended (the node still down) its reads went
// to the next node, which held the copy that write had replaced.
func TestPanicModeAfterFailedDeletesWritesWhereTheWriteWent(t *testing.T) {
	r := newSlowOwnerRig(t)
	mcs, px, c, ctx, owner, key, chain, byName, set := r.mcs, r.px, r.c, t.Context(), r.owner, r.key, r.chain, r.byName, r.set
	direct := memcache.New(mcs[0].Addr) // past the slow link
	// The deletes go 32 at a time, a round trip each (200 ms): the
	// key's is seen done on its node, and the rest are cut short, unless
	// the key was the very last of 161 (then again).
	for attempt := 1; ; attempt++ {
		set("v1")
		owner.eject("probe", errors.New("down"), false)
		set("v2") // to the next node, recorded on the owner
		for i := range 160 {
			owner.recordStale(fmt.Sprint("filler-", i), "")
		}
		for _, ch := range chain[2:] {
			byName[ch.Node].eject("probe", errors.New("down"), false)
		}
		if !c.panicking(c.topo.Load()) {
			t.Fatal("not panicking with 1 of 4 nodes up and PanicPercent 50")
		}
		px.SetLatency(100 * time.Millisecond)
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			c.readmit(rctx, owner)
		}()
		waitFor(t, 10*time.Second, "the key's delete on its node", func() bool {
			_, err := direct.Get(key)
			return errors.Is(err, memcache.ErrCacheMiss)
		})
		cancel() // the deletes fail with the rest undone
		<-done
		px.SetLatency(0)
		if !owner.available() {
			break
		}
		if attempt == 3 {
			t.Fatal("the owner was re-admitted 3 times: its deletes were done before the test could fail them")
		}
		for _, ch := range chain[2:] {
			byName[ch.Node].admit()
		}
	}
	set("v3") // in panic mode
	for _, ch := range chain[2:] {
		byName[ch.Node].admit()
	}
	if c.panicking(c.topo.Load()) {
		t.Fatal("still panicking with 3 of 4 nodes up")
	}
	it, err := c.Get(ctx, key)
	if err != nil || string(it.Value) != "v3" {
		t.Errorf("after panic mode, its node down after failed deletes, get of the key written in panic mode = %v, %v; want v3", it, err)
	}
}

// slowOwnerRig is a panic-mode cluster (PANIC_PERCENT 50) of four
// memcached, the first behind a relay a test can slow, and a key that
// node owns.
type slowOwnerRig struct {
	mcs    []*memcachedtest.Server
	px     *faultproxy.TCP
	c      *Cluster
	owner  *node
	key    string
	chain  []ChainNode
	byName map[string]*node
	set    func(v string) // stores v under key, failing the test if it fails
}

func newSlowOwnerRig(t *testing.T) *slowOwnerRig {
	t.Helper()
	mcs := memcachedtest.StartN(t, 4)
	px, port := relayTo(t, mcs[0].Addr)
	c, _ := newTestCluster(t, mcs, func(o *Options) {
		o.Health.PanicPercent = 50
		o.Servers[0].Port = port
		o.Timeout = 2 * time.Second // the slow link's round trip, with room under -race
	})
	r := &slowOwnerRig{mcs: mcs, px: px, c: c, owner: c.topo.Load().nodes[0], key: keyOwnedBy(t, c, 0), byName: map[string]*node{}}
	r.chain = c.Placement(r.key).Chain
	for _, n := range c.topo.Load().nodes {
		r.byName[n.name] = n
	}
	r.set = func(v string) {
		t.Helper()
		if res := c.Do(t.Context(), op.Op{Verb: op.Set, Item: op.Item{Key: r.key, Value: []byte(v)}}); res.Err != nil {
			t.Fatalf("set %s=%s: %v", r.key, v, res.Err)
		}
	}
	return r
}
