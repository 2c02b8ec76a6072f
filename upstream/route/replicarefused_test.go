package route

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream"
)

// TestRefusedReplicaInServiceIsNotReplaced: a replica that refuses a
// write's connection but stays in service (passive ejection off, so the
// refusal ejects nothing) is not replaced by a spare. Its memcached runs
// with its data throughout, only its connections refused for a while (a
// firewall's reject, a proxy in front of it restarting): its reads come
// to it again once it takes connections, and with the copy moved to the
// spare the write answered under the all policy and left the replica's
// older value to be read, with no re-admission to clear the key there
// (decisions/0086). The copy fails there instead, and the write answers
// that it may be partly applied. A replica whose refusal ejects it is
// replaced, as TestSpareTakesTheWrite shows.
func TestRefusedReplicaInServiceIsNotReplaced(t *testing.T) {
	mcs := memcachedtest.StartN(t, 3)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refusedAt := ln.Addr().String() // nothing listens there: dials are refused
	ln.Close()
	var refusing atomic.Value // the address refused, if any
	refusing.Store("")
	co := clusterOptions(mcs)
	co.Health.Interval = time.Hour // no probe after the first
	co.Health.PassiveFails = 0     // the replica stays in service
	co.Dialer = func(ctx context.Context, network, address string) (net.Conn, error) {
		if address == refusing.Load().(string) {
			address = refusedAt
		}
		var d net.Dialer
		return d.DialContext(ctx, network, address)
	}
	r, _ := newRouter(t, Options{Pools: []PoolOptions{{Cluster: co, Replicas: 2, Write: WriteAll}}})
	ctx := t.Context()
	const key = "k"
	p := r.Placement(key)
	a, spare := replicaAndSpare(t, mcs, p, key)
	refusing.Store(a.Addr)
	err = set(ctx, r, key, "new")
	refusing.Store("")
	var ne *upstream.NodeError
	if err != nil && (!errors.Is(err, upstream.ErrPartlyApplied) || !errors.As(err, &ne) || ne.Node != a.Addr) {
		t.Errorf("set while replica %s, in service, refuses connections = %v; want it partly applied, with that replica's failure", a.Addr, err)
	}
	if v, ok := direct(t, spare.Addr, key); ok {
		t.Errorf("the spare %s holds %q: the copy of a replica in service moved there", spare.Addr, v)
	}
	got, gerr := get(ctx, r, key)
	if err == nil && got == "old" {
		t.Errorf("set answered, and a read once the replica takes connections again returns the value it replaced (%q, %v)", got, gerr)
	}
}
