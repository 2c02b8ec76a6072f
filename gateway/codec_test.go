package gateway

import (
	"bytes"
	"compress/zlib"
	"encoding/binary"
	"io"
	"log/slog"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/gateway/budget"
	"github.com/memcgate/memcgate/upstream/op"
)

func zlibStream(t *testing.T, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := zlib.NewWriter(&buf)
	if _, err := w.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestCodecGet serves items stored by each PHP extension through the codec
// made for it; the real extensions are exercised by the e2e tests.
func TestCodecGet(t *testing.T) {
	big := strings.Repeat("pecl/memcache text ", 200) // within 64 × MaxValueBytes
	tests := []struct {
		name                  string
		codec                 ValueCodec
		item                  op.Item
		wantStatus            int
		wantBody, wantPHPType string
		wantContentType       string
	}{
		{"raw ignores flags", CodecRaw, op.Item{Value: []byte("42"), Flags: 0x300}, 200, "42", "", "application/octet-stream"},
		{"php long", CodecPHP, op.Item{Value: []byte("42"), Flags: 1}, 200, "42", "long", "text/plain; charset=utf-8"},
		{"pecl string", CodecPeclMemcache, op.Item{Value: []byte("héllo")}, 200, "héllo", "string", "application/octet-stream"},
		{"pecl long", CodecPeclMemcache, op.Item{Value: []byte("-7"), Flags: 0x300}, 200, "-7", "long", "text/plain; charset=utf-8"},
		{"pecl double", CodecPeclMemcache, op.Item{Value: []byte("1.0e+100"), Flags: 0x700}, 200, "1.0e+100", "double", "text/plain; charset=utf-8"},
		{"pecl true", CodecPeclMemcache, op.Item{Value: []byte("1"), Flags: 0x100}, 200, "true", "bool", "text/plain; charset=utf-8"},
		{"pecl false", CodecPeclMemcache, op.Item{Value: []byte("0"), Flags: 0x100}, 200, "false", "bool", "text/plain; charset=utf-8"},
		{"pecl serialized", CodecPeclMemcache, op.Item{Value: []byte(`a:1:{i:0;i:1;}`), Flags: 0x1}, 200, `a:1:{i:0;i:1;}`, "serialized", "application/vnd.php.serialized"},
		{"pecl compressed", CodecPeclMemcache, op.Item{Value: zlibStream(t, []byte(big)), Flags: 0x10002}, 200, big, "string", "application/octet-stream"},
		{"pecl corrupt", CodecPeclMemcache, op.Item{Value: []byte("not zlib"), Flags: 0x2}, 502, "stored value cannot be decoded", "", ""},
		// 64-byte values, 64× that decompressed at most.
		{"pecl bomb", CodecPeclMemcache, op.Item{Value: zlibStream(t, make([]byte, 64*64+1)), Flags: 0x2}, 502, "stored value cannot be decoded: phpvalue: value too large", "", ""},
		// A php-memcached value read as pecl/memcache's: 0x10 is no flag there.
		{"pecl reads php-memcached compressed as string", CodecPeclMemcache, op.Item{Value: []byte("xyz"), Flags: 0x50}, 200, "xyz", "string", "application/octet-stream"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fake := newFake()
			tt.item.Key = "k"
			fake.Put(tt.item)
			h := NewHandler(fake, slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry(),
				Options{MaxValueBytes: 64, Codec: tt.codec})
			w := do(h, "GET", "/k", "")
			if w.Code != tt.wantStatus || !strings.HasPrefix(w.Body.String(), tt.wantBody) {
				t.Fatalf("GET = %d %.60q, want %d %.60q", w.Code, w.Body.String(), tt.wantStatus, tt.wantBody)
			}
			if w.Code != 200 {
				return
			}
			if got := w.Header().Get("X-PHP-Type"); got != tt.wantPHPType {
				t.Errorf("X-PHP-Type = %q, want %q", got, tt.wantPHPType)
			}
			if got := w.Header().Get("Content-Type"); got != tt.wantContentType {
				t.Errorf("Content-Type = %q, want %q", got, tt.wantContentType)
			}
		})
	}
}

