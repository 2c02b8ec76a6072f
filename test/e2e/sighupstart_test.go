package e2e

import (
	"errors"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/dnstest"
	"github.com/memcgate/memcgate/test/gatewaytest"
	"github.com/memcgate/memcgate/test/memcachedtest"
)

// TestSighupDuringStart sends SIGHUP while the gateway is still
// starting (here waiting for its SERVERS_DNS answer), as "systemctl
// reload" may once the unit is active, which for Type=exec is from the
// exec on. A SIGHUP before the gateway listened for it ended the
// process (the signal's default action). It must start, and reload once
// it runs: the signal may have been sent for an edit the start read too
// early.
func TestSighupDuringStart(t *testing.T) {
	mc := memcachedtest.Start(t)
	dns := dnstest.Start(t)
	dns.SetLocalhost(mc.Port)
	dns.Hold(true)
	ports, err := memcachedtest.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	admin := "127.0.0.1:" + strconv.Itoa(ports[1])
	cmd := exec.Command(binary)
	cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"),
		"MEMCGATE_SERVERS_DNS=_memcache._tcp.memcached.test", "MEMCGATE_DNS_SERVER=" + dns.Addr(),
		"MEMCGATE_LISTEN_ADDR=127.0.0.1:" + strconv.Itoa(ports[0]), "MEMCGATE_ADMIN_ADDR=" + admin,
		"MEMCGATE_DRAIN_DELAY=0s",
	}
	var out gatewaytest.SyncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{}) // closed once waitErr is set
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("memcgate output:\n%s", gatewaytest.Tail(out.String(), 3000))
		}
	})

	deadline := time.Now().Add(10 * time.Second)
	for dns.Asked() == 0 { // the gateway is in its start, waiting for the answer
		if time.Now().After(deadline) {
			t.Fatal("memcgate asked no DNS question within 10s of its start")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
		var ee *exec.ExitError
		if errors.As(waitErr, &ee) {
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				t.Fatalf("memcgate ended by %v, sent while it started", ws.Signal())
			}
		}
		t.Fatalf("memcgate exited while it started: %v", waitErr)
	case <-time.After(500 * time.Millisecond): // a signal's default action is quicker
	}
	dns.Hold(false)

	client := &http.Client{Timeout: time.Second}
	for {
		if resp, err := client.Get("http://" + admin + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case <-exited:
			t.Fatalf("memcgate exited before it was ready: %v", waitErr)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("memcgate not ready within 10s")
		}
	}
	for !strings.Contains(out.String(), `"msg":"configuration reloaded","trigger":"sighup"`) {
		if time.Now().After(deadline) {
			t.Fatal("no reload for the SIGHUP sent during the start")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
