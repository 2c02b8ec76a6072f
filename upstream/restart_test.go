package upstream

import (
	"bufio"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/memcgate/memcgate/test/memcachedtest"
)

// logTo makes n log to logs.
func logTo(n *node, logs *syncBuffer) {
	n.log = slog.New(slog.NewTextHandler(logs, nil)).With("node", n.name)
}

// restartOptions are faultOptions with a fall window no test here
// reaches unless it means to (a restart between two probes must not
// need an ejection to be seen), and a probe timeout that a loaded
// machine does not reach by accident.
func restartOptions(o *Options) {
	faultOptions(o)
	o.Health.Fall, o.Health.Timeout = 3, time.Second
}

// TestRestartBetweenProbesIsSeen: a memcached killed and restarted on
// its port between two probes, well within the fall window, is seen by
// the next probe: no probe fails, the node never goes down, and the
// restart is counted, logged once with both processes' pids and starts
// and what the new one holds, and shown in /debug/nodes. A restart while
// the node is down is counted alike, its line saying so, and its
// re-admission goes on as before. Probes after it, on the kept
// connection, see nothing more.
func TestRestartBetweenProbesIsSeen(t *testing.T) {
	tests := []struct {
		name     string
		down     bool   // the node is ejected by probes before it comes back
		wantLine string // the restart line's message starts so
	}{
		{name: "back within the fall window", wantLine: "memcached restarted: another process answers"},
		{name: "back while down", down: true, wantLine: "memcached restarted while the node was down"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mcs := memcachedtest.StartN(t, 2)
			c, _ := newTestCluster(t, mcs, restartOptions)
			n := c.topo.Load().nodes[0]
			var logs syncBuffer
			logTo(n, &logs)
			c.checkAll(t.Context())
			before, err := mcs[0].Stats()
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Set(t.Context(), Item{Key: keyOwnedBy(t, c, 0), Value: []byte("v")}); err != nil {
				t.Fatal(err)
			}
			mcs[0].Kill()
			if tt.down {
				for range c.opts.Health.Fall {
					c.checkAll(t.Context())
				}
				if n.available() {
					t.Fatal("the killed node is still up after Fall failed probes")
				}
				if got := testutil.ToFloat64(n.m.restarts); got != 0 {
					t.Errorf("restarts_total while nothing answers = %v, want 0", got)
				}
			}
			mcs[0].Restart()
			after, err := mcs[0].Stats()
			if err != nil {
				t.Fatal(err)
			}
			fails := testutil.ToFloat64(n.m.probeFail)
			c.checkAll(t.Context())
			if got := testutil.ToFloat64(n.m.restarts); got != 1 {
				t.Fatalf("memcgate_upstream_restarts_total after the first probe of the new process = %v, want 1\n%s", got, logs.String())
			}
			if got := testutil.ToFloat64(n.m.probeFail) - fails; got != 0 {
				t.Errorf("probes failed on the restarted node = %v, want 0: the connection it closed is dialled again", got)
			}
			if tt.down {
				readmitNow(t, c, 0)
			} else if !n.available() {
				t.Error("the node went down")
			}
			ejections := 0.0
			for _, r := range ejectReasons {
				ejections += testutil.ToFloat64(c.m.ejects.WithLabelValues(n.name, r))
			}
			if want := map[bool]float64{false: 0, true: 1}[tt.down]; ejections != want {
				t.Errorf("ejections = %v, want %v", ejections, want)
			}
			for range 3 {
				c.checkAll(t.Context())
			}
			if got := testutil.ToFloat64(n.m.restarts); got != 1 {
				t.Errorf("restarts_total after more probes = %v, want 1", got)
			}
			lines := linesOf(logs.String(), "memcached restarted")
			if len(lines) != 1 {
				t.Fatalf("restart lines = %d, want 1:\n%s", len(lines), logs.String())
			}
			line := lines[0]
			started := func(st map[string]string) string {
				var now, up int64
				fmt.Sscan(st["time"], &now)
				fmt.Sscan(st["uptime"], &up)
				return time.Unix(now-up, 0).UTC().Format(time.RFC3339)
			}
			for _, want := range []string{
				"level=WARN", `msg="` + tt.wantLine, "node=" + n.name,
				"pid=" + after["pid"], "pid_before=" + before["pid"],
				"started=" + started(after), "started_before=" + started(before),
				"curr_items=0",
			} {
				if !strings.Contains(line, want) {
					t.Errorf("restart line lacks %s:\n%s", want, line)
				}
			}
			if got, want := n.status().Restarted.Format(time.RFC3339), started(after); got != want {
				t.Errorf("NodeStatus.Restarted = %s, want the new process's start %s", got, want)
			}
			if !c.Nodes()[1].Restarted.IsZero() {
				t.Error("the other node shows a restart")
			}
		})
	}
}

