package e2e

import (
	"encoding/json"
	"net/http"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/faultproxy"
	"github.com/memcgate/memcgate/test/gatewaytest"
	"github.com/memcgate/memcgate/test/memcachedtest"
)

// nodeState is a node's line of /debug/nodes.
type nodeState struct {
	Node   string `json:"node"`
	Up     bool   `json:"up"`
	Reason string `json:"reason"`
}

// nodeStates returns /debug/nodes.
func nodeStates(t *testing.T, g *gateway) []nodeState {
	t.Helper()
	resp, err := http.Get(g.Admin + "/debug/nodes")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var ns []nodeState
	if err := json.NewDecoder(resp.Body).Decode(&ns); err != nil {
		t.Fatal(err)
	}
	return ns
}

// TestReloadPausedWithAnAddedNodeStartsItUp: a reload adds a node whose
// memcached is stopped, and the gateway is stopped too while the node's
// probe waits for its answer, longer than the reload waits for the
// probe (two HEALTH_TIMEOUTs from its start), as a host or container
// frozen whole would be; the gateway is let go first, memcached 30 ms
// later. The probe, its deadline come to late, is sent once more and
// passes (0087), and the reload, its own wait come to late too, waits
// for it once more (0090): the node starts up. Without that, the
// reload's wait ends on waking and the node starts down ("no answer
// within 300ms"), taking traffic HEALTH_RISE probe rounds later.
func TestReloadPausedWithAnAddedNodeStartsItUp(t *testing.T) {
	mcs := memcachedtest.StartN(t, 2)
	px := faultproxy.NewTCP(mcs[1].Addr) // tells when the probe's connection is made
	if err := px.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { px.Close() })
	file := filepath.Join(t.TempDir(), "servers")
	writeAtomic(t, file, mcs[0].Addr+"\n")
	g := startGateway(t, map[string]string{
		"MEMCGATE_SERVERS_FILE":   file,
		"MEMCGATE_WATCH_INTERVAL": "0s",
		"MEMCGATE_HEALTH_TIMEOUT": "300ms",
		// One probe round, at start: none admits the node after the reload.
		"MEMCGATE_HEALTH_INTERVAL": "1h",
	})
	reloadsOK := metric(t, g, "memcgate_config_reloads_total", `{result="ok"}`)
	mcs[1].Pause()
	writeAtomic(t, file, mcs[0].Addr+"\n"+px.Addr()+"\n")
	g.Signal(syscall.SIGHUP)
	for deadline := time.Now().Add(10 * time.Second); px.Stats().Accepted == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the node added not probed within 10s of SIGHUP")
		}
	}
	time.Sleep(50 * time.Millisecond) // the probe's version waits in the stopped memcached's socket
	g.Signal(syscall.SIGSTOP)
	memcachedtest.WaitStopped(t, "gateway", g.Pid())
	time.Sleep(time.Second) // past the probe's deadline and the reload's wait, 600 ms from the probe's start
	g.Signal(syscall.SIGCONT)
	time.Sleep(30 * time.Millisecond)
	mcs[1].Resume()
	for deadline := time.Now().Add(10 * time.Second); metric(t, g, "memcgate_config_reloads_total", `{result="ok"}`) <= reloadsOK; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the reload not done within 10s; log:\n%s", gatewaytest.Tail(g.Logs(), 3000))
		}
	}
	found := false
	for _, n := range nodeStates(t, g) {
		if n.Node != px.Addr() {
			continue
		}
		found = true
		if !n.Up {
			t.Errorf("the node added is down (%s), want up: its probe, sent again on waking, passed; log:\n%s", n.Reason, gatewaytest.Tail(g.Logs(), 3000))
		}
	}
	if !found {
		t.Fatalf("the node added (%s) is not in /debug/nodes", px.Addr())
	}
	t.Logf("probes late: %v", metricSum(t, g, "memcgate_upstream_probes_late_total"))
}
