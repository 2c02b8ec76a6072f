package route

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/upstream"
	"github.com/memcgate/memcgate/upstream/op"
)

// TestWriteOrder: a copy waits for the latest recorded copy of its key to
// its node, a copy answered is forgotten unless a later one took its
// place, and once every recorded copy is answered nothing is kept and a
// write takes no lock.
func TestWriteOrder(t *testing.T) {
	c, err := upstream.New(upstream.Options{Servers: []upstream.Server{{Host: "127.0.0.1", Port: 1}, {Host: "127.0.0.1", Port: 2}}},
		discard(), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	rs := c.Replicas(&op.Op{Verb: op.Set, Item: op.Item{Key: "k"}}, 2).Replicas
	if len(rs) != 2 {
		t.Fatalf("%d replicas, want 2", len(rs))
	}
	a, b := rs[0].Node(), rs[1].Node()
	var w writeOrder
	if prev, done := w.enter("k", rs, false); prev != nil || done != nil {
		t.Fatalf("nothing recorded: enter = %v, %v, want nil, nil", prev, done)
	}
	_, first := w.enter("k", rs, true)
	check := func(what string, prev []chan struct{}, want ...chan struct{}) {
		t.Helper()
		for i, ch := range want {
			var got chan struct{}
			if prev != nil {
				got = prev[i]
			}
			if got != ch {
				t.Errorf("%s: the copy to %s waits for %v, want %v", what, rs[i].Node(), got, ch)
			}
		}
	}
	prev, _ := w.enter("k", rs, false)
	check("after the first write", prev, first[0], first[1])
	if prev, _ := w.enter("other", rs, false); prev != nil {
		t.Errorf("another key waits for %v", prev)
	}
	w.answered(a, "k", first[0])
	prev, _ = w.enter("k", rs, false)
	check("after its copy to "+a+" answered", prev, nil, first[1])
	prev, second := w.enter("k", rs, true)
	check("the second write", prev, nil, first[1])
	w.answered(b, "k", first[1]) // replaced by the second write's: kept
	prev, _ = w.enter("k", rs, false)
	check("after the first write answered", prev, second[0], second[1])
	w.answered(a, "k", second[0])
	w.answered(b, "k", second[1])
	if n := w.n.Load(); n != 0 || len(w.last) != 0 {
		t.Errorf("every copy answered: %d counted, %d kept, want none", n, len(w.last))
	}
	for i, ch := range append(first, second...) {
		select {
		case <-ch:
		default:
			t.Errorf("copy %d answered but its channel is open", i)
		}
	}
}
