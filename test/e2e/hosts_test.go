package e2e

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/memcachedtest"
)

// hostRequest sends method url with Host host (and body, if any) through
// client, and returns the status and the body's first 300 bytes.
func hostRequest(t *testing.T, client *http.Client, method, url, host, body string) (int, string) {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, r)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s with Host %q: %v", method, url, host, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if len(b) > 300 { // a page or the metrics: the start is enough for a message
		b = append(b[:300:300], "…"...)
	}
	return resp.StatusCode, string(b)
}

// http10NoHost sends an HTTP/1.0 GET of path without a Host header to
// addr and returns the status line.
func http10NoHost(t *testing.T, addr, path string) string {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, "GET "+path+" HTTP/1.0\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("HTTP/1.0 GET %s without Host: %v", path, err)
	}
	return strings.TrimSpace(line)
}

// TestLoopbackAdminHost: the admin listener on loopback (its default) is
// what a web page reaches by making its own name resolve to 127.0.0.1
// (DNS rebinding). It answers 421 to a Host that is not a loopback
// address or localhost, /healthz included, and serves the names a client
// on this host uses; the data listener is unchanged while
// MEMCGATE_ALLOWED_HOSTS is unset; the container health check passes.
func TestLoopbackAdminHost(t *testing.T) {
	mcs := memcachedtest.StartN(t, 1)
	g := startGateway(t, map[string]string{"MEMCGATE_SERVERS": memcachedtest.Addrs(mcs)})
	port := strconv.Itoa(g.AdminPort)
	client := &http.Client{Timeout: 10 * time.Second}
	for _, path := range []string{"/debug/config", "/metrics", "/healthz", "/readyz", "/debug/pprof/cmdline"} {
		for _, host := range []string{"evil.example", "evil.example:" + port, "localhost.evil.example:" + port} {
			if s, body := hostRequest(t, client, "GET", g.Admin+path, host, ""); s != http.StatusMisdirectedRequest || !strings.Contains(body, "MEMCGATE_ALLOWED_HOSTS") {
				t.Errorf("admin %s with Host %q = %d %q, want 421 naming MEMCGATE_ALLOWED_HOSTS", path, host, s, body)
			}
		}
		for _, host := range []string{"localhost:" + port, "127.0.0.1:" + port, "[::1]:" + port, "localhost", "app.localhost:" + port} {
			if s, body := hostRequest(t, client, "GET", g.Admin+path, host, ""); s != http.StatusOK {
				t.Errorf("admin %s with Host %q = %d %q, want 200", path, host, s, body)
			}
		}
	}
	if line := http10NoHost(t, g.AdminAddr, "/healthz"); !strings.Contains(line, " 200 ") {
		t.Errorf("HTTP/1.0 /healthz without Host = %q, want 200 (no browser sends it)", line)
	}
	// The data listener: no check while ALLOWED_HOSTS is unset (a local
	// nginx or HAProxy in front may forward any Host).
	if s, body := hostRequest(t, client, "PUT", g.URL+"/k", "evil.example:8080", "v"); s != http.StatusCreated {
		t.Errorf("data PUT with Host evil.example, ALLOWED_HOSTS unset = %d %q, want 201", s, body)
	}
	if s, body := hostRequest(t, client, "GET", g.URL+"/memc?cmd=get&key=k", "evil.example", ""); s != http.StatusOK || body != "v" {
		t.Errorf("data /memc get with Host evil.example, ALLOWED_HOSTS unset = %d %q, want 200 \"v\"", s, body)
	}
	if got := metric(t, g, "memcgate_http_misdirected_requests_total", `{listener="admin"}`); got != 15 {
		t.Errorf(`memcgate_http_misdirected_requests_total{listener="admin"} = %v, want 15`, got)
	}
	if got := metric(t, g, "memcgate_http_misdirected_requests_total", `{listener="data"}`); got != 0 {
		t.Errorf(`memcgate_http_misdirected_requests_total{listener="data"} = %v, want 0`, got)
	}
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(g.Logs(), "Host not allowed"); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the refusals were not logged within 10s:\n%s", g.Logs())
		}
	}
	// The image's health check, whatever name ADMIN_ADDR gives.
	for _, addr := range []string{g.AdminAddr, "localhost:" + port} {
		cmd := exec.Command(binary, "healthcheck", "/readyz")
		cmd.Env = append(os.Environ(), "MEMCGATE_ADMIN_ADDR="+addr)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("memcgate healthcheck with ADMIN_ADDR=%s: %v\n%s", addr, err, out)
		}
	}
}

