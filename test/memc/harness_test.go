// Package memc_test runs the same HTTP requests against the reference
// nginx + HttpMemcModule setup (testdata/httpmemc-nginx.conf, the
// configuration docs/migrating-from-nginx-memc.md was measured on) and
// against memcgate's compatible endpoints, each with its own memcached,
// and compares the answers. Intended differences are named expectations
// in the table, never silent skips.
package memc_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/gatewaytest"
	"github.com/memcgate/memcgate/test/memcachedtest"
)

// memcModule is where Debian's libnginx-mod-http-memc puts the module; the
// reference configuration loads it from there.
const memcModule = "/usr/lib/nginx/modules/ngx_http_memc_module.so"

var binary string

func TestMain(m *testing.M) { gatewaytest.Main(m, true, &binary) }

// needNginx returns the nginx binary if the memc module is installed too,
// or skips t (fails it where tests must not skip: make test installs
// nginx and libnginx-mod-http-memc; see gatewaytest.Missing).
func needNginx(t *testing.T) string {
	t.Helper()
	bin := gatewaytest.Tool(t, "nginx", "nginx libnginx-mod-http-memc")
	if _, err := os.Stat(memcModule); err != nil {
		gatewaytest.Missing(t, "nginx's memc module", "libnginx-mod-http-memc", err)
	}
	return bin
}

// startNginx renders the reference configuration for memcached at
// mcPort, with nothing listening on deadPort, and starts nginx. It
// returns the address nginx listens on; nginx is stopped when t ends.
func startNginx(t *testing.T, bin string, mcPort, deadPort int) string {
	t.Helper()
	return runNginx(t, bin, "testdata/httpmemc-nginx.conf",
		"@MEMC_PORT@", strconv.Itoa(mcPort), "@DEAD_PORT@", strconv.Itoa(deadPort))
}

// runNginx renders the configuration in file, replacing @PREFIX@,
// @HTTP_PORT@ and the placeholder/value pairs in vars, and starts nginx.
// It returns the address nginx listens on; nginx is stopped when t ends.
func runNginx(t *testing.T, bin, file string, vars ...string) string {
	t.Helper()
	tmpl, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	// Not t.TempDir: the worker runs as nobody when the test runs as root
	// and must reach the prefix to buffer request bodies in tmp/.
	prefix, err := os.MkdirTemp("", "memc-nginx-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(prefix) })
	for _, d := range []struct {
		path string
		mode os.FileMode
	}{{prefix, 0o755}, {filepath.Join(prefix, "logs"), 0o755}, {filepath.Join(prefix, "tmp"), 0o777}} {
		if err := os.MkdirAll(d.path, d.mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d.path, d.mode); err != nil {
			t.Fatal(err)
		}
	}
	port, err := memcachedtest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	conf := strings.NewReplacer(append([]string{
		"@PREFIX@", prefix,
		"@HTTP_PORT@", strconv.Itoa(port),
	}, vars...)...).Replace(string(tmpl))
	if strings.Contains(conf, "@") {
		t.Fatalf("unfilled placeholder in the rendered configuration:\n%s", conf)
	}
	confPath := filepath.Join(prefix, "nginx.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-e", filepath.Join(prefix, "logs", "startup.log"), "-c", confPath, "-p", prefix+"/")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("starting nginx: %v\n%s", err, out)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	t.Cleanup(func() {
		if t.Failed() {
			if b, err := os.ReadFile(filepath.Join(prefix, "logs", "error.log")); err == nil {
				t.Logf("nginx error.log (tail):\n%s", gatewaytest.Tail(string(b), 3000))
			}
		}
		b, err := os.ReadFile(filepath.Join(prefix, "logs", "nginx.pid"))
		if err != nil {
			return
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			return
		}
		_ = syscall.Kill(pid, syscall.SIGTERM)
		waitClosed(addr)
	})
	gatewaytest.WaitListening(t, "nginx", addr, nil)
	return addr
}

func waitClosed(addr string) {
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		c, err := net.DialTimeout("tcp", addr, 50*time.Millisecond)
		if err != nil {
			return
		}
		c.Close()
		time.Sleep(20 * time.Millisecond)
	}
}

