package e2e

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/memcgate/memcgate/test/memcachedtest"
)

// TestIncrPartlyApplied: under REPLICAS=2 and WRITE_POLICY=all, an incr
// that one replica applied and the other, stopped, never answered fails,
// on /memc and on the REST API, with an answer that says the write may be
// partly applied (docs/pools.md "What an error means"): "memcached did
// not answer in time", or "no memcached node could be reached" once the
// node is down, read as if nothing was written.
func TestIncrPartlyApplied(t *testing.T) {
	a, b := memcachedtest.Start(t), memcachedtest.Start(t)
	g := startGateway(t, map[string]string{"MEMCGATE_SERVERS": a.Addr + "," + b.Addr, "MEMCGATE_REPLICAS": "2", "MEMCGATE_TIMEOUT": "300ms"})
	for _, mc := range []*memcachedtest.Server{a, b} {
		if err := memcache.New(mc.Addr).Set(&memcache.Item{Key: "n", Value: []byte("5")}); err != nil {
			t.Fatal(err)
		}
	}
	b.Pause()
	defer b.Resume()
	for _, u := range []string{"/memc?cmd=incr&key=n&val=1", "/n?op=incr"} {
		method := http.MethodGet
		if u[1] == 'n' {
			method = http.MethodPost
		}
		req, _ := http.NewRequest(method, g.URL+u, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode < 500 || !strings.Contains(string(body), "partly") {
			t.Errorf("%s: %d %q, want a failure that says the write may be partly applied", u, resp.StatusCode, body)
		}
	}
	if it, err := memcache.New(a.Addr).Get("n"); err != nil || string(it.Value) != "7" {
		t.Errorf("the first replica: %v, want both incrs applied (7)", err)
	}
}
