package upstream

import (
	"context"
	"fmt"
	"runtime/debug"
	"sync"
	"time"
)

// Run checks every node actively until ctx is done: a round at once, then
// one every Health.Interval. Each round probes all nodes in parallel with
// memcached's version command over each node's own one-connection probe
// client (never the data pool) and waits for every probe, so rounds never
// overlap. Run returns nil when ctx is done.
func (c *Cluster) Run(ctx context.Context) error {
	t := time.NewTicker(c.opts.Health.Interval)
	defer t.Stop()
	c.checkAll(ctx)
	close(c.probed)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			c.checkAll(ctx)
		}
	}
}

// checkAll runs one probe round synchronously.
func (c *Cluster) checkAll(ctx context.Context) {
	var wg sync.WaitGroup
	for _, n := range c.nodes {
		wg.Go(func() {
			defer func() {
				if r := recover(); r != nil {
					c.log.Error("probe panicked", "node", n.name, "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
				}
			}()
			err := n.probe.Ping()
			if ctx.Err() != nil {
				return // shutting down: a failed probe says nothing
			}
			if err != nil {
				c.m.probes.WithLabelValues(n.name, "fail").Inc()
			} else {
				c.m.probes.WithLabelValues(n.name, "ok").Inc()
			}
			n.probeResult(classify(n.name, "probe", err))
		})
	}
	wg.Wait()
}
