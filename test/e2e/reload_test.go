package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/dnstest"
	"github.com/memcgate/memcgate/test/gatewaytest"
	"github.com/memcgate/memcgate/test/memcachedtest"
)

// writeAtomic replaces path with body in one rename, as kubelet updates a
// ConfigMap volume.
func writeAtomic(t *testing.T, path, body string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// load sends PUTs and GETs of keys to g until stop is closed, and counts
// every answer that is not 2xx or a 404 miss.
type load struct {
	failed  atomic.Int64
	sent    atomic.Int64
	first   atomic.Value
	stop    chan struct{}
	workers sync.WaitGroup
}

func startLoad(g *gateway, keys []string) *load {
	l := &load{stop: make(chan struct{})}
	client := &http.Client{Timeout: 5 * time.Second}
	for w := range 4 {
		l.workers.Go(func() {
			for i := w; ; i += 4 {
				select {
				case <-l.stop:
					return
				default:
				}
				k := keys[i%len(keys)]
				var req *http.Request
				if i%3 == 0 {
					req, _ = http.NewRequest("PUT", g.URL+"/"+k, strings.NewReader("v"))
				} else {
					req, _ = http.NewRequest("GET", g.URL+"/"+k, nil)
				}
				resp, err := client.Do(req)
				l.sent.Add(1)
				if err != nil {
					l.failed.Add(1)
					l.first.CompareAndSwap(nil, err.Error())
					continue
				}
				resp.Body.Close()
				if resp.StatusCode/100 != 2 && resp.StatusCode != 404 {
					l.failed.Add(1)
					l.first.CompareAndSwap(nil, resp.Status+" "+req.Method)
				}
			}
		})
	}
	return l
}

func (l *load) end() (sent, failed int64) {
	close(l.stop)
	l.workers.Wait()
	return l.sent.Load(), l.failed.Load()
}

// owners asks /debug/owners for each key's owner.
func owners(t *testing.T, g *gateway, keys []string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, k := range keys {
		resp, err := http.Get(g.Admin + "/debug/owners?key=" + k)
		if err != nil {
			t.Fatal(err)
		}
		var p struct {
			Chain []struct{ Node string } `json:"chain"`
		}
		err = json.NewDecoder(resp.Body).Decode(&p)
		resp.Body.Close()
		if err != nil || len(p.Chain) == 0 {
			t.Fatalf("/debug/owners?key=%s: %v", k, err)
		}
		out[k] = p.Chain[0].Node
	}
	return out
}

// nodeNames returns the nodes of /debug/nodes.
func nodeNames(t *testing.T, g *gateway) []string {
	t.Helper()
	resp, err := http.Get(g.Admin + "/debug/nodes")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var ns []struct{ Node string }
	if err := json.NewDecoder(resp.Body).Decode(&ns); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, n := range ns {
		out = append(out, n.Node)
	}
	return out
}

// waitNodes polls /debug/nodes until it lists want (in any order).
func waitNodes(t *testing.T, g *gateway, want []string) {
	t.Helper()
	want = slices.Sorted(slices.Values(want))
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := slices.Sorted(slices.Values(nodeNames(t, g)))
		if strings.Join(got, ",") == strings.Join(want, ",") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("nodes = %v, want %v", got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// moved counts the keys whose owner changed, and checks that each moved
// to or from a node in changed.
func moved(t *testing.T, before, after map[string]string, changed ...string) int {
	t.Helper()
	n := 0
	for k, b := range before {
		if a := after[k]; a != b {
			n++
			ok := false
			for _, c := range changed {
				ok = ok || a == c || b == c
			}
			if !ok {
				t.Errorf("%s moved from %s to %s, neither of which changed", k, b, a)
			}
		}
	}
	return n
}

// metric returns one sample of the gateway's metrics, or -1.
func metric(t *testing.T, g *gateway, name, labels string) float64 {
	t.Helper()
	text, err := g.Metrics(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, name+labels+" ") {
			v, _ := strconv.ParseFloat(strings.Fields(line)[1], 64)
			return v
		}
	}
	return -1
}

func reloadKeys() []string {
	var keys []string
	for i := range 600 {
		keys = append(keys, fmt.Sprint("reload-", i))
	}
	return keys
}

// TestReload: nodes added and removed through SIGHUP and through a change
// of the watched CONFIG_FILE, under load, with no failed request and only
// the changed node's keys moving; a bad configuration changes nothing and
// says why.
func TestReload(t *testing.T) {
	mcs := memcachedtest.StartN(t, 4)
	file := filepath.Join(t.TempDir(), "memcgate.env")
	write := func(servers string, extra ...string) {
		t.Helper()
		body := "# memcgate\nMEMCGATE_SERVERS=" + servers + "\n" + strings.Join(extra, "\n") + "\n"
		writeAtomic(t, file, body)
	}
	three := memcachedtest.Addrs(mcs[:3])
	write(three)
	g := startGateway(t, map[string]string{"MEMCGATE_CONFIG_FILE": file, "MEMCGATE_WATCH_INTERVAL": "100ms"})
	waitNodes(t, g, strings.Split(three, ","))
	keys := reloadKeys()
	l := startLoad(g, keys)

	// 1. SIGHUP after adding a node (the watcher may see it first: either
	// way the file is applied once).
	before := owners(t, g, keys)
	write(memcachedtest.Addrs(mcs))
	g.Signal(syscall.SIGHUP)
	waitNodes(t, g, strings.Split(memcachedtest.Addrs(mcs), ","))
	n := moved(t, before, owners(t, g, keys), mcs[3].Addr)
	t.Logf("added %s: %d of %d keys moved (%.1f%%)", mcs[3].Addr, n, len(keys), 100*float64(n)/float64(len(keys)))

	// 2. The watched file alone removes a node.
	before = owners(t, g, keys)
	rest := []*memcachedtest.Server{mcs[0], mcs[2], mcs[3]}
	write(memcachedtest.Addrs(rest))
	waitNodes(t, g, strings.Split(memcachedtest.Addrs(rest), ","))
	n = moved(t, before, owners(t, g, keys), mcs[1].Addr)
	t.Logf("removed %s: %d of %d keys moved (%.1f%%)", mcs[1].Addr, n, len(keys), 100*float64(n)/float64(len(keys)))

	// 3. A bad configuration changes nothing: the nodes stay, the reload
	// counts as an error, the log says why.
	write("not a server list")
	deadline := time.Now().Add(5 * time.Second)
	for metric(t, g, "memcgate_config_reloads_total", `{result="error"}`) < 1 {
		if time.Now().After(deadline) {
			t.Fatal("a bad configuration file was not counted as a refused reload")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := nodeNames(t, g); strings.Join(got, ",") != memcachedtest.Addrs(rest) {
		t.Errorf("after a bad reload the nodes are %v, want them unchanged", got)
	}
	if v := metric(t, g, "memcgate_config_last_reload_successful", ""); v != 0 {
		t.Errorf("memcgate_config_last_reload_successful = %v after a bad reload, want 0", v)
	}
	// The log reaches the test through a pipe, after the metric may
	// already show the reload.
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(g.Logs(), "configuration reload refused"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Error("the refused reload was not logged")
			break
		}
	}

	// 4. A setting that needs a restart is named, one that does not is
	// applied (the cap on client connections), and nothing else breaks.
	write(memcachedtest.Addrs(rest), "MEMCGATE_TIMEOUT=900ms", "MEMCGATE_MAX_CLIENT_CONNS=5000")
	g.Signal(syscall.SIGHUP)
	deadline = time.Now().Add(5 * time.Second)
	for !strings.Contains(g.Logs(), `"needs_restart":["MEMCGATE_TIMEOUT"]`) {
		if time.Now().After(deadline) {
			t.Fatalf("the reload did not name MEMCGATE_TIMEOUT as needing a restart:\n%s", gatewaytest.Tail(g.Logs(), 2000))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if v := metric(t, g, "memcgate_http_connections_max", ""); v != 5000 {
		t.Errorf("memcgate_http_connections_max = %v after a reload set MEMCGATE_MAX_CLIENT_CONNS=5000", v)
	}
	sent, failed := l.end()
	t.Logf("%d requests during the reloads, %d failed", sent, failed)
	if failed != 0 {
		t.Errorf("%d of %d requests failed during the reloads; first: %v", failed, sent, l.first.Load())
	}
	if v := metric(t, g, "memcgate_config_reloads_total", `{result="ok"}`); v < 3 {
		t.Errorf("memcgate_config_reloads_total{result=\"ok\"} = %v, want at least 3", v)
	}
}

// TestServersFile: MEMCGATE_SERVERS_FILE is read at start and again when
// it changes.
func TestServersFile(t *testing.T) {
	mcs := memcachedtest.StartN(t, 3)
	file := filepath.Join(t.TempDir(), "servers")
	if err := os.WriteFile(file, []byte(mcs[0].Addr+"\n"+mcs[1].Addr+" # two\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	g := startGateway(t, map[string]string{"MEMCGATE_SERVERS_FILE": file, "MEMCGATE_WATCH_INTERVAL": "100ms"})
	waitNodes(t, g, []string{mcs[0].Addr, mcs[1].Addr})
	l := startLoad(g, reloadKeys())
	writeAtomic(t, file, memcachedtest.Addrs(mcs))
	waitNodes(t, g, strings.Split(memcachedtest.Addrs(mcs), ","))
	sent, failed := l.end()
	t.Logf("%d requests while the servers file changed, %d failed", sent, failed)
	if failed != 0 {
		t.Errorf("%d of %d requests failed while the servers file changed; first: %v", failed, sent, l.first.Load())
	}
}

// TestServersDNS: MEMCGATE_SERVERS_DNS finds the nodes in SRV records from
// a DNS server, and follows their changes under load.
func TestServersDNS(t *testing.T) {
	mcs := memcachedtest.StartN(t, 3)
	dns := dnstest.Start(t)
	dns.SetLocalhost(mcs[0].Port, mcs[1].Port)
	name := func(m *memcachedtest.Server) string { return "localhost:" + strconv.Itoa(m.Port) }
	g := startGateway(t, map[string]string{
		"MEMCGATE_SERVERS_DNS":  "_memcache._tcp.memcached.test",
		"MEMCGATE_DNS_SERVER":   dns.Addr(),
		"MEMCGATE_DNS_INTERVAL": "100ms",
	})
	two := []string{name(mcs[0]), name(mcs[1])}
	waitNodes(t, g, two)
	keys := reloadKeys()
	l := startLoad(g, keys)
	before := owners(t, g, keys)
	dns.SetLocalhost(mcs[0].Port, mcs[1].Port, mcs[2].Port)
	waitNodes(t, g, append(two, name(mcs[2])))
	n := moved(t, before, owners(t, g, keys), name(mcs[2]))
	t.Logf("DNS added %s: %d of %d keys moved (%.1f%%)", name(mcs[2]), n, len(keys), 100*float64(n)/float64(len(keys)))
	before = owners(t, g, keys)
	dns.SetLocalhost(mcs[1].Port, mcs[2].Port)
	waitNodes(t, g, []string{name(mcs[1]), name(mcs[2])})
	n = moved(t, before, owners(t, g, keys), name(mcs[0]))
	t.Logf("DNS removed %s: %d of %d keys moved (%.1f%%)", name(mcs[0]), n, len(keys), 100*float64(n)/float64(len(keys)))
	sent, failed := l.end()
	t.Logf("%d requests while DNS changed, %d failed", sent, failed)
	if failed != 0 {
		t.Errorf("%d of %d requests failed while DNS changed; first: %v", failed, sent, l.first.Load())
	}
}

// TestServersDNSOverMaxNodes: a DNS answer with more nodes than
// MEMCGATE_MAX_NODES is refused, at start (the gateway does not start) and
// on a poll (the running nodes stay and serve); the refusal is counted,
// shown on the status page and logged once however many polls repeat
// it, and the next answer within the bound is applied.
func TestServersDNSOverMaxNodes(t *testing.T) {
	mcs := memcachedtest.StartN(t, 3)
	dns := dnstest.Start(t)
	env := map[string]string{
		"MEMCGATE_SERVERS_DNS":  "_memcache._tcp.memcached.test",
		"MEMCGATE_DNS_SERVER":   dns.Addr(),
		"MEMCGATE_DNS_INTERVAL": "100ms",
		"MEMCGATE_MAX_NODES":    "2",
	}
	const refusal = "MEMCGATE_SERVERS_DNS _memcache._tcp.memcached.test: 3 nodes, more than MEMCGATE_MAX_NODES=2"
	dns.SetLocalhost(mcs[0].Port, mcs[1].Port, mcs[2].Port)
	cmd := exec.Command(binary)
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), refusal) {
		t.Fatalf("memcgate started on a DNS answer over MEMCGATE_MAX_NODES: %v\n%s", err, out)
	}

	dns.SetLocalhost(mcs[0].Port, mcs[1].Port)
	g := startGateway(t, env)
	name := func(m *memcachedtest.Server) string { return "localhost:" + strconv.Itoa(m.Port) }
	two := []string{name(mcs[0]), name(mcs[1])}
	waitNodes(t, g, two)
	errBefore := metric(t, g, "memcgate_config_reloads_total", `{result="error"}`)
	dns.SetLocalhost(mcs[0].Port, mcs[1].Port, mcs[2].Port)
	// Several polls, each refused the same way.
	for deadline := time.Now().Add(10 * time.Second); metric(t, g, "memcgate_config_reloads_total", `{result="error"}`) < errBefore+3; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the DNS answer over MEMCGATE_MAX_NODES was not counted as refused reloads")
		}
	}
	if got, want := slices.Sorted(slices.Values(nodeNames(t, g))), slices.Sorted(slices.Values(two)); !slices.Equal(got, want) {
		t.Errorf("after refused DNS answers the nodes are %v, want %v", got, want)
	}
	if v := metric(t, g, "memcgate_config_last_reload_successful", ""); v != 0 {
		t.Errorf("memcgate_config_last_reload_successful = %v while the DNS answer is refused, want 0", v)
	}
	if r := g.do("PUT", "/k", []byte("v")); r.status != http.StatusCreated {
		t.Errorf("PUT while the DNS answer is refused = %d, want 201", r.status)
	}
	if r := g.do("GET", "/k", nil); r.status != http.StatusOK || r.body != "v" {
		t.Errorf("GET while the DNS answer is refused = %d %q, want 200 \"v\"", r.status, r.body)
	}
	resp, err := http.Get(g.Admin + "/status")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if n := strings.Count(string(page), refusal); n != 1 || !strings.Contains(string(page), "refused the same on") {
		t.Errorf("the status page shows the refusal %d times, want once with its repeats counted:\n%s", n, page)
	}

	// An answer within the bound is applied; by the time its line is
	// logged, every refusal before it has been, and one line said it.
	dns.SetLocalhost(mcs[1].Port, mcs[2].Port)
	waitNodes(t, g, []string{name(mcs[1]), name(mcs[2])})
	// The nodes change before the reload is counted.
	for deadline := time.Now().Add(5 * time.Second); metric(t, g, "memcgate_config_last_reload_successful", "") != 1; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("memcgate_config_last_reload_successful stayed 0 after an answer within the bound")
		}
	}
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(g.Logs(), `"configuration reloaded","trigger":"dns"`); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the applied DNS answer was not logged:\n%s", gatewaytest.Tail(g.Logs(), 2000))
		}
	}
	if n := strings.Count(g.Logs(), refusal); n != 1 {
		t.Errorf("the refusal was logged %d times, want once:\n%s", n, gatewaytest.Tail(g.Logs(), 3000))
	}
}

