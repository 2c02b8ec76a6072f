package e2e

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/memcgate/memcgate/test/gatewaytest"
	"github.com/memcgate/memcgate/test/memcachedtest"
)

// curlRequest is what the relay in front of the gateway saw of one request.
type curlRequest struct {
	method, path, prefer string
	body                 string
}

// TestPHPCurlFunctions runs docs/php.md's mc_get and mc_set
// (test/php/mc_curl.php) with php-curl against a real gateway, through a
// relay that records each request, on one handle as the page uses it:
// between them the fire-and-forget PUT the same section shows. Each call
// must set what the handle's last request left: a GET after mc_set would
// carry the value just written (the whole value uploaded again with
// every read), and one after the asynchronous PUT would say
// "Prefer: respond-async".
func TestPHPCurlFunctions(t *testing.T) {
	php := gatewaytest.PHP(t, "curl")
	mcs := memcachedtest.StartN(t, 1)
	g := startGateway(t, map[string]string{"MEMCGATE_SERVERS": memcachedtest.Addrs(mcs)})
	target, err := url.Parse(g.URL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	var mu sync.Mutex
	var seen []curlRequest
	relay := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		seen = append(seen, curlRequest{r.Method, r.URL.RequestURI(), r.Header.Get("Prefer"), string(body)})
		mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(body))
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(relay.Close)

	src, err := os.ReadFile("../php/mc_curl.php")
	if err != nil {
		t.Fatal(err)
	}
	const docAddr = "http://127.0.0.1:8080"
	if !bytes.Contains(src, []byte(docAddr)) {
		t.Fatalf("mc_curl.php does not name %s, the address this test replaces", docAddr)
	}
	dir := t.TempDir()
	lib := filepath.Join(dir, "mc_curl.php")
	if err := os.WriteFile(lib, bytes.ReplaceAll(src, []byte(docAddr), []byte(relay.URL)), 0o644); err != nil {
		t.Fatal(err)
	}
	page := filepath.Join(dir, "page.php")
	if err := os.WriteFile(page, []byte(`<?php
require getenv('MC_LIB');
$out = [];
$out[] = var_export(mc_set('k', 'the first value, long enough to see'), true);
$out[] = mc_get('k');
// docs/php.md's fire-and-forget write, on the same handle
curl_setopt_array($ch, [CURLOPT_URL => getenv('MC_BASE') . '/other', CURLOPT_CUSTOMREQUEST => 'PUT',
    CURLOPT_POSTFIELDS => 'later', CURLOPT_HTTPHEADER => ['Prefer: respond-async', 'Expect:']]);
curl_exec($ch);
$out[] = mc_get('k');
$out[] = var_export(mc_get('missing'), true);
$out[] = var_export(mc_set('k', 'second'), true);
$out[] = mc_get('k');
echo implode("\n", $out), "\n";
`), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(php, page)
	cmd.Env = append(os.Environ(), "MC_LIB="+lib, "MC_BASE="+relay.URL)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("php: %v\n%s", err, out)
	}
	if got, want := string(out), "true\nthe first value, long enough to see\nthe first value, long enough to see\nNULL\ntrue\nsecond\n"; got != want {
		t.Errorf("the page printed\n%s\nwant\n%s", got, want)
	}

	mu.Lock()
	defer mu.Unlock()
	want := []curlRequest{
		{method: "PUT", path: "/k?exptime=0", body: "the first value, long enough to see"},
		{method: "GET", path: "/k"},
		{method: "PUT", path: "/other", prefer: "respond-async", body: "later"},
		{method: "GET", path: "/k"},
		{method: "GET", path: "/missing"},
		{method: "PUT", path: "/k?exptime=0", body: "second"},
		{method: "GET", path: "/k"},
	}
	if len(seen) != len(want) {
		t.Fatalf("the relay saw %d requests %+v, want %d", len(seen), seen, len(want))
	}
	for i := range want {
		if seen[i] != want[i] {
			t.Errorf("request %d = %+v, want %+v", i+1, seen[i], want[i])
		}
	}
}

// TestPHPCurlFunctionsDocumented: docs/php.md prints mc_get and mc_set for
// users to copy; they must be the ones TestPHPCurlFunctions runs.
func TestPHPCurlFunctionsDocumented(t *testing.T) {
	src, err := os.ReadFile("../php/mc_curl.php")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("../../docs/php.md")
	if err != nil {
		t.Fatal(err)
	}
	_, fns, ok := strings.Cut(string(src), "\n$ch = curl_init();")
	if !ok {
		t.Fatal(`mc_curl.php has no line "$ch = curl_init();"`)
	}
	block := "```php\n$ch = curl_init();" + strings.TrimRight(fns, "\n") + "\n```\n"
	if !strings.Contains(string(doc), block) {
		t.Error("docs/php.md does not print test/php/mc_curl.php (from \"$ch = curl_init();\" to the end) as a php code block, unchanged")
	}
}
