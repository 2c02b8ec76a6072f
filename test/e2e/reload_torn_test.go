package e2e

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/dnstest"
	"github.com/memcgate/memcgate/test/gatewaytest"
	"github.com/memcgate/memcgate/test/memcachedtest"
)

// writeInPlace writes body over path's content, the file kept (its
// inode), as cat > path, an editor saving in place or a deploy script
// do.
func writeInPlace(t *testing.T, path, body string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
}

// appendTo appends body to path, as echo >> path does.
func appendTo(t *testing.T, path, body string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(body); err != nil {
		t.Fatal(err)
	}
}

// TestReloadRefusesCutFile: a SERVERS_FILE written in place and read
// while the write was under way, its last line cut (a node's port cut
// short to another, valid port), is refused by SIGHUP and by the watch
// poll alike, however long it stays cut: the running nodes stay, where
// the cut list would put a node that is not one of the list's on the
// ring. The rest of the line written, the list is applied, once.
func TestReloadRefusesCutFile(t *testing.T) {
	for _, trigger := range []string{"sighup", "watch"} {
		t.Run(trigger, func(t *testing.T) {
			t.Parallel() // its own gateway and memcached; it mostly waits for reloads
			mcs := memcachedtest.StartN(t, 3)
			file := filepath.Join(t.TempDir(), "servers")
			two := mcs[0].Addr + "\n" + mcs[1].Addr + "\n"
			writeInPlace(t, file, two)
			watch := "0"
			if trigger == "watch" {
				watch = "50ms"
			}
			g := startGateway(t, map[string]string{"MEMCGATE_SERVERS_FILE": file, "MEMCGATE_WATCH_INTERVAL": watch})
			waitNodes(t, g, []string{mcs[0].Addr, mcs[1].Addr})
			reload := func() {
				if trigger == "sighup" {
					g.Signal(syscall.SIGHUP)
				}
			}

			third := mcs[2].Addr
			cut := third[:len(third)-1] // 127.0.0.1:4321 read as 127.0.0.1:432
			errs := metric(t, g, "memcgate_config_reloads_total", `{result="error"}`)
			oks := metric(t, g, "memcgate_config_reloads_total", `{result="ok"}`)
			writeInPlace(t, file, two+cut)
			reload()
			errs = waitCounted(t, g, "error", errs)
			waitLog(t, g, file+" ends in the middle of a line")
			if got := nodeNames(t, g); strings.Join(got, ",") != mcs[0].Addr+","+mcs[1].Addr {
				t.Errorf("nodes after a cut file was read = %v, want the two running", got)
			}
			if trigger == "sighup" { // a SIGHUP again does not take it either
				reload()
				waitCounted(t, g, "error", errs)
				if got := nodeNames(t, g); len(got) != 2 {
					t.Errorf("nodes after a second SIGHUP on the cut file = %v, want the two running", got)
				}
			}
			if v := metric(t, g, "memcgate_config_reloads_total", `{result="ok"}`); v != oks {
				t.Errorf("memcgate_config_reloads_total{result=\"ok\"} = %v while the file was cut, want %v", v, oks)
			}

			appendTo(t, file, third[len(third)-1:]+"\n")
			reload()
			waitNodes(t, g, strings.Split(memcachedtest.Addrs(mcs), ","))
			waitCounted(t, g, "ok", oks)
			if v := metric(t, g, "memcgate_config_reloads_total", `{result="ok"}`); v != oks+1 {
				t.Errorf("memcgate_config_reloads_total{result=\"ok\"} = %v after the file was finished, want %v: applied once", v, oks+1)
			}
			waitLog(t, g, `"configuration reloaded"`) // through a pipe, after the metric
			if n := strings.Count(g.Logs(), `"configuration reloaded"`); n != 1 {
				t.Errorf("%d reloads logged as applied, want 1", n)
			}
		})
	}
}

// TestServersDNSFlapDamped: a SERVERS_DNS answer that drops a node from
// every other answer (round-robin DNS that cuts its answers, a registry
// that flaps) does not change the ring: the node stays, every answer
// that misses it is counted in memcgate_dns_missing_nodes_total, where
// each answer taken as it came would remove the node or add it back,
// moving its keys away and back at every poll. A node missing from 3
// answers in a row is removed.
func TestServersDNSFlapDamped(t *testing.T) {
	const srvName = "_memcache._tcp.memcached.test"
	mcs := memcachedtest.StartN(t, 3)
	ports := []int{mcs[0].Port, mcs[1].Port, mcs[2].Port}
	name := func(p int) string { return "localhost:" + strconv.Itoa(p) }
	dns := dnstest.Start(t)
	dns.SetLocalhost(ports...)
	g := startGateway(t, map[string]string{
		"MEMCGATE_SERVERS_DNS":  srvName,
		"MEMCGATE_DNS_SERVER":   dns.Addr(),
		"MEMCGATE_DNS_INTERVAL": "20ms",
	})
	all := []string{name(ports[0]), name(ports[1]), name(ports[2])}
	waitNodes(t, g, all)
	asked := func() int { return dns.SRVQuestions(srvName + ".") }
	// waitAsked waits until the gateway asked n more questions than
	// from: it asks each after the reload of the answer before it, so
	// the first n have been applied or refused.
	waitAsked := func(from, n int) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); asked() < from+n; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the gateway asked %d questions in 10s, want %d:\n%s", asked()-from, n, gatewaytest.Tail(g.Logs(), 2000))
			}
		}
	}

	oks := metric(t, g, "memcgate_config_reloads_total", `{result="ok"}`)
	dns.AlternateLocalhost(ports[:2], ports)
	q := asked()
	const answers = 20
	waitAsked(q, answers+1)
	moves := metric(t, g, "memcgate_config_reloads_total", `{result="ok"}`) - oks
	missed := metric(t, g, "memcgate_dns_missing_nodes_total", "")
	t.Logf("%d answers, every other one without %s: %v reloads changed the nodes, %v answers counted as missing it", answers, name(ports[2]), moves, missed)
	if moves != 0 {
		t.Errorf("a DNS answer flapping changed the nodes %v times in %d answers, want none", moves, answers)
	}
	if missed < answers/2-1 {
		t.Errorf("memcgate_dns_missing_nodes_total = %v after %d answers, every other one missing a node, want at least %d", missed, answers, answers/2-1)
	}
	if got := nodeNames(t, g); len(got) != 3 {
		t.Errorf("nodes while DNS flapped = %v, want all three", got)
	}

	// Every node in the answers again, then one gone for good: it is
	// removed at the third answer without it, not before.
	dns.SetLocalhost(ports...)
	waitAsked(asked(), 2)
	dns.SetLocalhost(ports[:2]...)
	q = asked()
	waitNodes(t, g, all[:2])
	if n := asked() - q; n < 3 {
		t.Errorf("a node gone from DNS was removed after %d answers without it, want 3", n)
	}
	if v := metric(t, g, "memcgate_dns_held_nodes", ""); v != 0 {
		t.Errorf("memcgate_dns_held_nodes = %v after the node was removed, want 0", v)
	}
}
