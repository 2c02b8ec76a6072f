package upstream

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// The health model, in one place:
//
//   - Active: every Interval each node gets a `version` probe on its own
//     one-connection client. Fall failures in a row take it down; Rise
//     passes in a row bring it back (hysteresis). Only probes re-admit.
//     A probe that gets only the late answer to the one before it in
//     time is slow: no failure for a node in service, no pass for one
//     out of it (probeResult).
//   - Passive: on the data path a refused or reset connection ejects the
//     node at once; PassiveFails timeouts in a row eject it; any answer
//     from memcached resets the count. Passive ejections are capped at
//     MaxEjectedPercent of the nodes (at least one), so a fault on the
//     gateway's side cannot empty the ring; probes are not capped, because
//     they confirm a node is gone.
//   - Flapping: an ejection that follows a re-admission within FlapWindow is
//     a flap; after k flaps in a row, probe passes only start to count after
//     FlapBackoff·2^(k-1) (capped at FlapBackoffMax) plus up to 50% jitter,
//     the node's own: the same for every gateway (backoff).
//   - Rounds start on the wall clock's multiples of Interval (Run), so that
//     gateways whose clocks agree probe a node at the same moments and
//     re-admit it together.
//   - Panic: while fewer than PanicPercent of the nodes are up (but at least
//     one), routing ignores health, as Envoy does, but for the keys a down
//     node recorded as written elsewhere (node.passedOver): they go where
//     those writes went.
//   - UDP: a node with a UDP port also gets a `version` request over UDP
//     each round, from a probe socket of its own. The port starts down;
//     one answer brings it up, Fall failures in a row or one refusal
//     (ICMP port unreachable, here or on a set's write) take it down.
//     SetQuiet sends datagrams only while the node and its port are up.

// healthPolicy is the cluster-wide part of health checking, shared by all
// nodes. It holds atomics: it must not be copied.
type healthPolicy struct {
	HealthOptions
	down       atomic.Int32  // nodes currently down
	moves      atomic.Uint64 // the nodes' changes of state, each counted before it takes effect (Cluster.Moves)
	maxPassive atomic.Int32  // most nodes passive ejection may take down at once
	// readmitFlush is HealthOptions.ReadmitFlush, which a committed
	// server list (NextServers.ReadmitFlush) changes.
	readmitFlush atomic.Bool
	ejected      func(node, reason string)
	refused      func(node string)
}

// reservePassive counts one more node down if passive ejection may take it.
func (p *healthPolicy) reservePassive() bool {
	for {
		d := p.down.Load()
		if d >= p.maxPassive.Load() {
			return false
		}
		if p.down.CompareAndSwap(d, d+1) {
			return true
		}
	}
}

// backoff is how long re-admission of the node named name waits after
// the flaps-th flap in a row. Its jitter, up to half the hold, spreads
// the nodes' re-admissions apart but is the same for a node in every
// gateway (a hash of its name and the count, not a random draw): gateways
// behind one balancer that saw the same flaps hold the node as long and
// re-admit it together, where a draw of their own set them up to half a
// hold apart, each reading the node while another still wrote its keys
// elsewhere.
func (p *healthPolicy) backoff(name string, flaps int) time.Duration {
	if flaps <= 0 || p.FlapBackoff <= 0 {
		return 0
	}
	d := p.FlapBackoff
	for i := 1; i < flaps && d < p.FlapBackoffMax; i++ {
		d *= 2
	}
	d = min(d, p.FlapBackoffMax)
	return d + time.Duration(spread(name, flaps)%uint64(d/2+1))
}

// spread is a hash of name and k (64-bit FNV-1a, then k mixed in) that
// every process computes alike.
func spread(name string, k int) uint64 {
	f := fnv.New64a()
	io.WriteString(f, name)
	h := f.Sum64() ^ uint64(k)
	h *= 0x9e3779b97f4a7c15
	return h ^ h>>29
}

// nextRound is when the probe round after the one that started at last
// starts: the wall clock's next multiple of interval (counted from Go's
// zero time, midnight UTC, so that every process agrees), strictly after
// now, and never last again. A timer runs on the monotonic clock: one
// that fired as the wall clock stepped back by less than an interval
// leaves now just before last, whose round would otherwise run twice,
// its passes counted twice. After a step back by more, the next multiple
// after now is the one: the rounds do not wait for the clock to return.
func nextRound(now, last time.Time, interval time.Duration) time.Time {
	next := now.Round(0).Truncate(interval).Add(interval)
	if next.Equal(last) {
		next = next.Add(interval)
	}
	return next
}

