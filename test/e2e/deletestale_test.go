package e2e

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/memcgate/memcgate/test/memcachedtest"
)

// TestDeleteDuringOutageStaysDeleted: a key deleted (or touched to a past
// expiration) while its node is away must not come back with the node.
// The delete fails over to the key's successor, which has no copy and
// answers 404; the owner, paused, still holds the value. The key must be
// recorded as written elsewhere and deleted on the owner before its
// re-admission (docs/operations.md, "No stale keys after a return"),
// also when values in chunks are on, where a delete first reads the item
// to find an index: that read's miss is the successor's, not the owner's.
// Found by the soak that checks every answer against its request
// (docs/benchmarks.md, "Answers checked against their requests").
func TestDeleteDuringOutageStaysDeleted(t *testing.T) {
	cases := []struct {
		name  string
		env   map[string]string
		write func(g *gateway, k string) response
	}{
		{name: "delete", write: func(g *gateway, k string) response { return g.do("DELETE", "/"+k, nil) }},
		{name: "delete, values in chunks on", env: map[string]string{"MEMCGATE_BIG_VALUE_MAX_BYTES": "4194304"},
			write: func(g *gateway, k string) response { return g.do("DELETE", "/"+k, nil) }},
		{name: "touch to the past, values in chunks on", env: map[string]string{"MEMCGATE_BIG_VALUE_MAX_BYTES": "4194304"},
			write: func(g *gateway, k string) response { return g.do("POST", "/"+k+"?op=touch&exptime=-1", nil) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel() // its own gateway and memcached; it mostly waits for the node's ejection and return
			mcs := memcachedtest.StartN(t, 3)
			x := mcs[0]
			env := map[string]string{"MEMCGATE_SERVERS": memcachedtest.Addrs(mcs)}
			for k, v := range tc.env {
				env[k] = v
			}
			g := startGateway(t, env)
			var keys []string
			for i := 0; len(keys) < 10 && i < 2000; i++ {
				if k := fmt.Sprint("ds-", i); g.owner(k) == x.Addr {
					keys = append(keys, k)
				}
			}
			if len(keys) < 10 {
				t.Fatalf("only %d keys owned by %s", len(keys), x.Addr)
			}
			for _, k := range keys {
				if r := g.do("PUT", "/"+k, []byte("v1")); r.status != http.StatusCreated {
					t.Fatalf("PUT %s = %d %s", k, r.status, r.body)
				}
			}
			x.Pause()
			t.Cleanup(x.Resume)
			waitNode(t, g, x.Addr, func(st nodeStatus) bool { return !st.Up })
			for _, k := range keys {
				if r := tc.write(g, k); r.status != http.StatusNoContent && r.status != http.StatusNotFound {
					t.Fatalf("%s %s during the outage = %d %s", tc.name, k, r.status, r.body)
				}
			}
			x.Resume()
			waitNode(t, g, x.Addr, func(st nodeStatus) bool { return st.Up })
			back := 0
			for _, k := range keys {
				switch r := g.do("GET", "/"+k, nil); {
				case r.status == http.StatusOK && r.body == "v1":
					back++
				case r.status == http.StatusNotFound:
				default:
					t.Errorf("GET %s after the return = %d %q", k, r.status, r.body)
				}
			}
			if back > 0 {
				t.Errorf("%d of %d keys removed during the outage read their value from before it after the node's return", back, len(keys))
			}
		})
	}
}
