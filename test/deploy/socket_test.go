package deploy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/memcgate/memcgate/config"
	"github.com/memcgate/memcgate/test/gatewaytest"
	"github.com/memcgate/memcgate/test/memcachedtest"
)

// The shipped socket units, and the listener each holds.
var socketUnits = []struct{ rel, name string }{
	{"deploy/systemd/memcgate.socket", "data"},
	{"deploy/systemd/memcgate-admin.socket", "admin"},
	{"deploy/systemd/memcgate-unix.socket", "socket"},
}

// socketSection returns the [Socket] section of rel, one value per key.
func socketSection(t *testing.T, rel string) map[string]string {
	t.Helper()
	sec := unitFile(read(t, rel))["Socket"]
	if sec == nil {
		t.Fatalf("%s: no [Socket] section", rel)
	}
	out := map[string]string{}
	for k, v := range sec {
		if len(v) != 1 {
			t.Errorf("%s: %s= given %d times, want once", rel, k, len(v))
		}
		out[k] = v[len(v)-1]
	}
	return out
}

// TestSystemdSockets checks the socket units against what the gateway
// expects of them: each names its socket as the gateway places it, the
// addresses are those memcgate.env and the defaults give the listeners
// (a mismatch stops the start), the Unix socket is docs/php.md's, with
// the mode the Unix socket unit's comment tells memcgate.env to set, and
// each unit starts memcgate.service, whose RuntimeDirectory= (which
// would remove the socket file at every stop) stays commented out.
func TestSystemdSockets(t *testing.T) {
	cfg := loadConfig(t, envRel, envFile(t, envRel))
	for _, u := range socketUnits {
		sec := socketSection(t, u.rel)
		if got := sec["FileDescriptorName"]; got != u.name {
			t.Errorf("%s: FileDescriptorName=%s, want %s", u.rel, got, u.name)
		}
		if u.rel != "deploy/systemd/memcgate.socket" && sec["Service"] != "memcgate.service" {
			t.Errorf("%s: Service=%s, want memcgate.service (only memcgate.socket starts it by its name)", u.rel, sec["Service"])
		}
		if sec["Accept"] != "" && sec["Accept"] != "no" {
			t.Errorf("%s: Accept=%s: the gateway takes a listening socket", u.rel, sec["Accept"])
		}
		listen := sec["ListenStream"]
		switch u.name {
		case "data", "admin":
			want := cfg.ListenAddr
			if u.name == "admin" {
				want = cfg.AdminAddr
			}
			if !strings.Contains(listen, ":") {
				listen = ":" + listen // ListenStream=8080: every address
			}
			if listen != want {
				t.Errorf("%s: ListenStream=%s, but memcgate.env gives the %s listener %s", u.rel, sec["ListenStream"], u.name, want)
			}
		case "socket":
			if listen != "/run/memcgate/memcgate.sock" || !strings.Contains(read(t, "docs/php.md"), listen) {
				t.Errorf("%s: ListenStream=%s, want docs/php.md's /run/memcgate/memcgate.sock", u.rel, listen)
			}
			if want := "MEMCGATE_LISTEN_SOCKET_MODE=" + sec["SocketMode"]; !strings.Contains(read(t, u.rel), want) {
				t.Errorf("%s: SocketMode=%s, but its comment does not tell memcgate.env %s", u.rel, sec["SocketMode"], want)
			}
		}
	}
	if d := unitFile(read(t, unitRel))["Service"]["RuntimeDirectory"]; len(d) > 0 {
		t.Errorf("%s: RuntimeDirectory=%v removes memcgate-unix.socket's file at every stop", unitRel, d)
	}

	t.Run("systemd-analyze verify", func(t *testing.T) {
		sa := gatewaytest.Optional(t, "systemd-analyze")
		dir := t.TempDir()
		unit := strings.ReplaceAll(read(t, unitRel), "/usr/local/bin/memcgate", binary)
		paths := []string{filepath.Join(dir, "memcgate.service")}
		if err := os.WriteFile(paths[0], []byte(unit), 0o644); err != nil {
			t.Fatal(err)
		}
		for _, u := range socketUnits {
			p := filepath.Join(dir, filepath.Base(u.rel))
			if err := os.WriteFile(p, []byte(read(t, u.rel)), 0o644); err != nil {
				t.Fatal(err)
			}
			paths = append(paths, p)
		}
		// memcgate.env is not there: systemd does not read it.
		if out, err := run(t, dir, sa, append([]string{"verify"}, paths...)...); err != nil || strings.TrimSpace(out) != "" {
			t.Errorf("systemd-analyze verify: %v\n%s", err, out)
		}
	})
}

