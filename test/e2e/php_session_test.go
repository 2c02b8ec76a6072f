package e2e

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/memcgate/memcgate/test/gatewaytest"
	"github.com/memcgate/memcgate/test/memcachedtest"
)

// sessionEncode is PHP's session_encode() (session.serialize_handler=php)
// of string and int variables, in order.
func sessionEncode(vars [][2]any) string {
	var b strings.Builder
	for _, v := range vars {
		switch x := v[1].(type) {
		case string:
			fmt.Fprintf(&b, "%s|s:%d:\"%s\";", v[0], len(x), x)
		case int:
			fmt.Fprintf(&b, "%s|i:%d;", v[0], x)
		}
	}
	return b.String()
}

// sessionData returns n sessions keyed by id: a user name, a counter and,
// in one of them, 30 KB of text (over pecl/memcache's 20000-byte
// compression threshold).
func sessionData(r *rand.Rand, n int, tag string) map[string][][2]any {
	out := map[string][][2]any{}
	for i := range n {
		id := fmt.Sprintf("%s%d-%x", tag, i, r.Uint64())
		vars := [][2]any{{"user", "user-" + strconv.Itoa(i)}, {"n", r.IntN(1000)}}
		if i == n/2 {
			vars = append(vars, [2]any{"page", strings.Repeat("cached page text ", 1800)})
		}
		out[id] = vars
	}
	return out
}

