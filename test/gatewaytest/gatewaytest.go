// Package gatewaytest holds the shared start-up of the end-to-end
// (test/e2e, test/abuse), deploy (test/deploy), load-balancer (test/lb)
// and differential (test/memc) tests.
//
// It builds the memcgate binary (the way the Dockerfile does, or with the
// race detector) and runs it as a process on loopback ports; it starts
// no memcached (test/memcachedtest does): the caller passes
// MEMCGATE_SERVERS. It reads the gateway's metrics.
//
// It also says, in one place, what a test does when an external tool is
// missing (tools.go): Tool, PHP and Missing skip it, or fail it where
// tests must not skip (CI or MEMCGATE_TEST_REQUIRE_MEMCACHED set, as make
// test does after installing every tool); Optional always skips, for the
// tools make test does not install. The unit tests of upstream/hashring
// and gateway/phpvalue, which run php and nginx, use these too.
package gatewaytest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
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

	"github.com/memcgate/memcgate/test/memcachedtest"
)

// Build compiles github.com/memcgate/memcgate/cmd/memcgate into dir and
// returns the binary's path: with the Dockerfile's flags, or, with race,
// with the race detector (which needs cgo), so that end-to-end runs also
// catch data races in the shipped code.
func Build(dir string, race bool) (string, error) {
	bin := filepath.Join(dir, "memcgate")
	args := []string{"build", "-trimpath", "-ldflags=-s -w", "-o", bin}
	env := append(os.Environ(), "CGO_ENABLED=0")
	if race {
		args = []string{"build", "-race", "-o", bin}
		env = os.Environ()
	}
	cmd := exec.Command("go", append(args, "github.com/memcgate/memcgate/cmd/memcgate")...)
	cmd.Env = env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build: %v\n%s", err, out.String())
	}
	return bin, nil
}