// TestSystemdSocketRestart restarts a gateway that takes its listeners
// from systemd, as the socket units make it, under requests each on a new
// connection (PHP's pages) over TCP and the Unix socket: the test holds
// the sockets as systemd does and passes them to each process it starts.
// No request may fail, and a request sent while no process runs is
// answered by the next one. A gateway that binds its own listeners
// closes them at the end of its drain, and until the next one binds them
// every page got "connection refused", or ENOENT for the Unix socket
// removed at stop.
func TestSystemdSocketRestart(t *testing.T) {
	mc := memcachedtest.Start(t)
	sock := filepath.Join(t.TempDir(), "memcgate.sock")
	const mode = 0o666 // memcgate-unix.socket's
	if got := socketSection(t, "deploy/systemd/memcgate-unix.socket")["SocketMode"]; got != fmt.Sprintf("%04o", mode) {
		t.Fatalf("memcgate-unix.socket: SocketMode=%s, want %04o as here", got, mode)
	}
	g := gatewaytest.New(t, binary, map[string]string{
		"MEMCGATE_SERVERS":            mc.Addr,
		"MEMCGATE_LISTEN_SOCKET":      sock,
		"MEMCGATE_LISTEN_SOCKET_MODE": fmt.Sprintf("%04o", mode),
	})
	var names []string
	var files []*os.File
	for _, u := range socketUnits {
		var ln net.Listener
		var err error
		switch u.name {
		case "data":
			ln, err = net.Listen("tcp", g.DataAddr)
		case "admin":
			ln, err = net.Listen("tcp", g.AdminAddr)
		case "socket":
			if ln, err = net.Listen("unix", sock); err == nil {
				err = os.Chmod(sock, mode)
			}
		}
		if err != nil {
			t.Fatalf("%s: %v", u.name, err)
		}
		defer ln.Close()
		f, err := ln.(interface{ File() (*os.File, error) }).File()
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		names, files = append(names, u.name), append(files, f)
	}
	g.Activate(names, files)
	g.Start(t)

	const key, value = "restart", "page"
	tcp := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: time.Minute}
	unix := &http.Client{Transport: &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}, Timeout: time.Minute}
	req, err := http.NewRequest(http.MethodPut, "http://"+g.DataAddr+"/"+key, strings.NewReader(value))
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := tcp.Do(req); err != nil {
		t.Fatal(err)
	} else if resp.Body.Close(); resp.StatusCode/100 != 2 {
		t.Fatalf("PUT: %s", resp.Status)
	}

	// Pages, each on a new connection, until the restarts are done.
	var mu sync.Mutex // guards ok, failures
	ok := map[string]int{}
	var failures []string
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, c := range []struct {
		name   string
		client *http.Client
	}{{"tcp", tcp}, {"unix", unix}, {"tcp", tcp}, {"unix", unix}} {
		wg.Go(func() {
			for ctx.Err() == nil {
				err := getValue(c.client, "http://"+g.DataAddr+"/"+key, value)
				mu.Lock()
				if err != nil {
					failures = append(failures, c.name+": "+err.Error())
				} else {
					ok[c.name]++
				}
				mu.Unlock()
			}
		})
	}

	for i := range 2 {
		g.Signal(syscall.SIGTERM)
		if _, exited := g.Wait(time.Minute); !exited {
			t.Fatal("the gateway did not exit within a minute of SIGTERM")
		}
		if fi, err := os.Stat(sock); err != nil || fi.Mode().Type() != os.ModeSocket {
			t.Fatalf("restart %d: the Unix socket file after the exit: %v, %v; want it kept", i, fi, err)
		}
		// No process runs: a page connects now, and its request waits in
		// the socket's queue for the next process.
		var waiting []net.Conn
		for _, addr := range []struct{ network, addr string }{{"tcp", g.DataAddr}, {"unix", sock}} {
			c, err := net.Dial(addr.network, addr.addr)
			if err != nil {
				t.Fatalf("restart %d: connecting over %s while no gateway runs: %v", i, addr.network, err)
			}
			defer c.Close()
			if _, err := io.WriteString(c, "GET /"+key+" HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"); err != nil {
				t.Fatal(err)
			}
			waiting = append(waiting, c)
		}
		g.Start(t)
		for _, c := range waiting {
			c.SetReadDeadline(time.Now().Add(time.Minute))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("restart %d: the page sent over %s while no gateway ran: %v", i, c.RemoteAddr().Network(), err)
			}
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusOK || string(body) != value {
				t.Errorf("restart %d: the page sent over %s while no gateway ran got %s %q, want 200 %q", i, c.RemoteAddr().Network(), resp.Status, body, value)
			}
		}
	}
	stop()
	wg.Wait()
	t.Logf("pages answered: %v", ok)
	if len(failures) > 0 {
		t.Errorf("%d pages failed across the restarts, want none; the first: %s", len(failures), strings.Join(failures[:min(len(failures), 5)], "; "))
	}
	if ok["tcp"] == 0 || ok["unix"] == 0 {
		t.Errorf("pages answered %v: none over one of the listeners", ok)
	}
	// systemd keeps the sockets: there is no balancer to wait for.
	if logs := g.Logs(); !strings.Contains(logs, "draining without the delay") {
		t.Errorf("the stops waited %sDRAIN_DELAY for balancers: a restart takes that much longer and nothing needs it", config.Prefix)
	}
}