// TestAllowedHostsData: with MEMCGATE_ALLOWED_HOSTS set, every data
// listener checks the Host, on the fast path, on Go's net/http
// (FAST_PATH=false, TLS) and on the Unix socket, the HttpMemc endpoints
// included: another name gets 421 and changes nothing; the listed names,
// IP addresses and localhost are served.
func TestAllowedHostsData(t *testing.T) {
	caFile, certFile, keyFile := writeCert(t)
	mcs := memcachedtest.StartN(t, 1)
	tests := []struct {
		name string
		env  map[string]string
	}{
		{"fast path", map[string]string{}},
		{"net/http", map[string]string{"MEMCGATE_FAST_PATH": "false"}},
		{"TLS", map[string]string{"MEMCGATE_TLS_CERT_FILE": certFile, "MEMCGATE_TLS_KEY_FILE": keyFile}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sock := filepath.Join(t.TempDir(), "memcgate.sock")
			env := map[string]string{
				"MEMCGATE_SERVERS":       memcachedtest.Addrs(mcs),
				"MEMCGATE_ALLOWED_HOSTS": "cache.internal, .example.com",
				"MEMCGATE_LISTEN_SOCKET": sock,
			}
			for k, v := range tt.env {
				env[k] = v
			}
			scheme := "http"
			client := &http.Client{Timeout: 10 * time.Second}
			if env["MEMCGATE_TLS_CERT_FILE"] != "" {
				scheme = "https"
				client = httpsClient(t, caFile)
			}
			g := startGatewayScheme(t, scheme, env)
			unix := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
				DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
					var d net.Dialer
					return d.DialContext(ctx, "unix", sock)
				},
			}}
			if scheme == "https" {
				unix = nil // TLS on the socket too: the TCP listener stands for both
			}
			type via struct {
				name   string
				client *http.Client
				base   string
			}
			vias := []via{{"TCP", client, g.URL}}
			if unix != nil {
				vias = append(vias, via{"Unix socket", unix, "http://localhost"})
			}
			refused := 0
			for _, v := range vias {
				if s, body := hostRequest(t, v.client, "PUT", v.base+"/k", "localhost", "original"); s != http.StatusCreated {
					t.Fatalf("%s: PUT with Host localhost = %d %q, want 201", v.name, s, body)
				}
				for _, rq := range []struct{ method, path, body string }{
					{"PUT", "/k", "changed"},
					{"GET", "/k", ""},
					{"DELETE", "/k", ""},
					{"POST", "/", `{"ops":[{"op":"set","key":"k","value":"changed"}]}`},
					{"GET", "/memc?cmd=set&key=k&val=changed", ""},
					{"GET", "/memc?cmd=get&key=k", ""},
				} {
					for _, host := range []string{"evil.example", "evil.example:8080", "cache.internal.evil.example"} {
						s, body := hostRequest(t, v.client, rq.method, v.base+rq.path, host, rq.body)
						if s != http.StatusMisdirectedRequest || !strings.Contains(body, "MEMCGATE_ALLOWED_HOSTS") {
							t.Errorf("%s: %s %s with Host %q = %d %q, want 421 naming MEMCGATE_ALLOWED_HOSTS", v.name, rq.method, rq.path, host, s, body)
						}
						refused++
					}
				}
				for _, host := range []string{"cache.internal", "CACHE.internal:8080", "cache.example.com", "127.0.0.1:8080", "[::1]:8080", "localhost"} {
					if s, body := hostRequest(t, v.client, "GET", v.base+"/k", host, ""); s != http.StatusOK || body != "original" {
						t.Errorf("%s: GET /k with Host %q = %d %q, want 200 \"original\" (refused requests change nothing)", v.name, host, s, body)
					}
					if s, body := hostRequest(t, v.client, "GET", v.base+"/memc?cmd=get&key=k", host, ""); s != http.StatusOK || body != "original" {
						t.Errorf("%s: /memc get with Host %q = %d %q, want 200 \"original\"", v.name, host, s, body)
					}
				}
			}
			if got := metric(t, g, "memcgate_http_misdirected_requests_total", `{listener="data"}`); got != float64(refused) {
				t.Errorf(`memcgate_http_misdirected_requests_total{listener="data"} = %v, want %d`, got, refused)
			}
			if got := metric(t, g, "memcgate_http_requests_total", `{code="421",method="PUT"}`); got < 3 {
				t.Errorf(`memcgate_http_requests_total{code="421",method="PUT"} = %v, want the refusals counted as other answers are`, got)
			}
			// The admin listener checks the listed names too.
			if s, _ := hostRequest(t, client, "GET", g.Admin+"/healthz", "cache.internal", ""); s != http.StatusOK {
				t.Errorf("admin /healthz with a listed Host = %d, want 200", s)
			}
			if s, _ := hostRequest(t, client, "GET", g.Admin+"/healthz", "evil.example", ""); s != http.StatusMisdirectedRequest {
				t.Errorf("admin /healthz with Host evil.example = %d, want 421", s)
			}
		})
	}
}

