package upstream

import (
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/memcachedtest"
)

// TestKeptConnectionsAgeOut: a connection kept for raw commands and left
// unused for keptIdle is closed by the next health round, so that a
// one-off command (the stats at the admission of a node a reload adds)
// does not hold a connection for the node's life, nor one memcached has
// since closed (a restart) stay open in CLOSE_WAIT and counted in
// memcgate_upstream_connections. One used within keptIdle stays kept.
func TestKeptConnectionsAgeOut(t *testing.T) {
	mcs := memcachedtest.StartN(t, 1)
	const keptIdle = 300 * time.Millisecond
	c, _ := newTestCluster(t, mcs, func(o *Options) { o.keptIdle = keptIdle })
	ctx := t.Context()
	n := c.topo.Load().nodes[0]
	before := n.conns.Load()
	kept := func() int {
		n.cmdIdle.mu.Lock()
		defer n.cmdIdle.mu.Unlock()
		return len(n.cmdIdle.idle)
	}

	if r := c.Stats(ctx)[0]; r.Err != nil {
		t.Fatalf("Stats: %v", r.Err)
	}
	if kept() != 1 || n.conns.Load() != before+1 {
		t.Fatalf("after a command: %d kept, %d open, want 1 kept and %d open", kept(), n.conns.Load(), before+1)
	}
	c.checkAll(ctx)
	if kept() != 1 {
		t.Errorf("a round just after the command left %d kept, want 1: a connection in use is kept", kept())
	}

	time.Sleep(keptIdle + 50*time.Millisecond)
	c.checkAll(ctx)
	if kept() != 0 || n.conns.Load() != before {
		t.Errorf("a round %v after the last command: %d kept, %d open, want none kept and %d open", keptIdle, kept(), n.conns.Load(), before)
	}
	if r := c.Stats(ctx)[0]; r.Err != nil {
		t.Errorf("Stats after the kept connection aged out: %v", r.Err)
	}
}
