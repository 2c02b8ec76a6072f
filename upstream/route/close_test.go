package route

import (
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/faultproxy"
	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream"
)

// slowed sets co's server i to mc behind a fault proxy that delays each
// direction by d, with timeouts that wait for it.
func slowed(t *testing.T, co *upstream.Options, i int, mc *memcachedtest.Server, d time.Duration) {
	t.Helper()
	p := faultproxy.NewTCP(mc.Addr)
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	p.SetLatency(d)
	_, port, _ := net.SplitHostPort(p.Addr())
	co.Servers[i].Port, _ = strconv.Atoi(port)
	co.Timeout, co.Health.Timeout = 2*time.Second, 2*time.Second
}

// TestCloseWaitsForBackgroundWork: the work a router runs past its
// answers (a first-policy write's other replicas, a warm-up write-back,
// a mirrored shadow write) is done when Close returns, so that a
// gateway shutting down does not drop writes it already acknowledged.
func TestCloseWaitsForBackgroundWork(t *testing.T) {
	const latency = 100 * time.Millisecond // each way: a round trip takes 200ms
	for _, tc := range []struct {
		name string
		// run builds a router whose slow node is mc (behind the proxy)
		// and does one operation that leaves work for later on it.
		run func(t *testing.T, mc *memcachedtest.Server)
	}{
		{"replica write", func(t *testing.T, mc *memcachedtest.Server) {
			fast := memcachedtest.StartN(t, 1)
			co := clusterOptions([]*memcachedtest.Server{fast[0], mc})
			slowed(t, &co, 1, mc, latency)
			co.Health.PassiveFails = 0
			r, _ := newRouter(t, Options{Pools: []PoolOptions{{Cluster: co, Replicas: 2, Write: WriteFirst}}})
			if err := set(t.Context(), r, "k", "v"); err != nil {
				t.Fatal(err)
			}
			r.Close()
		}},
		{"warm write-back", func(t *testing.T, mc *memcachedtest.Server) {
			warm := memcachedtest.StartN(t, 1)
			co := clusterOptions([]*memcachedtest.Server{mc})
			slowed(t, &co, 0, mc, latency)
			r, _ := newRouter(t, Options{Pools: []PoolOptions{
				{Cluster: co, Warm: "old"},
				{Name: "old", Cluster: clusterOptions(warm)},
			}})
			directSet(t, warm[0].Addr, "k", "v", 0)
			if v, err := get(t.Context(), r, "k"); err != nil || v != "v" {
				t.Fatalf("Get(k) = %q, %v", v, err)
			}
			r.Close()
		}},
		{"shadow write", func(t *testing.T, mc *memcachedtest.Server) {
			main := memcachedtest.StartN(t, 1)
			so := clusterOptions([]*memcachedtest.Server{mc})
			slowed(t, &so, 0, mc, latency)
			r, _ := newRouter(t, Options{Pools: []PoolOptions{
				{Cluster: clusterOptions(main), Shadow: "next", ShadowPercent: 100},
				{Name: "next", Cluster: so},
			}})
			if err := set(t.Context(), r, "k", "v"); err != nil {
				t.Fatal(err)
			}
			r.Close()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mc := memcachedtest.Start(t)
			tc.run(t, mc)
			if v, ok := direct(t, mc.Addr, "k"); !ok || v != "v" {
				t.Errorf("after Close the slow node holds %q (found %v), want v", v, ok)
			}
		})
	}
}