// TestAllowedHostsReload: MEMCGATE_ALLOWED_HOSTS is applied by a reload,
// on the data listener and the admin listener at once.
func TestAllowedHostsReload(t *testing.T) {
	mcs := memcachedtest.StartN(t, 1)
	file := filepath.Join(t.TempDir(), "memcgate.env")
	writeAtomic(t, file, "MEMCGATE_SERVERS="+memcachedtest.Addrs(mcs)+"\n")
	g := startGateway(t, map[string]string{"MEMCGATE_CONFIG_FILE": file, "MEMCGATE_WATCH_INTERVAL": "100ms"})
	client := &http.Client{Timeout: 10 * time.Second}
	if s, _ := hostRequest(t, client, "GET", g.URL+"/k", "evil.example", ""); s != http.StatusNotFound {
		t.Fatalf("data GET with Host evil.example before the reload = %d, want 404 (a miss: no check)", s)
	}
	writeAtomic(t, file, "MEMCGATE_SERVERS="+memcachedtest.Addrs(mcs)+"\nMEMCGATE_ALLOWED_HOSTS=cache.internal\n")
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if s, _ := hostRequest(t, client, "GET", g.URL+"/k", "evil.example", ""); s == http.StatusMisdirectedRequest {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ALLOWED_HOSTS set in CONFIG_FILE was not applied within 10s:\n%s", g.Logs())
		}
	}
	if s, _ := hostRequest(t, client, "GET", g.URL+"/k", "cache.internal", ""); s != http.StatusNotFound {
		t.Errorf("data GET with the listed Host after the reload = %d, want 404", s)
	}
	if s, _ := hostRequest(t, client, "GET", g.Admin+"/healthz", "cache.internal", ""); s != http.StatusOK {
		t.Errorf("admin /healthz with the listed Host after the reload = %d, want 200", s)
	}
	// The log is written out every 200 ms.
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(g.Logs(), `"changed":["MEMCGATE_ALLOWED_HOSTS"]`); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no reload line naming MEMCGATE_ALLOWED_HOSTS within 10s:\n%s", g.Logs())
		}
	}
}
