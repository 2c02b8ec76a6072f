package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/memcachedtest"
)

// TestRestartDuringOutage: a gateway restarted while a node is away
// starts without the keys its predecessor wrote to other nodes on that
// node's account, so it cannot delete them on the node when it returns
// (docs/decisions/0064). A node that kept its data (SIGSTOP) then
// serves those keys' older values. What the gateway owes its operator is
// that this never happens silently: the node shows history_unknown in
// /debug/nodes while it is away, its re-admission is counted
// (memcgate_upstream_readmit_unknown_history_total, which
// MemcgateStaleReadsPossible watches) and logged with the remedy. A
// node flushed on its return (READMIT_FLUSH, a replicated pool) serves
// nothing stale and is not counted; nor is a node that comes back empty
// (restarted), which holds nothing that could be stale.
func TestRestartDuringOutage(t *testing.T) {
	cases := []struct {
		name  string
		env   map[string]string
		stop  syscall.Signal // how the gateway is stopped during the outage; 0: it runs on
		empty bool           // the node is killed and comes back empty, instead of paused
		loud  bool           // the return may serve stale values: it must be counted and logged
	}{
		{name: "outage seen whole"}, // no restart: the keys written elsewhere are deleted on the node (0020)
		{name: "graceful restart", stop: syscall.SIGTERM, loud: true},
		{name: "crash", stop: syscall.SIGKILL, loud: true},
		{name: "readmit flush", env: map[string]string{"MEMCGATE_READMIT_FLUSH": "true"}, stop: syscall.SIGTERM},
		{name: "replicated", env: map[string]string{"MEMCGATE_REPLICAS": "2"}, stop: syscall.SIGTERM},
		{name: "node restarted empty", stop: syscall.SIGTERM, empty: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel() // its own gateway and memcached; it mostly waits for the node's ejection and return
			mcs := memcachedtest.StartN(t, 3)
			x := mcs[0]
			env := map[string]string{
				"MEMCGATE_SERVERS":      memcachedtest.Addrs(mcs),
				"MEMCGATE_FAILOVER_TTL": "0s", // the copies written elsewhere stay: the test reads what the owner serves
			}
			for k, v := range tc.env {
				env[k] = v
			}
			g := startGateway(t, env)
			var keys []string
			for i := 0; len(keys) < 20 && i < 2000; i++ {
				if k := fmt.Sprint("rs-", i); g.owner(k) == x.Addr {
					keys = append(keys, k)
				}
			}
			if len(keys) < 20 {
				t.Fatalf("only %d keys owned by %s", len(keys), x.Addr)
			}
			for _, k := range keys {
				if r := g.do("PUT", "/"+k, []byte("v1")); r.status != http.StatusCreated {
					t.Fatalf("PUT %s v1 = %d %s", k, r.status, r.body)
				}
			}

			if tc.empty {
				x.Kill()
			} else {
				x.Pause()
				t.Cleanup(x.Resume) // before its kill, which a stopped process would not get to
			}
			waitNode(t, g, x.Addr, func(st nodeStatus) bool { return !st.Up })
			for _, k := range keys {
				if r := g.do("PUT", "/"+k, []byte("v2")); r.status != http.StatusCreated {
					t.Fatalf("PUT %s v2 during the outage = %d %s", k, r.status, r.body)
				}
			}

			if tc.stop != 0 {
				g.Signal(tc.stop)
				if _, ok := g.Wait(20 * time.Second); !ok {
					t.Fatal("the gateway did not exit")
				}
				g.Start(t)
			}
			restarted := tc.stop != 0
			st := waitNode(t, g, x.Addr, func(st nodeStatus) bool { return !st.Up })
			if st.HistoryUnknown != restarted {
				t.Errorf("/debug/nodes history_unknown = %v while %s is away, want %v", st.HistoryUnknown, x.Addr, restarted)
			}

			if tc.empty {
				x.Restart()
			} else {
				x.Resume()
			}
			// Up, and its history closed: the re-admission is counted
			// by then, if it is.
			waitNode(t, g, x.Addr, func(st nodeStatus) bool { return st.Up && !st.HistoryUnknown })

			stale := 0
			for _, k := range keys {
				r := g.do("GET", "/"+k, nil)
				switch {
				case r.status == http.StatusOK && r.body == "v1":
					stale++
				case r.status == http.StatusOK && r.body == "v2", r.status == http.StatusNotFound:
				default:
					t.Errorf("GET %s = %d %q", k, r.status, r.body)
				}
			}
			counted := metric(t, g, "memcgate_upstream_readmit_unknown_history_total", `{node="`+x.Addr+`"}`) // -1: no such metric
			t.Logf("%d of %d keys read their value from before the outage; counted %v", stale, len(keys), counted)
			if tc.loud {
				if counted != 1 {
					t.Errorf("%s returned with a history this process does not know (%d keys read stale): counted %v, want 1", x.Addr, stale, counted)
				}
				waitLogged(t, g, "may serve values older than those written to other nodes")
				return
			}
			if stale > 0 {
				t.Errorf("%d keys read their value from before the outage", stale)
			}
			if counted != 0 {
				t.Errorf("counted %v for a node whose history this process saw, or that returned flushed or empty; want 0", counted)
			}
			if strings.Contains(g.Logs(), "may serve values older than those written to other nodes") {
				t.Error("warned of stale values for a node whose history this process saw, or that returned flushed or empty")
			}
		})
	}
}

// nodeStatus is what the tests read of a node in /debug/nodes.
type nodeStatus struct {
	Node           string `json:"node"`
	Up             bool   `json:"up"`
	HistoryUnknown bool   `json:"history_unknown"`
}

// waitNode polls /debug/nodes until node's status satisfies ok and
// returns it.
func waitNode(t *testing.T, g *gateway, node string, ok func(nodeStatus) bool) nodeStatus {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(g.Admin + "/debug/nodes")
		if err != nil {
			t.Fatal(err)
		}
		var ns []nodeStatus
		err = json.NewDecoder(resp.Body).Decode(&ns)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range ns {
			if n.Node == node && ok(n) {
				return n
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not in the state waited for within 30s: %+v", node, ns)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
