package e2e

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"io"
	"math/rand/v2"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/gatewaytest"
	"github.com/memcgate/memcgate/test/memcachedtest"
)

// TestBigValue: a 20 MB value through the binary, with memcached's and
// memcgate's default item sizes: written in chunks and read back byte for
// byte, a Range of its middle fetching only the chunks it covers; and
// every reader that cannot stream it says so instead of serving the
// index: php-memcached and pecl/memcache reading memcached directly get
// false, the HttpMemc endpoint 409, a multi-get 507.
func TestBigValue(t *testing.T) {
	mc := memcachedtest.Start(t, "-m", "256")
	g := startGateway(t, map[string]string{"MEMCGATE_SERVERS": mc.Addr, "MEMCGATE_BIG_VALUE_MAX_BYTES": strconv.Itoa(32 << 20)})
	const size = 20 << 20
	v := make([]byte, size)
	rnd := rand.NewChaCha8([32]byte{19})
	rnd.Read(v)

	start := time.Now()
	if r := g.do("PUT", "/big?exptime=600", v); r.status != 201 {
		t.Fatalf("PUT 20 MB = %d %q", r.status, r.body)
	}
	put := time.Since(start)
	start = time.Now()
	r := g.do("GET", "/big", nil)
	get := time.Since(start)
	if r.status != 200 || sha256.Sum256([]byte(r.body)) != sha256.Sum256(v) || r.header.Get("Content-Length") != strconv.Itoa(size) {
		t.Fatalf("GET = %d, %d bytes, Content-Length %q: not the 20 MB written", r.status, len(r.body), r.header.Get("Content-Length"))
	}
	written, read := metricValue(t, g, `memcgate_chunks_total{event="written"}`), metricValue(t, g, `memcgate_chunks_total{event="read"}`)
	t.Logf("20 MiB in %v chunks: PUT %v, GET %v", written, put.Round(time.Millisecond), get.Round(time.Millisecond))
	if written != 21 || read != 21 {
		t.Errorf("chunks written %v, read %v; want 21 (20 MiB in chunks of 1048000 bytes)", written, read)
	}

	// The middle megabyte: chunks 9 and 10 only.
	const from, to = 10_000_000, 10_999_999
	r = g.do("GET", "/big", nil, "Range", "bytes="+strconv.Itoa(from)+"-"+strconv.Itoa(to))
	fetched := metricValue(t, g, `memcgate_chunks_total{event="read"}`) - read
	t.Logf("Range bytes=%d-%d: %d, %d bytes, %v chunks fetched", from, to, r.status, len(r.body), fetched)
	if r.status != 206 || r.body != string(v[from:to+1]) || r.header.Get("Content-Range") != "bytes 10000000-10999999/20971520" {
		t.Errorf("Range of the middle = %d, %d bytes, Content-Range %q", r.status, len(r.body), r.header.Get("Content-Range"))
	}
	if fetched != 2 {
		t.Errorf("%v chunks fetched for the middle megabyte, want 2", fetched)
	}
	if r := g.do("HEAD", "/big", nil); r.status != 200 || r.header.Get("Content-Length") != strconv.Itoa(size) {
		t.Errorf("HEAD = %d, Content-Length %q", r.status, r.header.Get("Content-Length"))
	}

	// Readers that cannot stream it.
	if r := g.do("GET", "/memc?key=big", nil); r.status != 409 || !strings.Contains(r.body, "stored in chunks") {
		t.Errorf("HttpMemc get = %d %q, want 409", r.status, r.body)
	}
	var mg struct{ Results []struct{ Status int } }
	if r := g.do("GET", "/?key=big", nil); json.Unmarshal([]byte(r.body), &mg) != nil || len(mg.Results) != 1 || mg.Results[0].Status != 507 {
		t.Errorf("multi-get = %d %q, want the key's result 507", r.status, r.body)
	}
	if php := phpFor(t, "memcached"); php != "" {
		out := runPHPCode(t, php, `$m = new Memcached(); $m->addServer($argv[1], (int)$argv[2]);
$v = $m->get('big'); echo json_encode(['value' => $v === false ? false : strlen($v), 'code' => $m->getResultCode()]);`, mc)
		t.Logf("php-memcached get: %s", out)
		if !strings.HasPrefix(out, `{"value":false,`) {
			t.Errorf("php-memcached get of the index = %s, want false", out)
		}
	}
	if php := phpFor(t, "memcache"); php != "" {
		out := runPHPCode(t, php, `error_reporting(E_ALL & ~E_DEPRECATED & ~E_WARNING & ~E_NOTICE); $m = new Memcache(); $m->addServer($argv[1], (int)$argv[2]);
$v = $m->get('big'); echo json_encode(['value' => $v === false ? false : strlen($v)]);`, mc)
		t.Logf("pecl/memcache get: %s", out)
		if out != `{"value":false}` {
			t.Errorf("pecl/memcache get of the index = %s, want false", out)
		}
	}

	// DELETE hides it at once; the chunks expire after the grace period.
	if r := g.do("DELETE", "/big", nil); r.status != 204 {
		t.Errorf("DELETE = %d %q", r.status, r.body)
	}
	if r := g.do("GET", "/big", nil); r.status != 404 {
		t.Errorf("GET after DELETE = %d", r.status)
	}
	if got := metricValue(t, g, `memcgate_chunks_total{event="retired"}`); got != 21 {
		t.Errorf("chunks retired by DELETE: %v, want 21", got)
	}
}

// phpFor is php with ext, or "" (the test skips that part) where make
// test has not installed it.
func phpFor(t *testing.T, ext string) string {
	t.Helper()
	var php string
	t.Run("php-"+ext, func(t *testing.T) { php = gatewaytest.PHP(t, ext) })
	return php
}

// runPHPCode runs code with memcached's host and port as its arguments
// and returns what it printed.
func runPHPCode(t *testing.T, php, code string, mc *memcachedtest.Server) string {
	t.Helper()
	cmd := exec.Command(php, "-r", code, "--", "127.0.0.1", strconv.Itoa(mc.Port))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("php: %v\n%s", err, stderr.String())
	}
	return string(out)
}

// metricValue is the value of one sample of the gateway's metrics, named
// as the exposition writes it (name{labels}).
func metricValue(t *testing.T, g *gateway, sample string) float64 {
	t.Helper()
	resp, err := http.Get(g.Admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), sample+" "); ok {
			v, err := strconv.ParseFloat(rest, 64)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
	}
	io.Copy(io.Discard, resp.Body)
	t.Fatalf("no sample %s in /metrics", sample)
	return 0
}
