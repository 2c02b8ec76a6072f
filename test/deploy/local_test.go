package deploy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/memcachedtest"
)

// localRun is deploy/local/run.sh (what make run runs) started on ports
// of its own, in a process group of its own so that a signal to the group
// is a Ctrl-C in its terminal.
type localRun struct {
	cmd *exec.Cmd
	out *io.PipeReader
}

// startLocal runs deploy/local/run.sh with the memcached ports and the
// listener addresses given, env (NAME=value) besides, the gateway binary
// under test, and stderr merged into what lines reads.
func startLocal(t *testing.T, ports []int, listen, admin string, env ...string) *localRun {
	t.Helper()
	memcachedtest.Binary(t)
	ps := make([]string, len(ports))
	for i, p := range ports {
		ps[i] = fmt.Sprint(p)
	}
	cmd := exec.Command("bash", filepath.Join(root, "deploy/local/run.sh"), binary)
	cmd.Env = append(os.Environ(),
		"MEMCACHED_PORTS="+strings.Join(ps, " "),
		"MEMCGATE_LISTEN_ADDR="+listen,
		"MEMCGATE_ADMIN_ADDR="+admin,
	)
	cmd.Env = append(cmd.Env, env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = cmd.Wait(); pw.Close() }()
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	return &localRun{cmd: cmd, out: pr}
}

// lines reads the run's output up to its end, sending each line on.
func (r *localRun) lines() <-chan string {
	ch := make(chan string, 256)
	go func() {
		defer close(ch)
		sc := bufio.NewScanner(r.out)
		for sc.Scan() {
			ch <- sc.Text()
		}
	}()
	return ch
}

// until reads lines until one contains want, returning what it read.
func until(t *testing.T, lines <-chan string, want string) string {
	t.Helper()
	var seen strings.Builder
	timeout := time.After(time.Minute)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("run.sh ended before %q; it printed:\n%s", want, seen.String())
			}
			seen.WriteString(l + "\n")
			if strings.Contains(l, want) {
				return seen.String()
			}
		case <-timeout:
			t.Fatalf("no %q within a minute; run.sh printed:\n%s", want, seen.String())
		}
	}
}

// freeAddrs returns n loopback TCP ports that were free a moment ago.
func freeAddrs(t *testing.T, n int) []int {
	t.Helper()
	ports, err := memcachedtest.FreePorts(n)
	if err != nil {
		t.Fatal(err)
	}
	return ports
}