// TestPauseIsNotARestart: a memcached paused (SIGSTOP) past two probes'
// timeouts, so that a probe after them dials anew and reads its stats
// again (the first keeps its connection for the late answer, the second
// gets none and closes it: decision 0095), and then resumed, is the same
// process: no restart, whether it was paused for less than the fall
// window or long enough to be ejected.
func TestPauseIsNotARestart(t *testing.T) {
	for _, rounds := range []int{2, 3} {
		t.Run(fmt.Sprintf("%d rounds", rounds), func(t *testing.T) {
			mcs := memcachedtest.StartN(t, 2)
			c, _ := newTestCluster(t, mcs, restartOptions)
			n := c.topo.Load().nodes[0]
			c.checkAll(t.Context())
			mcs[0].Pause()
			fails := testutil.ToFloat64(n.m.probeFail)
			for range rounds {
				c.checkAll(t.Context())
			}
			if got := testutil.ToFloat64(n.m.probeFail) - fails; got != float64(rounds) {
				t.Fatalf("probes failed while paused = %v, want %d", got, rounds)
			}
			time.Sleep(1500 * time.Millisecond) // memcached's uptime counts the pause: more than its rounding
			mcs[0].Resume()
			n.mu.Lock()
			n.inst.uptime = -1 // marks the last look: the probe that reads stats again replaces it
			n.mu.Unlock()
			readmitNow(t, c, 0)
			n.mu.Lock()
			looked := n.inst.uptime >= 0
			n.mu.Unlock()
			if !looked {
				t.Fatal("no probe read stats after the pause: the test checks nothing")
			}
			if got := testutil.ToFloat64(n.m.restarts); got != 0 {
				t.Errorf("memcgate_upstream_restarts_total after a pause = %v, want 0", got)
			}
			if !n.status().Restarted.IsZero() {
				t.Errorf("NodeStatus.Restarted = %v after a pause, want none", n.status().Restarted)
			}
		})
	}
}

