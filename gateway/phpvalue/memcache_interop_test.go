package phpvalue

// Golden vectors from the real pecl/memcache (Debian php-memcache): PHP's
// Memcache class writes values of every type to a real memcached and Go
// reads the raw flags and bytes back; Go writes EncodeMemcache's output raw
// and Memcache::get must read the identical string. Without php-cli, its
// memcache extension or memcached the tests skip, or fail when CI or
// MEMCGATE_TEST_REQUIRE_MEMCACHED is set (gatewaytest.PHP).

import (
	"bytes"
	"crypto/sha1"
	"encoding/hex"
	"encoding/json"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/memcgate/memcgate/test/gatewaytest"
	"github.com/memcgate/memcgate/test/memcachedtest"
)

// memcachePrelude opens a Memcache on argv[1]'s port. pecl/memcache
// 4.0.5.2 on PHP 8.2 reports "Creation of dynamic property" as
// E_DEPRECATED on addServer; every other message still fails the test.
const memcachePrelude = `<?php
error_reporting(E_ALL & ~E_DEPRECATED);
function mk() {
	global $argv;
	$m = new Memcache();
	$m->addServer('127.0.0.1', (int)$argv[1]);
	return $m;
}
function words($n) { // deterministic, compressible text of $n bytes
	$s = '';
	for ($i = 0; strlen($s) < $n; $i++) { $s .= 'word' . (($i * 7919) % 211) . ' '; }
	return substr($s, 0, $n);
}
$out = [];
`