// TestPHPSessions: a session written by each PHP session handler
// (php-memcached's "memcached" and pecl/memcache's "memcache") is served
// raw by the gateway configured like the handler, and a session the
// gateway writes is what session_start() reads.
func TestPHPSessions(t *testing.T) {
	t.Parallel() // its own gateway and memcached
	php := gatewaytest.PHP(t, "memcached", "memcache", "session")
	mcs := memcachedtest.StartN(t, 3)
	weights := []int{1, 2, 1}
	var servers, memcachedPath, memcachePath []string
	for i, m := range mcs {
		servers = append(servers, m.Addr+":"+strconv.Itoa(weights[i]))
		memcachedPath = append(memcachedPath, fmt.Sprintf("127.0.0.1:%d:%d", m.Port, weights[i]))
		// A timeout of 10 s, not 1: pecl/memcache's handler writes a
		// session that times out on a loaded machine to the next server.
		memcachePath = append(memcachePath, fmt.Sprintf("tcp://127.0.0.1:%d?weight=%d&timeout=10", m.Port, weights[i]))
	}
	cases := []struct {
		name    string
		env     map[string]string // the gateway's, beside MEMCGATE_SERVERS
		phpOpts []string
	}{
		{"memcached handler", map[string]string{
			"MEMCGATE_DISTRIBUTION": "consistent", "MEMCGATE_KEY_PREFIX": "memc.sess.key.", "MEMCGATE_VALUE_CODEC": "raw",
		}, []string{"-d", "session.save_handler=memcached", "-d", "session.save_path=" + strings.Join(memcachedPath, ",")}},
		{"memcache handler", map[string]string{
			"MEMCGATE_DISTRIBUTION": "pecl-session-consistent-crc32", "MEMCGATE_VALUE_CODEC": "pecl-memcache",
		}, []string{"-d", "session.save_handler=memcache", "-d", `session.save_path="` + strings.Join(memcachePath, ", ") + `"`}},
		{"memcache handler standard fnv", map[string]string{
			"MEMCGATE_DISTRIBUTION": "pecl-session-standard-fnv", "MEMCGATE_VALUE_CODEC": "pecl-memcache",
		}, []string{"-d", "session.save_handler=memcache", "-d", `session.save_path="` + strings.Join(memcachePath, ", ") + `"`,
			"-d", "memcache.hash_strategy=standard", "-d", "memcache.hash_function=fnv"}},
	}
	for ci, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			env := map[string]string{"MEMCGATE_SERVERS": strings.Join(servers, ","), "MEMCGATE_ACCESS_LOG": "false"}
			for k, v := range c.env {
				env[k] = v
			}
			g := startGateway(t, env)
			r := rand.New(rand.NewPCG(uint64(ci), 44))

			// PHP's handler writes; the gateway serves each session raw.
			phpSessions := sessionData(r, 100, "php")
			in := map[string]map[string]any{}
			for id, vars := range phpSessions {
				m := map[string]any{}
				for _, v := range vars {
					m[v[0].(string)] = v[1]
				}
				in[id] = m
			}
			stored := map[string]string{}
			phpWrites := func(ids []string) {
				sessions := map[string]map[string]any{}
				for _, id := range ids {
					sessions[id] = in[id]
				}
				var got map[string]string
				out := runPHPScript(t, php, "session.php", map[string]any{"op": "write", "sessions": sessions}, c.phpOpts...)
				if err := json.Unmarshal(out, &got); err != nil || len(got) != len(sessions) {
					t.Fatalf("session.php write: %v, %d sessions: %.200s", err, len(got), out)
				}
				for id, v := range got {
					stored[id] = v
				}
			}
			compressed := map[string]bool{}
			gatewayServes := func(ids []string) (missed []string) {
				for _, id := range ids {
					want := stored[id]
					resp := g.do("GET", "/"+id, nil)
					// pecl/memcache's zlib, inflated by the codec
					compressed[id] = resp.header.Get("X-Memcached-Flags") == "2"
					if resp.status != 200 || resp.body != want {
						if len(missed) < 3 {
							t.Logf("GET /%s = %d %.60q, want 200 %.60q", id, resp.status, resp.body, want)
						}
						missed = append(missed, id)
					}
				}
				return missed
			}
			var phpIDs []string
			for id := range in {
				phpIDs = append(phpIDs, id)
			}
			phpWrites(phpIDs)
			missed := gatewayServes(phpIDs)
			nCompressed := 0
			for _, z := range compressed {
				if z {
					nCompressed++
				}
			}
			t.Logf("%s: PHP wrote %d sessions with session_start() (%d compressed); the gateway served %d of them identical", c.name, len(stored), nCompressed, len(phpIDs)-len(missed))
			if still := retryPHPMisses(t, "PHP-written sessions the gateway served", len(phpIDs), missed, func(ids []string) []string {
				phpWrites(ids)
				return gatewayServes(ids)
			}); len(still) > 0 {
				t.Errorf("the gateway served %d of %d PHP sessions; %d missed in every try, %q first", len(phpIDs)-len(still), len(phpIDs), len(still), still[0])
			}
			if wantCompressed := c.env["MEMCGATE_VALUE_CODEC"] == "pecl-memcache"; (nCompressed > 0) != wantCompressed {
				t.Errorf("%d sessions were stored compressed; want some only with pecl/memcache's handler", nCompressed)
			}

			// The gateway writes sessions; session_start() reads them.
			gwSessions := sessionData(r, 100, "gw")
			var ids []string
			for id, vars := range gwSessions {
				if resp := g.do("PUT", "/"+id+"?exptime=1440", []byte(sessionEncode(vars))); resp.status != 201 {
					t.Fatalf("PUT /%s = %d %q", id, resp.status, resp.body)
				}
				ids = append(ids, id)
			}
			sessionStarts := func(ids []string) (missed []string) {
				var read map[string]map[string]any
				out := runPHPScript(t, php, "session.php", map[string]any{"op": "read", "ids": ids}, c.phpOpts...)
				if err := json.Unmarshal(out, &read); err != nil {
					t.Fatalf("session.php read: %v: %.200s", err, out)
				}
				for _, id := range ids {
					want := map[string]any{}
					for _, v := range gwSessions[id] {
						if n, ok := v[1].(int); ok {
							want[v[0].(string)] = float64(n) // as JSON numbers decode
						} else {
							want[v[0].(string)] = v[1]
						}
					}
					if !reflect.DeepEqual(read[id], want) {
						if len(missed) < 3 {
							t.Logf("session_start() of %s read %.100v, want %.100v", id, read[id], want)
						}
						missed = append(missed, id)
					}
				}
				return missed
			}
			missed = sessionStarts(ids)
			t.Logf("%s: the gateway wrote %d sessions; session_start() read %d of them with every variable", c.name, len(gwSessions), len(ids)-len(missed))
			if still := retryPHPMisses(t, "gateway-written sessions PHP read", len(ids), missed, sessionStarts); len(still) > 0 {
				t.Errorf("PHP read %d of %d gateway-written sessions; %d missed in every try, %q first", len(ids)-len(still), len(ids), len(still), still[0])
			}
		})
	}
}
