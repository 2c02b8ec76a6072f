package phpvalue

// Golden vectors from the real php-memcached: PHP writes values of every
// type to a real memcached and Go reads the raw flags and bytes back; Go
// writes Encode's output raw and PHP must read the identical string. The
// tests need php-cli with the memcached extension (Debian php-memcached)
// and memcached; without them they skip, or fail when CI or
// MEMCGATE_TEST_REQUIRE_MEMCACHED is set (gatewaytest.PHP).

import (
	"bufio"
	"bytes"
	"crypto/sha1"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/gatewaytest"
	"github.com/memcgate/memcgate/test/memcachedtest"
)

// runPHP runs script with args and returns its standard output. Any
// output on standard error (a PHP warning, say) fails the test.
func runPHP(t *testing.T, php, script string, args ...string) []byte {
	t.Helper()
	path := filepath.Join(t.TempDir(), "script.php")
	if err := os.WriteFile(path, []byte(script), 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(t.Context(), php,
		append([]string{"-d", "display_errors=stderr", "-d", "error_reporting=-1", "-d", "log_errors=0", path}, args...)...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil || stderr.Len() > 0 {
		t.Fatalf("php %s: %v\nstderr: %s\nstdout: %.2000s", path, err, stderr.Bytes(), stdout.Bytes())
	}
	return stdout.Bytes()
}

// rawClient speaks memcached's text protocol, so the tests see the flags
// and bytes exactly as stored.
type rawClient struct {
	c net.Conn
	r *bufio.Reader
}

func dialRaw(t *testing.T, addr string) *rawClient {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawClient{c: c, r: bufio.NewReader(c)}
}

func (rc *rawClient) line(t *testing.T) string {
	t.Helper()
	l, err := rc.r.ReadString('\n')
	if err != nil {
		t.Fatalf("read from memcached: %v", err)
	}
	return strings.TrimSuffix(l, "\r\n")
}

func (rc *rawClient) set(t *testing.T, key string, flags uint32, data []byte) {
	t.Helper()
	_ = rc.c.SetDeadline(time.Now().Add(5 * time.Second))
	msg := fmt.Appendf(nil, "set %s %d 0 %d\r\n", key, flags, len(data))
	msg = append(append(msg, data...), "\r\n"...)
	if _, err := rc.c.Write(msg); err != nil {
		t.Fatalf("set %s: %v", key, err)
	}
	if l := rc.line(t); l != "STORED" {
		t.Fatalf("set %s: memcached answered %q", key, l)
	}
}

// gets returns the stored flags and bytes of key, failing if it is missing.
func (rc *rawClient) gets(t *testing.T, key string) (uint32, []byte) {
	t.Helper()
	_ = rc.c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintf(rc.c, "gets %s\r\n", key); err != nil {
		t.Fatalf("gets %s: %v", key, err)
	}
	f := strings.Fields(rc.line(t)) // VALUE <key> <flags> <bytes> <cas>
	if len(f) != 5 || f[0] != "VALUE" || f[1] != key {
		t.Fatalf("gets %s: unexpected answer %q", key, f)
	}
	flags, err1 := strconv.ParseUint(f[2], 10, 32)
	n, err2 := strconv.Atoi(f[3])
	if err1 != nil || err2 != nil {
		t.Fatalf("gets %s: bad header %q", key, f)
	}
	data := make([]byte, n+2)
	if _, err := io.ReadFull(rc.r, data); err != nil {
		t.Fatalf("gets %s: reading %d bytes: %v", key, n, err)
	}
	if l := rc.line(t); l != "END" {
		t.Fatalf("gets %s: trailer %q, want END", key, l)
	}
	return uint32(flags), data[:n]
}

const phpPrelude = `<?php
function mk() {
	global $argv;
	$m = new Memcached();
	$m->setOption(Memcached::OPT_LIBKETAMA_COMPATIBLE, true);
	$m->addServer('127.0.0.1', (int)$argv[1]);
	return $m;
}
function serialized_as($m, $v) {
	switch ($m->getOption(Memcached::OPT_SERIALIZER)) {
	case Memcached::SERIALIZER_PHP: return [4, serialize($v)];
	case Memcached::SERIALIZER_IGBINARY: return [5, igbinary_serialize($v)];
	case Memcached::SERIALIZER_JSON: case Memcached::SERIALIZER_JSON_ARRAY: return [6, json_encode($v)];
	case Memcached::SERIALIZER_MSGPACK: return [7, msgpack_pack($v)];
	}
	return [-1, ''];
}
function words($n) { // deterministic, compressible text of $n bytes
	$s = '';
	for ($i = 0; strlen($s) < $n; $i++) { $s .= 'word' . (($i * 7919) % 211) . ' '; }
	return substr($s, 0, $n);
}
function blocks($n) { // a 20000-byte hex block repeated: FastLZ level-2 far matches
	$b = '';
	for ($i = 0; $i < 625; $i++) { $b .= md5("block $i"); }
	return substr(str_repeat($b, intdiv($n, 20000) + 1), 0, $n);
}
$out = [];
`

func TestPHPWritesGoDecodes(t *testing.T) {
	php := gatewaytest.PHP(t, "memcached")
	srv := memcachedtest.Start(t)

	const (
		fastlz = flagCompressed | flagFastLZ
		zlibC  = flagCompressed | flagZlib
	)
	tests := []struct {
		key   string
		need  string // PHP condition for the vector to apply ("" = always)
		setup string // PHP statements on $m before the set
		value string // PHP expression stored with $m->set
		// The expected body: body, or when bodyExpr is set the PHP
		// expression's value; serialized asks PHP which serializer $m
		// uses and expects that type and serialization.
		body       string
		bodyExpr   string
		serialized bool
		wantType   Type
		wantFlags  uint32
	}{
		{key: "string", value: `'hello world'`, body: "hello world", wantType: String, wantFlags: 0},
		{key: "empty", value: `''`, body: "", wantType: String, wantFlags: 0},
		{key: "binary", value: `"a\r\nb\0c\xff"`, body: "a\r\nb\x00c\xff", wantType: String, wantFlags: 0},
		{key: "long", value: `42`, body: "42", wantType: Long, wantFlags: 1},
		{key: "long_min", value: `PHP_INT_MIN`, body: "-9223372036854775808", wantType: Long, wantFlags: 1},
		{key: "double", value: `0.1`, body: ".1", wantType: Double, wantFlags: 2},
		{key: "double_half", value: `-1.5`, body: "-1.5", wantType: Double, wantFlags: 2},
		{key: "double_whole", value: `100.0`, body: "100", wantType: Double, wantFlags: 2},
		{key: "double_big", value: `1e100`, body: "1e+100", wantType: Double, wantFlags: 2},
		{key: "double_inf", value: `-INF`, body: "-Infinity", wantType: Double, wantFlags: 2},
		{key: "double_nan", value: `NAN`, body: "NaN", wantType: Double, wantFlags: 2},
		{key: "true", value: `true`, body: "1", wantType: Bool, wantFlags: 3},
		{key: "false", value: `false`, body: "", wantType: Bool, wantFlags: 3},
		{key: "array_default", value: `['a' => 1, 'b' => [true, null, 1.5]]`, serialized: true},
		{key: "array_php", setup: `$m->setOption(Memcached::OPT_SERIALIZER, Memcached::SERIALIZER_PHP);`,
			value: `['a' => 1, 'b' => [true, null, 1.5]]`, bodyExpr: `serialize($v)`, wantType: Serialized, wantFlags: 4},
		{key: "object_php", setup: `$m->setOption(Memcached::OPT_SERIALIZER, Memcached::SERIALIZER_PHP);`,
			value: `(object)['x' => 'y']`, bodyExpr: `serialize($v)`, wantType: Serialized, wantFlags: 4},
		{key: "array_igbinary", need: `Memcached::HAVE_IGBINARY`, setup: `$m->setOption(Memcached::OPT_SERIALIZER, Memcached::SERIALIZER_IGBINARY);`,
			value: `['a' => 1]`, bodyExpr: `igbinary_serialize($v)`, wantType: Igbinary, wantFlags: 5},
		{key: "array_json", need: `Memcached::HAVE_JSON`, setup: `$m->setOption(Memcached::OPT_SERIALIZER, Memcached::SERIALIZER_JSON);`,
			value: `['a' => 1, 'u' => "\u{e9}"]`, bodyExpr: `json_encode($v)`, wantType: JSON, wantFlags: 6},
		{key: "array_json_array", need: `Memcached::HAVE_JSON`, setup: `$m->setOption(Memcached::OPT_SERIALIZER, Memcached::SERIALIZER_JSON_ARRAY);`,
			value: `[1, 2, 3]`, body: "[1,2,3]", wantType: JSON, wantFlags: 6},
		{key: "array_msgpack", need: `Memcached::HAVE_MSGPACK`, setup: `$m->setOption(Memcached::OPT_SERIALIZER, Memcached::SERIALIZER_MSGPACK);`,
			value: `['a' => 1]`, bodyExpr: `msgpack_pack($v)`, wantType: Msgpack, wantFlags: 7},
		{key: "below_threshold", value: `words(1999)`, bodyExpr: `$v`, wantType: String, wantFlags: 0},
		{key: "at_threshold", value: `words(2000)`, bodyExpr: `$v`, wantType: String, wantFlags: fastlz},
		{key: "fastlz_10k", value: `words(10000)`, bodyExpr: `$v`, wantType: String, wantFlags: fastlz},
		{key: "zlib_10k", setup: `$m->setOption(Memcached::OPT_COMPRESSION_TYPE, Memcached::COMPRESSION_ZLIB);`,
			value: `words(10000)`, bodyExpr: `$v`, wantType: String, wantFlags: zlibC},
		{key: "fastlz_100k", value: `blocks(100000)`, bodyExpr: `$v`, wantType: String, wantFlags: fastlz},
		{key: "fastlz_100k_words", value: `words(100000)`, bodyExpr: `$v`, wantType: String, wantFlags: fastlz},
		{key: "zlib_100k", setup: `$m->setOption(Memcached::OPT_COMPRESSION_TYPE, Memcached::COMPRESSION_ZLIB);`,
			value: `blocks(100000)`, bodyExpr: `$v`, wantType: String, wantFlags: zlibC},
		{key: "fastlz_run", value: `str_repeat('a', 70000)`, bodyExpr: `$v`, wantType: String, wantFlags: fastlz},
		{key: "incompressible", value: `random_bytes(10000)`, bodyExpr: `$v`, wantType: String, wantFlags: 0},
		{key: "compression_off", setup: `$m->setOption(Memcached::OPT_COMPRESSION, false);`,
			value: `words(10000)`, bodyExpr: `$v`, wantType: String, wantFlags: 0},
		{key: "serialized_fastlz", setup: `$m->setOption(Memcached::OPT_SERIALIZER, Memcached::SERIALIZER_PHP);`,
			value: `range(1, 3000)`, bodyExpr: `serialize($v)`, wantType: Serialized, wantFlags: fastlz | 4},
		{key: "json_zlib", need: `Memcached::HAVE_JSON`,
			setup: `$m->setOption(Memcached::OPT_SERIALIZER, Memcached::SERIALIZER_JSON); $m->setOption(Memcached::OPT_COMPRESSION_TYPE, Memcached::COMPRESSION_ZLIB);`,
			value: `array_fill(0, 1000, 'abc')`, bodyExpr: `json_encode($v)`, wantType: JSON, wantFlags: zlibC | 6},
		{key: "user_flags", need: `defined('Memcached::OPT_USER_FLAGS')`, setup: `$m->setOption(Memcached::OPT_USER_FLAGS, 1234);`,
			value: `'x'`, body: "x", wantType: String, wantFlags: 1234 << 16},
		{key: "user_flags_long", need: `defined('Memcached::OPT_USER_FLAGS')`, setup: `$m->setOption(Memcached::OPT_USER_FLAGS, 7);`,
			value: `-7`, body: "-7", wantType: Long, wantFlags: 7<<16 | 1},
		{key: "user_flags_fastlz", need: `defined('Memcached::OPT_USER_FLAGS')`, setup: `$m->setOption(Memcached::OPT_USER_FLAGS, 65535);`,
			value: `words(10000)`, bodyExpr: `$v`, wantType: String, wantFlags: 0xffff0000 | fastlz},
	}

	var script strings.Builder
	script.WriteString(phpPrelude)
	for _, tt := range tests {
		k := "'" + tt.key + "'"
		need := tt.need
		if need == "" {
			need = "true"
		}
		script.WriteString("if (!(" + need + ")) { $out[" + k + "] = ['skip' => true]; } else {\n")
		script.WriteString("\t$m = mk();\n\t" + tt.setup + "\n\t$v = " + tt.value + ";\n")
		script.WriteString("\tif (!$m->set(" + k + ", $v)) { fwrite(STDERR, 'set " + tt.key + ": ' . $m->getResultMessage()); exit(1); }\n")
		switch {
		case tt.serialized:
			script.WriteString("\t[$t, $b] = serialized_as($m, $v);\n\t$out[" + k + "] = ['type' => $t, 'body' => base64_encode($b)];\n")
		case tt.bodyExpr != "":
			script.WriteString("\t$out[" + k + "] = ['body' => base64_encode(" + tt.bodyExpr + ")];\n")
		default:
			script.WriteString("\t$out[" + k + "] = new stdClass();\n")
		}
		script.WriteString("}\n")
	}
	script.WriteString("echo json_encode($out);\n")

	var expect map[string]struct {
		Skip bool   `json:"skip"`
		Type *int   `json:"type"`
		Body []byte `json:"body"` // base64 in JSON
	}
	out := runPHP(t, php, script.String(), strconv.Itoa(srv.Port))
	if err := json.Unmarshal(out, &expect); err != nil {
		t.Fatalf("php output %.500q: %v", out, err)
	}

	rc := dialRaw(t, srv.Addr)
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			e, ok := expect[tt.key]
			if !ok {
				t.Fatalf("php reported nothing for %s", tt.key)
			}
			if e.Skip {
				t.Skipf("php-memcached lacks %s", tt.need)
			}
			wantBody, wantType, wantFlags := []byte(tt.body), tt.wantType, tt.wantFlags
			if tt.bodyExpr != "" || tt.serialized {
				wantBody = e.Body
			}
			if tt.serialized {
				if e.Type == nil || *e.Type < 4 {
					t.Fatalf("php reported no serializer type for %s", tt.key)
				}
				wantType, wantFlags = Type(*e.Type), uint32(*e.Type)
				t.Logf("default serializer: %v", wantType)
			}
			flags, payload := rc.gets(t, tt.key)
			if flags != wantFlags {
				t.Errorf("php stored %s with flags %#x, want %#x", tt.key, flags, wantFlags)
			}
			v, err := Decode(flags, payload, 1<<20)
			if err != nil {
				t.Fatalf("Decode(%#x, %d bytes) error: %v", flags, len(payload), err)
			}
			if v.Type != wantType {
				t.Errorf("Decode(%#x).Type = %v, want %v", flags, v.Type, wantType)
			}
			if v.UserFlags != uint16(wantFlags>>16) {
				t.Errorf("Decode(%#x).UserFlags = %d, want %d", flags, v.UserFlags, wantFlags>>16)
			}
			if !bytes.Equal(v.Body, wantBody) {
				t.Errorf("Decode(%#x).Body = %.80q (%d bytes), want %.80q (%d bytes)", flags, v.Body, len(v.Body), wantBody, len(wantBody))
			}
			if flags&flagCompressed != 0 {
				opt := EncodeOptions{Threshold: 1, Factor: 1e-9}
				if flags&flagZlib != 0 {
					opt.Compression = CompressZlib
				}
				ours, _ := Encode(v.Body, opt)
				t.Logf("%s: %d bytes, php stored %d, Encode %d", tt.key, len(v.Body), len(payload), len(ours))
			}
		})
	}
}

