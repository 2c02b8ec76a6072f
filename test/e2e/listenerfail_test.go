package e2e

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/gatewaytest"
	"github.com/memcgate/memcgate/test/memcachedtest"
)

// TestListenerFailsAfterStart breaks the data listener of a running
// gateway for good: the listening socket, passed as systemd passes it,
// is shut down through the test's own descriptor of it, and accept
// fails with EINVAL. The gateway must stop with status 1 (so that
// systemd's Restart=on-failure starts it again) and say why in its log
// at error level, not only in the plain line it writes to stderr at
// its exit, after the shutdown's lines.
func TestListenerFailsAfterStart(t *testing.T) {
	mc := memcachedtest.Start(t)
	g := gatewaytest.New(t, binary, map[string]string{"MEMCGATE_SERVERS": mc.Addr, "MEMCGATE_DRAIN_DELAY": "0s"})
	files := activateTCP(t, g)
	g.Start(t)

	if err := syscall.Shutdown(int(files[0].Fd()), syscall.SHUT_RDWR); err != nil {
		t.Fatalf("shutdown of the data socket: %v", err)
	}
	exit, ok := g.Wait(15 * time.Second)
	if !ok {
		t.Fatal("memcgate still runs 15s after its data listener failed")
	}
	var ee *exec.ExitError
	if !errors.As(exit, &ee) || ee.ExitCode() != 1 {
		t.Errorf("memcgate exited with %v, want status 1", exit)
	}
	logs := g.Logs()
	i := strings.Index(logs, `"msg":"the gateway stops: a server failed"`)
	if i < 0 {
		t.Fatalf("no error line in the log says a server failed:\n%s", gatewaytest.Tail(logs, 2000))
	}
	line, _, _ := strings.Cut(logs[strings.LastIndexByte(logs[:i], '\n')+1:], "\n")
	if !strings.Contains(line, `"level":"ERROR"`) || !strings.Contains(line, "accept") {
		t.Errorf("log line %q: want level ERROR and the accept's error", line)
	}
}

// activateTCP binds g's data and admin addresses and passes the two
// listeners to g as systemd passes sockets (named data and admin), so
// that a test holds their descriptors and can shut one down under the
// running gateway. It returns the descriptors, data first; call it
// before g's first Start.
func activateTCP(t *testing.T, g *gatewaytest.Gateway) []*os.File {
	t.Helper()
	var files []*os.File
	for _, addr := range []string{g.DataAddr, g.AdminAddr} {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		f, err := ln.(*net.TCPListener).File()
		ln.Close()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		files = append(files, f)
	}
	g.Activate([]string{"data", "admin"}, files)
	return files
}
