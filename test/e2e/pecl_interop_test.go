package e2e

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/memcgate/memcgate/test/gatewaytest"
	"github.com/memcgate/memcgate/test/memcachedtest"
)

// runPHPScript runs a script of test/php with in as its JSON input and php
// options (-d …) before it, and returns its output; anything on standard
// error fails t.
func runPHPScript(t *testing.T, php, script string, in any, opts ...string) []byte {
	t.Helper()
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), php, append(opts, "../php/"+script)...)
	cmd.Stdin = bytes.NewReader(b)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil || stderr.Len() > 0 {
		t.Fatalf("php %s %v: %v\n%s", script, opts, err, stderr.String())
	}
	return out
}

// phpRetries is how many more tries retryPHPMisses gives a miss.
const phpRetries = 3

// retryPHPMisses gives the keys (or session ids) of n that missed between
// a PHP client talking to memcached directly and the gateway up to
// phpRetries more tries, each redone by redo (a fresh PHP process) after
// a growing pause, and returns those that missed in every try. Placement
// and values are pure functions of the key, so an interop bug misses
// every time; but pecl/memcache, finding a server slow on a loaded
// machine, fails over to the next one for the rest of its process (CI
// saw it once in upstream/hashring's TestPeclSessionInterop), and that
// is no interop bug. More than 1 % misses are not retried: they are
// returned as they are. What was retried is logged.
func retryPHPMisses(t *testing.T, what string, n int, missed []string, redo func(keys []string) []string) []string {
	t.Helper()
	if len(missed) == 0 || len(missed) > max(n/100, 1) {
		return missed
	}
	still := missed
	for round := range phpRetries {
		time.Sleep(time.Duration(round+1) * 500 * time.Millisecond)
		if still = redo(still); len(still) == 0 {
			break
		}
	}
	t.Logf("%s: %d of %d missed at first; %d only transiently (a client failover), %d in every one of %d more tries",
		what, len(missed), n, len(missed)-len(still), len(still), phpRetries)
	return still
}

