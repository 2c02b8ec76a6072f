package e2e

import (
	"io"
	"net/http"
	"testing"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/memcgate/memcgate/test/memcachedtest"
)

// TestMemcDeleteOfAWarmOnlyKey: a delete of a key that only the warm-up
// pool holds answers as the cold pool answers it (docs/routes.md), on
// /memc as on DELETE /{key}: not found, and the warm copy is gone.
func TestMemcDeleteOfAWarmOnlyKey(t *testing.T) {
	for _, chunks := range []string{"0", "4000000"} {
		t.Run("BIG_VALUE_MAX_BYTES="+chunks, func(t *testing.T) {
			cold, warm := memcachedtest.Start(t), memcachedtest.Start(t)
			g := startGateway(t, map[string]string{"MEMCGATE_SERVERS": cold.Addr, "MEMCGATE_POOLS": "old servers=" + warm.Addr, "MEMCGATE_WARM_POOL": "old",
				"MEMCGATE_MEMC_KEY_PATH": "/key/", "MEMCGATE_BIG_VALUE_MAX_BYTES": chunks})
			wc := memcache.New(warm.Addr)
			for _, tc := range []struct{ name, method, url, key string }{
				{"DELETE /{key}", http.MethodDelete, "/wk1", "wk1"},
				{"/memc?cmd=delete", http.MethodGet, "/memc?cmd=delete&key=wk2", "wk2"},
				{"DELETE /key/", http.MethodDelete, "/key/wk3", "wk3"},
			} {
				if err := wc.Set(&memcache.Item{Key: tc.key, Value: []byte("warm")}); err != nil {
					t.Fatal(err)
				}
				req, _ := http.NewRequest(tc.method, g.URL+tc.url, nil)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusNotFound {
					t.Errorf("%s of a key only the warm pool holds: %d %q, want 404 as the cold pool answers", tc.name, resp.StatusCode, body)
				}
				if _, err := wc.Get(tc.key); err != memcache.ErrCacheMiss {
					t.Errorf("%s: the warm pool's copy: %v, want it deleted", tc.name, err)
				}
			}
		})
	}
}
