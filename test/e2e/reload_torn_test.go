package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

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
// poll alike, however long it stays cut: the running nodes stay. It
// was applied, with a node that is not one of the list's. The rest of
// the line written, the list is applied, once.
func TestReloadRefusesCutFile(t *testing.T) {
	for _, trigger := range []string{"sighup", "watch"} {
		t.Run(trigger, func(t *testing.T) {
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
				errs = waitCounted(t, g, "error", errs)
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
			if n := strings.Count(g.Logs(), `"configuration reloaded"`); n != 1 {
				t.Errorf("%d reloads logged as applied, want 1", n)
			}
		})
	}
}
