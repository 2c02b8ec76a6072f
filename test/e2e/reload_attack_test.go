package e2e

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

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
