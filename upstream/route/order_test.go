package route

import (
	"testing"
	"time"

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
	if prev, done := w.enter("k", rs, nil, false); prev != nil || done != nil {
		t.Fatalf("nothing recorded: enter = %v, %v, want nil, nil", prev, done)
	}
	_, first := w.enter("k", rs, nil, true)
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
	prev, _ := w.enter("k", rs, nil, false)
	check("after the first write", prev, first[0], first[1])
	if prev, _ := w.enter("other", rs, nil, false); prev != nil {
		t.Errorf("another key waits for %v", prev)
	}
	w.answered(a, "k", first[0])
	prev, _ = w.enter("k", rs, nil, false)
	check("after its copy to "+a+" answered", prev, nil, first[1])
	prev, second := w.enter("k", rs, nil, true)
	check("the second write", prev, nil, first[1])
	w.answered(b, "k", first[1]) // replaced by the second write's: kept
	prev, _ = w.enter("k", rs, nil, false)
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

// TestWriteOrderSpares: a write that records reserves a place on each
// spare its copies may move on to, behind the key's earlier writes and
// before its later ones. A copy that moves there waits for the earlier
// writes' places, never its own write's. A place no copy took is given up
// only once the place before it is, so that a later write waiting for it
// waits for the earlier ones too, and once every write is done nothing is
// kept. A write that records nothing reserves nothing, and a copy of it
// that moves waits for what is recorded on the spare then.
func TestWriteOrderSpares(t *testing.T) {
	c, err := upstream.New(upstream.Options{Servers: []upstream.Server{
		{Host: "127.0.0.1", Port: 1}, {Host: "127.0.0.1", Port: 2}, {Host: "127.0.0.1", Port: 3}}},
		discard(), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	o := op.Op{Verb: op.Set, Item: op.Item{Key: "k"}}
	replicas := func() *upstream.ReplicaSet {
		set := c.Replicas(&o, 2)
		return &set
	}
	rs := replicas().Replicas
	// write records a write of k to rs.
	write := func(w *writeOrder) *writeCopies {
		t.Helper()
		wc := newWriteCopies(w, "k", replicas(), rs, true)
		if len(wc.reserved) != 1 || len(wc.done) != 3 {
			t.Fatalf("%d spares reserved, %d places; want the third node, 3", len(wc.reserved), len(wc.done))
		}
		return wc
	}
	// done gives up every place of wc that its copies to rs held.
	done := func(wc *writeCopies) {
		for i, r := range rs {
			wc.leave(i, r)
			wc.finish(t.Context())
		}
	}

	t.Run("moved", func(t *testing.T) {
		var w writeOrder
		w0, w1 := write(&w), write(&w)
		s := w0.reserved[0]
		got, place, ok := w1.spare()
		if !ok || got.Node() != s.Node() || place != 2 {
			t.Fatalf("spare() = %s, %d, %v; want %s, 2, true", got.Node(), place, ok, s.Node())
		}
		if before := w1.before(place, got); before != w0.done[2] {
			t.Errorf("the moved copy waits for %v, want the first write's place there %v", before, w0.done[2])
		}
		if _, _, ok := w1.spare(); ok {
			t.Errorf("a second spare was given: only one was reserved")
		}
		// A write to the second replica and the spare (as after rs[0]
		// was ejected) waits for the second write's places there.
		if prev, _ := w.enter("k", []upstream.Replica{rs[1], s}, nil, false); prev == nil || prev[0] != w1.done[1] || prev[1] != w1.done[2] {
			t.Errorf("the next write waits for %v, want the second write's places %v", prev, w1.done[1:])
		}
		done(w0)
		moved := make(chan struct{})
		go func() {
			await(t.Context(), w1.before(place, got))
			w1.leave(place, got) // the moved copy, answered
			close(moved)
		}()
		done(w1)
		<-moved
		if n := w.n.Load(); n != 0 || len(w.last) != 0 {
			t.Errorf("every write done: %d counted, %d kept, want none", n, len(w.last))
		}
	})

	t.Run("unused", func(t *testing.T) {
		var w writeOrder
		w0, w1 := write(&w), write(&w)
		finished := make(chan struct{})
		go func() {
			done(w1) // its last copy gives up its unused place on the spare, after the first write's
			close(finished)
		}()
		select {
		case <-finished:
			t.Fatal("the second write gave up its place on the spare before the first write")
		case <-time.After(50 * time.Millisecond): // a grace for a wrong order to show; the right one never ends here
		}
		done(w0)
		<-finished
		if n := w.n.Load(); n != 0 || len(w.last) != 0 {
			t.Errorf("every write done: %d counted, %d kept, want none", n, len(w.last))
		}
	})

	t.Run("records nothing", func(t *testing.T) {
		var w writeOrder
		wc := newWriteCopies(&w, "k", replicas(), rs, false)
		if wc.done != nil || wc.reserved != nil {
			t.Fatalf("a write that records nothing reserved %d spares", len(wc.reserved))
		}
		got, place, ok := wc.spare()
		if !ok || place != -1 {
			t.Fatalf("spare() = %s, %d, %v; want the set's next, -1, true", got.Node(), place, ok)
		}
		if before := wc.before(place, got); before != nil {
			t.Errorf("nothing recorded: the moved copy waits for %v", before)
		}
		later := write(&w)
		if before := wc.before(place, got); before != later.done[2] {
			t.Errorf("the moved copy waits for %v, want the place recorded on the spare since %v", before, later.done[2])
		}
		wc.leave(0, rs[0]) // records nothing: gives up nothing
		if n := w.n.Load(); n != 3 {
			t.Errorf("%d places kept, want the later write's 3", n)
		}
		done(later)
	})
}