// TestServersDNSPollAppliesLoudly: with SERVERS_DNS, the DNS poll reads the
// whole configuration again; a change it applies while the nodes stay the
// same (here READ_ONLY and a pool's nodes, from CONFIG_FILE, which is not
// watched) is logged and counted as a reload, not applied unannounced.
func TestServersDNSPollAppliesLoudly(t *testing.T) {
	mcs := memcachedtest.StartN(t, 3)
	dns := dnstest.Start(t)
	dns.SetLocalhost(mcs[0].Port)
	file := filepath.Join(t.TempDir(), "memcgate.env")
	writeAtomic(t, file, fmt.Sprintf("MEMCGATE_POOLS=sess servers=127.0.0.1:%d prefixes=sess:\n", mcs[1].Port))
	g := startGateway(t, map[string]string{
		"MEMCGATE_CONFIG_FILE":    file,
		"MEMCGATE_WATCH_INTERVAL": "0s",
		"MEMCGATE_SERVERS_DNS":    "_memcache._tcp.memcached.test",
		"MEMCGATE_DNS_SERVER":     dns.Addr(),
		"MEMCGATE_DNS_INTERVAL":   "100ms",
	})
	waitNodes(t, g, []string{"localhost:" + strconv.Itoa(mcs[0].Port), "127.0.0.1:" + strconv.Itoa(mcs[1].Port)})
	okBefore := metric(t, g, "memcgate_config_reloads_total", `{result="ok"}`)
	writeAtomic(t, file, fmt.Sprintf("MEMCGATE_POOLS=sess servers=127.0.0.1:%d prefixes=sess:\nMEMCGATE_READ_ONLY=true\n", mcs[2].Port))
	deadline := time.Now().Add(5 * time.Second)
	for g.do("PUT", "/k", []byte("v")).status != http.StatusForbidden {
		if time.Now().After(deadline) {
			t.Fatal("READ_ONLY=true was not applied by the DNS poll")
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // the reload's log line (written every 200ms) and count follow its effect
	if ok := metric(t, g, "memcgate_config_reloads_total", `{result="ok"}`); ok != okBefore+1 {
		t.Errorf("memcgate_config_reloads_total{result=ok} went from %v to %v, want one reload counted", okBefore, ok)
	}
	logs := g.Logs()
	if !strings.Contains(logs, `"configuration reloaded","trigger":"dns","changed":["MEMCGATE_POOLS","MEMCGATE_READ_ONLY"]`) {
		t.Errorf("the DNS poll's changes were not logged:\n%s", gatewaytest.Tail(logs, 2000))
	}
}

// TestTokensFileReloadNamed: a reload that only changes AUTH_TOKENS_FILE's
// content applies the new tokens and names the file among the changes.
func TestTokensFileReloadNamed(t *testing.T) {
	mcs := memcachedtest.StartN(t, 1)
	tokFile := filepath.Join(t.TempDir(), "tokens")
	writeAtomic(t, tokFile, "read+write:first-token-0123456789\n")
	g := startGateway(t, map[string]string{
		"MEMCGATE_SERVERS":          memcachedtest.Addrs(mcs),
		"MEMCGATE_AUTH_TOKENS_FILE": tokFile,
		"MEMCGATE_WATCH_INTERVAL":   "100ms",
	})
	put := func(token string) int {
		return g.do("PUT", "/k", []byte("v"), "Authorization", "Bearer "+token).status
	}
	if s := put("first-token-0123456789"); s != http.StatusCreated {
		t.Fatalf("PUT with the first token = %d, want 201", s)
	}
	writeAtomic(t, tokFile, "read+write:second-token-0123456789\n")
	deadline := time.Now().Add(5 * time.Second)
	for put("second-token-0123456789") != http.StatusCreated {
		if time.Now().After(deadline) {
			t.Fatal("the token added to the file was not accepted")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if s := put("first-token-0123456789"); s != http.StatusUnauthorized {
		t.Errorf("PUT with the token removed from the file = %d, want 401", s)
	}
	time.Sleep(500 * time.Millisecond) // the log is written every 200ms
	if logs := g.Logs(); !strings.Contains(logs, `"configuration reloaded","trigger":"file","changed":["MEMCGATE_AUTH_TOKENS_FILE"]`) {
		t.Errorf("the reload did not name MEMCGATE_AUTH_TOKENS_FILE:\n%s", gatewaytest.Tail(logs, 2000))
	}
}

// TestReloadNeedsRestartAtWarn: a reload with settings that need a
// restart says so even when LOG_LEVEL hides info lines: those settings
// did not take effect.
func TestReloadNeedsRestartAtWarn(t *testing.T) {
	mcs := memcachedtest.StartN(t, 1)
	file := filepath.Join(t.TempDir(), "memcgate.env")
	writeAtomic(t, file, "MEMCGATE_SERVERS="+memcachedtest.Addrs(mcs)+"\nMEMCGATE_LOG_LEVEL=warn\n")
	g := startGateway(t, map[string]string{"MEMCGATE_CONFIG_FILE": file, "MEMCGATE_WATCH_INTERVAL": "100ms"})
	writeAtomic(t, file, "MEMCGATE_SERVERS="+memcachedtest.Addrs(mcs)+"\nMEMCGATE_LOG_LEVEL=warn\nMEMCGATE_TIMEOUT=900ms\n")
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(g.Logs(), `"needs_restart":["MEMCGATE_TIMEOUT"]`) {
		if time.Now().After(deadline) {
			t.Fatalf("the reload did not name MEMCGATE_TIMEOUT as needing a restart at LOG_LEVEL=warn:\n%s", gatewaytest.Tail(g.Logs(), 2000))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestAdminTokensReload: a reload that changes the tokens changes them on
// the admin listener too, as on the data listener. The admin listener
// kept the tokens it started with: a leaked admin token removed from
// MEMCGATE_AUTH_TOKENS_FILE still opened /metrics, /debug/config and
// pprof until a restart, the token that replaced it was refused, and
// tokens set by a reload where there were none left it open to anyone.
// A token file with none yet refuses every client until they come
// (TestTokenFileEmptyAtStart).
func TestAdminTokensReload(t *testing.T) {
	mcs := memcachedtest.StartN(t, 1)
	tokFile := filepath.Join(t.TempDir(), "tokens")
	writeAtomic(t, tokFile, "# no tokens yet\n")
	g := startGateway(t, map[string]string{
		"MEMCGATE_SERVERS":          memcachedtest.Addrs(mcs),
		"MEMCGATE_AUTH_TOKENS_FILE": tokFile,
		"MEMCGATE_WATCH_INTERVAL":   "100ms",
	})
	get := func(url, token string) int {
		t.Helper()
		req, _ := http.NewRequest("GET", url, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	// applied waits until the data listener takes token, and only it, for
	// the admin scope (/memc?cmd=stats needs it): the reload is in force.
	applied := func(token string) {
		t.Helper()
		stats := g.URL + "/memc?cmd=stats"
		for deadline := time.Now().Add(5 * time.Second); get(stats, token) != http.StatusOK || get(stats, "") != http.StatusUnauthorized; time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the data listener did not take the reloaded token %q within 5s", token)
			}
		}
	}
	type check struct {
		token string // "": none
		want  int
	}
	tests := []struct {
		file   string // the tokens file's new content
		token  string // one of its admin tokens
		checks []check
	}{
		{"admin:first-admin-token-0123\n", "first-admin-token-0123", []check{{"", 401}, {"first-admin-token-0123", 200}}},
		{"admin:second-admin-token-0123\n", "second-admin-token-0123", []check{{"first-admin-token-0123", 401}, {"second-admin-token-0123", 200}}},
	}
	if s := get(g.Admin+"/debug/config", ""); s != http.StatusUnauthorized {
		t.Fatalf("/debug/config with a token file that has no token yet = %d, want 401", s)
	}
	for _, tt := range tests {
		writeAtomic(t, tokFile, tt.file)
		applied(tt.token)
		for _, c := range tt.checks {
			for _, path := range []string{"/debug/config", "/metrics", "/debug/pprof/cmdline"} {
				if s := get(g.Admin+path, c.token); s != c.want {
					t.Errorf("tokens file %q: admin %s with %q = %d, want %d", tt.file, path, c.token, s, c.want)
				}
			}
		}
		if s := get(g.Admin+"/readyz", ""); s != http.StatusOK {
			t.Errorf("tokens file %q: /readyz without a token = %d, want 200 (probes have no secrets)", tt.file, s)
		}
	}
}

// TestReloadRefusesWhatWouldHarm: a reload refuses what a start would
// take but what, in place of a running configuration, would silently
// break it (each case says how). Each refusal changes nothing, is counted
// and logged with its reason, and the next good reload applies.
func TestReloadRefusesWhatWouldHarm(t *testing.T) {
	mcs := memcachedtest.StartN(t, 3)
	dir := t.TempDir()
	file, tokFile := filepath.Join(dir, "memcgate.env"), filepath.Join(dir, "tokens")
	const secret = "reload-token-0123456789"
	const token = "read+write+admin:" + secret + "\n"
	nodes := memcachedtest.Addrs(mcs[:2])
	good := "MEMCGATE_SERVERS=" + nodes + "\nMEMCGATE_AUTH_TOKENS_FILE=" + tokFile + "\nMEMCGATE_MAX_BUFFERED_BYTES=8388608\n"
	writeAtomic(t, file, good)
	writeAtomic(t, tokFile, token)
	// Reloads on SIGHUP only: one per step, with both files as written.
	g := startGateway(t, map[string]string{"MEMCGATE_CONFIG_FILE": file, "MEMCGATE_WATCH_INTERVAL": "0s"})
	// admin GETs path on the admin listener with the token.
	admin := func(t *testing.T, path string) string {
		t.Helper()
		req, _ := http.NewRequest("GET", g.Admin+path, nil)
		req.Header.Set("Authorization", "Bearer "+secret)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s = %d %s (%v)", path, resp.StatusCode, b, err)
		}
		return string(b)
	}
	metric := func(t *testing.T, name string) float64 {
		t.Helper()
		for _, line := range strings.Split(admin(t, "/metrics"), "\n") {
			if strings.HasPrefix(line, name+" ") {
				v, _ := strconv.ParseFloat(strings.Fields(line)[1], 64)
				return v
			}
		}
		return -1
	}
	nodesNow := func(t *testing.T) string {
		t.Helper()
		var ns []struct{ Node string }
		if err := json.Unmarshal([]byte(admin(t, "/debug/nodes")), &ns); err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, n := range ns {
			out = append(out, n.Node)
		}
		return strings.Join(out, ",")
	}
	put := func(t *testing.T, auth string) int {
		t.Helper()
		hdr := []string{}
		if auth != "" {
			hdr = []string{"Authorization", "Bearer " + auth}
		}
		return g.do("PUT", "/refused", []byte("v"), hdr...).status
	}
	// reload writes the files, sends SIGHUP and waits until the reload
	// is counted under result.
	reload := func(t *testing.T, config, tokens, result string) {
		t.Helper()
		counter := `memcgate_config_reloads_total{result="` + result + `"}`
		before := metric(t, counter)
		writeAtomic(t, file, config)
		writeAtomic(t, tokFile, tokens)
		g.Signal(syscall.SIGHUP)
		for deadline := time.Now().Add(10 * time.Second); metric(t, counter) <= before; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("no reload counted as %s within 10s:\n%s", result, gatewaytest.Tail(g.Logs(), 2000))
			}
		}
	}
	tests := []struct {
		name           string
		config, tokens string
		why            string // in the refusal's log line
	}{
		// SERVERS' default, a memcached on this host, took the place of
		// every node: every request got 503.
		{"nodes' variable gone", "MEMCGATE_AUTH_TOKENS_FILE=" + tokFile + "\nMEMCGATE_MAX_BUFFERED_BYTES=8388608\n", token,
			"a reload does not put the default (127.0.0.1:11211) in place of the nodes running"},
		// Both listeners were opened to every client.
		{"token file emptied", good, "", "a reload does not turn authentication off"},
		// MAX_VALUE_BYTES needs a restart: its running value stayed
		// beside a budget that cannot hold such a value, and every large
		// body got 503 "retry shortly" for good.
		{"budget below the running MAX_VALUE_BYTES", good + "MEMCGATE_MAX_VALUE_BYTES=100000\nMEMCGATE_MAX_BUFFERED_BYTES=200000\n", token,
			"MEMCGATE_MAX_BUFFERED_BYTES: 200000 is less than MAX_VALUE_BYTES 1048000"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reload(t, tt.config, tt.tokens, "error")
			if v := metric(t, "memcgate_config_last_reload_successful"); v != 0 {
				t.Errorf("memcgate_config_last_reload_successful = %v after a refused reload, want 0", v)
			}
			if got := nodesNow(t); got != nodes {
				t.Errorf("nodes after the refused reload = %s, want %s", got, nodes)
			}
			if s := put(t, ""); s != http.StatusUnauthorized {
				t.Errorf("PUT without a token after the refused reload = %d, want 401", s)
			}
			if s := put(t, secret); s != http.StatusCreated {
				t.Errorf("PUT with the token after the refused reload = %d, want 201", s)
			}
			if v := metric(t, "memcgate_buffered_bytes_limit"); v != 8388608 {
				t.Errorf("memcgate_buffered_bytes_limit = %v after the refused reload, want 8388608", v)
			}
			// The log reaches the test through a pipe, after the metric.
			for deadline := time.Now().Add(5 * time.Second); !strings.Contains(g.Logs(), tt.why); time.Sleep(20 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("the refusal's log line does not say %q:\n%s", tt.why, gatewaytest.Tail(g.Logs(), 2000))
				}
			}
			reload(t, good, token, "ok")
			if v := metric(t, "memcgate_config_last_reload_successful"); v != 1 {
				t.Errorf("memcgate_config_last_reload_successful = %v after a good reload, want 1", v)
			}
		})
	}
}

// TestServersDNSRecovers: a SERVERS_DNS poll that fails (here: no
// records) is a refused reload, and the first that succeeds again ends
// it even when it finds the same nodes: it is logged and counted, and
// memcgate_config_last_reload_successful is 1 again. That poll found
// nothing new and was dropped, which left the metric at 0 (and
// MemcgateConfigReloadFailed firing) until the nodes next changed.
func TestServersDNSRecovers(t *testing.T) {
	mcs := memcachedtest.StartN(t, 1)
	dns := dnstest.Start(t)
	dns.SetLocalhost(mcs[0].Port)
	g := startGateway(t, map[string]string{
		"MEMCGATE_SERVERS_DNS":  "_memcache._tcp.memcached.test",
		"MEMCGATE_DNS_SERVER":   dns.Addr(),
		"MEMCGATE_DNS_INTERVAL": "100ms",
	})
	waitMetric := func(name, labels string, ok func(float64) bool, what string) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !ok(metric(t, g, name, labels)); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %s%s = %v:\n%s", what, name, labels, metric(t, g, name, labels), gatewaytest.Tail(g.Logs(), 2000))
			}
		}
	}
	okBefore := metric(t, g, "memcgate_config_reloads_total", `{result="ok"}`)
	dns.SetLocalhost() // no records
	waitMetric("memcgate_config_last_reload_successful", "", func(v float64) bool { return v == 0 }, "a DNS answer without records was not refused")
	dns.SetLocalhost(mcs[0].Port) // the same node again
	waitMetric("memcgate_config_last_reload_successful", "", func(v float64) bool { return v == 1 }, "the DNS poll that succeeded again did not end the refusal")
	if ok := metric(t, g, "memcgate_config_reloads_total", `{result="ok"}`); ok != okBefore+1 {
		t.Errorf("memcgate_config_reloads_total{result=ok} went from %v to %v, want the recovery counted once", okBefore, ok)
	}
	if got := nodeNames(t, g); len(got) != 1 || got[0] != "localhost:"+strconv.Itoa(mcs[0].Port) {
		t.Errorf("nodes = %v, want the one DNS names", got)
	}
}