// available reports whether the node takes traffic.
func (n *node) available() bool { return n.up.Load() }

// readyUp reports whether the node counts as up for readiness: it takes
// traffic and, if no probe has found it in service since it joined, its
// last probe did not fail. A node stays available until Health.Fall
// probes fail in a row; without this, a gateway none of whose nodes
// answers would call itself ready from its first round until the last
// of those probes.
func (n *node) readyUp() bool {
	if !n.available() {
		return false
	}
	if !n.unseen.Load() {
		return true
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.fails == 0
}

// observe is passive health checking of one data-path result.
func (n *node) observe(err error) {
	if err == nil {
		if n.passiveRuns.Load() != 0 {
			n.passiveRuns.Store(0)
		}
		return
	}
	n.observeFailure(err)
}

// observeFailure is observe for an error; apart so that the success path
// does not pay for errors.As's escaping target.
func (n *node) observeFailure(err error) {
	var ne *NodeError
	if !errors.As(err, &ne) {
		if n.passiveRuns.Load() != 0 {
			n.passiveRuns.Store(0)
		}
		return
	}
	if n.h.PassiveFails <= 0 || errors.Is(err, context.DeadlineExceeded) {
		return // waiting for our own semaphore says nothing about the node
	}
	switch {
	case hardFailure(err):
		// A connection refused is what a failed probe sees: nothing
		// listens there, which no stall of the gateway's own can fake.
		// It is not capped, as probes are not; the cap is for the
		// signals that a gateway-side fault could send for every node
		// at once. Capped, all nodes killed at once left the others
		// routed for a probe round, and their requests got 502, not
		// 503 (docs/benchmarks.md, "All nodes killed at once").
		n.eject("refused", err, !refusedDial(ne, err))
	case ne.timeout && int(n.passiveRuns.Add(1)) >= n.h.PassiveFails:
		n.eject("timeouts", err, true)
	}
}

// eject takes the node out of service, its flap hold-down counted from
// now. It logs and counts only when the state changes. Idle data
// connections are closed: they lead to a process that is dead or hung.
func (n *node) eject(reason string, cause error, passive bool) {
	n.ejectHeld(reason, cause, passive, time.Time{})
}

// ejectHeld is eject with the flap hold-down counted from from (zero:
// now): a probe's ejection counts it from its round's start, as every
// failed probe of a down node does (probeResult), not from when its
// answer came, a timeout later for a probe that timed out.
func (n *node) ejectHeld(reason string, cause error, passive bool, from time.Time) {
	if !n.up.Load() || n.retired.Load() {
		return
	}
	if passive && !n.h.reservePassive() {
		n.h.refused(n.name)
		return
	}
	n.mu.Lock()
	n.h.moves.Add(1) // before the change, seen by whoever sees it (Cluster.Moves)
	if !n.up.CompareAndSwap(true, false) {
		n.mu.Unlock()
		if passive {
			n.h.down.Add(-1)
		}
		return
	}
	if !passive {
		n.h.down.Add(1)
	}
	now := time.Now()
	n.passes = 0
	n.passiveRuns.Store(0)
	if !n.readmittedAt.IsZero() && now.Sub(n.readmittedAt) < n.h.FlapWindow {
		n.flaps++
	} else {
		n.flaps = 0
	}
	hold := n.h.backoff(n.name, n.flaps)
	if from.IsZero() {
		from = now
	}
	n.hold, n.holdUntil = hold, from.Add(hold)
	n.since, n.reason = now, reason+": "+cause.Error()
	flaps := n.flaps
	n.mu.Unlock()

	n.m.up.Set(0)
	n.h.ejected(n.name, reason)
	attrs := []any{"reason", reason, "err", cause.Error(), "flaps", flaps, "readmit_hold", hold.String()}
	if n.unseen.Load() {
		// Not seen in service since it joined: writes sent elsewhere on
		// its account before then are unknown here (stale.go, "Unknown history").
		attrs = append(attrs, "history_unknown", true)
	}
	n.log.Warn("node down", attrs...)
	_ = n.client.Close()
}

type probeAction uint8

const (
	probeNone probeAction = iota
	probeEject
	probeReadmit
)

// probeResult applies the result of a probe of the round that started at
// at to the counters and says what to do; the caller acts without
// holding the lock. A flap's hold-down counts from the round of the last
// failed probe, not from the ejection: every gateway probes at the same
// rounds (Run) and sees the same failures, where each ejects at a moment
// of its own (a passive ejection, by its own traffic), so they end the
// hold-down, and re-admit, together.
//
// A slow probe (errProbeSlow: memcached answered the probe before it,
// late, and not this one in time) is no failure of a node in service:
// it ends a run of failures, as an answer does, and the node stays. On a
// node out of service it is a failure: one too slow to answer its own
// probe in time is not re-admitted (decision 0095).
func (n *node) probeResult(err error, at time.Time) probeAction {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err != nil && n.up.Load() && errors.Is(err, errProbeSlow) {
		n.fails = 0
		return probeNone
	}
	if err != nil {
		n.passes = 0
		n.fails++
		if n.up.Load() {
			if n.fails >= n.h.Fall {
				return probeEject
			}
		} else if n.hold > 0 {
			n.holdUntil = at.Add(n.hold)
		}
		return probeNone
	}
	n.fails = 0
	if n.up.Load() {
		n.unseen.Store(false) // in service and answering: from here on this process sees its outages
		return probeNone
	}
	if n.holdUntil.Sub(at) > n.hold+n.h.Interval {
		// More of the hold-down is left than it lasts: the wall clock,
		// on which rounds and hold-downs count, stepped back since it
		// was set. It counts from this round instead of holding the
		// node out of service for as long as the clock stepped.
		n.holdUntil = at.Add(n.hold)
	}
	if at.Before(n.holdUntil) {
		return probeNone
	}
	n.passes++
	if n.passes >= n.h.Rise {
		return probeReadmit
	}
	return probeNone
}

// admit puts a node back into service and reports whether it did (a
// node removed meanwhile, or up already, is left as it is).
func (n *node) admit() bool {
	n.mu.Lock()
	n.h.moves.Add(1) // before the change, seen by whoever sees it (Cluster.Moves)
	if n.retired.Load() || !n.up.CompareAndSwap(false, true) {
		n.mu.Unlock()
		return false
	}
	n.h.down.Add(-1)
	now := time.Now()
	passes := n.passes
	n.readmittedAt, n.passes = now, 0
	n.since, n.reason = now, fmt.Sprintf("%d probes passed", passes)
	n.mu.Unlock()
	n.m.up.Set(1)
	n.log.Info("node up", "passes", passes)
	return true
}

// Run checks every node actively until ctx is done: a round at once, then
// one at each multiple of Health.Interval on the wall clock (nextRound).
// Gateways whose clocks agree (NTP keeps them within milliseconds) so
// probe a node at the same moments, see it fail and pass at the same
// rounds, and re-admit it together: each deletes the keys it wrote
// elsewhere as it re-admits, and until the last has, a read through one
// that has may find the node's older value of a key another still writes
// to the next node (decision 0070). Rounds never overlap: each waits
// for all its probes, and one that runs past a multiple skips it.
// Run returns nil when ctx is done, without waiting for the probes in
// flight: they end with ctx.
func (c *Cluster) Run(ctx context.Context) error {
	c.checkAll(ctx)
	c.probedOnce.Do(func() { close(c.probed) })
	at := nextRound(time.Now(), time.Time{}, c.opts.Health.Interval)
	t := time.NewTimer(time.Until(at))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if ctx.Err() != nil {
				// A round due while ctx ended can be chosen over
				// ctx.Done: no round starts after ctx ended.
				return nil
			}
			c.checkRound(ctx, at)
			at = nextRound(time.Now(), at, c.opts.Health.Interval)
			t.Reset(time.Until(at))
		}
	}
}

