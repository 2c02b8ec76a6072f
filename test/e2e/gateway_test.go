// Package e2e tests the built memcgate binary against real memcached
// processes, over HTTP, as a user would run it.
package e2e

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/memcgate/memcgate/test/gatewaytest"
	"github.com/memcgate/memcgate/test/memcachedtest"
)

var binary string

// The binary is built with the race detector, so end-to-end runs also
// catch data races in the shipped code.
//
// The package's parallel tests run 4 at a time unless -parallel says
// otherwise, where go test's default is one per core: they mostly wait on
// the processes they start (timeouts, ejections, drains, PHP), and they
// run after the serial tests, which keep the machine to themselves.
func TestMain(m *testing.M) {
	flag.Parse()
	parallelSet := false
	flag.Visit(func(f *flag.Flag) { parallelSet = parallelSet || f.Name == "test.parallel" })
	if !parallelSet {
		flag.Set("test.parallel", "4")
	}
	gatewaytest.Main(m, true, &binary)
}

// gateway is one running memcgate process with request helpers.
type gateway struct {
	*gatewaytest.Gateway
	t     *testing.T
	URL   string // data listener, http(s)://127.0.0.1:port
	Admin string // admin listener, http://127.0.0.1:port
}

// startGateway runs the binary with env (MEMCGATE_ variables; listeners are
// picked here) and waits until /readyz answers 200.
func startGateway(t *testing.T, env map[string]string) *gateway {
	t.Helper()
	return startGatewayScheme(t, "http", env)
}

// startGatewayScheme is startGateway for a data listener speaking scheme
// (http or https); the admin listener stays plain HTTP.
func startGatewayScheme(t *testing.T, scheme string, env map[string]string) *gateway {
	t.Helper()
	vars := map[string]string{
		"MEMCGATE_DRAIN_DELAY":     "0s",
		"MEMCGATE_HEALTH_INTERVAL": "200ms",
	}
	for k, v := range env {
		vars[k] = v
	}
	g := gatewaytest.New(t, binary, vars)
	g.Start(t)
	return &gateway{Gateway: g, t: t, URL: scheme + "://" + g.DataAddr, Admin: "http://" + g.AdminAddr}
}

type response struct {
	status int
	body   string
	header http.Header
}

func (g *gateway) do(method, path string, body []byte, hdr ...string) response {
	g.t.Helper()
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, g.URL+path, r)
	if err != nil {
		g.t.Fatalf("%s %s: %v", method, path, err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		g.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		g.t.Fatalf("%s %s: reading body: %v", method, path, err)
	}
	return response{resp.StatusCode, string(b), resp.Header}
}