// TestReloadConnCapWarned: a reload that sets MAX_CLIENT_CONNS above what
// the open-file limit leaves after its reserve is warned about, as the
// same setting is at start; it was applied without a word.
func TestReloadConnCapWarned(t *testing.T) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Max >= 1<<30 {
		t.Skipf("no open-file limit to go past (hard limit %d, %v)", rl.Max, err)
	}
	mcs := memcachedtest.StartN(t, 1)
	file := filepath.Join(t.TempDir(), "memcgate.env")
	writeAtomic(t, file, "MEMCGATE_SERVERS="+memcachedtest.Addrs(mcs)+"\n")
	g := startGateway(t, map[string]string{"MEMCGATE_CONFIG_FILE": file, "MEMCGATE_WATCH_INTERVAL": "0s"})
	const warning = "MEMCGATE_MAX_CLIENT_CONNS leaves few descriptors of the open-file limit"
	if strings.Contains(g.Logs(), warning) {
		t.Fatalf("warned at start with the default cap:\n%s", gatewaytest.Tail(g.Logs(), 2000))
	}
	writeAtomic(t, file, "MEMCGATE_SERVERS="+memcachedtest.Addrs(mcs)+"\nMEMCGATE_MAX_CLIENT_CONNS="+strconv.FormatUint(rl.Max, 10)+"\n")
	g.Signal(syscall.SIGHUP)
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(g.Logs(), warning); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("a reload set MEMCGATE_MAX_CLIENT_CONNS to the whole open-file limit (%d) without a warning:\n%s", rl.Max, gatewaytest.Tail(g.Logs(), 2000))
		}
	}
}

