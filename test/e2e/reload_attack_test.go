package e2e

import (
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/dnstest"
	"github.com/memcgate/memcgate/test/gatewaytest"
	"github.com/memcgate/memcgate/test/memcachedtest"
)

// waitCounted polls the gateway's metrics until
// memcgate_config_reloads_total{result=result} is above before, and
// returns it.
func waitCounted(t *testing.T, g *gateway, result string, before float64) float64 {
	t.Helper()
	labels := `{result="` + result + `"}`
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if v := metric(t, g, "memcgate_config_reloads_total", labels); v > before {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("no reload counted as %s within 10s:\n%s", result, gatewaytest.Tail(g.Logs(), 2000))
		}
	}
}

// waitLog polls the gateway's log until it holds want.
func waitLog(t *testing.T, g *gateway, want string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(g.Logs(), want); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the log does not say %q:\n%s", want, gatewaytest.Tail(g.Logs(), 2000))
		}
	}
}

// TestServersFileBecomesAPipe: a SERVERS_FILE replaced by a named pipe
// is refused, by the watch poll and by SIGHUP alike, and the reloads
// after it work. Opening the pipe waited for a writer: the reloader hung
// with the lock the status page takes, so /status and /debug/config
// hung, no reload ran again (a good file back, SIGHUP) and SIGTERM never
// ended the process; the log said nothing.
func TestServersFileBecomesAPipe(t *testing.T) {
	t.Parallel() // its own gateway and memcached; it mostly waits for reloads
	mcs := memcachedtest.StartN(t, 3)
	dir := t.TempDir()
	file := filepath.Join(dir, "servers")
	writeAtomic(t, file, memcachedtest.Addrs(mcs[:2]))
	g := startGateway(t, map[string]string{"MEMCGATE_SERVERS_FILE": file, "MEMCGATE_WATCH_INTERVAL": "50ms"})
	waitNodes(t, g, []string{mcs[0].Addr, mcs[1].Addr})

	pipe := filepath.Join(dir, "pipe")
	if err := syscall.Mkfifo(pipe, 0o600); err != nil {
		t.Fatal(err)
	}
	errs := metric(t, g, "memcgate_config_reloads_total", `{result="error"}`)
	if err := os.Rename(pipe, file); err != nil {
		t.Fatal(err)
	}
	errs = waitCounted(t, g, "error", errs) // the watch poll's
	waitLog(t, g, "is not a regular file (a named pipe)")
	client := &http.Client{Timeout: 5 * time.Second}
	for _, path := range []string{"/status", "/debug/config"} {
		resp, err := client.Get(g.Admin + path)
		if err != nil {
			t.Fatalf("GET %s while SERVERS_FILE is a pipe: %v", path, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s while SERVERS_FILE is a pipe = %d, want 200", path, resp.StatusCode)
		}
	}
	g.Signal(syscall.SIGHUP)
	waitCounted(t, g, "error", errs)
	if got := nodeNames(t, g); len(got) != 2 {
		t.Errorf("nodes after the refused reloads = %v, want the two running", got)
	}
	if s := g.do("PUT", "/pipe", []byte("v")).status; s != http.StatusCreated {
		t.Errorf("PUT while SERVERS_FILE is a pipe = %d, want 201", s)
	}

	writeAtomic(t, file, memcachedtest.Addrs(mcs))
	waitNodes(t, g, strings.Split(memcachedtest.Addrs(mcs), ","))
	g.Signal(syscall.SIGTERM)
	if _, ok := g.Wait(30 * time.Second); !ok {
		t.Fatalf("SIGTERM did not stop the gateway:\n%s", gatewaytest.Tail(g.Logs(), 2000))
	}
}

// TestReloadRefusesNoNodeUp: a server list none of whose nodes answers
// (every line mistyped, a DNS answer naming nodes that do not answer)
// is refused, from SERVERS_FILE and SERVERS_DNS alike: the running
// nodes stay and keep serving. It was applied: every request got 503
// and /readyz 503, the reload counted as ok. A list that keeps one
// running node, or adds one that answers, is applied as before.
func TestReloadRefusesNoNodeUp(t *testing.T) {
	mcs := memcachedtest.StartN(t, 3)
	dead := []int{memcachedtest.DeadPort(t), memcachedtest.DeadPort(t)}
	deadAddrs := []string{"127.0.0.1:" + strconv.Itoa(dead[0]), "127.0.0.1:" + strconv.Itoa(dead[1])}
	const why = "no node of it would be up (none of the 2 nodes it adds answered its probe"

	// check sees the refusal of a list of dead nodes through g, whose
	// nodes are running, and the list that follows applied.
	check := func(t *testing.T, g *gateway, running []string, refuse, apply func(), applied []string) {
		t.Helper()
		running = slices.Sorted(slices.Values(running))
		errs := metric(t, g, "memcgate_config_reloads_total", `{result="error"}`)
		oks := metric(t, g, "memcgate_config_reloads_total", `{result="ok"}`)
		refuse()
		waitCounted(t, g, "error", errs)
		waitLog(t, g, why)
		if v := metric(t, g, "memcgate_config_last_reload_successful", ""); v != 0 {
			t.Errorf("memcgate_config_last_reload_successful = %v after the refusal, want 0", v)
		}
		if got := slices.Sorted(slices.Values(nodeNames(t, g))); !slices.Equal(got, running) {
			t.Errorf("nodes after the refusal = %v, want %v", got, running)
		}
		if s := g.do("PUT", "/nonodeup", []byte("v")).status; s != http.StatusCreated {
			t.Errorf("PUT after the refusal = %d, want 201", s)
		}
		resp, err := http.Get(g.Admin + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("/readyz after the refusal = %d, want 200", resp.StatusCode)
		}
		apply()
		waitCounted(t, g, "ok", oks)
		waitNodes(t, g, applied)
	}

	// Each case has its own gateway beside the other, on the shared
	// memcached; they mostly wait for reloads.
	t.Run("SERVERS_FILE", func(t *testing.T) {
		t.Parallel()
		file := filepath.Join(t.TempDir(), "servers")
		writeAtomic(t, file, memcachedtest.Addrs(mcs[:2]))
		// Reloads on SIGHUP only: one per step.
		g := startGateway(t, map[string]string{"MEMCGATE_SERVERS_FILE": file, "MEMCGATE_WATCH_INTERVAL": "0s"})
		running := []string{mcs[0].Addr, mcs[1].Addr}
		waitNodes(t, g, running)
		// One running node kept beside the dead ones: applied.
		kept := append([]string{mcs[0].Addr}, deadAddrs...)
		check(t, g, running,
			func() { writeAtomic(t, file, strings.Join(deadAddrs, "\n")); g.Signal(syscall.SIGHUP) },
			func() { writeAtomic(t, file, strings.Join(kept, "\n")); g.Signal(syscall.SIGHUP) },
			slices.Sorted(slices.Values(kept)))
	})

	t.Run("SERVERS_DNS", func(t *testing.T) {
		t.Parallel()
		dns := dnstest.Start(t)
		dns.SetLocalhost(mcs[0].Port)
		g := startGateway(t, map[string]string{
			"MEMCGATE_SERVERS_DNS":  "_memcache._tcp.memcached.test",
			"MEMCGATE_DNS_SERVER":   dns.Addr(),
			"MEMCGATE_DNS_INTERVAL": "100ms",
		})
		running := []string{"localhost:" + strconv.Itoa(mcs[0].Port)}
		waitNodes(t, g, running)
		// A node that answers beside the dead ones: applied.
		ports := []int{dead[0], dead[1], mcs[2].Port}
		var applied []string
		for _, p := range ports {
			applied = append(applied, "localhost:"+strconv.Itoa(p))
		}
		check(t, g, running,
			func() { dns.SetLocalhost(dead...) },
			func() { dns.SetLocalhost(ports...) },
			applied)
	})
}

// TestTLSKeyFileBecomesAPipe: a reload loads the TLS files again to check
// them; a key file replaced by a named pipe is refused, as a file of the
// configuration is, instead of holding the reload, the status page and
// the shutdown for good.
func TestTLSKeyFileBecomesAPipe(t *testing.T) {
	mc := memcachedtest.Start(t)
	_, certFile, keyFile := writeCert(t)
	g := startGatewayScheme(t, "https", map[string]string{
		"MEMCGATE_SERVERS": mc.Addr, "MEMCGATE_WATCH_INTERVAL": "0s",
		"MEMCGATE_TLS_CERT_FILE": certFile, "MEMCGATE_TLS_KEY_FILE": keyFile,
	})
	pipe := filepath.Join(t.TempDir(), "pipe")
	if err := syscall.Mkfifo(pipe, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(pipe, keyFile); err != nil {
		t.Fatal(err)
	}
	errs := metric(t, g, "memcgate_config_reloads_total", `{result="error"}`)
	g.Signal(syscall.SIGHUP)
	waitCounted(t, g, "error", errs)
	waitLog(t, g, "is not a regular file (a named pipe)")
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(g.Admin + "/status")
	if err != nil {
		t.Fatalf("GET /status after the refusal: %v", err)
	}
	resp.Body.Close()
	g.Signal(syscall.SIGTERM)
	if _, ok := g.Wait(30 * time.Second); !ok {
		t.Fatalf("SIGTERM did not stop the gateway:\n%s", gatewaytest.Tail(g.Logs(), 2000))
	}
}

// TestRefusedServersFileRetried: a SERVERS_FILE refused because none of
// its nodes answered is tried again by the watch poll, without a log
// line or a history row per poll, and applied once its nodes answer (a
// list written a moment before its memcached started). Before, the file
// counted as seen: the list stayed refused until it changed again or
// SIGHUP.
func TestRefusedServersFileRetried(t *testing.T) {
	mcs := memcachedtest.StartN(t, 2)
	file := filepath.Join(t.TempDir(), "servers")
	writeAtomic(t, file, mcs[0].Addr)
	g := startGateway(t, map[string]string{
		"MEMCGATE_SERVERS_FILE": file, "MEMCGATE_WATCH_INTERVAL": "50ms",
		"MEMCGATE_HEALTH_TIMEOUT": "100ms",
	})
	waitNodes(t, g, []string{mcs[0].Addr})
	mcs[1].Pause() // accepts connections, answers nothing
	errs := metric(t, g, "memcgate_config_reloads_total", `{result="error"}`)
	writeAtomic(t, file, mcs[1].Addr)
	errs = waitCounted(t, g, "error", errs)
	waitCounted(t, g, "error", errs) // tried again
	waitLog(t, g, "no node of it would be up")
	if n := strings.Count(g.Logs(), "no node of it would be up"); n != 1 {
		t.Errorf("%d log lines of the refusal tried again, want 1:\n%s", n, gatewaytest.Tail(g.Logs(), 2000))
	}
	if got := nodeNames(t, g); len(got) != 1 || got[0] != mcs[0].Addr {
		t.Errorf("nodes while the file's node does not answer = %v, want %s", got, mcs[0].Addr)
	}
	mcs[1].Resume()
	waitNodes(t, g, []string{mcs[1].Addr})
	// The nodes change before the reload is recorded: wait for the record.
	waitMetric(t, g, "memcgate_config_last_reload_successful", 1)
}
