package memc_test

import (
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/memcgate/memcgate/test/memcachedtest"
)

// placementSpecials end some keys: what the module escapes (space, %,
// control bytes), UTF-8 escaped and raw, and + (re-escaped on the path
// style).
var placementSpecials = []string{"%20x", "%25", "%01", "%C3%A4", "\xc3\xb6", "+y", ""}

// placementKeys returns n keys as a client writes them in the query or
// the path, deterministic per seed.
func placementKeys(n int, seed uint64) []string {
	rng := rand.New(rand.NewPCG(seed, 1))
	const alpha = "abcdefghijklmnopqrstuvwxyz0123456789:_-"
	keys := make([]string, n)
	for i := range keys {
		var b strings.Builder
		for range 1 + rng.IntN(40) {
			b.WriteByte(alpha[rng.IntN(len(alpha))])
		}
		b.WriteString(placementSpecials[i%len(placementSpecials)])
		keys[i] = b.String()
	}
	return keys
}

// TestPlacement holds the placement docs/migrating-from-nginx-memc.md
// tells a migrating team to pick: keys written through nginx + the memc
// module over three memcached (one of weight 2) read back through
// memcgate over the same memcached, and the other way round, so each key
// is on the node nginx put it on. `hash $memc_key consistent` against
// MEMCGATE_DISTRIBUTION=nginx, on the query and the path style (where
// nginx hashes the key before the module escapes it); `hash $memc_key`
// against pecl-standard-crc32, whose one exception, a key whose
// (crc32 >> 16) & 0x7fff is 0, must read as a miss.
func TestPlacement(t *testing.T) {
	bin := needNginx(t)
	if testing.Short() {
		t.Skip("starts nginx, two gateways and three memcached")
	}
	mcs := memcachedtest.StartN(t, 3)
	servers := mcs[0].Addr + "," + mcs[1].Addr + "," + mcs[2].Addr + ":2"
	nginx := runNginx(t, bin, "testdata/placement-nginx.conf", "@MC1@", mcs[0].Addr, "@MC2@", mcs[1].Addr, "@MC3@", mcs[2].Addr)
	ring := startGate(t, map[string]string{
		"MEMCGATE_SERVERS":       servers,
		"MEMCGATE_DISTRIBUTION":  "nginx",
		"MEMCGATE_MEMC_KEY_PATH": "/key/",
	}, true)
	modulo := startGate(t, map[string]string{
		"MEMCGATE_SERVERS":      servers,
		"MEMCGATE_DISTRIBUTION": "pecl-standard-crc32",
		"MEMCGATE_MEMC_PATH":    "/plain",
	}, true)

	keys := placementKeys(300, 20261207)
	zero := func(k string) bool { return (crc32.ChecksumIEEE([]byte(k))>>16)&0x7fff == 0 }
	styles := []struct {
		name, gate string
		set        func(key, val string) request
		get        func(key string) request
		keys       []string
	}{
		{"hash consistent, query", ring,
			func(k, v string) request { return get("/memc?cmd=set&key=" + k + "&val=" + v) },
			func(k string) request { return get("/memc?cmd=get&key=" + k) }, keys},
		{"hash consistent, path", ring,
			func(k, v string) request { return put("/key/"+k, v) },
			func(k string) request { return get("/key/" + k) }, keys},
		{"hash without consistent", modulo,
			func(k, v string) request { return get("/plain?cmd=set&key=" + k + "&val=" + v) },
			func(k string) request { return get("/plain?cmd=get&key=" + k) }, append(keys, "k25")},
	}
	for _, s := range styles {
		t.Run(s.name, func(t *testing.T) {
			do := func(addr string, rq request) response {
				t.Helper()
				r, err := send(addr, rq)
				if err != nil {
					t.Fatalf("%s %s: %v", rq.method, rq.target, err)
				}
				return r
			}
			zeroes, moved := 0, 0
			for i, k := range s.keys {
				if s.gate == modulo && zero(k) {
					zeroes++
					if r := do(nginx, s.set(k, "z")); r.status != 201 {
						t.Fatalf("nginx: set %q = %v", k, r)
					}
					if r := do(s.gate, s.get(k)); r.status == 404 {
						moved++
					}
					continue
				}
				for _, w := range []struct{ from, to, val string }{
					{nginx, s.gate, fmt.Sprintf("n%d", i)},
					{s.gate, nginx, fmt.Sprintf("g%d", i)},
				} {
					if r := do(w.from, s.set(k, w.val)); r.status != 201 {
						t.Fatalf("set %q through %s = %v", k, w.from, r)
					}
					if r := do(w.to, s.get(k)); r.status != 200 || string(r.body) != w.val {
						t.Errorf("key %q written through %s, read through %s = %v; want 200 %s", k, w.from, w.to, r, w.val)
					}
				}
			}
			if s.gate == modulo && (zeroes == 0 || moved != zeroes) {
				t.Errorf("%d keys with a zero hash, %d of them missed through the gateway; want some, all missed", zeroes, moved)
			}
		})
	}
	for _, mc := range mcs {
		if keys, err := memcachedKeys(mc.Addr); err != nil || len(keys) == 0 {
			t.Errorf("memcached %s holds %d keys (%v); want a share", mc.Addr, len(keys), err)
		}
	}
}