// TestPeclMemcacheInterop: PHP code writing to memcached directly with the
// older Memcache extension (pecl/memcache) and the gateway must find each
// other's keys and read each other's values, in its default placement, in
// the standard strategy with fnv, and with memcache.prefix_static_key. Every
// 100th value is 30 KB of text, which both sides compress (pecl/memcache's
// compress_threshold is 20000 bytes).
func TestPeclMemcacheInterop(t *testing.T) {
	t.Parallel() // its own gateway and memcached
	php := gatewaytest.PHP(t, "memcache")
	mcs := memcachedtest.StartN(t, 3)
	weights := []int{1, 2, 1}
	var phpServers [][]any
	var env []string
	for i, m := range mcs {
		phpServers = append(phpServers, []any{"127.0.0.1", m.Port, weights[i]})
		env = append(env, m.Addr+":"+strconv.Itoa(weights[i]))
	}
	cases := []struct{ strategy, hash, prefix string }{
		{"consistent", "crc32", ""},
		{"standard", "fnv", ""},
		{"consistent", "crc32", "app"},
	}
	for ci, c := range cases {
		dist := "pecl-" + c.strategy + "-" + c.hash
		t.Run(dist+"/"+c.prefix, func(t *testing.T) {
			g := startGateway(t, map[string]string{
				"MEMCGATE_SERVERS":      strings.Join(env, ","),
				"MEMCGATE_DISTRIBUTION": dist,
				"MEMCGATE_VALUE_CODEC":  "pecl-memcache",
				// pecl/memcache places the prefixed key.
				"MEMCGATE_KEY_PREFIX":       c.prefix,
				"MEMCGATE_HASH_WITH_PREFIX": "true",
				"MEMCGATE_ACCESS_LOG":       "false",
			})
			r := rand.New(rand.NewPCG(uint64(ci), 43))
			keys, values := interopKeys(r, 2000)
			for i, k := range keys {
				if i%100 == 7 {
					values[k] = []byte(strings.Repeat(fmt.Sprintf("compressible %d ", i), 2000)[:30000])
				}
			}
			phpKeys, gwKeys := keys[:1000], keys[1000:]
			in := map[string]any{"servers": phpServers, "strategy": c.strategy, "hash": c.hash, "prefix": c.prefix}

			// PHP writes directly; the gateway reads over HTTP.
			phpWrite := func(keys []string) {
				items := map[string]string{}
				for _, k := range keys {
					items[k] = base64.StdEncoding.EncodeToString(values[k])
				}
				in["op"], in["items"] = "write", items
				delete(in, "keys")
				if out := runPHPScript(t, php, "direct_memcache.php", in); !strings.Contains(string(out), fmt.Sprintf(`"ok":%d`, len(keys))) {
					t.Fatalf("PHP wrote %s, want ok %d", out, len(keys))
				}
			}
			gatewayReads := func(keys []string) (missed []string) {
				for _, k := range keys {
					resp := g.do("GET", "/"+pathEscape(k), nil)
					if resp.status != 200 || resp.body != string(values[k]) {
						if len(missed) < 3 {
							t.Logf("GET %q = %d (%d bytes), want 200 with %d bytes", k, resp.status, len(resp.body), len(values[k]))
						}
						missed = append(missed, k)
					}
				}
				return missed
			}
			phpWrite(phpKeys)
			missed := gatewayReads(phpKeys)
			t.Logf("%s prefix %q: PHP (Memcache) wrote 1000 keys directly, the gateway read %d with identical bytes", dist, c.prefix, 1000-len(missed))
			if still := retryPHPMisses(t, "PHP-written keys the gateway read", len(phpKeys), missed, func(keys []string) []string {
				phpWrite(keys)
				return gatewayReads(keys)
			}); len(still) > 0 {
				t.Errorf("gateway read %d of 1000 PHP-written keys, want all; %d missed in every try, %q first", 1000-len(still), len(still), still[0])
			}

			// The gateway writes; PHP reads directly.
			for _, k := range gwKeys {
				if resp := g.do("PUT", "/"+pathEscape(k), values[k]); resp.status != 201 {
					t.Fatalf("PUT %q = %d %q", k, resp.status, resp.body)
				}
			}
			phpReads := func(keys []string) (missed []string) {
				in["op"], in["keys"] = "read", keys
				delete(in, "items")
				var got map[string]*string
				if out := runPHPScript(t, php, "direct_memcache.php", in); json.Unmarshal(out, &got) != nil {
					t.Fatalf("PHP read output: %.200s", out)
				}
				for _, k := range keys {
					if v := got[k]; v == nil || *v != base64.StdEncoding.EncodeToString(values[k]) {
						missed = append(missed, k)
					}
				}
				return missed
			}
			missed = phpReads(gwKeys)
			t.Logf("%s prefix %q: the gateway wrote 1000 keys, PHP (Memcache) read %d directly with identical bytes", dist, c.prefix, 1000-len(missed))
			if still := retryPHPMisses(t, "gateway-written keys PHP read", len(gwKeys), missed, phpReads); len(still) > 0 {
				t.Errorf("PHP read %d of 1000 gateway-written keys, want all; %d missed in every try, %q first", 1000-len(still), len(still), still[0])
			}
		})
	}
}