// getValue GETs url and checks the answer is 200 with want.
func getValue(c *http.Client, url, want string) error {
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK || string(body) != want {
		return fmt.Errorf("%s %q", resp.Status, strconv.Quote(string(body)))
	}
	return nil
}

// TestSystemdSocketActivate runs the gateway under systemd's own
// implementation of the protocol (systemd-socket-activate, which binds the
// sockets, names them, sets LISTEN_PID to the pid it execs the gateway
// in) with the shipped socket units' names: the gateway must take all
// three and serve on them, and leave the Unix socket file in place when
// it stops.
func TestSystemdSocketActivate(t *testing.T) {
	sa := gatewaytest.Optional(t, "systemd-socket-activate")
	mc := memcachedtest.Start(t)
	ports, err := memcachedtest.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	data, admin := "127.0.0.1:"+strconv.Itoa(ports[0]), "127.0.0.1:"+strconv.Itoa(ports[1])
	sock := filepath.Join(t.TempDir(), "memcgate.sock")
	addrs := map[string]string{"data": data, "admin": admin, "socket": sock}
	args := []string{}
	var names []string
	for _, u := range socketUnits {
		args = append(args, "-l", addrs[u.name])
		names = append(names, u.name)
	}
	args = append(args, "--fdname="+strings.Join(names, ":"))
	for k, v := range map[string]string{
		"MEMCGATE_SERVERS": mc.Addr, "MEMCGATE_LISTEN_ADDR": data, "MEMCGATE_ADMIN_ADDR": admin,
		"MEMCGATE_LISTEN_SOCKET": sock, "MEMCGATE_LISTEN_SOCKET_MODE": "0644", // what the tool makes it
	} {
		args = append(args, "-E", k+"="+v)
	}
	var out gatewaytest.SyncBuffer
	cmd := exec.Command(sa, append(args, binary)...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer func() {
		cmd.Process.Kill()
		<-done
		if t.Failed() {
			t.Logf("systemd-socket-activate and memcgate:\n%s", gatewaytest.Tail(out.String(), 3000))
		}
	}()
	// The tool says each socket it holds ("Listening on ADDR as FD."),
	// then execs the gateway on the first connection to fd 3; this
	// request waits in the socket's queue until the gateway accepts it.
	last := fmt.Sprintf("as %d.", 2+len(socketUnits))
	for deadline := time.Now().Add(time.Minute); !strings.Contains(out.String(), last); time.Sleep(10 * time.Millisecond) {
		select {
		case err := <-done:
			done <- err
			t.Fatalf("systemd-socket-activate exited: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("systemd-socket-activate did not listen within a minute")
		}
	}
	tcp := &http.Client{Timeout: time.Minute}
	if err := getStatus(tcp, "http://"+data+"/missing", http.StatusNotFound); err != nil {
		t.Fatalf("data listener: %v", err)
	}
	if err := getStatus(tcp, "http://"+admin+"/healthz", http.StatusOK); err != nil {
		t.Fatalf("admin listener: %v", err)
	}
	unix := &http.Client{Timeout: time.Minute, Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
	if err := getStatus(unix, "http://localhost/missing", http.StatusNotFound); err != nil {
		t.Fatalf("Unix socket: %v", err)
	}
	cmd.Process.Signal(syscall.SIGTERM) // the gateway's pid: the tool exec'd it
	select {
	case err := <-done:
		done <- err // for the deferred wait
		if err != nil {
			t.Errorf("exit after SIGTERM: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("no exit within a minute of SIGTERM")
	}
	// The log is written out by the exit.
	if logs := out.String(); !strings.Contains(logs, `"inherited":["data","admin","socket"]`) {
		t.Errorf("the start did not log the three sockets inherited")
	}
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Type() != os.ModeSocket {
		t.Errorf("the Unix socket file after the stop: %v, %v; want it left to systemd", fi, err)
	}
}

// getStatus GETs url and checks the answer's status.
func getStatus(c *http.Client, url string, want int) error {
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != want {
		return fmt.Errorf("%s: %s, want %d", url, resp.Status, want)
	}
	return nil
}