// TestCodecPut checks what each codec stores for a PUT.
func TestCodecPut(t *testing.T) {
	big := strings.Repeat("pecl/memcache text ", 2000) // 38,000 bytes
	tests := []struct {
		name       string
		codec      ValueCodec
		target     string
		body       string
		opts       Options
		wantStatus int
		wantFlags  uint32
		compressed bool // stored as a zlib stream
	}{
		{"raw keeps flags", CodecRaw, "/k?flags=70000", "v", Options{}, 201, 70000, false},
		{"pecl string", CodecPeclMemcache, "/k", "v", Options{}, 201, 0, false},
		{"pecl user flags", CodecPeclMemcache, "/k?flags=3", "v", Options{}, 201, 3 << 16, false},
		{"pecl flags too big", CodecPeclMemcache, "/k?flags=65536", "v", Options{}, 400, 0, false},
		{"pecl flags too big async", CodecPeclMemcache, "/k?flags=65536", "v", Options{}, 400, 0, false},
		{"pecl compressed from the threshold", CodecPeclMemcache, "/k?flags=1", big, Options{}, 201, 1<<16 | 2, true},
		{"pecl threshold raised", CodecPeclMemcache, "/k", big, Options{PeclMemcache: PeclMemcacheOptions{Threshold: 40000}}, 201, 0, false},
		{"pecl compression off", CodecPeclMemcache, "/k", big, Options{PeclMemcache: PeclMemcacheOptions{Threshold: -1}}, 201, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fake := newFake()
			opts := tt.opts
			opts.Codec, opts.MaxValueBytes = tt.codec, 1<<20
			h := NewHandler(fake, slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry(), opts)
			var hdr []string
			if strings.HasSuffix(tt.name, "async") {
				hdr = []string{"Prefer", "respond-async"}
			}
			w := do(h, "PUT", tt.target, tt.body, hdr...)
			if w.Code != tt.wantStatus {
				t.Fatalf("PUT %s = %d %q, want %d", tt.target, w.Code, w.Body.String(), tt.wantStatus)
			}
			if w.Code != 201 {
				return
			}
			it := fake.Items["k"]
			if it.Flags != tt.wantFlags {
				t.Errorf("stored flags = %#x, want %#x", it.Flags, tt.wantFlags)
			}
			if got := len(it.Value) > 1 && it.Value[0] == 0x78 && it.Value[1] == 0x9c; got != tt.compressed {
				t.Errorf("stored a zlib stream = %v, want %v (%d bytes stored)", got, tt.compressed, len(it.Value))
			}
			if !tt.compressed && string(it.Value) != tt.body {
				t.Errorf("stored %d bytes, want the %d-byte body as it is", len(it.Value), len(tt.body))
			}
			if tt.codec == CodecPeclMemcache {
				if got := do(h, "GET", "/k", ""); got.Code != 200 || got.Body.String() != tt.body {
					t.Errorf("GET after PUT = %d, %d bytes; want 200 with the body", got.Code, got.Body.Len())
				}
			}
		})
	}
}

// TestCompressedBombs: a compressed value that inflates past what the
// byte budget can hold is refused before it is inflated, for GET, HEAD,
// a multi-get and a batch, under both PHP codecs; one that fits is
// served. A php-memcached value records its inflated length, so it is
// refused before anything is inflated; a pecl/memcache value does not, so
// it inflates until what it holds passes the budget. Either way the
// memory allocated is bounded by the budget, not by the bombs.
func TestCompressedBombs(t *testing.T) {
	const inflated = 8 << 20 // a budget of 4 MiB cannot hold it
	zeros := zlibStream(t, make([]byte, inflated))
	php := append(binary.LittleEndian.AppendUint32(nil, inflated), zeros...)
	small := zlibStream(t, make([]byte, 100<<10))
	for _, tt := range []struct {
		name       string
		codec      ValueCodec
		bomb, fits op.Item
		maxAlloc   uint64 // allocated in all while the bombs are refused
	}{
		{"php", CodecPHP, op.Item{Value: php, Flags: 0x30}, op.Item{Value: append(binary.LittleEndian.AppendUint32(nil, 100<<10), small...), Flags: 0x30}, 1 << 20},
		// Ten inflations, each stopped by the 4 MiB budget.
		{"pecl-memcache", CodecPeclMemcache, op.Item{Value: zeros, Flags: 0x2}, op.Item{Value: small, Flags: 0x2}, 10 * 4 << 20},
	} {
		t.Run(tt.name, func(t *testing.T) {
			fake := newFake()
			for i := range 4 {
				tt.bomb.Key = "bomb" + strconv.Itoa(i)
				fake.Put(tt.bomb)
			}
			tt.fits.Key = "fits"
			fake.Put(tt.fits)
			h := NewHandler(fake, slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry(),
				Options{MaxValueBytes: 1 << 20, Codec: tt.codec, Budget: budget.New(4 << 20)})
			if w := do(h, "GET", "/fits", ""); w.Code != 200 || w.Body.Len() != 100<<10 {
				t.Fatalf("GET of a value that fits = %d, %d bytes", w.Code, w.Body.Len())
			}
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			for _, req := range []struct{ method, target, body, want string }{
				{"GET", "/bomb0", "", "503"},
				{"HEAD", "/bomb0", "", "503"},
				{"GET", "/?key=bomb0&key=bomb1&key=bomb2&key=bomb3", "", `"status":503`},
				{"GET", "/?key=bomb0&key=bomb1&key=bomb2&key=bomb3&touch=60", "", `"status":503`},
				{"POST", "/", `[{"op":"get","key":"bomb0"},{"op":"get","key":"bomb1"},{"op":"gat","key":"bomb2","exptime":60}]`, `"status":503`},
			} {
				w := do(h, req.method, req.target, req.body)
				if got := strconv.Itoa(w.Code) + " " + w.Body.String(); !strings.Contains(got, req.want) || strings.Contains(got, `"status":200`) {
					t.Errorf("%s %s = %.200s, want %s for every bomb", req.method, req.target, got, req.want)
				}
			}
			runtime.ReadMemStats(&after)
			if n := after.TotalAlloc - before.TotalAlloc; n > tt.maxAlloc {
				t.Errorf("refusing the bombs allocated %d bytes, want at most %d", n, tt.maxAlloc)
			}
		})
	}
}