// checkAll runs one probe round now (checkRound).
func (c *Cluster) checkAll(ctx context.Context) { c.checkRound(ctx, time.Now()) }

// checkRound runs the probe round that starts at at (a multiple of the
// interval, or now), synchronously, and closes the removed
// nodes that have nothing left in flight. Every node's TCP probe comes
// before the UDP probes, so that ports that do not answer delay no
// node's health; at most maxProbes run at once, on as many goroutines.
// A probe ends within Health.Timeout (two when it is sent again for a
// deadline the gateway came to late: probeClient.roundTrip), so a round
// of hanging nodes takes that per maxProbes of them (plus the re-admissions, whose
// flushes and deletes are bounded by their own timeouts). The round
// ends as soon as ctx does: the probes in flight are cut short, and
// those not started are not.
func (c *Cluster) checkRound(ctx context.Context, at time.Time) {
	c.closeRetired()
	nodes := c.topo.Load().nodes
	type check struct {
		n   *node
		udp bool
	}
	checks := make([]check, 0, len(nodes))
	for _, n := range nodes {
		checks = append(checks, check{n, false})
	}
	for _, n := range nodes {
		if n.udp != nil {
			checks = append(checks, check{n, true})
		}
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(len(checks), maxProbes) {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= len(checks) {
					return
				}
				c.runCheck(ctx, checks[i].n, checks[i].udp, at)
			}
		})
	}
	wg.Wait()
}

