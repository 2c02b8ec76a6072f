package route

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream"
)

// nodesOf returns "pool/node" for every node of r, sorted.
func nodesOf(r *Router) []string {
	var out []string
	for _, n := range r.Nodes() {
		out = append(out, n.Pool+"/"+n.Node)
	}
	slices.Sort(out)
	return out
}

// nodeSeries counts the metric series of reg labelled with node.
func nodeSeries(t *testing.T, reg *prometheus.Registry, node string) int {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "node" && l.GetValue() == node {
					n++
				}
			}
		}
	}
	return n
}

// TestReconfigureEveryPoolOrNone: a reload that changes two pools, one
// of whose server lists is refused (none of its nodes answers while the
// pool's running nodes are up), changes neither: the other pool keeps
// its running nodes and policy too, the nodes it would have added leave
// no metric series, and the error names the pool refused. A reload
// that both pools take changes both.
func TestReconfigureEveryPoolOrNone(t *testing.T) {
	mcs := memcachedtest.StartN(t, 4)
	dead := []upstream.Server{
		{Host: "127.0.0.1", Port: memcachedtest.DeadPort(t), Weight: 1},
		{Host: "127.0.0.1", Port: memcachedtest.DeadPort(t), Weight: 1},
	}
	o := Options{Pools: []PoolOptions{
		{Cluster: clusterOptions(mcs[:1])},
		{Name: "b", Prefixes: []string{"b:"}, Cluster: clusterOptions(mcs[1:2])},
	}}
	r, reg := newRouter(t, o)
	running := nodesOf(r)

	next := func(b []upstream.Server) Options {
		n := Options{Pools: []PoolOptions{o.Pools[0], o.Pools[1]}}
		n.Pools[0].Cluster = clusterOptions(mcs[:3]) // adds mcs[1] and mcs[2]
		n.Pools[1].Cluster = clusterOptions(nil)
		n.Pools[1].Cluster.Servers = b
		n.Pools[1].Prefixes = []string{"x:"}
		return n
	}
	ch, err := r.Reconfigure(t.Context(), next(dead))
	if !errors.Is(err, upstream.ErrNoNodeUp) || !strings.Contains(err.Error(), `pool "b"`) || strings.Contains(err.Error(), `pool "main"`) {
		t.Fatalf("Reconfigure = %+v, %v; want ErrNoNodeUp naming pool b alone", ch, err)
	}
	if got := nodesOf(r); !slices.Equal(got, running) {
		t.Errorf("nodes after the refused reload = %v, want the running ones %v", got, running)
	}
	// mcs[1] stays b's; mcs[2] was a node of the default pool's list alone.
	if n := nodeSeries(t, reg, mcs[2].Addr); n != 0 {
		t.Errorf("%d metric series of %s, which the refused reload would have added", n, mcs[2].Addr)
	}
	if p := r.Placement("b:1"); p.Pool != "b" {
		t.Errorf("after the refused reload b:1 goes to %s, want b", p.Pool)
	}
	if err := set(t.Context(), r, "k", "v"); err != nil {
		t.Errorf("set after the refused reload: %v", err)
	}

	// A node that answers beside the dead ones: both pools change.
	ch, err = r.Reconfigure(t.Context(), next(append(clusterOptions(mcs[3:]).Servers, dead...)))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"b/127.0.0.1:" + strconv.Itoa(dead[0].Port), "b/127.0.0.1:" + strconv.Itoa(dead[1].Port), "b/" + mcs[3].Addr,
		"main/" + mcs[0].Addr, "main/" + mcs[1].Addr, "main/" + mcs[2].Addr}
	slices.Sort(want)
	if got := nodesOf(r); !slices.Equal(got, want) || len(ch) != 2 {
		t.Errorf("after the reload taken: nodes %v, changes %+v; want %v in two pools", got, ch, want)
	}
	if p := r.Placement("x:1"); p.Pool != "b" {
		t.Errorf("after the reload taken x:1 goes to %s, want b", p.Pool)
	}
}
