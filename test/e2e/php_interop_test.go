package e2e

import (
	"bytes"
	"crypto/sha1"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/memcgate/memcgate/test/gatewaytest"
	"github.com/memcgate/memcgate/test/memcachedtest"
)

// runPHP runs test/php/direct.php with in as its JSON input.
func runPHP(t *testing.T, php string, in map[string]any) []byte {
	t.Helper()
	b, _ := json.Marshal(in)
	cmd := exec.Command(php, "../php/direct.php")
	cmd.Stdin = bytes.NewReader(b)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("php direct.php %s: %v\n%s", in["op"], err, stderr.String())
	}
	return out
}

// interopKeys makes n random keys like an application's (printable ASCII,
// every tenth 96 characters as in the seed benchmark; php-memcached refuses
// bytes above 0x7e in keys with "CHARACTERS OUT OF RANGE") and binary
// values.
func interopKeys(r *rand.Rand, n int) (keys []string, values map[string][]byte) {
	const chars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789:_-./"
	values = map[string][]byte{}
	for len(keys) < n {
		l := 1 + r.IntN(60)
		if len(keys)%10 == 0 {
			l = 96
		}
		var b strings.Builder
		for range l {
			b.WriteByte(chars[r.IntN(len(chars))])
		}
		k := b.String()
		if _, dup := values[k]; dup {
			continue
		}
		v := make([]byte, r.IntN(1500))
		for i := range v {
			v[i] = byte(r.IntN(256))
		}
		keys = append(keys, k)
		values[k] = v
	}
	return keys, values
}

// TestPHPInterop: PHP code writing to memcached directly and the gateway
// must find each other's keys and read each other's bytes, for both of
// php-memcached's placements and with a key prefix.
func TestPHPInterop(t *testing.T) {
	t.Parallel() // its own gateway and memcached
	php := gatewaytest.PHP(t, "memcached")
	mcs := memcachedtest.StartN(t, 3)
	weights := []int{1, 2, 1}
	var phpServers [][]any
	var env []string
	for i, m := range mcs {
		phpServers = append(phpServers, []any{"127.0.0.1", m.Port, weights[i]})
		env = append(env, m.Addr+":"+strconv.Itoa(weights[i]))
	}
	cases := []struct{ mode, prefix string }{{"ketama", ""}, {"ketama", "app:"}, {"modula", ""}}
	for ci, c := range cases {
		t.Run(c.mode+"/"+c.prefix, func(t *testing.T) {
			g := startGateway(t, map[string]string{
				"MEMCGATE_SERVERS":      strings.Join(env, ","),
				"MEMCGATE_DISTRIBUTION": c.mode,
				"MEMCGATE_KEY_PREFIX":   c.prefix,
				"MEMCGATE_ACCESS_LOG":   "false",
			})
			r := rand.New(rand.NewPCG(uint64(ci), 42))
			keys, values := interopKeys(r, 2000)
			phpKeys, gwKeys := keys[:1000], keys[1000:]

			// PHP writes directly; the gateway reads over HTTP.
			items := map[string]string{}
			for _, k := range phpKeys {
				items[k] = base64.StdEncoding.EncodeToString(values[k])
			}
			out := runPHP(t, php, map[string]any{"servers": phpServers, "mode": c.mode, "prefix": c.prefix, "op": "write", "items": items})
			if !strings.Contains(string(out), `"ok":1000`) {
				t.Fatalf("PHP wrote %s, want ok 1000", out)
			}
			hits := 0
			for _, k := range phpKeys {
				resp := g.do("GET", "/"+pathEscape(k), nil)
				if resp.status == 200 && resp.body == string(values[k]) {
					hits++
				} else if hits < 3 {
					t.Logf("GET %q = %d (%d bytes), want 200 with %d bytes", k, resp.status, len(resp.body), len(values[k]))
				}
			}
			t.Logf("%s prefix %q: PHP wrote 1000 keys directly, the gateway read %d with identical bytes", c.mode, c.prefix, hits)
			if hits != 1000 {
				t.Errorf("gateway read %d of 1000 PHP-written keys, want all", hits)
			}

			// The gateway writes; PHP reads directly.
			for _, k := range gwKeys {
				if resp := g.do("PUT", "/"+pathEscape(k), values[k]); resp.status != 201 {
					t.Fatalf("PUT %q = %d %q", k, resp.status, resp.body)
				}
			}
			out = runPHP(t, php, map[string]any{"servers": phpServers, "mode": c.mode, "prefix": c.prefix, "op": "read", "keys": gwKeys})
			var got map[string]*string
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatalf("PHP read output: %v: %.200s", err, out)
			}
			hits = 0
			for _, k := range gwKeys {
				if v := got[k]; v != nil && *v == base64.StdEncoding.EncodeToString(values[k]) {
					hits++
				}
			}
			t.Logf("%s prefix %q: the gateway wrote 1000 keys, PHP read %d directly with identical bytes", c.mode, c.prefix, hits)
			if hits != 1000 {
				t.Errorf("PHP read %d of 1000 gateway-written keys, want all", hits)
			}
		})
	}
}

