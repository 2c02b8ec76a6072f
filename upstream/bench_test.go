package upstream

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/memcgate/memcgate/test/memcachedtest"
)

// BenchmarkClusterGet measures one Get through the cluster against a real
// memcached on loopback (the seed's 96-byte key, 400-byte value).
func BenchmarkClusterGet(b *testing.B) {
	mc := memcachedtest.Start(b)
	c, _ := newBenchCluster(b, []*memcachedtest.Server{mc})
	key := strings.Repeat("k", 96)
	if err := c.Set(b.Context(), Item{Key: key, Value: []byte(strings.Repeat("v", 400))}); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Get(b.Context(), key); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkClusterSet is BenchmarkClusterGet for Set.
func BenchmarkClusterSet(b *testing.B) {
	mc := memcachedtest.Start(b)
	c, _ := newBenchCluster(b, []*memcachedtest.Server{mc})
	it := Item{Key: strings.Repeat("k", 96), Value: []byte(strings.Repeat("v", 400))}
	b.ReportAllocs()
	for b.Loop() {
		if err := c.Set(b.Context(), it); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkClusterGetParallel runs Gets from many goroutines over few
// connections, where parked Gets are batched (compare with
// -bench 'GetParallel' and BATCH off: the BatchGets=false sub-benchmark).
func BenchmarkClusterGetParallel(b *testing.B) {
	mc := memcachedtest.Start(b)
	for _, batching := range []bool{true, false} {
		name := "batched"
		if !batching {
			name = "unbatched"
		}
		b.Run(name, func(b *testing.B) {
			c, _ := newTestClusterTB(b, []*memcachedtest.Server{mc}, func(o *Options) {
				o.MaxConns, o.MaxIdleConns, o.MaxInFlight, o.BatchGets = 8, 8, 8, batching
			})
			// 1000 distinct 96-byte keys, so batches are not just one key
			// fetched once for everyone.
			keys := make([]string, 1000)
			for i := range keys {
				keys[i] = fmt.Sprintf("%096d", i)
				if err := c.Set(b.Context(), Item{Key: keys[i], Value: []byte(strings.Repeat("v", 400))}); err != nil {
					b.Fatal(err)
				}
			}
			var seq atomic.Uint64
			b.SetParallelism(64) // 64 × GOMAXPROCS goroutines on 8 connections
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := c.Get(b.Context(), keys[seq.Add(7919)%1000]); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