func TestMemcacheWritesGoDecodes(t *testing.T) {
	php := gatewaytest.PHP(t, "memcache")
	srv := memcachedtest.Start(t)

	const c = memcacheCompressed
	tests := []struct {
		key       string
		setup     string // PHP statements on $m before the set
		value     string // PHP expression stored with $m->set
		flags     string // PHP expression for set's flags argument
		bodyExpr  string // PHP expression for the expected body; "" for doubles
		wantFloat float64
		wantType  Type
		wantFlags uint32
	}{
		{key: "string", value: `'hello world'`, bodyExpr: `$v`, wantType: String, wantFlags: 0},
		{key: "empty", value: `''`, bodyExpr: `$v`, wantType: String, wantFlags: 0},
		{key: "binary", value: `"a\r\nb\0c\xff"`, bodyExpr: `$v`, wantType: String, wantFlags: 0},
		{key: "utf8", value: `'héllo wörld'`, bodyExpr: `$v`, wantType: String, wantFlags: 0},
		{key: "long", value: `42`, bodyExpr: `'42'`, wantType: Long, wantFlags: 0x300},
		{key: "long_min", value: `PHP_INT_MIN`, bodyExpr: `'-9223372036854775808'`, wantType: Long, wantFlags: 0x300},
		{key: "double", value: `0.1`, wantFloat: 0.1, wantType: Double, wantFlags: 0x700},
		{key: "double_half", value: `-1.5`, wantFloat: -1.5, wantType: Double, wantFlags: 0x700},
		{key: "double_whole", value: `100.0`, wantFloat: 100, wantType: Double, wantFlags: 0x700},
		{key: "double_big", value: `1e100`, wantFloat: 1e100, wantType: Double, wantFlags: 0x700},
		{key: "double_inf", value: `-INF`, wantFloat: math.Inf(-1), wantType: Double, wantFlags: 0x700},
		{key: "double_nan", value: `NAN`, wantFloat: math.NaN(), wantType: Double, wantFlags: 0x700},
		{key: "true", value: `true`, bodyExpr: `'1'`, wantType: Bool, wantFlags: 0x100},
		{key: "false", value: `false`, bodyExpr: `''`, wantType: Bool, wantFlags: 0x100},
		{key: "null", value: `null`, bodyExpr: `serialize($v)`, wantType: Serialized, wantFlags: 0x1},
		{key: "array", value: `['a' => 1, 'b' => [true, null, 1.5]]`, bodyExpr: `serialize($v)`, wantType: Serialized, wantFlags: 0x1},
		{key: "object", value: `(object)['x' => 'y']`, bodyExpr: `serialize($v)`, wantType: Serialized, wantFlags: 0x1},
		{key: "flag_compressed", value: `words(10000)`, flags: `MEMCACHE_COMPRESSED`, bodyExpr: `$v`, wantType: String, wantFlags: c},
		{key: "flag_compressed_small", value: `str_repeat('ab', 50)`, flags: `MEMCACHE_COMPRESSED`, bodyExpr: `$v`, wantType: String, wantFlags: c},
		{key: "below_threshold", value: `words(19999)`, bodyExpr: `$v`, wantType: String, wantFlags: 0},
		{key: "at_threshold", value: `words(20000)`, bodyExpr: `$v`, wantType: String, wantFlags: c},
		{key: "threshold_300k", value: `words(300000)`, bodyExpr: `$v`, wantType: String, wantFlags: c},
		{key: "set_threshold", setup: `$m->setCompressThreshold(100, 0.2);`, value: `words(1000)`, bodyExpr: `$v`, wantType: String, wantFlags: c},
		{key: "set_threshold_savings", setup: `$m->setCompressThreshold(100, 0.99);`, value: `words(1000)`, bodyExpr: `$v`, wantType: String, wantFlags: 0},
		{key: "incompressible", value: `random_bytes(30000)`, flags: `MEMCACHE_COMPRESSED`, bodyExpr: `$v`, wantType: String, wantFlags: 0},
		{key: "serialized_compressed", value: `range(1, 3000)`, flags: `MEMCACHE_COMPRESSED`, bodyExpr: `serialize($v)`, wantType: Serialized, wantFlags: c | 0x1},
		{key: "long_compressed_flag", value: `42`, flags: `MEMCACHE_COMPRESSED`, bodyExpr: `'42'`, wantType: Long, wantFlags: 0x300},
		{key: "user_flags", value: `'x'`, flags: `0x10000`, bodyExpr: `$v`, wantType: String, wantFlags: 0x10000},
		{key: "user_flags_long", value: `-7`, flags: `0xf0000`, bodyExpr: `'-7'`, wantType: Long, wantFlags: 0xf0300},
		{key: "user_flags_compressed", value: `words(10000)`, flags: `0xffff0000 | MEMCACHE_COMPRESSED`, bodyExpr: `$v`, wantType: String, wantFlags: 0xffff0000 | c},
	}

	var script strings.Builder
	script.WriteString(memcachePrelude)
	for _, tt := range tests {
		k := "'" + tt.key + "'"
		flags := tt.flags
		if flags == "" {
			flags = "0"
		}
		script.WriteString("$m = mk();\n" + tt.setup + "\n$v = " + tt.value + ";\n")
		script.WriteString("if (!$m->set(" + k + ", $v, " + flags + ")) { fwrite(STDERR, 'set " + tt.key + " failed'); exit(1); }\n")
		if tt.bodyExpr != "" {
			script.WriteString("$out[" + k + "] = base64_encode(" + tt.bodyExpr + ");\n")
		}
	}
	script.WriteString("echo json_encode($out);\n")

	var expect map[string][]byte // base64 in JSON
	out := runPHP(t, php, script.String(), strconv.Itoa(srv.Port))
	if err := json.Unmarshal(out, &expect); err != nil {
		t.Fatalf("php output %.500q: %v", out, err)
	}

	rc := dialRaw(t, srv.Addr)
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			flags, payload := rc.gets(t, tt.key)
			if flags != tt.wantFlags {
				t.Errorf("pecl/memcache stored %s with flags %#x, want %#x", tt.key, flags, tt.wantFlags)
			}
			v, err := DecodeMemcache(flags, payload, 1<<20)
			if err != nil {
				t.Fatalf("DecodeMemcache(%#x, %d bytes) error: %v", flags, len(payload), err)
			}
			if v.Type != tt.wantType || v.UserFlags != uint16(tt.wantFlags>>16) {
				t.Errorf("DecodeMemcache(%#x) = type %v, user flags %d; want %v, %d", flags, v.Type, v.UserFlags, tt.wantType, tt.wantFlags>>16)
			}
			if tt.bodyExpr == "" {
				f, err := strconv.ParseFloat(string(v.Body), 64)
				if err != nil || !(f == tt.wantFloat || math.IsNaN(f) && math.IsNaN(tt.wantFloat)) {
					t.Errorf("DecodeMemcache(%#x).Body = %q (%v, %v), want the double %v", flags, v.Body, f, err, tt.wantFloat)
				}
				t.Logf("%s: stored as %q", tt.key, v.Body)
				return
			}
			want, ok := expect[tt.key]
			if !ok {
				t.Fatalf("php reported nothing for %s", tt.key)
			}
			if !bytes.Equal(v.Body, want) {
				t.Errorf("DecodeMemcache(%#x).Body = %.80q (%d bytes), want %.80q (%d bytes)", flags, v.Body, len(v.Body), want, len(want))
			}
		})
	}
}

