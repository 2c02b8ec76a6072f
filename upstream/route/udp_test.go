package route

import (
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream/op"
)

// udpOptions is clusterOptions with each node's memcached UDP port, so
// that SetQuiet may send datagrams to it.
func udpOptions(mcs []*memcachedtest.Server) PoolOptions {
	co := clusterOptions(mcs)
	for i, m := range mcs {
		co.Servers[i].UDPPort = m.UDPPort
	}
	return PoolOptions{Cluster: co}
}

// TestSetQuietReplicated: a quiet set leaves as a datagram only to a
// pool of one copy without warm-up or shadow. In a replicated pool it is
// an ordinary replicated set over TCP, even while every node's UDP port
// is up: a datagram to one node would leave the other replicas with the
// old value, which a read may then be served from. The UDP ports are up
// before each set, so a set that went over TCP did so by choice.
func TestSetQuietReplicated(t *testing.T) {
	for _, tc := range []struct {
		name     string
		replicas int
		prefix   string // KEY_PREFIX, as stored in memcached
		shadow   bool   // the pool also mirrors its keys to a shadow pool
		wantUDP  bool
		copies   int
	}{
		{name: "one copy", replicas: 1, wantUDP: true, copies: 1},
		{name: "two replicas", replicas: 2, copies: 2},
		{name: "two replicas with a key prefix", replicas: 2, prefix: "app:", copies: 2},
		{name: "three replicas", replicas: 3, copies: 3},
		{name: "one copy with a shadow pool", replicas: 1, shadow: true, copies: 1},
		{name: "two replicas with a shadow pool", replicas: 2, shadow: true, copies: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mcs := make([]*memcachedtest.Server, 3)
			for i := range mcs {
				mcs[i] = memcachedtest.StartUDP(t)
			}
			p := udpOptions(mcs)
			p.Replicas, p.Cluster.KeyPrefix = tc.replicas, tc.prefix
			pools := []PoolOptions{p}
			if tc.shadow {
				pools[0].Shadow = "shadow"
				pools = append(pools, PoolOptions{Name: "shadow", Cluster: clusterOptions(memcachedtest.StartN(t, 1))})
			}
			r, _ := newRouter(t, Options{Pools: pools})
			waitUntil(t, 5*time.Second, "every UDP port up", func() bool {
				up := 0
				for _, n := range r.Nodes() {
					if n.UDP != nil && n.UDP.Up {
						up++
					}
				}
				return up == len(mcs)
			})
			ctx := t.Context()
			const key = "k"
			stored := tc.prefix + key
			if err := set(ctx, r, key, "old"); err != nil {
				t.Fatalf("set old: %v", err)
			}
			udp, err := r.SetQuiet(ctx, op.Item{Key: key, Value: []byte("new")})
			if err != nil || udp != tc.wantUDP {
				t.Fatalf("SetQuiet = udp %v, %v; want udp %v, nil", udp, err, tc.wantUDP)
			}
			if !udp { // a set over TCP is applied when SetQuiet returns
				if got := copies(t, mcs, stored, "new"); len(got) != tc.copies {
					t.Errorf("new on %v, want %d copies", got, tc.copies)
				}
			} else {
				waitUntil(t, 2*time.Second, "the datagram applied", func() bool { return len(copies(t, mcs, stored, "new")) == tc.copies })
			}
			if got := copies(t, mcs, stored, "old"); len(got) != 0 {
				t.Errorf("old still on %v: the replicas diverged", got)
			}
			if v, err := get(ctx, r, key); err != nil || v != "new" {
				t.Errorf("get = %q, %v; want new", v, err)
			}
		})
	}
}
