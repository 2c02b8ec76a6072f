package upstream

import (
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

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

// BenchmarkSetLarge measures a Set of a large value through the cluster
// against a real memcached: one at a time (what a value costs, its
// copies included), and from 64 goroutines at once on the node's
// pipelined connections (many clients' PUTs). fails/op counts the Sets
// that failed, as they did when the connection's writer fell behind
// and the node was ejected.
func BenchmarkSetLarge(b *testing.B) {
	mc := memcachedtest.Start(b, "-I", "2m", "-m", "1024")
	for _, size := range []int{100_000, 1_000_000} {
		value := []byte(strings.Repeat("v", size))
		b.Run(fmt.Sprintf("%dKB", size/1000), func(b *testing.B) {
			c, _ := newTestClusterTB(b, []*memcachedtest.Server{mc}, func(o *Options) { o.Timeout = 500 * time.Millisecond })
			b.SetBytes(int64(size))
			b.ReportAllocs()
			for b.Loop() {
				if err := c.Set(b.Context(), Item{Key: "large", Value: value}); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("%dKB/parallel64", size/1000), func(b *testing.B) {
			c, _ := newTestClusterTB(b, []*memcachedtest.Server{mc}, func(o *Options) {
				o.Timeout, o.MaxInFlight = 500*time.Millisecond, 4096
			})
			var seq, fails atomic.Int64
			b.SetParallelism(max(1, 64/runtime.GOMAXPROCS(0)))
			b.SetBytes(int64(size))
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				key := fmt.Sprint("large", seq.Add(1))
				for pb.Next() {
					if err := c.Set(b.Context(), Item{Key: key, Value: value}); err != nil {
						fails.Add(1)
					}
				}
			})
			b.ReportMetric(float64(fails.Load())/float64(b.N), "fails/op")
		})
	}
}