func TestGoEncodesMemcacheReads(t *testing.T) {
	php := gatewaytest.PHP(t, "memcache")
	srv := memcachedtest.Start(t)

	allBytes := make([]byte, 256)
	for i := range allBytes {
		allBytes[i] = byte(i)
	}
	tests := []struct {
		key            string
		value          []byte
		opt            MemcacheOptions
		wantCompressed bool
	}{
		{"small", []byte("hello"), MemcacheOptions{}, false},
		{"empty", []byte{}, MemcacheOptions{}, false},
		{"all_bytes", allBytes, MemcacheOptions{}, false},
		{"one", []byte("1"), MemcacheOptions{}, false},
		{"below_threshold", testData("text", 19999, 1), MemcacheOptions{}, false},
		{"at_threshold", testData("text", 20000, 2), MemcacheOptions{}, true},
		{"text_300k", testData("text", 300*1024, 3), MemcacheOptions{}, true},
		{"blocks_300k", testData("blocks", 300*1024, 4), MemcacheOptions{}, true},
		{"run_300k", bytes.Repeat([]byte("a"), 300*1024), MemcacheOptions{}, true},
		{"random_300k", testData("random", 300*1024, 5), MemcacheOptions{}, false},
		{"low_threshold", testData("text", 500, 6), MemcacheOptions{Threshold: 100}, true},
		{"tiny_forced", []byte("ab"), MemcacheOptions{Threshold: 1, MinSavings: -1}, false},
		{"period_forced", testData("period", 5000, 7), MemcacheOptions{Threshold: 1, MinSavings: -1}, true},
		{"threshold_off", testData("text", 30000, 8), MemcacheOptions{Threshold: -1}, false},
		{"user_flags", []byte("x"), MemcacheOptions{UserFlags: 1}, false},
		{"user_flags_compressed", testData("text", 30000, 9), MemcacheOptions{UserFlags: 0xffff}, true},
	}
	rc := dialRaw(t, srv.Addr)
	keys := make([]string, 0, len(tests))
	for _, tt := range tests {
		payload, flags := EncodeMemcache(tt.value, tt.opt)
		if got := flags&memcacheCompressed != 0; got != tt.wantCompressed {
			t.Errorf("EncodeMemcache(%s, %d bytes) compressed = %v, want %v", tt.key, len(tt.value), got, tt.wantCompressed)
		}
		rc.set(t, tt.key, flags, payload)
		keys = append(keys, tt.key)
	}

	const script = memcachePrelude + `
$m = mk();
foreach (array_slice($argv, 2) as $k) {
	$flags = 0;
	$v = $m->get($k, $flags);
	$out[$k] = ['type' => gettype($v), 'len' => is_string($v) ? strlen($v) : -1,
		'sha1' => is_string($v) ? sha1($v) : '', 'flags' => $flags];
}
echo json_encode($out);
`
	var got map[string]struct {
		Type  string `json:"type"`
		Len   int    `json:"len"`
		SHA1  string `json:"sha1"`
		Flags uint32 `json:"flags"`
	}
	out := runPHP(t, php, script, append([]string{strconv.Itoa(srv.Port)}, keys...)...)
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("php output %.500q: %v", out, err)
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			g, ok := got[tt.key]
			if !ok {
				t.Fatalf("php reported nothing for %s", tt.key)
			}
			sum := sha1.Sum(tt.value)
			want := hex.EncodeToString(sum[:])
			if g.Type != "string" || g.Len != len(tt.value) || g.SHA1 != want {
				t.Errorf("Memcache::get(%s) = %s of %d bytes sha1 %s, want string of %d bytes sha1 %s",
					tt.key, g.Type, g.Len, g.SHA1, len(tt.value), want)
			}
			if g.Flags>>16 != uint32(tt.opt.UserFlags) {
				t.Errorf("Memcache::get(%s) flags = %#x, want user flags %d in bits 16-31", tt.key, g.Flags, tt.opt.UserFlags)
			}
		})
	}
}