// startGate runs memcgate with env (MEMCGATE_* variables; the listeners
// are chosen here) and waits until it serves: /readyz, or /healthz when
// ready is false (a gateway whose only memcached is dead never gets ready).
// It returns the data listener's address.
func startGate(t *testing.T, env map[string]string, ready bool) string {
	t.Helper()
	vars := map[string]string{
		"MEMCGATE_DRAIN_DELAY":     "0s",
		"MEMCGATE_HEALTH_INTERVAL": "200ms",
		"MEMCGATE_ACCESS_LOG":      "false",
	}
	for k, v := range env {
		vars[k] = v
	}
	g := gatewaytest.New(t, binary, vars)
	if ready {
		g.Start(t)
	} else {
		g.StartAlive(t)
	}
	return g.DataAddr
}

// request is one HTTP/1.1 request, written byte for byte as given.
type request struct {
	method  string
	target  string   // sent as is: raw query bytes, duplicates, odd case
	hdr     []string // extra "Name: value" lines
	body    []byte   // sent with Content-Length when not nil
	chunks  [][]byte // sent chunked when chunked is set
	chunked bool
	// keepAlive leaves out "Connection: close", to see whether the server
	// keeps the connection (nginx closes it after 400, 413 and 500).
	keepAlive bool
}

func (rq request) bytes() []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: localhost\r\n", rq.method, rq.target)
	if !rq.keepAlive {
		b.WriteString("Connection: close\r\n")
	}
	for _, h := range rq.hdr {
		b.WriteString(h + "\r\n")
	}
	switch {
	case rq.chunked:
		b.WriteString("Transfer-Encoding: chunked\r\n\r\n")
		for _, c := range rq.chunks {
			fmt.Fprintf(&b, "%x\r\n", len(c))
			b.Write(c)
			b.WriteString("\r\n")
		}
		b.WriteString("0\r\n\r\n")
	case rq.body != nil:
		fmt.Fprintf(&b, "Content-Length: %d\r\n\r\n", len(rq.body))
		b.Write(rq.body)
	default:
		b.WriteString("\r\n")
	}
	return b.Bytes()
}

// response is what came back.
type response struct {
	status        int
	header        http.Header
	contentLength int64 // -1 if not sent
	body          []byte
	close         bool // the server said Connection: close
}

func (r response) String() string {
	body := r.body
	if len(body) > 200 {
		body = append(body[:200:200], "…"...)
	}
	return fmt.Sprintf("%d Content-Type=%q Content-Length=%d X-Memc-Flags=%q Last-Modified=%q body=%q",
		r.status, r.header.Get("Content-Type"), r.contentLength, r.header.Get("X-Memc-Flags"), r.header.Get("Last-Modified"), body)
}

// send writes rq on a new connection while reading the answer, so that a
// server that answers before it has read the body (413) is heard.
func send(addr string, rq request) (response, error) {
	conn, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return response{}, err
	}
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	written := make(chan struct{})
	go func() {
		defer close(written)
		_, _ = conn.Write(rq.bytes())
	}()
	defer func() { conn.Close(); <-written }()
	resp, err := http.ReadResponse(bufio.NewReader(conn), &http.Request{Method: rq.method})
	if err != nil {
		return response{}, fmt.Errorf("reading the answer: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil && (resp.ContentLength < 0 || int64(len(body)) < resp.ContentLength) {
		return response{}, fmt.Errorf("reading the body: %w", err)
	}
	return response{status: resp.StatusCode, header: resp.Header, contentLength: resp.ContentLength, body: body, close: resp.Close}, nil
}

// memcachedKeys lists the keys memcached at addr holds (live items only),
// sorted, as lru_crawler metadump reports them (URI-encoded by memcached).
func memcachedKeys(addr string) ([]string, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("lru_crawler metadump all\r\n")); err != nil {
		return nil, err
	}
	var keys []string
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		line := strings.TrimSuffix(sc.Text(), "\r")
		if line == "END" {
			sort.Strings(keys)
			return keys, nil
		}
		if k, ok := strings.CutPrefix(line, "key="); ok {
			k, _, _ = strings.Cut(k, " ")
			keys = append(keys, k)
		}
	}
	return nil, fmt.Errorf("metadump from %s: %v", addr, sc.Err())
}

// statNames returns the names of a stats reply's STAT lines, and whether
// it is STAT lines followed by exactly one END.
func statNames(body []byte) ([]string, bool) {
	s := string(body)
	if !strings.HasSuffix(s, "END\r\n") {
		return nil, false
	}
	var names []string
	for line := range strings.SplitSeq(strings.TrimSuffix(s, "END\r\n"), "\r\n") {
		if line == "" {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != "STAT" {
			return nil, false
		}
		names = append(names, f[1])
	}
	return names, len(names) > 0
}
