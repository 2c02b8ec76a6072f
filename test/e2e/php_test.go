package e2e

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/gatewaytest"
	"github.com/memcgate/memcgate/test/memcachedtest"
)

// TestPHPExample runs the PHP client example shipped in test/php against a
// running gateway, as docs/php.md tells PHP users to.
func TestPHPExample(t *testing.T) {
	php := gatewaytest.PHP(t, "curl")
	mcs := memcachedtest.StartN(t, 3)
	g := startGateway(t, map[string]string{"MEMCGATE_SERVERS": memcachedtest.Addrs(mcs)})
	cmd := exec.Command(php, "../php/example.php")
	cmd.Env = append(os.Environ(), "MEMCGATE_URL="+g.URL)
	out, err := cmd.CombinedOutput()
	t.Logf("php example.php:\n%s", out)
	if err != nil {
		t.Fatalf("php example.php failed: %v", err)
	}
	if !strings.Contains(string(out), "all ok") {
		t.Errorf("php example.php did not finish: %s", out)
	}
}

// TestPHPExampleUnixSocket runs the same example over the gateway's Unix
// socket (MEMCGATE_LISTEN_SOCKET, curl's CURLOPT_UNIX_SOCKET_PATH), and
// checks the socket file's life: the mode asked for, removed at stop,
// and a stale one, left by a killed process, replaced at the next start.
func TestPHPExampleUnixSocket(t *testing.T) {
	t.Parallel() // its own gateway and memcached
	php := gatewaytest.PHP(t, "curl")
	mcs := memcachedtest.StartN(t, 1)
	sock := filepath.Join(t.TempDir(), "memcgate.sock")
	g := startGateway(t, map[string]string{
		"MEMCGATE_SERVERS":            memcachedtest.Addrs(mcs),
		"MEMCGATE_LISTEN_SOCKET":      sock,
		"MEMCGATE_LISTEN_SOCKET_MODE": "0600",
	})
	run := func() {
		t.Helper()
		cmd := exec.Command(php, "../php/example.php")
		cmd.Env = append(os.Environ(), "MEMCGATE_UNIX_SOCKET="+sock)
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "all ok") {
			t.Fatalf("php example.php over %s: %v\n%s", sock, err, out)
		}
	}
	run()
	if fi, err := os.Lstat(sock); err != nil || fi.Mode().Type() != fs.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket file: %v, %v; want a socket with mode 0600", fi, err)
	}

	g.Kill() // no chance to remove the file: it stays, stale
	if _, err := os.Lstat(sock); err != nil {
		t.Fatalf("after SIGKILL the socket file is gone (%v); the stale case is not tested", err)
	}
	g.Start(t)
	run()

	g.Signal(syscall.SIGTERM)
	if _, ok := g.Wait(10 * time.Second); !ok {
		t.Fatal("memcgate did not stop on SIGTERM")
	}
	if _, err := os.Lstat(sock); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("after SIGTERM, %s: %v; want it removed", sock, err)
	}
}