// Main is a TestMain body: it builds the binary into a temporary
// directory (with the race detector if race), stores its path in *bin,
// runs the tests, removes the directory and exits with the tests' code.
func Main(m *testing.M, race bool, bin *string) {
	dir, err := os.MkdirTemp("", "memcgate-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if *bin, err = Build(dir, race); err != nil {
		fmt.Fprintln(os.Stderr, "building memcgate:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// SyncBuffer is a bytes.Buffer safe for concurrent writers, for process
// output.
type SyncBuffer struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what was written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Gateway is one memcgate process with fixed loopback ports, so that it can
// be stopped and started again at the same addresses. Its methods are safe
// for concurrent use.
//
// The ports New picks were free a moment before the binary binds them,
// and another process can take one in between: the first Start then
// starts the binary again on fresh ports, and the address fields change.
// They are final once a start succeeded: read them after the first Start
// (to put a balancer in front, say), never between New and Start.
type Gateway struct {
	DataAddr  string // 127.0.0.1:port of MEMCGATE_LISTEN_ADDR
	AdminAddr string // 127.0.0.1:port of MEMCGATE_ADMIN_ADDR
	DataPort  int
	AdminPort int

	bin  string
	env  map[string]string
	logs string    // the file the process writes its output to
	out  io.Writer // where the process writes instead, if not nil (SetOutput)

	// files are passed to the process as systemd passes sockets, named
	// by names (Activate); fixed before the first Start.
	files []*os.File
	names []string

	mu      sync.Mutex // guards cmd, done, started, attempts
	cmd     *exec.Cmd
	done    chan error // receives the exit of cmd, once
	started bool       // a start succeeded: the addresses are final
	// attempts counts the processes run, retries included, for the
	// tests of the retry.
	attempts int
}

// maxStarts bounds the processes a first Start runs when each loses one
// of its ports to another process.
const maxStarts = 5

// New picks two free loopback ports and returns a gateway that is not
// running yet. env holds MEMCGATE_ variables; the listeners are set here.
// The process, if running, is killed when the test ends, and its logs are
// printed if the test failed.
func New(t testing.TB, bin string, env map[string]string) *Gateway {
	t.Helper()
	// The output goes to a file, as a deployment's log would: a test
	// that makes the gateway log tens of megabytes a second (every
	// request writes an access log line) must not spend its own CPU
	// copying them, nor make the gateway wait for it. The directory is
	// removed after the process is killed (cleanups run last first).
	g := &Gateway{bin: bin, env: map[string]string{}, logs: filepath.Join(t.TempDir(), "memcgate.log")}
	for k, v := range env {
		g.env[k] = v
	}
	if err := g.pickPorts(); err != nil {
		t.Fatalf("free ports: %v", err)
	}
	t.Cleanup(func() {
		g.Kill()
		if t.Failed() {
			t.Logf("memcgate %s logs (tail):\n%s", g.DataAddr, Tail(g.Logs(), 3000))
		}
	})
	return g
}

// pickPorts sets the addresses, and the listeners in env, to two loopback
// ports free a moment ago.
func (g *Gateway) pickPorts() error {
	ports, err := memcachedtest.FreePorts(2)
	if err != nil {
		return err
	}
	g.DataPort, g.AdminPort = ports[0], ports[1]
	g.DataAddr, g.AdminAddr = "127.0.0.1:"+strconv.Itoa(g.DataPort), "127.0.0.1:"+strconv.Itoa(g.AdminPort)
	g.env["MEMCGATE_LISTEN_ADDR"] = g.DataAddr
	g.env["MEMCGATE_ADMIN_ADDR"] = g.AdminAddr
	return nil
}

// Start runs the binary and waits until /readyz answers 200; it fails t
// (the test running on the calling goroutine) if that does not happen.
// A first start whose port another process took is run again on fresh
// ports (see Gateway); a restart keeps its addresses, and fails if one
// was taken meanwhile.
func (g *Gateway) Start(t testing.TB) {
	t.Helper()
	if err := g.start(t, "/readyz"); err != nil {
		t.Fatal(err)
	}
}

// StartAlive is Start for a gateway that cannot become ready (its memcached
// is meant to be down): it waits for /healthz instead.
func (g *Gateway) StartAlive(t testing.TB) {
	t.Helper()
	if err := g.start(t, "/healthz"); err != nil {
		t.Fatal(err)
	}
}

// Activate makes the processes started from now on inherit files as
// systemd's socket activation passes sockets (sd_listen_fds(3)):
// descriptors 3 on, LISTEN_FDS of them, named in LISTEN_FDNAMES by names,
// and LISTEN_PID, which must be the process's own pid and so cannot be
// set before it exists: /bin/sh sets it to its $$ and execs the binary,
// which keeps that pid. The files stay the caller's to close, after the
// test. A start that cannot bind a port is not retried on fresh ports:
// the caller bound the files to these addresses.
func (g *Gateway) Activate(names []string, files []*os.File) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.names, g.files = names, files
}

// portTakenError is the exit of a process that could not bind one of its
// ports because another process had it.
type portTakenError struct {
	line string // what the binary said as it exited
}

func (e *portTakenError) Error() string {
	return "memcgate lost its port to another process before it bound it: " + e.line
}

// start runs the binary until probe answers 200, again on fresh ports
// while a first start loses a port (at most maxStarts times). Any other
// failure, and a lost port on a restart, is returned at once.
func (g *Gateway) start(t testing.TB, probe string) error {
	t.Helper()
	for n := 1; ; n++ {
		err := g.startOnce(probe)
		g.mu.Lock()
		if err == nil {
			g.started = true
		}
		restart := g.started || g.files != nil
		g.mu.Unlock()
		var taken *portTakenError
		if err == nil || !errors.As(err, &taken) || restart || n == maxStarts {
			return err
		}
		t.Logf("%v; starting it again on fresh ports", err)
		if err := g.pickPorts(); err != nil {
			return fmt.Errorf("free ports: %w", err)
		}
	}
}

// startOnce runs the binary once and waits until probe answers 200 on the
// admin listener, from this process. If the process exits meanwhile, the
// error is a *portTakenError when the binary said it could not bind
// DataAddr or AdminAddr because it was in use (read from the log file;
// output sent to SetOutput's writer is not read, so such a start is not
// recognised as one that lost its port).
func (g *Gateway) startOnce(probe string) error {
	cmd := exec.Command(g.bin)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	for k, v := range g.env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	g.mu.Lock()
	out := g.out
	if g.files != nil {
		env := cmd.Env
		cmd = exec.Command("/bin/sh", "-c", `LISTEN_PID=$$; export LISTEN_PID; exec "$0"`, g.bin)
		cmd.Env = append(env, "LISTEN_FDS="+strconv.Itoa(len(g.files)), "LISTEN_FDNAMES="+strings.Join(g.names, ":"))
		cmd.ExtraFiles = g.files
	}
	g.mu.Unlock()
	from := int64(-1) // where this process's output begins in the log file; -1: not there
	if out == nil {
		f, err := os.OpenFile(g.logs, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644) // a restart appends
		if err != nil {
			return fmt.Errorf("memcgate's log file: %w", err)
		}
		defer f.Close() // the process has its own descriptor once started
		st, err := f.Stat()
		if err != nil {
			return fmt.Errorf("memcgate's log file: %w", err)
		}
		from, out = st.Size(), f
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting memcgate: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	g.mu.Lock()
	g.cmd, g.done = cmd, done
	g.attempts++
	g.mu.Unlock()
	client := &http.Client{Timeout: time.Second}
	other := "" // why the last 200 was not this process's
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); {
		if resp, err := client.Get("http://" + g.AdminAddr + probe); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				// Another process that took the admin port may answer
				// for this one, which then exits. The data listener is
				// bound first: an admin listener of this process means
				// both ports are its own.
				owns, err := memcachedtest.Listens(cmd.Process.Pid, g.AdminPort)
				if owns {
					return nil
				}
				other = fmt.Sprintf(" (%s answered 200, but not from memcgate's pid %d: %v)", g.AdminAddr, cmd.Process.Pid, err)
			}
		}
		select {
		case err := <-done:
			g.mu.Lock()
			g.cmd, g.done = nil, nil
			g.mu.Unlock()
			return g.exitError(err, from)
		case <-time.After(20 * time.Millisecond):
		}
	}
	return fmt.Errorf("memcgate %s not ready within 15s%s:\n%s", g.DataAddr, other, Tail(g.Logs(), 3000))
}

