package upstream

import (
	"errors"
	"fmt"
	"testing"

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