// TestSlowDNSHoldsOnlyTheReload: a SERVERS_DNS lookup that gets no
// answer (up to its 5 s timeout) holds the reload that asked, and
// nothing else: requests, the admin endpoints that show the
// configuration and its reloads, and a SIGTERM, which cuts the lookup
// short and stops the gateway at once.
func TestSlowDNSHoldsOnlyTheReload(t *testing.T) {
	mcs := memcachedtest.StartN(t, 1)
	dns := dnstest.Start(t)
	dns.SetLocalhost(mcs[0].Port)
	g := startGateway(t, map[string]string{
		"MEMCGATE_SERVERS_DNS":  "_memcache._tcp.memcached.test",
		"MEMCGATE_DNS_SERVER":   dns.Addr(),
		"MEMCGATE_DNS_INTERVAL": "1h", // SIGHUP alone asks
	})
	if r := g.do("PUT", "/k", []byte("v")); r.status != 201 {
		t.Fatalf("PUT /k = %d %s", r.status, r.body)
	}
	dns.Hang(true)
	asked := dns.Asked()
	g.Signal(syscall.SIGHUP)
	for deadline := time.Now().Add(5 * time.Second); dns.Asked() == asked; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("SIGHUP asked the DNS server nothing")
		}
	}
	const quick = time.Second // the lookup waits 5 s
	for _, url := range []string{g.URL + "/k", g.Admin + "/debug/config", g.Admin + "/status", g.Admin + "/readyz", g.Admin + "/debug/nodes"} {
		start := time.Now()
		resp, err := http.Get(url)
		if err != nil {
			t.Fatalf("GET %s during the lookup: %v", url, err)
		}
		resp.Body.Close()
		if took := time.Since(start); resp.StatusCode != 200 || took > quick {
			t.Errorf("GET %s during the lookup: %d after %v, want 200 within %v", url, resp.StatusCode, took, quick)
		}
	}
	// The race detector's runtime sleeps a second at exit
	// (GORACE atexit_sleep_ms).
	const stopped = quick + time.Second
	start := time.Now()
	g.Signal(syscall.SIGTERM)
	err, exited := g.Wait(10 * time.Second)
	took := time.Since(start)
	t.Logf("SIGTERM during the lookup: exited after %v", took)
	if !exited || err != nil || took > stopped {
		t.Errorf("SIGTERM during the lookup: exited %v (%v) after %v, want status 0 within %v", exited, err, took, stopped)
	}
}