// TestLocalRun runs make run's script as a user would: on ports of its
// own, its printed examples answer on the addresses it prints, a second
// run on the same ports says which port is taken and how to move it, and
// Ctrl-C stops every process it started.
func TestLocalRun(t *testing.T) {
	p := freeAddrs(t, 5)
	listen, admin := fmt.Sprintf("127.0.0.1:%d", p[3]), fmt.Sprintf("127.0.0.1:%d", p[4])
	r := startLocal(t, p[:3], listen, admin)
	lines := r.lines()
	out := until(t, lines, "Ctrl-C stops")
	for _, want := range []string{
		fmt.Sprintf("memcached: %d %d %d on 127.0.0.1", p[0], p[1], p[2]),
		"data http://" + listen + "   admin http://" + admin,
		"curl -i " + listen + "/greeting",
		"curl -s " + admin + "/debug/nodes",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("run.sh printed no %q:\n%s", want, out)
		}
	}
	// The examples answer as printed, through the three memcached.
	req, _ := http.NewRequest(http.MethodPut, "http://"+listen+"/greeting?exptime=300", strings.NewReader("hello"))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Errorf("PUT: %d, want 201", resp.StatusCode)
	}
	resp, err = http.Get("http://" + listen + "/greeting")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(body) != "hello" {
		t.Errorf("GET: %d %q, want 200 \"hello\"", resp.StatusCode, body)
	}

	// Each taken port is named, with the variable that moves it, and
	// nothing is started (so nothing is said to be stopped).
	others := freeAddrs(t, 5)
	for _, tc := range []struct {
		name          string
		ports         []int
		listen, admin string
		want          string
	}{
		{"memcached", p[:3], fmt.Sprintf("127.0.0.1:%d", others[3]), fmt.Sprintf("127.0.0.1:%d", others[4]), fmt.Sprintf("port %d is taken (memcached); stop whatever listens there, or set MEMCACHED_PORTS", p[0])},
		{"data", others[:3], listen, fmt.Sprintf("127.0.0.1:%d", others[4]), listen + " is taken (data listener); stop whatever listens there, or set MEMCGATE_LISTEN_ADDR"},
		{"admin", others[:3], fmt.Sprintf("127.0.0.1:%d", others[3]), admin, admin + " is taken (admin listener); stop whatever listens there, or set MEMCGATE_ADMIN_ADDR"},
	} {
		t.Run(tc.name+" taken", func(t *testing.T) {
			second := startLocal(t, tc.ports, tc.listen, tc.admin)
			b, _ := io.ReadAll(second.out)
			if got := strings.TrimSpace(string(b)); got != tc.want+"='P1 P2 P3'" && got != tc.want+"=HOST:PORT" {
				t.Errorf("second run printed:\n%s\nwant only: %s…", got, tc.want)
			}
			if code := second.cmd.ProcessState.ExitCode(); code != 1 {
				t.Errorf("second run exited %d, want 1", code)
			}
		})
	}

	// Ctrl-C: SIGINT to the terminal's process group.
	if err := syscall.Kill(-r.cmd.Process.Pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	until(t, lines, fmt.Sprintf("stopped memcached:%d memcached:%d memcached:%d memcgate", p[0], p[1], p[2]))
	for range lines {
	}
	for _, port := range append(p[:3:3], p[3], p[4]) {
		if c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
			c.Close()
			t.Errorf("port %d still accepts connections after Ctrl-C", port)
		}
	}
}

// TestLocalRunNamesInheritedSettings: MEMCGATE_ variables the shell
// passes on (one exported while trying a deployment) are the gateway's
// over run.sh's own, and its banner names them, MEMCGATE_SERVERS with
// its value: without that, the banner says the gateway serves the
// memcached it started while every printed example answers 503 from the
// servers of the environment.
func TestLocalRunNamesInheritedSettings(t *testing.T) {
	p := freeAddrs(t, 5)
	listen, admin := fmt.Sprintf("127.0.0.1:%d", p[3]), fmt.Sprintf("127.0.0.1:%d", p[4])
	r := startLocal(t, p[:3], listen, admin, "MEMCGATE_SERVERS=127.0.0.1:1", "MEMCGATE_TIMEOUT=300ms")
	lines := r.lines()
	out := until(t, lines, "Ctrl-C stops")
	named := ""
	for _, l := range strings.Split(out, "\n") {
		if strings.HasSuffix(l, " from the environment") {
			named = l
		}
	}
	for _, want := range []string{" MEMCGATE_SERVERS ", " MEMCGATE_TIMEOUT "} {
		if !strings.Contains(named, want) {
			t.Errorf("run.sh's line of settings from the environment is %q, want it to name%s:\n%s", named, want, out)
		}
	}
	if want := "(MEMCGATE_SERVERS=127.0.0.1:1: not the memcached above)"; !strings.Contains(out, want) {
		t.Errorf("run.sh printed no %q:\n%s", want, out)
	}
	if strings.Contains(out, "MEMCGATE_LISTEN_ADDR") || strings.Contains(out, "MEMCGATE_ADMIN_ADDR") {
		t.Errorf("run.sh names the listeners' variables, which its own line shows:\n%s", out)
	}
	if err := syscall.Kill(-r.cmd.Process.Pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	until(t, lines, "stopped memcached")
	for range lines {
	}
}