// exitError describes the exit, with err from Wait, of a process that
// had not become ready, from its output (in the log file from offset
// from; none if from < 0).
func (g *Gateway) exitError(err error, from int64) error {
	output := ""
	if from >= 0 {
		if b := []byte(g.Logs()); int64(len(b)) >= from {
			output = string(b[from:])
		}
	}
	// What main prints for a listener that cannot bind (cmd/memcgate:
	// the variable, then net.Listen's error), with status 1.
	var exit *exec.ExitError
	if errors.As(err, &exit) && exit.ExitCode() == 1 {
		for _, line := range strings.Split(output, "\n") {
			if line == "memcgate: MEMCGATE_LISTEN_ADDR: listen tcp "+g.DataAddr+": bind: address already in use" ||
				line == "memcgate: MEMCGATE_ADMIN_ADDR: listen tcp "+g.AdminAddr+": bind: address already in use" {
				return &portTakenError{line: line}
			}
		}
	}
	return fmt.Errorf("memcgate exited at start: %v\n%s", err, Tail(output, 3000))
}

// SetOutput makes the process started next write its stdout and stderr
// to w instead of the file Logs reads: an *os.File, such as a pipe
// nobody reads, is the process's own.
func (g *Gateway) SetOutput(w io.Writer) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.out = w
}

// Signal sends sig to the process, if it runs.
func (g *Gateway) Signal(sig syscall.Signal) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cmd != nil {
		_ = g.cmd.Process.Signal(sig)
	}
}

// Wait waits up to timeout for the process to exit and returns its exit
// error; ok is false if it is still running.
func (g *Gateway) Wait(timeout time.Duration) (exit error, ok bool) {
	g.mu.Lock()
	done := g.done
	g.mu.Unlock()
	if done == nil {
		return nil, true
	}
	select {
	case err := <-done:
		g.mu.Lock()
		g.cmd, g.done = nil, nil
		g.mu.Unlock()
		return err, true
	case <-time.After(timeout):
		return nil, false
	}
}

// Kill sends SIGKILL and waits for the exit.
func (g *Gateway) Kill() {
	g.Signal(syscall.SIGKILL)
	g.Wait(10 * time.Second)
}

// Pid returns the process id of the running binary, or 0 if it is not
// running (for reading /proc/<pid>/status, say).
func (g *Gateway) Pid() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cmd == nil || g.cmd.Process == nil {
		return 0
	}
	return g.cmd.Process.Pid
}

// Logs returns everything the process wrote so far (nothing that went to
// SetOutput's writer).
func (g *Gateway) Logs() string {
	b, _ := os.ReadFile(g.logs) // no file: nothing written yet
	return string(b)
}

// Metrics returns the admin listener's /metrics text.
func (g *Gateway) Metrics(ctx context.Context) (string, error) {
	return Scrape(ctx, "http://"+g.AdminAddr+"/metrics")
}

