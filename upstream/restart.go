package upstream

import (
	"bufio"
	"bytes"
	"strconv"
	"time"
)

// Restarts. A memcached that its supervisor (systemd, compose, a
// container runtime) restarts is back within a probe interval, empty: no
// probe fails Health.Fall times, the node never goes down, and nothing
// else says that every key it held now misses. So every new probe
// connection asks stats after its command, in the same write
// (probeClient), and the node compares what it says of the process with
// the last one seen at its address (node.sawInstance): another pid, or a
// start (memcached's time less its uptime) moved by more than
// restartSkew, is another process: a restart. A probe dials anew at the
// start, after a failed probe, and when memcached closed the kept
// connection (as a restart does), so the first probe that reaches the
// new process sees it, within one Health.Interval of its return; a probe
// on a kept connection asks nothing more. A restart seen while the node
// is down (the probes of its re-admission) is counted alike, and its line
// says the node was down; the re-admission itself (0049, 0064) goes on
// as before. Decision 0071.

// restartSkew, in seconds, is how far the start of one process may move
// between two stats replies: memcached reads time and uptime from one
// clock reading, whole seconds, so its start does not move; a server
// that reads them apart, or rounds them differently, may put it a second
// away. A process restarted within restartSkew of its previous start
// under the same pid (a container's pid 1) is not told apart.
const restartSkew = 2

// restartLogEvery is the least time between two restart lines of a
// node: each new probe connection can see a restart, so a node whose
// every connection reaches another process would log one at every
// probe (sawInstance).
const restartLogEvery = time.Minute

// instance is what a stats reply says of the memcached process that
// sent it.
type instance struct {
	pid     int64
	started int64  // Unix seconds: the reply's time less its uptime
	uptime  int64  // seconds
	items   string // curr_items as sent; "" if the reply had none
}

// known reports whether the reply named the process: pid, time and
// uptime all came.
func (i instance) known() bool { return i.pid > 0 && i.started > 0 }

// replacedBy reports whether j, read on a later connection to the same
// address, is another process than i: another pid, or the same pid with
// its start moved by more than restartSkew.
func (i instance) replacedBy(j instance) bool {
	if i.pid != j.pid {
		return true
	}
	d := j.started - i.started
	return d > restartSkew || d < -restartSkew
}

// startTime is i's start as a time, UTC.
func (i instance) startTime() time.Time { return time.Unix(i.started, 0).UTC() }

// statsTimeMax is the last second of the year 9999, in Unix seconds: a
// stats time past it is not a clock's, and a start past it cannot be
// shown (/debug/nodes encodes it as JSON, which ends at that year).
const statsTimeMax = 253402300799

// readStats reads a stats reply from br, to its END, at most
// statsLinesMax lines of at most br's size each. It returns what the
// reply says of the process (zero unless it names it, each of pid, time
// and uptime given and time within statsTimeMax: known), and
// whether the reply was read to its end (END, or the single error line
// of a server that has no stats), which leaves the connection in a
// known state.
func readStats(br *bufio.Reader) (instance, bool) {
	var (
		in          instance
		now, uptime int64
		have        uint8 // of pid, time and uptime, a bit each
	)
	for range statsLinesMax {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return instance{}, false
		}
		if isErrorLine(line) {
			return instance{}, true
		}
		if string(line) == "END\r\n" {
			if have != 0b111 || now <= uptime || now > statsTimeMax {
				return instance{}, true
			}
			in.started, in.uptime = now-uptime, uptime
			return in, true
		}
		rest, ok := bytes.CutPrefix(line, []byte("STAT "))
		if !ok {
			continue
		}
		name, value, _ := bytes.Cut(bytes.TrimRight(rest, "\r\n"), []byte(" "))
		var (
			dst *int64
			bit uint8
		)
		switch string(name) {
		case "pid":
			dst, bit = &in.pid, 0b001
		case "time":
			dst, bit = &now, 0b010
		case "uptime":
			dst, bit = &uptime, 0b100
		case "curr_items":
			in.items = string(value)
			continue
		default:
			continue
		}
		v, err := strconv.ParseInt(string(value), 10, 64)
		if err != nil || v < 0 {
			continue
		}
		*dst = v
		have |= bit
	}
	return instance{}, false
}

// sawInstance compares in, read on a new probe connection, with the last
// process seen at n's address, and takes its place. Another process is a
// restart: counted, logged, and its start shown in /debug/nodes
// (NodeStatus.Restarted). The first process seen is no restart: this
// process cannot tell what ran there before it looked. A restart can be
// seen once per new probe connection at most, but an address where
// another process answers every new connection (a node that closes each
// one after its answer, a balancer over several memcacheds) restarts at
// every probe: a node's line comes at most once per restartLogEvery, and
// says how many restarts went unlogged before it (restarts_unlogged);
// every one is counted.
func (n *node) sawInstance(in instance) {
	if n.retired.Load() {
		return
	}
	now := time.Now()
	n.mu.Lock()
	last := n.inst
	n.inst = in
	restarted := last.known() && last.replacedBy(in)
	logged, unlogged := false, 0
	if restarted {
		n.restarted = in.startTime()
		if d := now.Sub(n.restartLogged); n.restartLogged.IsZero() || d >= restartLogEvery || d < 0 {
			logged, unlogged = true, n.restartUnlogged
			n.restartLogged, n.restartUnlogged = now, 0
		} else {
			n.restartUnlogged++
		}
	}
	up := n.up.Load()
	n.mu.Unlock()
	if !restarted {
		return
	}
	n.m.restarts.Inc()
	if !logged {
		return
	}
	attrs := []any{"pid", in.pid, "pid_before", last.pid,
		"started", in.startTime().Format(time.RFC3339), "started_before", last.startTime().Format(time.RFC3339),
		"uptime", in.uptime, "uptime_before", last.uptime} // uptime_before: the one before's, when last seen
	if in.items != "" {
		attrs = append(attrs, "curr_items", in.items)
	}
	if unlogged > 0 {
		attrs = append(attrs, "restarts_unlogged", unlogged)
	}
	msg := "memcached restarted: another process answers at the node's address, and what the one before held is gone (unless memcached restarted warm, -e): its keys miss until written again"
	if !up {
		msg = "memcached restarted while the node was down: it returns with what the new process holds (curr_items), not what the one before held"
	}
	n.log.Warn(msg, attrs...)
}