// runCheck checks one node, or its UDP port, counting and logging a
// panic (probePanics) instead of ending the round's goroutine with the
// process (a panic of the probe itself is a failed probe: probeOnce).
func (c *Cluster) runCheck(ctx context.Context, n *node, udp bool, at time.Time) {
	defer func() {
		if r := recover(); r != nil {
			c.probePanics.Stopped(c.log, r, "node", n.name, "udp", udp)
		}
	}()
	if udp {
		c.checkUDP(ctx, n)
	} else {
		c.checkNode(ctx, n, at)
	}
}

// checkUDP probes a node's UDP port and applies the result (see udpPort).
// Changes are logged: up at Info, down at Warn.
func (c *Cluster) checkUDP(ctx context.Context, n *node) {
	u := n.udp
	err := u.check(ctx, c.opts.Health.Timeout)
	if ctx.Err() != nil || n.retired.Load() {
		return // shutting down, or removed meanwhile: a probe says nothing
	}
	if err == nil {
		if u.change(true, "UDP probe passed") {
			n.log.Info("memcached UDP port up: asynchronous sets to this node go out as datagrams", "udp", u.addr)
		}
		return
	}
	fails := u.failed()
	if !refused(err) && fails < c.opts.Health.Fall && u.up.Load() {
		return
	}
	why := "UDP probe failed: " + err.Error()
	if refused(err) {
		why = "UDP probe refused (ICMP port unreachable: nothing listens there; memcached needs -U): " + err.Error()
	}
	if u.change(false, why) {
		n.log.Warn("memcached UDP port down; sets to this node go over TCP until a UDP probe passes", "udp", u.addr, "reason", why, "consecutive_fails", fails)
	}
}

// checkNode probes a node and applies the result: an ejection after
// Health.Fall failures, a re-admission after Health.Rise passes. It
// first closes the node's side connections kept unused too long
// (closeKeptIdle).
func (c *Cluster) checkNode(ctx context.Context, n *node, at time.Time) {
	n.closeKeptIdle(at)
	err := c.probeOnce(ctx, n, false)
	if ctx.Err() != nil || n.retired.Load() {
		return // shutting down, or removed meanwhile: a probe says nothing
	}
	if err != nil {
		n.m.probeFail.Inc()
		if errors.Is(err, errProbeSlow) {
			n.m.probeSlow.Inc()
		}
	} else {
		n.m.probeOK.Inc()
	}
	switch n.probeResult(err, at) {
	case probeEject:
		n.ejectHeld("probe", err, false, at)
	case probeReadmit:
		c.readmit(ctx, n)
	}
}

