package e2e

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/memcachedtest"
)

// TestOneHugeValueLeavesNothing: buffers the gateway keeps for the next
// request (bodies, response buffers, memcached write buffers, answer
// scratch) are kept only up to a size, and large ones for a second at
// most, so that one value of 24 MiB, written and read every way (GET,
// multi-get, batch, HttpMemc), leaves nothing of its size behind: a
// second after, the live heap is within a few MiB of what it was before.
func TestOneHugeValueLeavesNothing(t *testing.T) {
	const size = 24 << 20
	mc := memcachedtest.Start(t, "-I", "32m", "-m", "256")
	g := startGateway(t, map[string]string{
		"MEMCGATE_SERVERS":                  mc.Addr,
		"MEMCGATE_MAX_VALUE_BYTES":          strconv.Itoa(size),
		"MEMCGATE_MAX_BUFFERED_BYTES":       strconv.Itoa(256 << 20),
		"MEMCGATE_BATCH_MAX_RESPONSE_BYTES": strconv.Itoa(64 << 20),
	})
	client := &http.Client{Timeout: 30 * time.Second}
	before := liveHeap(t, client, g)

	value := bytes.Repeat([]byte("0123456789abcdef"), size/16)
	do := func(method, path, body string) int {
		t.Helper()
		var r io.Reader
		if body != "" {
			r = strings.NewReader(body)
		}
		if method == "PUT" {
			r = bytes.NewReader(value)
		}
		req, err := http.NewRequest(method, g.URL+path, r)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		n, _ := io.Copy(io.Discard, resp.Body)
		if resp.StatusCode >= 300 {
			t.Fatalf("%s %s = %d (%d bytes)", method, path, resp.StatusCode, n)
		}
		return int(n)
	}
	do("PUT", "/huge", "")
	for range 3 {
		if n := do("GET", "/huge", ""); n != size {
			t.Fatalf("GET /huge gave %d bytes, want %d", n, size)
		}
	}
	do("GET", "/?key=huge&key=other", "")
	do("POST", "/", `[{"op":"get","key":"huge"}]`)
	do("GET", "/memc?cmd=get&key=huge", "")

	// Large buffers are kept for a second at most unused.
	time.Sleep(2 * time.Second)
	after := liveHeap(t, client, g)
	t.Logf("live heap %.1f MiB before, %.1f MiB after a %d MiB value written and read 6 times", float64(before)/(1<<20), float64(after)/(1<<20), size>>20)
	if after-before > 8<<20 {
		t.Errorf("live heap grew by %.1f MiB after one %d MiB value, want at most 8 MiB: a buffer of its size was kept", float64(after-before)/(1<<20), size>>20)
	}
}

// liveHeap forces a garbage collection in the gateway (the admin
// listener's /debug/pprof/heap?gc=1) and returns its heap of live
// objects then (go_memstats_heap_alloc_bytes).
func liveHeap(t *testing.T, client *http.Client, g *gateway) int64 {
	t.Helper()
	resp, err := client.Get(g.Admin + "/debug/pprof/heap?gc=1")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := g.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(strings.NewReader(m))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "go_memstats_heap_alloc_bytes "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return int64(f)
		}
	}
	t.Fatal("no go_memstats_heap_alloc_bytes in the metrics")
	return 0
}