// Scrape GETs url and returns the body of a 200 answer. A 503 with
// Retry-After (the admin listener serves a few such requests at once) is
// asked again, until ctx or 20 seconds end.
func Scrape(ctx context.Context, url string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second) // a race-built gateway on a loaded machine gathers slowly
	defer cancel()
	for {
		b, retry, err := scrapeOnce(ctx, url)
		if !retry {
			return b, err
		}
		select {
		case <-ctx.Done():
			return b, err
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// scrapeOnce is one GET of Scrape; retry says it was answered 503 with
// Retry-After.
func scrapeOnce(ctx context.Context, url string) (_ string, retry bool, _ error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", false, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", false, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", false, err
	}
	if resp.StatusCode != http.StatusOK {
		busy := resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") != ""
		return "", busy, fmt.Errorf("%s: %s", url, resp.Status)
	}
	return string(b), false, nil
}

// Family is one metric family of a Prometheus text exposition.
type Family struct {
	Type    string  // counter, gauge, histogram, summary, untyped
	Samples int     // sample lines, series of a histogram included
	Sum     float64 // of every sample value (for histograms: of the _count samples)
	// Labels maps each label name seen on a sample to the values seen.
	Labels map[string]map[string]bool
}

// ParseText reads the families of a text exposition (# TYPE lines and the
// samples under them; _bucket, _sum and _count belong to their histogram).
func ParseText(text string) (map[string]*Family, error) {
	fams := map[string]*Family{}
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			name, typ, found := strings.Cut(rest, " ")
			if !found {
				return nil, fmt.Errorf("bad TYPE line %q", line)
			}
			fams[name] = &Family{Type: typ, Labels: map[string]map[string]bool{}}
			continue
		}
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name := line[:strings.IndexAny(line+" ", "{ ")]
		var fields []string // value [timestamp]
		if i := strings.LastIndexByte(line, '}'); strings.Contains(line, "{") && i > 0 {
			fields = strings.Fields(line[i+1:])
		} else {
			fields = strings.Fields(line)[1:]
		}
		if len(fields) == 0 {
			return nil, fmt.Errorf("sample without value: %q", line)
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return nil, fmt.Errorf("sample %q: %v", line, err)
		}
		f := fams[name]
		if f == nil {
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				if base, ok := strings.CutSuffix(name, suffix); ok && fams[base] != nil {
					f = fams[base]
					break
				}
			}
		}
		if f == nil {
			return nil, fmt.Errorf("sample %q has no # TYPE line", line)
		}
		f.Samples++
		if i := strings.IndexByte(line, '{'); i >= 0 {
			labels, err := parseLabels(line[i+1:])
			if err != nil {
				return nil, fmt.Errorf("sample %q: %v", line, err)
			}
			for k, v := range labels {
				if f.Labels[k] == nil {
					f.Labels[k] = map[string]bool{}
				}
				f.Labels[k][v] = true
			}
		}
		if f.Type != "histogram" || strings.HasSuffix(name, "_count") {
			f.Sum += v
		}
	}
	return fams, sc.Err()
}

// parseLabels reads `a="x",b="y\"z"}` up to the closing brace.
func parseLabels(s string) (map[string]string, error) {
	out := map[string]string{}
	for {
		s = strings.TrimLeft(s, ", ")
		if strings.HasPrefix(s, "}") {
			return out, nil
		}
		eq := strings.IndexByte(s, '=')
		if eq < 0 || len(s) < eq+2 || s[eq+1] != '"' {
			return nil, fmt.Errorf("bad label list %q", s)
		}
		name := s[:eq]
		s = s[eq+2:]
		var v strings.Builder
		for i := 0; ; i++ {
			if i >= len(s) {
				return nil, fmt.Errorf("unterminated label value for %s", name)
			}
			if s[i] == '\\' && i+1 < len(s) {
				i++
				switch s[i] {
				case 'n':
					v.WriteByte('\n')
				default:
					v.WriteByte(s[i])
				}
				continue
			}
			if s[i] == '"' {
				s = s[i+1:]
				break
			}
			v.WriteByte(s[i])
		}
		out[name] = v.String()
	}
}

// Families scrapes the admin listener's /metrics and parses it.
func (g *Gateway) Families(ctx context.Context) (map[string]*Family, error) {
	text, err := g.Metrics(ctx)
	if err != nil {
		return nil, err
	}
	return ParseText(text)
}

// Served returns how many HTTP requests the gateway answered since it
// started (memcgate_http_requests_total summed over all labels).
func (g *Gateway) Served(ctx context.Context) (float64, error) {
	fams, err := g.Families(ctx)
	if err != nil {
		return 0, err
	}
	f := fams["memcgate_http_requests_total"]
	if f == nil {
		return 0, nil
	}
	return f.Sum, nil
}

// WaitListening polls addr until it accepts TCP connections (sending
// nothing, so that a proxy passes no request on), and fails t if what
// (nginx, say) does not listen there within 10s; logs, if not nil, adds
// what the process wrote to the failure.
func WaitListening(t testing.TB, what, addr string, logs func() string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			return
		}
	}
	msg := fmt.Sprintf("%s does not accept connections on %s within 10s", what, addr)
	if logs != nil {
		msg += ":\n" + logs()
	}
	t.Fatal(msg)
}

// Tail returns the last n bytes of s, marked with a leading … when s was
// longer, for logs and bodies in failure messages.
func Tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}