func TestGoEncodesPHPReads(t *testing.T) {
	php := gatewaytest.PHP(t, "memcached")
	srv := memcachedtest.Start(t)

	allBytes := make([]byte, 256)
	for i := range allBytes {
		allBytes[i] = byte(i)
	}
	type vector struct {
		key            string
		value          []byte
		opt            EncodeOptions
		wantCompressed bool
	}
	tests := []vector{
		{"small", []byte("hello"), EncodeOptions{}, false},
		{"empty", []byte{}, EncodeOptions{}, false},
		{"all_bytes", allBytes, EncodeOptions{}, false},
		{"below_threshold", testData("text", 1999, 1), EncodeOptions{}, false},
		{"at_threshold", testData("text", 2000, 1), EncodeOptions{}, true},
		{"fastlz_10k", testData("text", 10_000, 2), EncodeOptions{}, true},
		{"fastlz_10k_period", testData("period", 10_000, 2), EncodeOptions{}, true},
		{"zlib_10k", testData("text", 10_000, 3), EncodeOptions{Compression: CompressZlib}, true},
		{"fastlz_65535", testData("text", 65535, 4), EncodeOptions{}, true},
		{"fastlz_65536", testData("text", 65536, 4), EncodeOptions{}, true},
		{"fastlz_l1_run", bytes.Repeat([]byte("a"), 60_000), EncodeOptions{}, true},
		{"fastlz_l2_run", bytes.Repeat([]byte("a"), 300*1024), EncodeOptions{}, true},
		{"fastlz_300k_blocks", testData("blocks", 300*1024, 5), EncodeOptions{}, true},
		{"fastlz_300k_text", testData("text", 300*1024, 6), EncodeOptions{}, true},
		{"fastlz_300k_mixed", testData("mixed", 300*1024, 7), EncodeOptions{Factor: 0.5}, true},
		{"fastlz_300k_period", testData("period", 300*1024, 8), EncodeOptions{}, true},
		{"zlib_300k", testData("blocks", 300*1024, 9), EncodeOptions{Compression: CompressZlib}, true},
		{"random_300k", testData("random", 300*1024, 10), EncodeOptions{}, false},
		{"user_flags", []byte("x"), EncodeOptions{UserFlags: 4321}, false},
		{"user_flags_fastlz", testData("text", 10_000, 11), EncodeOptions{UserFlags: 65535}, true},
	}
	// Tiny and awkward FastLZ blocks at both levels, kept even when they
	// grow (Factor near 0), to probe PHP's decoder at the edges.
	for _, n := range []int{1, 2, 3, 4, 5, 13, 32, 33, 100, 8200} {
		for _, kind := range []string{"random", "period"} {
			tests = append(tests, vector{fmt.Sprintf("tiny_%s_%d", kind, n), testData(kind, n, uint64(n)),
				EncodeOptions{Threshold: 1, Factor: 1e-9}, true})
		}
	}
	for _, n := range []int{65536, 65537, 65600, 80000} {
		tests = append(tests, vector{fmt.Sprintf("l2_random_%d", n), testData("random", n, uint64(n)),
			EncodeOptions{Threshold: 1, Factor: 1e-9}, true})
	}

	rc := dialRaw(t, srv.Addr)
	keys := make([]string, 0, len(tests))
	for _, tt := range tests {
		payload, flags := Encode(tt.value, tt.opt)
		if got := flags&flagCompressed != 0; got != tt.wantCompressed {
			t.Errorf("Encode(%s, %d bytes) compressed = %v, want %v", tt.key, len(tt.value), got, tt.wantCompressed)
		}
		rc.set(t, tt.key, flags, payload)
		keys = append(keys, tt.key)
	}

	const script = `<?php
$m = new Memcached();
$m->setOption(Memcached::OPT_LIBKETAMA_COMPATIBLE, true);
$m->addServer('127.0.0.1', (int)$argv[1]);
$out = [];
foreach (array_slice($argv, 2) as $k) {
	$r = $m->get($k, null, Memcached::GET_EXTENDED);
	if ($r === false) { $out[$k] = ['error' => $m->getResultMessage()]; continue; }
	$v = $r['value'];
	$out[$k] = ['type' => gettype($v), 'len' => is_string($v) ? strlen($v) : -1,
		'sha1' => is_string($v) ? sha1($v) : '', 'flags' => $r['flags']];
}
echo json_encode($out);
`
	var got map[string]struct {
		Error string `json:"error"`
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
			if !ok || g.Error != "" {
				t.Fatalf("php get(%s) failed: %q", tt.key, g.Error)
			}
			sum := sha1.Sum(tt.value)
			want := hex.EncodeToString(sum[:])
			if g.Type != "string" || g.Len != len(tt.value) || g.SHA1 != want {
				t.Errorf("php get(%s) = %s of %d bytes sha1 %s, want string of %d bytes sha1 %s",
					tt.key, g.Type, g.Len, g.SHA1, len(tt.value), want)
			}
			if g.Flags != uint32(tt.opt.UserFlags) {
				t.Errorf("php get(%s) user flags = %d, want %d", tt.key, g.Flags, tt.opt.UserFlags)
			}
		})
	}
}