// TestRestartSkew: on a server whose stats put the same process's start
// a second away from one connection to the next (rounding, or time and
// uptime read apart), nothing is counted; another pid, or the same pid
// with its start moved past the skew (a container's pid 1 restarted), is
// a restart.
func TestRestartSkew(t *testing.T) {
	const base = 1_790_000_000
	tests := []struct {
		name  string
		pid   func(conn int) int64
		start func(conn int) int64
		want  float64
	}{
		{name: "start a second later", pid: func(int) int64 { return 42 }, start: func(i int) int64 { return base + int64(i%2) }, want: 0},
		{name: "start a second earlier", pid: func(int) int64 { return 42 }, start: func(i int) int64 { return base - int64(i%2) }, want: 0},
		{name: "another pid, same start", pid: func(i int) int64 { return 42 + int64(i) }, start: func(int) int64 { return base }, want: 3},
		{name: "same pid, start a minute later", pid: func(int) int64 { return 1 }, start: func(i int) int64 { return base + 60*int64(i) }, want: 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var conns atomic.Int64
			srv := memcachedtest.StartScripted(t, scriptedStats(&conns, tt.pid, tt.start))
			c, _ := newTestCluster(t, []*memcachedtest.Server{{Addr: srv.Addr, Port: srv.Port}}, restartOptions)
			n := c.topo.Load().nodes[0]
			// Connections 0 to 3: each answers one probe and is closed
			// at the next one's version, which dials anew.
			for range 4 {
				c.checkAll(t.Context())
			}
			if got := conns.Load(); got != 4 {
				t.Fatalf("connections = %d, want 4", got)
			}
			if got := testutil.ToFloat64(n.m.probeFail); got != 0 {
				t.Errorf("failed probes = %v, want 0", got)
			}
			if got := testutil.ToFloat64(n.m.restarts); got != tt.want {
				t.Errorf("memcgate_upstream_restarts_total = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestRestartLinesGated: an address where another process answers each
// new probe connection (a node that closes every connection after its
// answer, behind a balancer over several memcacheds, or hostile) would
// log a restart at every probe, HEALTH_INTERVAL after HEALTH_INTERVAL,
// on every such node. Each restart is counted, but a node's restart line
// comes at most once per restartLogEvery, the next one saying how many
// restarts went unlogged before it.
func TestRestartLinesGated(t *testing.T) {
	var conns atomic.Int64
	srv := memcachedtest.StartScripted(t, scriptedStats(&conns,
		func(i int) int64 { return 42 + int64(i) }, func(int) int64 { return 1_790_000_000 }))
	c, _ := newTestCluster(t, []*memcachedtest.Server{{Addr: srv.Addr, Port: srv.Port}}, restartOptions)
	n := c.topo.Load().nodes[0]
	var logs syncBuffer
	logTo(n, &logs)
	const rounds = 20 // the first connection's process is no restart: 19
	for range rounds {
		c.checkAll(t.Context())
	}
	if got := testutil.ToFloat64(n.m.restarts); got != rounds-1 {
		t.Fatalf("memcgate_upstream_restarts_total = %v, want %d: every restart counted", got, rounds-1)
	}
	if lines := linesOf(logs.String(), "memcached restarted"); len(lines) != 1 || strings.Contains(lines[0], "restarts_unlogged") {
		t.Fatalf("%d restarts in a row logged %d lines, want 1, the first, with nothing unlogged before it:\n%s", rounds-1, len(lines), logs.String())
	}
	n.mu.Lock()
	n.restartLogged = n.restartLogged.Add(-restartLogEvery)
	n.mu.Unlock()
	c.checkAll(t.Context())
	lines := linesOf(logs.String(), "memcached restarted")
	if len(lines) != 2 || !strings.Contains(lines[1], fmt.Sprintf("restarts_unlogged=%d", rounds-2)) {
		t.Fatalf("a restart restartLogEvery after the last line: %d lines, want 2, the second counting %d unlogged:\n%s", len(lines), rounds-2, logs.String())
	}
}

// TestRestartStartOutOfRange: a node whose stats put its start past the
// year 9999 (time near 2^63, from a broken or hostile server) names no
// process: taken as a restart, its start made /debug/nodes, which
// encodes every node's restarted as JSON, fail for every node.
func TestRestartStartOutOfRange(t *testing.T) {
	var conns atomic.Int64
	srv := memcachedtest.StartScripted(t, scriptedStats(&conns,
		func(i int) int64 { return 42 + int64(i) },
		func(i int) int64 { return map[bool]int64{true: 1_790_000_000, false: 1 << 62}[i == 0] }))
	c, _ := newTestCluster(t, []*memcachedtest.Server{{Addr: srv.Addr, Port: srv.Port}}, restartOptions)
	n := c.topo.Load().nodes[0]
	for range 3 {
		c.checkAll(t.Context())
	}
	if got := testutil.ToFloat64(n.m.restarts); got != 0 {
		t.Errorf("memcgate_upstream_restarts_total = %v, want 0: a start past year 9999 names no process", got)
	}
	if _, err := json.Marshal(c.Nodes()); err != nil {
		t.Errorf("/debug/nodes: %v", err)
	}
}

// scriptedStats is the script of a server whose connection i answers
// stats with pid(i) and a start of start(i) (uptime 100), and closes at
// its second version, so that each connection answers one probe and the
// next probe dials anew and reads stats again; conns counts the
// connections.
func scriptedStats(conns *atomic.Int64, pid, start func(conn int) int64) func(string, *bufio.Reader) (string, bool) {
	type conn struct{ i, versions int }
	var mu sync.Mutex // guards byReader
	byReader := map[*bufio.Reader]*conn{}
	return func(line string, br *bufio.Reader) (string, bool) {
		mu.Lock()
		cn := byReader[br]
		if cn == nil {
			cn = &conn{i: int(conns.Add(1) - 1)}
			byReader[br] = cn
		}
		mu.Unlock()
		switch line {
		case "version\r\n":
			cn.versions++
			if cn.versions == 2 {
				return "", false
			}
			return "VERSION 1.6.18\r\n", true
		case "stats\r\n":
			const uptime = 100
			return fmt.Sprintf("STAT pid %d\r\nSTAT uptime %d\r\nSTAT time %d\r\nSTAT curr_items 0\r\nEND\r\n",
				pid(cn.i), uptime, start(cn.i)+uptime), true
		}
		return "ERROR\r\n", true
	}
}

// TestInstanceReplacedBy: another pid is another process; so is the same
// pid with its start moved past restartSkew either way; a start within
// it is the same process.
func TestInstanceReplacedBy(t *testing.T) {
	const base = 1_790_000_000
	last := instance{pid: 42, started: base, uptime: 600}
	tests := []struct {
		name string
		next instance
		want bool
	}{
		{"the same", instance{pid: 42, started: base, uptime: 700}, false},
		{"start a second later", instance{pid: 42, started: base + 1}, false},
		{"start a second earlier", instance{pid: 42, started: base - 1}, false},
		{"start at the skew", instance{pid: 42, started: base + restartSkew}, false},
		{"start past the skew", instance{pid: 42, started: base + restartSkew + 1}, true},
		{"start an hour earlier", instance{pid: 42, started: base - 3600}, true},
		{"another pid, same start", instance{pid: 43, started: base}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := last.replacedBy(tt.next); got != tt.want {
				t.Errorf("%+v.replacedBy(%+v) = %v, want %v", last, tt.next, got, tt.want)
			}
		})
	}
}

// TestReadStats: a reply is read to its END and names the process only
// with pid, time and uptime; an error line ends it at once; a reply cut
// short, or with a line longer than the reader holds, is not read.
func TestReadStats(t *testing.T) {
	tests := []struct {
		name     string
		reply    string
		want     instance
		wantRead bool
	}{
		{"memcached", "STAT pid 7\r\nSTAT uptime 100\r\nSTAT time 1790000100\r\nSTAT version 1.6.18\r\nSTAT curr_items 3\r\nEND\r\n",
			instance{pid: 7, started: 1790000000, uptime: 100, items: "3"}, true},
		{"no pid", "STAT uptime 100\r\nSTAT time 1790000100\r\nEND\r\n", instance{}, true},
		{"no curr_items", "STAT pid 7\r\nSTAT uptime 100\r\nSTAT time 1790000100\r\nEND\r\n",
			instance{pid: 7, started: 1790000000, uptime: 100}, true},
		{"not a number", "STAT pid x\r\nSTAT uptime 100\r\nSTAT time 1790000100\r\nEND\r\n", instance{}, true},
		{"no stats command", "ERROR\r\n", instance{}, true},
		{"cut short", "STAT pid 7\r\nSTAT uptime 100\r\n", instance{}, false},
		{"a line too long", "STAT pid 7\r\nSTAT x " + strings.Repeat("y", probeLineMax) + "\r\nEND\r\n", instance{}, false},
		{"pid twice, no uptime", "STAT pid 7\r\nSTAT pid 8\r\nSTAT time 1790000100\r\nEND\r\n", instance{}, true},
		{"time past year 9999", "STAT pid 7\r\nSTAT uptime 100\r\nSTAT time 9223372036854775807\r\nEND\r\n", instance{}, true},
		{"time at the end of year 9999", "STAT pid 7\r\nSTAT uptime 100\r\nSTAT time 253402300799\r\nEND\r\n",
			instance{pid: 7, started: 253402300699, uptime: 100}, true},
		{"uptime past time", "STAT pid 7\r\nSTAT uptime 1790000101\r\nSTAT time 1790000100\r\nEND\r\n", instance{}, true},
		{"negative uptime", "STAT pid 7\r\nSTAT uptime -5\r\nSTAT time 1790000100\r\nEND\r\n", instance{}, true},
		{"pid past int64", "STAT pid 9223372036854775808\r\nSTAT uptime 100\r\nSTAT time 1790000100\r\nEND\r\n", instance{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, read := readStats(bufio.NewReaderSize(strings.NewReader(tt.reply), probeLineMax))
			if got != tt.want || read != tt.wantRead {
				t.Errorf("readStats(%q) = %+v, %v; want %+v, %v", tt.reply, got, read, tt.want, tt.wantRead)
			}
		})
	}
}