// pathEscape escapes a key for the URL path (keeping '/').
func pathEscape(k string) string {
	var b strings.Builder
	for i := 0; i < len(k); i++ {
		c := k[i]
		if c == '/' || ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z') || ('0' <= c && c <= '9') || c == '-' || c == '_' || c == '.' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// TestPHPValues: with MEMCGATE_VALUE_CODEC=php the gateway serves what
// php-memcached stored (every type, compressed or not) and writes strings
// that PHP reads back as the same string.
func TestPHPValues(t *testing.T) {
	php := gatewaytest.PHP(t, "memcached")
	mc := memcachedtest.Start(t)
	g := startGateway(t, map[string]string{"MEMCGATE_SERVERS": mc.Addr, "MEMCGATE_VALUE_CODEC": "php"})
	if out, err := exec.Command(php, "../php/types.php", "127.0.0.1", strconv.Itoa(mc.Port), "write").CombinedOutput(); err != nil {
		t.Fatalf("php types.php write: %v\n%s", err, out)
	}
	cases := []struct {
		key, body, phpType, contentType string
	}{
		{"t_string", "héllo wörld", "string", "application/octet-stream"},
		{"t_int", "42", "long", "text/plain; charset=utf-8"},
		{"t_negint", "-7", "long", "text/plain; charset=utf-8"},
		{"t_float", "1.5", "double", "text/plain; charset=utf-8"},
		{"t_true", "true", "bool", "text/plain; charset=utf-8"},
		{"t_false", "false", "bool", "text/plain; charset=utf-8"},
		{"t_array", `a:2:{s:1:"a";i:1;s:1:"b";a:2:{i:0;i:2;i:1;i:3;}}`, "serialized", "application/vnd.php.serialized"},
		{"t_big", strings.Repeat("compressible text ", 600), "string", "application/octet-stream"},
		{"t_big_zlib", strings.Repeat("zlib text ", 1000), "string", "application/octet-stream"},
		{"t_json", `{"x":"y"}`, "json", "application/json"},
	}
	for _, c := range cases {
		r := g.do("GET", "/"+c.key, nil)
		if r.status != 200 || r.body != c.body || r.header.Get("X-PHP-Type") != c.phpType || r.header.Get("Content-Type") != c.contentType {
			t.Errorf("GET %s = %d %q type %q %q, want 200 %.40q type %q %q", c.key, r.status, gatewaytest.Tail(r.body, 60),
				r.header.Get("X-PHP-Type"), r.header.Get("Content-Type"), c.body, c.phpType, c.contentType)
		}
	}
	// The gateway writes strings, small and large (compressed on the way
	// in, as php-memcached would), and PHP reads them back identical.
	want := map[string]string{}
	r := rand.New(rand.NewPCG(1, 2))
	for _, size := range []int{0, 1, 400, 1999, 2000, 10_000, 70_000, 300_000} {
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
			if resp := g.do("PUT", "/"+key, v); resp.status != 201 {
				t.Fatalf("PUT %s = %d %q", key, resp.status, resp.body)
			}
			want[key] = fmt.Sprintf("%x", sha1sum(v))
		}
	}
	in, _ := json.Marshal(want)
	cmd := exec.Command(php, "../php/types.php", "127.0.0.1", strconv.Itoa(mc.Port), "read")
	cmd.Stdin = bytes.NewReader(in)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("php types.php read: %v", err)
	}
	var got map[string]string
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("php output %q: %v", out, err)
	}
	for k := range want {
		if got[k] != "ok" {
			t.Errorf("PHP read %s as %s, want the identical string", k, got[k])
		}
	}
	// Corrupt compressed data: a clear 502, never a crash.
	raw := memcachedClient(t, mc.Addr)
	raw.Set(&memcache.Item{Key: "t_corrupt", Value: []byte{0xff, 0xff, 0, 0, 1, 2, 3}, Flags: 0x10 | 0x40})
	if resp := g.do("GET", "/t_corrupt", nil); resp.status != 502 || !strings.Contains(resp.body, "cannot be decoded") {
		t.Errorf("GET of corrupt FastLZ data = %d %q, want 502 naming the problem", resp.status, resp.body)
	}
}

func sha1sum(b []byte) [20]byte { return sha1.Sum(b) }
