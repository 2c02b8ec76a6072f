package e2e

import (
	"bytes"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/memcgate/memcgate/test/memcachedtest"
)

// TestHeadSendsNoValue: a HEAD answers with the headers a GET sends, but
// memcached never sends the value (mg <key> s f c): a client cannot make
// memcached send a megabyte for a hundred-byte request. Items whose
// headers depend on their bytes are read whole and still answer right:
// a value in chunks, and a compressed value of the php codec.
func TestHeadSendsNoValue(t *testing.T) {
	mc := memcachedtest.Start(t, "-m", "256")
	raw := startGateway(t, map[string]string{"MEMCGATE_SERVERS": mc.Addr, "MEMCGATE_BIG_VALUE_MAX_BYTES": strconv.Itoa(8 << 20)})
	php := startGateway(t, map[string]string{"MEMCGATE_SERVERS": mc.Addr, "MEMCGATE_VALUE_CODEC": "php"})
	random := make([]byte, 512<<10)
	rand.NewChaCha8([32]byte{7}).Read(random)
	compressible := bytes.Repeat([]byte("abcdefgh"), 64<<10)

	written := func() int { t.Helper(); return memcachedtest.SumStat(t, "bytes_written", mc) }
	same := func(what string, head, get response) {
		t.Helper()
		if head.status != get.status || head.body != "" {
			t.Errorf("%s: HEAD = %d with %d bytes, GET = %d", what, head.status, len(head.body), get.status)
		}
		for _, h := range []string{"Content-Length", "Etag", "X-Memcached-Flags", "Content-Type", "X-Php-Type", "Content-Range"} {
			if head.header.Get(h) != get.header.Get(h) {
				t.Errorf("%s: HEAD %s = %q, GET's = %q", what, h, head.header.Get(h), get.header.Get(h))
			}
		}
	}

	if r := raw.do("PUT", "/v?flags=3", random); r.status != 201 {
		t.Fatalf("PUT = %d %q", r.status, r.body)
	}
	get := raw.do("GET", "/v", nil)
	etag := get.header.Get("Etag")
	memcGet := raw.do("GET", "/memc?key=v", nil)
	if memcGet.status != 200 || len(memcGet.body) != len(random) {
		t.Fatalf("GET /memc?key=v = %d with %d bytes, want the value", memcGet.status, len(memcGet.body))
	}
	before := written()
	const heads = 20
	for range heads {
		same("HEAD /v", raw.do("HEAD", "/v", nil), get)
	}
	// Range is for GET alone (RFC 9110 §14.2): a HEAD answers the whole.
	same("HEAD /v with Range", raw.do("HEAD", "/v", nil, "Range", "bytes=0-0"), get)
	same("HEAD /v with a Range past the end", raw.do("HEAD", "/v", nil, "Range", "bytes=600000-"), get)
	if r := raw.do("HEAD", "/v", nil, "If-None-Match", etag); r.status != 304 {
		t.Errorf("HEAD with If-None-Match: its ETag = %d, want 304", r.status)
	}
	if r := raw.do("HEAD", "/absent", nil); r.status != 404 {
		t.Errorf("HEAD /absent = %d, want 404", r.status)
	}
	// The HttpMemc endpoint's HEAD too.
	same("HEAD /memc?key=v", raw.do("HEAD", "/memc?key=v", nil), memcGet)
	// Each HEAD costs memcached a line of a few dozen bytes, not the
	// value; the rest is the stats reply and health probes.
	if n := written() - before; n > 64<<10 {
		t.Errorf("memcached wrote %d bytes for %d HEADs of a %d-byte value, want a few lines each", n, heads+5, len(random))
	}

	// With values in chunks on, a touch, an append or a delete asks
	// whether the item is an index by its flags and size, not by its
	// value.
	before = written()
	if r := raw.do("POST", "/v?op=touch&exptime=600", nil); r.status != 204 {
		t.Fatalf("touch = %d %q", r.status, r.body)
	}
	if r := raw.do("POST", "/v?op=append", []byte("!")); r.status != 204 && r.status != 201 {
		t.Fatalf("append = %d %q", r.status, r.body)
	}
	if r := raw.do("DELETE", "/v", nil); r.status != 204 {
		t.Fatalf("DELETE = %d %q", r.status, r.body)
	}
	if n := written() - before; n > 64<<10 {
		t.Errorf("memcached wrote %d bytes for a touch, an append and a delete of a %d-byte value, want a few lines", n, len(random))
	}

	// A value in chunks: its size is its index's.
	big := bytes.Repeat(random, 6) // 3 MiB: chunks of 1 MiB
	if r := raw.do("PUT", "/big", big); r.status != 201 {
		t.Fatalf("PUT 3 MiB = %d %q", r.status, r.body)
	}
	same("HEAD of a value in chunks", raw.do("HEAD", "/big", nil), raw.do("GET", "/big", nil))
	if r := raw.do("POST", "/big?op=append", []byte("!")); r.status != 409 {
		t.Errorf("append to a value in chunks = %d %q, want 409", r.status, r.body)
	}
	if r := raw.do("DELETE", "/big", nil); r.status != 204 {
		t.Errorf("DELETE of a value in chunks = %d %q", r.status, r.body)
	}
	if r := raw.do("GET", "/big", nil); r.status != 404 {
		t.Errorf("GET after its DELETE = %d, want 404", r.status)
	}

	// The php codec: an incompressible string is stored as it is and
	// answered from its size; a compressed one is read and decompressed.
	for name, v := range map[string][]byte{"/plain": random, "/compressed": compressible} {
		if r := php.do("PUT", name, v); r.status != 201 {
			t.Fatalf("PUT %s through the php codec = %d %q", name, r.status, r.body)
		}
		get := php.do("GET", name, nil)
		if get.header.Get("Content-Length") != strconv.Itoa(len(v)) {
			t.Fatalf("GET %s: Content-Length %q, want %d", name, get.header.Get("Content-Length"), len(v))
		}
		same("php HEAD "+name, php.do("HEAD", name, nil), get)
	}
}
