package route

import (
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream"
)

// TestTimedOutReplicaIsNotReplaced: a replica whose connection times out
// while it stays in service (memcached stopped with its listen backlog
// full: the dial waits for an accept that never comes) is not replaced
// by a spare for a write. Its reads still come to it, so a copy on the
// spare would make the write answer under the all policy and leave the
// replica's older value to be read once it runs again (decisions/0086):
// the copy fails there instead, and the write answers that it may be
// partly applied. A replica that refuses connections is replaced, as
// TestSpareTakesTheWrite shows.
func TestTimedOutReplicaIsNotReplaced(t *testing.T) {
	mcs := memcachedtest.StartN(t, 3, "-b", "1")
	co := clusterOptions(mcs)
	co.Health.Interval = time.Hour // no probe after the first
	co.Health.PassiveFails = 0     // the replica stays in service
	r, _ := newRouter(t, Options{Pools: []PoolOptions{{Cluster: co, Replicas: 2, Write: WriteAll}}})
	ctx := t.Context()
	const key = "k"
	p := r.Placement(key)
	a, spare := replicaAndSpare(t, mcs, p, key)
	a.Pause()
	a.FillBacklog()
	err := set(ctx, r, key, "new")
	note := a.ResumedNote()
	a.Resume()
	var ne *upstream.NodeError
	if !errors.Is(err, upstream.ErrPartlyApplied) || !errors.As(err, &ne) || !ne.Timeout() || ne.Node != a.Addr {
		t.Errorf("set while replica %s, in service, times out = %v; want it partly applied, with that replica's timeout%s", a.Addr, err, note)
	}
	if v, ok := direct(t, spare.Addr, key); ok {
		t.Errorf("the spare %s holds %q: the copy of a replica that timed out moved there", spare.Addr, v)
	}
	if n := testutil.ToFloat64(r.m.substituted.WithLabelValues("main")); n != 0 {
		t.Errorf("substitutions = %v, want none", n)
	}
	var got string
	var gerr error
	for range 5 { // just resumed, it may not have accepted the dial's connection yet
		if got, gerr = get(ctx, r, key); !errors.As(gerr, &ne) {
			break
		}
	}
	if err == nil && got == "old" {
		t.Errorf("set answered, and a read once the replica runs again returns the value it replaced (%q, %v)", got, gerr)
	}
}

// replicaAndSpare returns the server of the first of key's two replicas
// in p and the one of mcs that holds no copy (the spare), after storing
// "old" for key on both replicas directly, so that the router has no
// data connection to the first yet.
func replicaAndSpare(t *testing.T, mcs []*memcachedtest.Server, p Placement, key string) (first, spare *memcachedtest.Server) {
	t.Helper()
	for _, m := range mcs {
		switch m.Addr {
		case p.ReplicaNodes[0]:
			first = m
		case p.ReplicaNodes[1]:
		default:
			spare = m
		}
	}
	for _, addr := range p.ReplicaNodes {
		directSet(t, addr, key, "old", 0)
	}
	return first, spare
}
