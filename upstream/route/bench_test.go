package route

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream/op"
)

// BenchmarkRouterGet is upstream's BenchmarkClusterGet through a router:
// one pool of one copy (the default configuration, which must cost what
// the cluster alone costs), and a pool of two copies under each read
// policy. The seed's 96-byte key and 400-byte value, real memcached on
// loopback.
func BenchmarkRouterGet(b *testing.B) {
	mcs := memcachedtest.StartN(b, 2)
	key := strings.Repeat("k", 96)
	for _, tc := range []struct {
		name     string
		replicas int
		read     ReadPolicy
	}{{"one-pool", 1, ReadFirst}, {"replicas=2/first", 2, ReadFirst}, {"replicas=2/hedged", 2, ReadHedged}} {
		b.Run(tc.name, func(b *testing.B) {
			co := clusterOptions(mcs)
			co.Health.Interval = time.Hour
			co.Timeout = 2 * time.Second // a stall of the shared machine is not a failure here
			if tc.replicas == 1 {
				co.Servers = co.Servers[:1]
			}
			r, err := New(Options{Pools: []PoolOptions{{Cluster: co, Replicas: tc.replicas, Read: tc.read}}}, discard(), prometheus.NewRegistry())
			if err != nil {
				b.Fatal(err)
			}
			defer r.Close()
			ctx := b.Context()
			if err := r.Do(ctx, op.Op{Verb: op.Set, Item: op.Item{Key: key, Value: []byte(strings.Repeat("v", 400))}}).Err; err != nil {
				b.Fatal(err)
			}
			o := op.Op{Verb: op.Get, Item: op.Item{Key: key}}
			b.ReportAllocs()
			for b.Loop() {
				if res := r.Do(ctx, o); res.Err != nil {
					b.Fatal(res.Err)
				}
			}
		})
	}
}

// BenchmarkRouterSet is BenchmarkRouterGet for Set, under each write
// policy for two copies.
func BenchmarkRouterSet(b *testing.B) {
	mcs := memcachedtest.StartN(b, 2)
	it := op.Item{Key: strings.Repeat("k", 96), Value: []byte(strings.Repeat("v", 400))}
	for _, tc := range []struct {
		name     string
		replicas int
		write    WritePolicy
	}{{"one-pool", 1, WriteAll}, {"replicas=2/all", 2, WriteAll}, {"replicas=2/first", 2, WriteFirst}} {
		b.Run(tc.name, func(b *testing.B) {
			co := clusterOptions(mcs)
			co.Health.Interval = time.Hour
			co.Timeout = 2 * time.Second // a stall of the shared machine is not a failure here
			if tc.replicas == 1 {
				co.Servers = co.Servers[:1]
			}
			r, err := New(Options{Pools: []PoolOptions{{Cluster: co, Replicas: tc.replicas, Write: tc.write}}}, discard(), prometheus.NewRegistry())
			if err != nil {
				b.Fatal(err)
			}
			defer r.Close()
			ctx := b.Context()
			b.ReportAllocs()
			for b.Loop() {
				if res := r.Do(ctx, op.Op{Verb: op.Set, Item: it}); res.Err != nil {
					b.Fatal(res.Err)
				}
			}
		})
	}
}