// TestPeclMemcacheValues: with MEMCGATE_VALUE_CODEC=pecl-memcache the
// gateway serves what pecl/memcache stored (every type, compressed or not)
// and writes strings that Memcache::get reads back unchanged, with the
// ?flags= given.
func TestPeclMemcacheValues(t *testing.T) {
	php := gatewaytest.PHP(t, "memcache")
	mc := memcachedtest.Start(t)
	g := startGateway(t, map[string]string{"MEMCGATE_SERVERS": mc.Addr, "MEMCGATE_VALUE_CODEC": "pecl-memcache"})
	if out, err := exec.Command(php, "../php/types_memcache.php", "127.0.0.1", strconv.Itoa(mc.Port), "write").CombinedOutput(); err != nil || string(out) != "ok\n" {
		t.Fatalf("php types_memcache.php write: %v\n%s", err, out)
	}
	const text = "text/plain; charset=utf-8"
	cases := []struct {
		key, body, phpType, contentType, flags string
	}{
		{"m_string", "héllo wörld", "string", "application/octet-stream", "0"},
		{"m_int", "42", "long", text, "768"},
		{"m_negint", "-7", "long", text, "768"},
		{"m_float", "1.5", "double", text, "1792"},
		{"m_true", "true", "bool", text, "256"},
		{"m_false", "false", "bool", text, "256"},
		{"m_null", "N;", "serialized", "application/vnd.php.serialized", "1"},
		{"m_array", `a:2:{s:1:"a";i:1;s:1:"b";a:2:{i:0;i:2;i:1;i:3;}}`, "serialized", "application/vnd.php.serialized", "1"},
		{"m_flagged", "x", "string", "application/octet-stream", "327680"},
		{"m_compressed", strings.Repeat("compressible text ", 600), "string", "application/octet-stream", "2"},
		{"m_big", strings.Repeat("over the threshold ", 1200), "string", "application/octet-stream", "2"},
		{"m_array_compressed", phpSerializedRange(2000), "serialized", "application/vnd.php.serialized", "3"},
		{"m_low_threshold", strings.Repeat("setCompressThreshold ", 50), "string", "application/octet-stream", "2"},
	}
	for _, c := range cases {
		r := g.do("GET", "/"+c.key, nil)
		if r.status != 200 || r.body != c.body || r.header.Get("X-PHP-Type") != c.phpType ||
			r.header.Get("Content-Type") != c.contentType || r.header.Get("X-Memcached-Flags") != c.flags {
			t.Errorf("GET %s = %d %q type %q %q flags %s, want 200 %.40q type %q %q flags %s", c.key, r.status, gatewaytest.Tail(r.body, 60),
				r.header.Get("X-PHP-Type"), r.header.Get("Content-Type"), r.header.Get("X-Memcached-Flags"), c.body, c.phpType, c.contentType, c.flags)
		}
	}
	t.Logf("PHP (Memcache) wrote %d values of every type; the gateway served them", len(cases))

	// The gateway writes strings, small and large (compressed from 20000
	// bytes, as pecl/memcache would), some with application flags, and PHP
	// reads them back identical.
	want := map[string][2]any{}
	r := rand.New(rand.NewPCG(3, 4))
	for _, size := range []int{0, 1, 400, 19999, 20000, 70_000, 300_000} {
		for _, kind := range []string{"text", "random"} {
			v := make([]byte, size)
			for i := range v {
				if kind == "text" {
					v[i] = "the quick brown fox "[i%20]
				} else {
					v[i] = byte(r.IntN(256))
				}
			}
			key := fmt.Sprintf("g_%s_%d", kind, size)
			uf := size % 7
			if resp := g.do("PUT", "/"+key+"?flags="+strconv.Itoa(uf), v); resp.status != 201 {
				t.Fatalf("PUT %s = %d %q", key, resp.status, resp.body)
			}
			want[key] = [2]any{fmt.Sprintf("%x", sha1sum(v)), uf}
		}
	}
	in, _ := json.Marshal(want)
	cmd := exec.Command(php, "../php/types_memcache.php", "127.0.0.1", strconv.Itoa(mc.Port), "read")
	cmd.Stdin = bytes.NewReader(in)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("php types_memcache.php read: %v", err)
	}
	var got map[string]string
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("php output %q: %v", out, err)
	}
	ok := 0
	for k := range want {
		if got[k] == "ok" {
			ok++
		} else {
			t.Errorf("PHP read %s as %s, want the identical string and flags", k, got[k])
		}
	}
	t.Logf("the gateway wrote %d strings of 0 B-300 KB; PHP (Memcache) read %d back identical", len(want), ok)

	// Corrupt compressed data: a clear 502, never a crash.
	raw := memcachedClient(t, mc.Addr)
	raw.Set(&memcache.Item{Key: "m_corrupt", Value: []byte("not a zlib stream"), Flags: 0x2})
	if resp := g.do("GET", "/m_corrupt", nil); resp.status != 502 || !strings.Contains(resp.body, "cannot be decoded") {
		t.Errorf("GET of corrupt zlib data = %d %q, want 502 naming the problem", resp.status, resp.body)
	}
	if resp := g.do("PUT", "/m_x?flags=65536", []byte("x")); resp.status != 400 {
		t.Errorf("PUT ?flags=65536 = %d %q, want 400", resp.status, resp.body)
	}
}

// phpSerializedRange is serialize(range(1, n)).
func phpSerializedRange(n int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "a:%d:{", n)
	for i := range n {
		fmt.Fprintf(&b, "i:%d;i:%d;", i, i+1)
	}
	b.WriteString("}")
	return b.String()
}
