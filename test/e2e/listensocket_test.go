package e2e

import (
	"net"
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

// TestListenSocketGone removes, or replaces, the file of
// MEMCGATE_LISTEN_SOCKET under a running gateway. The listener goes on
// accepting on a socket no client can reach: the gateway must say so
// (memcgate_http_listen_socket_missing, an error line naming the path),
// and at its stop leave alone a socket another process put at that path.
func TestListenSocketGone(t *testing.T) {
	tests := []struct {
		name    string
		replace bool // another process listens at the path afterwards
		found   string
	}{
		{name: "removed", found: `"found":"nothing"`},
		{name: "replaced by another socket", replace: true, found: `"found":"another socket"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mc := memcachedtest.Start(t)
			sock := filepath.Join(t.TempDir(), "m.sock")
			g := startGateway(t, map[string]string{"MEMCGATE_SERVERS": mc.Addr, "MEMCGATE_LISTEN_SOCKET": sock})
			if v := socketMissing(t, g); v != 0 {
				t.Fatalf("memcgate_http_listen_socket_missing = %v before the file is touched, want 0", v)
			}
			if err := os.Remove(sock); err != nil {
				t.Fatal(err)
			}
			var other net.Listener
			if tt.replace {
				ln, err := net.Listen("unix", sock)
				if err != nil {
					t.Fatal(err)
				}
				ln.(*net.UnixListener).SetUnlinkOnClose(false)
				t.Cleanup(func() { ln.Close() })
				other = ln
			}
			deadline := time.Now().Add(5 * time.Second)
			for socketMissing(t, g) != 1 {
				if time.Now().After(deadline) {
					t.Fatalf("memcgate_http_listen_socket_missing not 1 within 5s of the socket file's removal")
				}
				time.Sleep(50 * time.Millisecond)
			}
			logs := g.Logs()
			i := strings.Index(logs, "listen socket file gone")
			for ; i < 0; i = strings.Index(logs, "listen socket file gone") { // the log is written every 200 ms
				if time.Now().After(deadline) {
					t.Fatalf("no log line says the listen socket file is gone")
				}
				time.Sleep(50 * time.Millisecond)
				logs = g.Logs()
			}
			line, _, _ := strings.Cut(logs[strings.LastIndexByte(logs[:i], '\n')+1:], "\n")
			if !strings.Contains(line, sock) || !strings.Contains(line, tt.found) || !strings.Contains(line, `"level":"ERROR"`) {
				t.Errorf("log line %q: want level ERROR, the path %s and %s", line, sock, tt.found)
			}
			// The TCP listener serves on.
			if r := g.do("PUT", "/k", []byte("v")); r.status != 201 {
				t.Errorf("PUT over TCP = %d, want 201", r.status)
			}
			g.Signal(syscall.SIGTERM)
			if _, ok := g.Wait(10 * time.Second); !ok {
				t.Fatal("memcgate did not stop within 10s of SIGTERM")
			}
			if other == nil {
				return
			}
			if _, err := os.Lstat(sock); err != nil {
				t.Fatalf("the other process's socket at %s after the gateway stopped: %v, want it left there", sock, err)
			}
			c, err := net.DialTimeout("unix", sock, time.Second)
			if err != nil {
				t.Fatalf("dial the other process's socket: %v", err)
			}
			c.Close()
		})
	}
}

// socketMissing returns the gateway's memcgate_http_listen_socket_missing.
func socketMissing(t *testing.T, g *gateway) float64 {
	t.Helper()
	fams, err := g.Families(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	f := fams["memcgate_http_listen_socket_missing"]
	if f == nil {
		t.Fatal("memcgate_http_listen_socket_missing not exported")
	}
	return f.Sum
}

// TestListenSocketRemovedAtStop: the gateway's own stop removes the
// socket file while requests still finish: that is not the file gone,
// and no error says it is, whether the stop is a SIGTERM or a server
// that failed (no signal then ends the watch). A request held by a
// paused memcached keeps the shutdown going for seconds, past several
// of the watch's looks.
func TestListenSocketRemovedAtStop(t *testing.T) {
	tests := []struct {
		name string
		fail bool // the data listener fails instead of a SIGTERM
	}{
		{name: "SIGTERM"},
		{name: "a server failed", fail: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mc := memcachedtest.Start(t)
			sock := filepath.Join(t.TempDir(), "m.sock")
			gw := gatewaytest.New(t, binary, map[string]string{"MEMCGATE_SERVERS": mc.Addr, "MEMCGATE_LISTEN_SOCKET": sock,
				"MEMCGATE_TIMEOUT": "3s", "MEMCGATE_REQUEST_TIMEOUT": "3s", "MEMCGATE_DRAIN_DELAY": "0s"})
			var data *os.File
			if tt.fail {
				// The data and admin listeners passed as systemd passes
				// them, so that the test can shut the data one down.
				data = activateTCP(t, gw)[0]
			}
			gw.Start(t)
			g := &gateway{Gateway: gw, t: t, URL: "http://" + gw.DataAddr, Admin: "http://" + gw.AdminAddr}
			if r := g.do("PUT", "/k", []byte("v")); r.status != 201 {
				t.Fatalf("PUT = %d, want 201", r.status)
			}
			mc.Pause()
			t.Cleanup(mc.Resume)
			held := make(chan struct{})
			go func() {
				defer close(held)
				resp, err := http.Get(g.URL + "/k") // waits for the paused memcached
				if err == nil {
					resp.Body.Close()
				}
			}()
			deadline := time.Now().Add(5 * time.Second)
			for inFlight(t, g) == 0 {
				if time.Now().After(deadline) {
					t.Fatal("the GET was not in flight within 5s")
				}
				time.Sleep(10 * time.Millisecond)
			}
			if tt.fail {
				if err := syscall.Shutdown(int(data.Fd()), syscall.SHUT_RDWR); err != nil {
					t.Fatalf("shutdown of the data socket: %v", err)
				}
			} else {
				g.Signal(syscall.SIGTERM)
			}
			if _, ok := g.Wait(15 * time.Second); !ok {
				t.Fatal("memcgate did not stop within 15s")
			}
			<-held
			if _, err := os.Lstat(sock); err == nil {
				t.Errorf("the socket file %s is still there after the stop", sock)
			}
			if logs := g.Logs(); strings.Contains(logs, "listen socket file gone") {
				t.Errorf("the gateway's own stop was logged as the socket file gone:\n%s", gatewaytest.Tail(logs, 2000))
			}
		})
	}
}

// inFlight returns the gateway's memcgate_http_in_flight_requests.
func inFlight(t *testing.T, g *gateway) float64 {
	t.Helper()
	fams, err := g.Families(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if f := fams["memcgate_http_in_flight_requests"]; f != nil {
		return f.Sum
	}
	return 0
}

// TestListenSocketReplacedDuringTheDrain: the socket file of
// MEMCGATE_LISTEN_SOCKET removed and another process's socket put at its
// path during the drain after SIGTERM (a script that starts the next
// gateway while the old one drains) is left there at the stop: the
// listener's close must not unlink what the path holds by then.
func TestListenSocketReplacedDuringTheDrain(t *testing.T) {
	t.Parallel()
	mc := memcachedtest.Start(t)
	sock := filepath.Join(t.TempDir(), "m.sock")
	g := startGateway(t, map[string]string{"MEMCGATE_SERVERS": mc.Addr, "MEMCGATE_LISTEN_SOCKET": sock, "MEMCGATE_DRAIN_DELAY": "2s"})
	g.Signal(syscall.SIGTERM)
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(g.Logs(), `"msg":"draining"`); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no drain began within 5s of SIGTERM:\n%s", gatewaytest.Tail(g.Logs(), 2000))
		}
	}
	if err := os.Remove(sock); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	t.Cleanup(func() { ln.Close() })
	if _, ok := g.Wait(10 * time.Second); !ok {
		t.Fatal("memcgate did not stop within 10s of SIGTERM")
	}
	c, err := net.DialTimeout("unix", sock, time.Second)
	if err != nil {
		t.Fatalf("the other process's socket at %s after the gateway stopped: %v, want it left there", sock, err)
	}
	c.Close()
}
