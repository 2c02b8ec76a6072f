package e2e

import (
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/faultproxy"
	"github.com/memcgate/memcgate/test/memcachedtest"
)

// hangingNodes starts n fault proxies that hang (faultproxy.StartHanging),
// closed when the test ends, and returns their addresses.
func hangingNodes(t *testing.T, n int) ([]string, []*faultproxy.TCP) {
	t.Helper()
	pxs, err := faultproxy.StartHanging(n)
	if err != nil {
		t.Fatal(err)
	}
	var addrs []string
	for _, px := range pxs {
		t.Cleanup(func() { px.Close() })
		addrs = append(addrs, px.Addr())
	}
	return addrs, pxs
}

// allProbed waits until every proxy of pxs has had a connection: the
// reload that added them is probing them all at once.
func allProbed(t *testing.T, pxs []*faultproxy.TCP) {
	t.Helper()
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		n := 0
		for _, px := range pxs {
			if px.Stats().Accepted > 0 {
				n++
			}
		}
		if n == len(pxs) {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%d of the %d nodes added were probed within 15s, want all at once", n, len(pxs))
			return
		}
	}
}

// TestReloadOfHangingNodesBlocksNothing: while a reload waits for the
// probes of 32 nodes that hang (a minute each), the admin endpoints a
// load balancer or an operator asks (/readyz, /status, /metrics,
// /debug/nodes, /debug/config) and requests to the nodes that answer
// are served; SIGTERM then ends the process without waiting for the
// probes. /status and /debug/config waited for the whole reload, one
// probe timeout per node, and so did the shutdown.
func TestReloadOfHangingNodesBlocksNothing(t *testing.T) {
	t.Parallel() // its own gateway, memcached and relays; it mostly waits on the hanging nodes
	mcs := memcachedtest.StartN(t, 1)
	dead, pxs := hangingNodes(t, 32)
	file := filepath.Join(t.TempDir(), "servers")
	writeAtomic(t, file, mcs[0].Addr+"\n")
	g := startGateway(t, map[string]string{
		"MEMCGATE_SERVERS_FILE":   file,
		"MEMCGATE_WATCH_INTERVAL": "0s",
		"MEMCGATE_HEALTH_TIMEOUT": "1m", // nothing but the shutdown ends the reload's wait
		// One probe round, at start: a later one would probe the
		// hanging nodes, and a shutdown waits for the round in flight.
		"MEMCGATE_HEALTH_INTERVAL": "1h",
	})
	reloadsOK := metric(t, g, "memcgate_config_reloads_total", `{result="ok"}`)
	writeAtomic(t, file, mcs[0].Addr+"\n"+strings.Join(dead, "\n")+"\n")
	g.Signal(syscall.SIGHUP)
	allProbed(t, pxs)

	// The reload is waiting now, for a minute: everything below is
	// answered meanwhile, or the client gives up well before.
	client := &http.Client{Timeout: 20 * time.Second}
	do := func(method, url, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, url, strings.NewReader(body))
		resp, err := client.Do(req)
		if err != nil {
			t.Errorf("%s %s while a reload waits for nodes that hang: %v", method, url, err)
			return 0, ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, path := range []string{"/readyz", "/status", "/metrics", "/debug/nodes", "/debug/config", "/debug/owners?key=k"} {
		if code, _ := do("GET", g.Admin+path, ""); code != http.StatusOK {
			t.Errorf("GET %s while a reload waits for nodes that hang = %d, want 200", path, code)
		}
	}
	if code, _ := do("PUT", g.URL+"/k", "v"); code != http.StatusCreated {
		t.Errorf("PUT while a reload waits for nodes that hang = %d, want 201", code)
	}
	if code, body := do("GET", g.URL+"/k", ""); code != http.StatusOK || body != "v" {
		t.Errorf("GET while a reload waits for nodes that hang = %d %q, want 200 \"v\"", code, body)
	}
	// All of it came while the reload was still waiting.
	if nodes := nodeNames(t, g); len(nodes) != 1 {
		t.Fatalf("the reload ended before the checks (nodes %v): they prove nothing", nodes)
	}
	if v := metric(t, g, "memcgate_config_reloads_total", `{result="ok"}`); v != reloadsOK {
		t.Fatalf("a reload was counted (%v, before %v) before the checks ended: they prove nothing", v, reloadsOK)
	}

	term := time.Now()
	g.Signal(syscall.SIGTERM)
	if _, ok := g.Wait(30 * time.Second); !ok {
		t.Fatal("SIGTERM during a reload waiting for nodes that hang: not exited within 30s (the probe timeout is 1m)")
	}
	t.Logf("SIGTERM during the reload: exited after %v", time.Since(term))
}

// TestReloadOfHangingNodesTakesOneTimeout: a reload adding 32 nodes that
// hang takes about one probe timeout, not one per node, and a reload
// asked for meanwhile follows it; /readyz answers 200 throughout, as the
// node that answers stays up (it answered 503 as soon as one probe had
// failed: each counted a node down against the ring before the reload).
func TestReloadOfHangingNodesTakesOneTimeout(t *testing.T) {
	t.Parallel() // its own gateway, memcached and relays; it mostly waits on the hanging nodes
	mcs := memcachedtest.StartN(t, 2)
	dead, pxs := hangingNodes(t, 32)
	const timeout = 500 * time.Millisecond
	file := filepath.Join(t.TempDir(), "servers")
	writeAtomic(t, file, mcs[0].Addr+"\n")
	g := startGateway(t, map[string]string{
		"MEMCGATE_SERVERS_FILE":   file,
		"MEMCGATE_WATCH_INTERVAL": "0s",
		"MEMCGATE_HEALTH_TIMEOUT": timeout.String(),
	})
	reloadsOK := metric(t, g, "memcgate_config_reloads_total", `{result="ok"}`)
	// /readyz, asked over and over until both reloads are done.
	stop, notReady := make(chan struct{}), make(chan int, 1)
	go func() {
		bad := 0
		client := &http.Client{Timeout: 20 * time.Second}
		for {
			select {
			case <-stop:
				notReady <- bad
				return
			default:
			}
			resp, err := client.Get(g.Admin + "/readyz")
			if err != nil || resp.StatusCode != http.StatusOK {
				bad++
			}
			if err == nil {
				resp.Body.Close()
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	writeAtomic(t, file, mcs[0].Addr+"\n"+strings.Join(dead, "\n")+"\n")
	start := time.Now()
	g.Signal(syscall.SIGHUP)
	allProbed(t, pxs) // the first reload read the file: the second reads the next one
	writeAtomic(t, file, mcs[0].Addr+"\n"+mcs[1].Addr+"\n")
	g.Signal(syscall.SIGHUP)
	for metric(t, g, "memcgate_config_reloads_total", `{result="ok"}`) < reloadsOK+2 {
		if time.Since(start) > time.Minute {
			t.Fatal("two reloads not done within a minute")
		}
		time.Sleep(10 * time.Millisecond)
	}
	took := time.Since(start)
	close(stop)
	t.Logf("a reload adding %d nodes that hang and one after it took %v (probe timeout %v)", len(dead), took, timeout)
	// Generous for a loaded machine: one probe after another, it is 32
	// timeouts (16 s) for the first reload alone; each reload also waits
	// 500 ms for its changed file to read the same twice (0047).
	if took > 24*timeout {
		t.Errorf("a reload adding %d nodes that hang and one after it took %v, want about one probe timeout (%v)", len(dead), took, timeout)
	}
	if got := nodeNames(t, g); strings.Join(got, ",") != mcs[0].Addr+","+mcs[1].Addr {
		t.Errorf("nodes after the second reload = %v, want %s and %s", got, mcs[0].Addr, mcs[1].Addr)
	}
	if bad := <-notReady; bad > 0 {
		t.Errorf("/readyz answered other than 200 %d times during the reloads, with a node that answers up all along", bad)
	}
}