func TestEndpoints(t *testing.T) {
	mcs := memcachedtest.StartN(t, 3)
	g := startGateway(t, map[string]string{"MEMCGATE_SERVERS": memcachedtest.Addrs(mcs)})
	binaryValue := []byte("a\x00b\r\nEND\r\nVALUE x 0 1\r\n\xff\x00")
	long96 := strings.Repeat("k", 96)
	value400 := strings.Repeat("v", 400)

	steps := []struct {
		name       string
		method     string
		path       string
		body       []byte
		hdr        []string
		wantStatus int
		wantBody   *string // nil: don't care
		wantHdr    map[string]string
	}{
		{name: "put binary", method: "PUT", path: "/bin/val%00ue?flags=42", body: binaryValue, wantStatus: 400},
		{name: "put binary value", method: "PUT", path: "/bin/value?flags=42", body: binaryValue, wantStatus: 201},
		{name: "get binary value", method: "GET", path: "/bin/value", wantStatus: 200, wantBody: ptr(string(binaryValue)),
			wantHdr: map[string]string{"X-Memcached-Flags": "42", "Content-Length": strconv.Itoa(len(binaryValue))}},
		{name: "head binary value", method: "HEAD", path: "/bin/value", wantStatus: 200, wantBody: ptr(""),
			wantHdr: map[string]string{"Content-Length": strconv.Itoa(len(binaryValue))}},
		{name: "utf8 key", method: "PUT", path: "/caf%C3%A9/%E6%97%A5%E6%9C%AC", body: []byte("ja"), wantStatus: 201},
		{name: "utf8 key raw", method: "GET", path: "/café/日本", wantStatus: 200, wantBody: ptr("ja")},
		{name: "slash encoded same key", method: "GET", path: "/caf%C3%A9%2F%E6%97%A5%E6%9C%AC", wantStatus: 200, wantBody: ptr("ja")},
		{name: "seed-sized", method: "PUT", path: "/" + long96, body: []byte(value400), wantStatus: 201},
		{name: "seed-sized get", method: "GET", path: "/" + long96, wantStatus: 200, wantBody: ptr(value400)},
		{name: "empty value", method: "PUT", path: "/empty", body: []byte{}, wantStatus: 201},
		{name: "empty value get", method: "GET", path: "/empty", wantStatus: 200, wantBody: ptr("")},
		{name: "miss", method: "GET", path: "/missing", wantStatus: 404, wantBody: ptr("not found\n")},
		{name: "add new", method: "PUT", path: "/cond", body: []byte("1"), hdr: []string{"If-None-Match", "*"}, wantStatus: 201},
		{name: "add again", method: "PUT", path: "/cond", body: []byte("2"), hdr: []string{"If-None-Match", "*"}, wantStatus: 412},
		{name: "replace missing", method: "PUT", path: "/nocond", body: []byte("1"), hdr: []string{"If-Match", "*"}, wantStatus: 412},
		{name: "replace", method: "PUT", path: "/cond", body: []byte("3"), hdr: []string{"If-Match", "*"}, wantStatus: 201},
		{name: "cas stale", method: "PUT", path: "/cond", body: []byte("4"), hdr: []string{"If-Match", `"1"`}, wantStatus: 412},
		{name: "append", method: "POST", path: "/cond?op=append", body: []byte("z"), wantStatus: 201},
		{name: "prepend", method: "POST", path: "/cond?op=prepend", body: []byte("a"), wantStatus: 201},
		{name: "after concat", method: "GET", path: "/cond", wantStatus: 200, wantBody: ptr("a3z")},
		{name: "append missing", method: "POST", path: "/nocond?op=append", body: []byte("z"), wantStatus: 404},
		{name: "counter", method: "PUT", path: "/n", body: []byte("10"), wantStatus: 201},
		{name: "incr", method: "POST", path: "/n?op=incr&delta=5", wantStatus: 200, wantBody: ptr("15")},
		{name: "decr", method: "POST", path: "/n?op=decr&delta=20", wantStatus: 200, wantBody: ptr("0")},
		{name: "incr missing", method: "POST", path: "/nocond?op=incr", wantStatus: 404},
		{name: "incr non-numeric", method: "POST", path: "/cond?op=incr", wantStatus: 409},
		{name: "incr bad delta", method: "POST", path: "/n?op=incr&delta=x", wantStatus: 400},
		{name: "touch", method: "POST", path: "/n?op=touch&exptime=100", wantStatus: 204},
		{name: "touch missing", method: "POST", path: "/nocond?op=touch&exptime=1", wantStatus: 404},
		{name: "gat", method: "GET", path: "/n?touch=100", wantStatus: 200, wantBody: ptr("0 ")}, // memcached pads a decremented value
		{name: "gat expires at once", method: "GET", path: "/cond?touch=-1", wantStatus: 200, wantBody: ptr("a3z")},
		{name: "gat expired", method: "GET", path: "/cond", wantStatus: 404},
		{name: "gat missing", method: "GET", path: "/nocond?touch=1", wantStatus: 404},
		{name: "cond again", method: "PUT", path: "/cond", body: []byte("a3z"), wantStatus: 201},
		{name: "delete", method: "DELETE", path: "/n", wantStatus: 204},
		{name: "delete again", method: "DELETE", path: "/n", wantStatus: 404},
		{name: "expired at once", method: "PUT", path: "/gone?exptime=-1", body: []byte("x"), wantStatus: 201},
		{name: "expired get", method: "GET", path: "/gone", wantStatus: 404},
		{name: "long key", method: "PUT", path: "/" + strings.Repeat("k", 251), body: []byte("delete cond"), wantStatus: 400},
		{name: "still there", method: "GET", path: "/cond", wantStatus: 200},
		{name: "injection key", method: "GET", path: "/a%0D%0Adelete%20cond", wantStatus: 400},
		{name: "bad exptime", method: "PUT", path: "/k?exptime=1h", body: []byte("x"), wantStatus: 400},
		{name: "bad flags", method: "PUT", path: "/k?flags=x", body: []byte("x"), wantStatus: 400},
		{name: "too large", method: "PUT", path: "/big", body: bytes.Repeat([]byte("x"), 1048001), wantStatus: 413},
		{name: "too large stored nothing", method: "GET", path: "/big", wantStatus: 404},
		{name: "largest", method: "PUT", path: "/" + strings.Repeat("L", 250), body: bytes.Repeat([]byte("x"), 1048000), wantStatus: 201},
		{name: "append past the item size", method: "POST", path: "/" + strings.Repeat("L", 250) + "?op=append", body: bytes.Repeat([]byte("y"), 600), wantStatus: 404,
			wantBody: ptr("not found, or the value would pass memcached's item size (memcached answers both alike)\n")},
		{name: "append missing says both", method: "POST", path: "/nocond?op=append", body: []byte("z"), wantStatus: 404,
			wantBody: ptr("not found, or the value would pass memcached's item size (memcached answers both alike)\n")},
		{name: "method", method: "PATCH", path: "/k", wantStatus: 405, wantHdr: map[string]string{"Allow": "GET, HEAD, PUT, DELETE, POST"}},
	}
	for _, s := range steps {
		got := g.do(s.method, s.path, s.body, s.hdr...)
		if got.status != s.wantStatus {
			t.Errorf("%s: %s %.60s = %d %q, want %d", s.name, s.method, s.path, got.status, gatewaytest.Tail(got.body, 100), s.wantStatus)
		}
		if s.wantBody != nil && got.body != *s.wantBody {
			t.Errorf("%s: %s %.60s body = %q, want %q", s.name, s.method, s.path, gatewaytest.Tail(got.body, 100), gatewaytest.Tail(*s.wantBody, 100))
		}
		for k, v := range s.wantHdr {
			if h := got.header.Get(k); h != v {
				t.Errorf("%s: %s %.60s header %s = %q, want %q", s.name, s.method, s.path, k, h, v)
			}
		}
	}

	// CAS round trip through ETag.
	get := g.do("GET", "/cond", nil)
	etag := get.header.Get("ETag")
	if r := g.do("PUT", "/cond", []byte("cas"), "If-Match", etag); r.status != 201 {
		t.Errorf("PUT If-Match %s = %d %q, want 201", etag, r.status, r.body)
	}
	if r := g.do("PUT", "/cond", []byte("cas2"), "If-Match", etag); r.status != 412 {
		t.Errorf("PUT If-Match %s again = %d, want 412", etag, r.status)
	}

	// A chunked body (no Content-Length).
	req, _ := http.NewRequest("PUT", g.URL+"/chunked", io.MultiReader(strings.NewReader("chunk-"), strings.NewReader("ed")))
	req.ContentLength = -1
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 201 {
		t.Errorf("chunked PUT = %v %v, want 201", resp, err)
	} else {
		resp.Body.Close()
	}
	if r := g.do("GET", "/chunked", nil); r.body != "chunk-ed" {
		t.Errorf("GET /chunked = %q, want %q", r.body, "chunk-ed")
	}
	req, _ = http.NewRequest("PUT", g.URL+"/chunked-big", io.LimitReader(zeros{}, 2<<20))
	req.ContentLength = -1
	if resp, err := http.DefaultClient.Do(req); err == nil {
		if resp.StatusCode != 413 {
			t.Errorf("chunked 2 MiB PUT = %d, want 413", resp.StatusCode)
		}
		resp.Body.Close()
	}

	// Admin introspection.
	resp, err := http.Get(g.Admin + "/debug/nodes")
	if err != nil {
		t.Fatal(err)
	}
	var nodes []struct {
		Node string `json:"node"`
		Up   bool   `json:"up"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&nodes); err != nil || len(nodes) != 3 || !nodes[0].Up {
		t.Errorf("/debug/nodes = %+v, %v, want 3 nodes up", nodes, err)
	}
	resp.Body.Close()
	resp, err = http.Get(g.Admin + "/debug/owners?key=cond")
	if err != nil {
		t.Fatal(err)
	}
	var place struct {
		Serving string `json:"serving"`
		Chain   []struct {
			Node string `json:"node"`
		} `json:"chain"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&place); err != nil || len(place.Chain) != 3 || place.Serving != place.Chain[0].Node {
		t.Errorf("/debug/owners?key=cond = %+v, %v, want a chain of 3 served by its owner", place, err)
	}
	resp.Body.Close()
	raw := memcachedClient(t, place.Serving)
	if v, err := raw.Get("cond"); err != nil || string(v.Value) != "cas" {
		t.Errorf("memcached %s (the owner /debug/owners named) has cond = %v, %v, want cas", place.Serving, v, err)
	}

	// Writes spread over the ring: with 60 more keys every node holds some
	// (the ring hashes random ports, so a dozen keys could miss a node).
	for i := range 60 {
		g.do("PUT", "/spread/"+strconv.Itoa(i), []byte("x"))
	}
	for _, m := range mcs {
		st, err := m.Stats()
		if err != nil {
			t.Fatal(err)
		}
		if st["total_items"] == "0" {
			t.Errorf("memcached %s got no items; placement should spread keys", m.Addr)
		}
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

func ptr(s string) *string { return &s }

func memcachedClient(t *testing.T, addr string) *memcache.Client {
	t.Helper()
	c := memcache.New(addr)
	t.Cleanup(func() { c.Close() })
	return c
}

// TestConcurrentClientsAndConnectionCap: 64 clients at once through
// gomemcache's pool (PIPELINE_CONNS=0, the mode MAX_CONNS_PER_NODE caps)
// are all answered, and no node sees more than MAX_CONNS_PER_NODE data
// connections and the probe's.
func TestConcurrentClientsAndConnectionCap(t *testing.T) {
	mcs := memcachedtest.StartN(t, 3)
	const maxConns = 4
	g := startGateway(t, map[string]string{
		"MEMCGATE_SERVERS":            memcachedtest.Addrs(mcs),
		"MEMCGATE_PIPELINE_CONNS":     "0",
		"MEMCGATE_MAX_CONNS_PER_NODE": strconv.Itoa(maxConns),
		"MEMCGATE_KEEPALIVE":          strconv.Itoa(maxConns),
		"MEMCGATE_ACCESS_LOG":         "false",
	})
	const clients, perClient = 64, 30
	tr := &http.Transport{MaxIdleConnsPerHost: clients}
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	defer tr.CloseIdleConnections()
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	peak := make([]int, len(mcs))
	var peakMu sync.Mutex
	stop, sampled := make(chan struct{}), make(chan struct{})
	go func() { // sample memcached's own connection counts while the load runs
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			for i, m := range mcs {
				if n, err := memcachedtest.CurrConnections(m.Addr); err == nil {
					peakMu.Lock()
					peak[i] = max(peak[i], n)
					peakMu.Unlock()
				}
			}
		}
	}()
	for c := range clients {
		wg.Go(func() {
			for i := range perClient {
				key := fmt.Sprintf("/c%d/k%d", c, i)
				val := strings.Repeat(strconv.Itoa(c), 40)
				if err := roundTrip(client, g.URL+key, val); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	<-sampled
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// The data pool holds at most MAX_CONNS_PER_NODE connections; the
	// health probe has one more of its own, so that probes never wait
	// behind data operations (docs/operations.md, "Connections and pools").
	for i, p := range peak {
		t.Logf("memcached %s: peak curr_connections (excluding the sampler) = %d", mcs[i].Addr, p)
		if p > maxConns+1 {
			t.Errorf("memcached %s saw %d connections from the gateway, want at most %d data + 1 probe", mcs[i].Addr, p, maxConns)
		}
	}
	m := g.do("GET", "/x", nil) // keep the data path warm before the scrape
	_ = m
	resp, err := http.Get(g.Admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`memcgate_http_requests_total{code="201",method="PUT"} 1920`,
		`memcgate_http_request_duration_seconds_bucket`,
		`memcgate_upstream_ops_total{node="` + mcs[0].Addr + `",op="get",result="ok"}`,
		`memcgate_upstream_connections{node="` + mcs[0].Addr + `",state="idle"}`,
		`memcgate_upstream_connections{node="` + mcs[0].Addr + `",state="in_use"}`,
		`memcgate_upstream_node_up{node="` + mcs[0].Addr + `"} 1`,
		`go_goroutines`,
		`process_resident_memory_bytes`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

func roundTrip(c *http.Client, url, val string) error {
	req, _ := http.NewRequest("PUT", url, strings.NewReader(val))
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 201 {
		return fmt.Errorf("PUT %s = %d", url, resp.StatusCode)
	}
	resp, err = c.Get(url)
	if err != nil {
		return err
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != val {
		return fmt.Errorf("GET %s = %d %q, want 200 %q", url, resp.StatusCode, b, val)
	}
	return nil
}

func TestShutdownDrains(t *testing.T) {
	mcs := memcachedtest.StartN(t, 1)
	g := startGateway(t, map[string]string{
		"MEMCGATE_SERVERS":     memcachedtest.Addrs(mcs),
		"MEMCGATE_DRAIN_DELAY": "500ms",
	})
	// A slow upload is in flight when SIGTERM arrives; it must complete.
	pr, pw := io.Pipe()
	result := make(chan error, 1)
	go func() {
		req, _ := http.NewRequest("PUT", g.URL+"/slow", pr)
		req.ContentLength = 8
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode != 201 {
				err = fmt.Errorf("slow PUT = %d", resp.StatusCode)
			}
		}
		result <- err
	}()
	pw.Write([]byte("half"))
	time.Sleep(100 * time.Millisecond)
	g.Signal(syscall.SIGTERM)
	// During the drain delay /readyz says 503 while data still flows.
	deadline := time.Now().Add(400 * time.Millisecond)
	sawNotReady := false
	for time.Now().Before(deadline) && !sawNotReady {
		if resp, err := http.Get(g.Admin + "/readyz"); err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if sawNotReady = resp.StatusCode == 503; sawNotReady {
				if want := "not ready: draining: the gateway is shutting down\n"; string(body) != want {
					t.Errorf("/readyz while draining says %q, want %q", body, want)
				}
			}
		}
	}
	if !sawNotReady {
		t.Error("/readyz did not turn 503 after SIGTERM")
	}
	pw.Write([]byte("done"))
	pw.Close()
	if err := <-result; err != nil {
		t.Errorf("request in flight during shutdown: %v", err)
	}
	err, exited := g.Wait(10 * time.Second)
	if !exited {
		t.Fatal("memcgate did not exit within 10s of SIGTERM")
	}
	if err != nil {
		t.Errorf("memcgate exit after SIGTERM: %v, want status 0", err)
	}
}

func TestBadConfigAndHelp(t *testing.T) {
	cmd := exec.Command(binary)
	cmd.Env = []string{"MEMCGATE_SERVERS=nohost", "MEMCGATE_TIMEOUT=soon", "MEMCGATE_MAX_CONNS_PER_NODE=0"}
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("memcgate with a bad configuration exited 0:\n%s", out)
	}
	for _, want := range []string{"MEMCGATE_SERVERS", "MEMCGATE_TIMEOUT", "MEMCGATE_MAX_CONNS_PER_NODE"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("bad-config output lacks %s:\n%s", want, out)
		}
	}
	out, err = exec.Command(binary, "-help").CombinedOutput()
	if err != nil {
		t.Fatalf("memcgate -help: %v", err)
	}
	for _, want := range []string{"MEMCGATE_SERVERS", "MEMCGATE_MAX_CONNS_PER_NODE", "MEMCGATE_KEEPALIVE", "(default 64)"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("-help lacks %q", want)
		}
	}
}

func TestAllNodesDown(t *testing.T) {
	mcs := memcachedtest.StartN(t, 1)
	g := startGateway(t, map[string]string{"MEMCGATE_SERVERS": memcachedtest.Addrs(mcs)})
	mcs[0].Kill()
	deadline := time.Now().Add(5 * time.Second)
	for {
		r := g.do("GET", "/k", nil)
		if r.status == 503 && r.header.Get("Retry-After") != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET with its node killed = %d %q, want 503 with Retry-After in the end", r.status, r.body)
		}
		if r.status != 502 && r.status != 503 {
			t.Fatalf("GET with its node killed = %d %q, want 502 or 503", r.status, r.body)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// /readyz says why, for the operator who asks after the load
	// balancer took the gateway out.
	resp, err := http.Get(g.Admin + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := "not ready: no memcached node is up (0 of 1)\n"; resp.StatusCode != 503 || string(body) != want {
		t.Errorf("/readyz with every node down = %d %q, want 503 %q", resp.StatusCode, body, want)
	}
	mcs[0].Restart()
	deadline = time.Now().Add(10 * time.Second)
	for g.do("PUT", "/k", []byte("v")).status != 201 {
		if time.Now().After(deadline) {
			t.Fatal("the gateway did not recover after its node came back")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// owner returns the node /debug/owners names as key's owner.
func (g *gateway) owner(key string) string {
	g.t.Helper()
	resp, err := http.Get(g.Admin + "/debug/owners?key=" + key)
	if err != nil {
		g.t.Fatal(err)
	}
	defer resp.Body.Close()
	var place struct {
		Chain []struct {
			Node string `json:"node"`
		} `json:"chain"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&place); err != nil || len(place.Chain) == 0 {
		g.t.Fatalf("/debug/owners?key=%s: %+v, %v", key, place, err)
	}
	return place.Chain[0].Node
}

// TestNoNodeAnswers: with every memcached node down, nothing that needs
// memcached answers 2xx: a multi-get and a batch answer 503 (not 200 with
// a 503 inside each item), asynchronous writes are refused with 503 instead
// of a 202 for a write that cannot be applied, and /readyz says 503. With
// one node of two down (MEMCGATE_FAILOVER=fail, so its keys do not move),
// a multi-get is a partial failure: 200, and each key's own status.
func TestNoNodeAnswers(t *testing.T) {
	mcs := memcachedtest.StartN(t, 2)
	g := startGateway(t, map[string]string{"MEMCGATE_SERVERS": memcachedtest.Addrs(mcs), "MEMCGATE_FAILOVER": "fail"})
	// One key on each node.
	keyOn := map[string]string{}
	for i := 0; len(keyOn) < 2 && i < 1000; i++ {
		k := "k" + strconv.Itoa(i)
		if n := g.owner(k); keyOn[n] == "" {
			keyOn[n] = k
		}
	}
	a, b := keyOn[mcs[0].Addr], keyOn[mcs[1].Addr]
	if a == "" || b == "" {
		t.Fatalf("no key found for each node: %v", keyOn)
	}
	for _, k := range []string{a, b} {
		if r := g.do("PUT", "/"+k, []byte("v")); r.status != 201 {
			t.Fatalf("PUT /%s = %d %q", k, r.status, r.body)
		}
	}
	multiGet := "/?key=" + a + "&key=" + b
	batch := []byte(`[{"op":"set","key":"` + a + `","value":"1"},{"op":"get","key":"` + b + `"}]`)
	asyncBatch := []byte(`[{"op":"set","key":"` + a + `","value":"1"},{"op":"set","key":"` + b + `","value":"1"}]`)
	statuses := func(r response) []int {
		var res struct {
			Results []struct {
				Status int `json:"status"`
			} `json:"results"`
		}
		if err := json.Unmarshal([]byte(r.body), &res); err != nil {
			t.Fatalf("answer %d %q is not results JSON: %v", r.status, r.body, err)
		}
		var out []int
		for _, x := range res.Results {
			out = append(out, x.Status)
		}
		return out
	}
	readyz := func() int {
		resp, err := http.Get(g.Admin + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	// waitDown waits until the gateway has ejected addr (probes every 200ms).
	waitDown := func(addr string) {
		deadline := time.Now().Add(10 * time.Second)
		for g.do("GET", "/"+keyOn[addr], nil).status != 503 {
			if time.Now().After(deadline) {
				t.Fatalf("%s was not ejected within 10s", addr)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	mcs[0].Kill()
	waitDown(mcs[0].Addr)
	if r := g.do("GET", multiGet, nil); r.status != 200 || fmt.Sprint(statuses(r)) != "[503 200]" {
		t.Errorf("multi-get with one of two nodes down = %d %v, want 200 [503 200] (a partial failure)", r.status, statuses(r))
	}
	if r := g.do("POST", "/", batch); r.status != 200 || fmt.Sprint(statuses(r)) != "[503 200]" {
		t.Errorf("batch with one of two nodes down = %d %v, want 200 [503 200]", r.status, statuses(r))
	}
	if r := g.do("POST", "/", asyncBatch, "Prefer", "respond-async"); r.status != 503 {
		t.Errorf("async batch touching the down node = %d %q, want 503, nothing queued", r.status, r.body)
	}
	if code := readyz(); code != 200 {
		t.Errorf("/readyz with one of two nodes up = %d, want 200", code)
	}

	mcs[1].Kill()
	waitDown(mcs[1].Addr)
	for _, tt := range []struct {
		name   string
		method string
		path   string
		body   []byte
		hdr    []string
		items  string // item statuses, "" for a text answer
	}{
		{"multi-get", "GET", multiGet, nil, nil, "[503 503]"},
		{"gat multi-get", "GET", multiGet + "&touch=60", nil, nil, "[503 503]"},
		{"batch", "POST", "/", batch, nil, "[503 503]"},
		{"async PUT", "PUT", "/" + a, []byte("v"), []string{"Prefer", "respond-async"}, ""},
		{"async DELETE", "DELETE", "/" + b, nil, []string{"Prefer", "respond-async"}, ""},
		{"async batch", "POST", "/", asyncBatch, []string{"Prefer", "respond-async"}, ""},
	} {
		r := g.do(tt.method, tt.path, tt.body, tt.hdr...)
		if r.status != 503 || r.header.Get("Retry-After") == "" {
			t.Errorf("%s with every node down = %d (Retry-After %q) %q, want 503 with Retry-After", tt.name, r.status, r.header.Get("Retry-After"), r.body)
			continue
		}
		if tt.items != "" && fmt.Sprint(statuses(r)) != tt.items {
			t.Errorf("%s with every node down: items %v, want %s", tt.name, statuses(r), tt.items)
		}
	}
	if code := readyz(); code != 503 {
		t.Errorf("/readyz with every node down = %d, want 503", code)
	}
	// The 503s are counted where the 5xx alert looks.
	text, err := g.Metrics(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`memcgate_http_requests_total{code="503",method="GET"}`, `memcgate_http_requests_total{code="503",method="POST"}`,
		`memcgate_async_writes_rejected_total{reason="node_down"}`} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}
