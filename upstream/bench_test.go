package upstream

import (
	"strings"
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