// readmit brings a node whose probes passed back into service, first
// making sure it cannot serve values older than what other nodes got
// while it was away: flushed if Health.ReadmitFlush is on, else its keys
// written elsewhere deleted (see stale.go for the order of the two
// passes). If that fails the node stays down and the count of passes
// starts again: the next Rise passes retry. Once admitted, the copies
// those keys left on the nodes that took them are deleted there
// (clearCopies), so a second outage cannot bring them back. A node
// away since before this process started, or since a server change
// added it, whose earlier keys written elsewhere are unknown, is counted
// and warned about unless it is flushed or empty (stale.go, "Unknown
// history").
func (c *Cluster) readmit(ctx context.Context, n *node) {
	if owed := n.flushOwed.Load(); owed || c.health.readmitFlush.Load() {
		// Start it empty: the keys written elsewhere need no delete on
		// it, only their copies on the nodes that took them (clearCopies).
		if ferr := c.probeOnce(ctx, n, true); ferr != nil {
			n.resetPasses()
			if ctx.Err() != nil {
				return // shutting down: the flush says nothing
			}
			n.log.Warn("flush before re-admission failed; staying down", "err", ferr.Error())
			return
		}
		if owed {
			n.flushOwed.Store(false)
			n.log.Info("flushed before re-admission: a flush_all was sent while it was down")
		}
		keys := n.stale.take()
		n.stale.admitted()
		if !n.admit() {
			n.stale.drop()
			return
		}
		n.unseen.Store(false) // flushed: whatever it went through, it holds nothing older
		keys = append(keys, n.stale.take()...)
		n.stale.admitted()
		if cleared := c.clearCopies(ctx, n, keys); cleared > 0 {
			n.log.Info(fmt.Sprintf("re-admitted flushed; deleted %d copies written to other nodes while it was down", cleared), "copies_deleted", cleared)
		}
		return
	}
	// Taken, the keys are still passed over in panic mode until the node
	// serves, or its deletes failed and recorded them again.
	keys := n.stale.takeDeleting()
	defer n.stale.endDeleting()
	deleted, err := c.invalidateStale(ctx, n, keys)
	if err != nil {
		n.resetPasses()
		left := n.stale.len()
		// Those deleted too: the node stays down, and in panic mode a key
		// it no longer records is written on it, and read on the next
		// node once panic ends, which holds the older copy. The next
		// re-admission deletes them once more.
		n.stale.putBack(keys)
		if ctx.Err() != nil {
			return // shutting down: the keys stay recorded
		}
		n.log.Warn("deleting keys written to other nodes while it was down failed; staying down",
			"deleted", deleted, "left", left, "err", err.Error())
		return
	}
	holds, unseenAttrs := c.unseenHolds(ctx, n)
	if !n.admit() {
		return
	}
	n.admittedUnseen(holds, unseenAttrs)
	// Writes that found the node down before the admission took effect,
	// or during the deletes: their keys are deleted once more, now that
	// the node serves. A failure here leaves them recorded for the next
	// re-admission.
	lateKeys := n.stale.take()
	late, err := c.invalidateStale(ctx, n, lateKeys)
	deleted += late
	untracked := n.stale.admitted()
	cleared := c.clearCopies(ctx, n, append(keys, lateKeys...))
	attrs := []any{"deleted", deleted, "copies_deleted", cleared}
	if untracked > 0 {
		attrs = append(attrs, "untracked", untracked)
	}
	if err != nil {
		attrs = append(attrs, "err", err.Error())
	}
	switch {
	case untracked > 0:
		n.log.Warn(fmt.Sprintf("re-admitted after deleting %d keys written to other nodes while it was down; %d more were not remembered and may read stale until written again (MEMCGATE_READMIT_FLUSH=true avoids it)", deleted, untracked), attrs...)
	case err != nil:
		n.log.Warn(fmt.Sprintf("re-admitted after deleting %d keys written to other nodes while it was down; deleting the last ones failed, they stay recorded", deleted), attrs...)
	case deleted > 0:
		n.log.Info(fmt.Sprintf("re-admitted after deleting %d keys written to other nodes while it was down", deleted), attrs...)
	}
}

// resetPasses makes the next re-admission wait for Rise more passes.
func (n *node) resetPasses() {
	n.mu.Lock()
	n.passes = 0
	n.mu.Unlock()
}

// Moves counts the changes of the nodes' health: each ejection and
// re-admission, counted before it takes effect (a few more: tries that
// found the change made already). Keys may be placed elsewhere once it
// has changed. A caller that spreads one value over several operations
// placed by one key (the chunks of a large value and their index) reads
// it before the first and after the last: if it is the same, they were
// all placed on the same nodes.
func (c *Cluster) Moves() uint64 { return c.health.moves.Load() }

// up is the number of t's nodes taking traffic.
func (c *Cluster) up(t *topology) int { return len(t.nodes) - int(c.health.down.Load()) }

// panicking reports whether routing should ignore health: fewer than
// PanicPercent of the nodes are up, but not none (then there is nothing to
// route to, and failing fast is better).
func (c *Cluster) panicking(t *topology) bool {
	p := c.opts.Health.PanicPercent
	if p <= 0 {
		return false
	}
	up := c.up(t)
	return up > 0 && up*100 < p*len(t.nodes)
}

// startDown marks a node SetServers added down before it takes traffic:
// its first probe failed or did not answer in time. Rise probes bring it
// up, as any down node. It reports whether it marked the node down; the
// caller counts such a node in healthPolicy.down once it is in the ring.
func (n *node) startDown(cause error) bool {
	n.mu.Lock()
	if !n.up.CompareAndSwap(true, false) {
		n.mu.Unlock()
		return false
	}
	n.since, n.reason = time.Now(), "added, first probe failed: "+cause.Error()
	n.mu.Unlock()
	n.m.up.Set(0)
	n.log.Debug("node added but down", "err", cause.Error()) // SetServers logs one line for all
	return true
}

// retire takes a node SetServers removed out of the health counts: it
// is no longer up or down, only draining.
func (n *node) retire() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.retired.Store(true)
	if !n.up.Load() {
		n.h.down.Add(-1)
	}
	n.up.Store(false) // takes no new operation (a stale topology may still offer it)
	n.since, n.reason = time.Now(), "removed from the servers"
}
