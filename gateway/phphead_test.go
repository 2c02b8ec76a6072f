package gateway

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"net/http"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/gateway/budget"
	"github.com/memcgate/memcgate/gateway/phpvalue"
	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream"
	"github.com/memcgate/memcgate/upstream/op"
)

// TestCompressedHeadNotModifiedRange: under the php codec, a HEAD, a 304
// and a Range of a compressed value answer the headers a GET of it does,
// over a real memcached; the HEAD (from the value's length prefix) and
// the 304s (from its CAS) without inflating it, so that a small request
// for a megabyte of zeros stored in 4 KB costs what the 4 KB cost. Items
// whose GET is an error answer HEAD with the same error.
func TestCompressedHeadNotModifiedRange(t *testing.T) {
	mc := memcachedtest.Start(t)
	reg := prometheus.NewRegistry()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	c, err := upstream.New(upstream.Options{Servers: []upstream.Server{{Host: "127.0.0.1", Port: mc.Port}}, PipelineConns: 2, Timeout: time.Second}, log, reg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	h := NewHandler(c, log, reg, Options{MaxValueBytes: 1 << 20, Codec: CodecPHP, Budget: budget.New(64 << 20)})

	zeros := make([]byte, 1<<20)
	fastlz, fastlzFlags := phpvalue.Encode(zeros, phpvalue.EncodeOptions{})
	zlib, zlibFlags := phpvalue.Encode(zeros, phpvalue.EncodeOptions{Compression: phpvalue.CompressZlib})
	json, jsonFlags := phpvalue.Encode(bytes.Repeat([]byte(`{"a":1},`), 1<<15), phpvalue.EncodeOptions{UserFlags: 7})
	jsonFlags |= uint32(phpvalue.JSON)
	// A length prefix past codec.maxDecoded (64 × MaxValueBytes).
	huge := binary.LittleEndian.AppendUint32(nil, 100<<20)
	huge = append(huge, fastlz[4:]...)
	// A prefix the data does not decode to: HEAD does not read the data.
	corrupt := binary.LittleEndian.AppendUint32(nil, 5000)
	corrupt = append(corrupt, "not fastlz at all"...)
	for _, it := range []op.Item{
		{Key: "fastlz", Value: fastlz, Flags: fastlzFlags},
		{Key: "zlib", Value: zlib, Flags: zlibFlags},
		{Key: "json", Value: json, Flags: jsonFlags},
		{Key: "huge", Value: huge, Flags: fastlzFlags},
		{Key: "corrupt", Value: corrupt, Flags: fastlzFlags},
	} {
		if res := c.Do(context.Background(), op.Op{Verb: op.Set, Item: it}); res.Err != nil {
			t.Fatalf("set %s: %v", it.Key, res.Err)
		}
	}
	if w := do(h, "PUT", "/put", string(zeros)); w.Code != http.StatusCreated {
		t.Fatalf("PUT = %d %s", w.Code, w.Body)
	}
	if res := c.Do(context.Background(), op.Op{Verb: op.Get, Item: op.Item{Key: "put"}}); res.Err != nil || !phpvalue.Compressed(res.Item.Flags) || len(res.Item.Value) > 8<<10 {
		t.Fatalf("the PUT stored %d bytes with flags %#x (%v), want a compressed value", len(res.Item.Value), res.Item.Flags, res.Err)
	}

	headers := []string{"Content-Length", "Etag", "X-Memcached-Flags", "Content-Type", "X-Php-Type", "Content-Range"}
	same := func(t *testing.T, what string, got, want http.Header) {
		t.Helper()
		for _, k := range headers {
			if got.Get(k) != want.Get(k) {
				t.Errorf("%s: %s = %q, GET's = %q", what, k, got.Get(k), want.Get(k))
			}
		}
	}
	// allocated is what running f allocated, in bytes.
	allocated := func(f func()) uint64 {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		f()
		runtime.ReadMemStats(&after)
		return after.TotalAlloc - before.TotalAlloc
	}
	const reps = 20
	for _, tt := range []struct {
		key        string
		size       int // the decompressed length; 0: GET is an error
		wantStatus int // GET's
		headStatus int // HEAD's, when not GET's
	}{
		{"fastlz", 1 << 20, 200, 0},
		{"zlib", 1 << 20, 200, 0},
		{"json", 8 << 15, 200, 0},
		{"put", 1 << 20, 200, 0},
		{"huge", 0, http.StatusBadGateway, 0},
		// The documented exception: HEAD reads the prefix, not the data.
		{"corrupt", 0, http.StatusBadGateway, http.StatusOK},
	} {
		t.Run(tt.key, func(t *testing.T) {
			path := "/" + tt.key
			get := do(h, "GET", path, "")
			if get.Code != tt.wantStatus || (tt.size > 0 && get.Body.Len() != tt.size) {
				t.Fatalf("GET = %d with %d bytes, want %d with %d", get.Code, get.Body.Len(), tt.wantStatus, tt.size)
			}
			head := do(h, "HEAD", path, "")
			if tt.headStatus != 0 {
				if head.Code != tt.headStatus || head.Header().Get("Content-Length") != "5000" {
					t.Errorf("HEAD = %d, Content-Length %q; want %d, 5000 (from the prefix)", head.Code, head.Header().Get("Content-Length"), tt.headStatus)
				}
				return
			}
			// (the recorder keeps an error's body, which a server drops)
			if head.Code != get.Code || (head.Code == 200 && head.Body.Len() != 0) {
				t.Fatalf("HEAD = %d with %d bytes, GET = %d", head.Code, head.Body.Len(), get.Code)
			}
			if get.Code != 200 {
				return
			}
			same(t, "HEAD", head.Header(), get.Header())
			etag := get.Header().Get("Etag")
			for _, method := range []string{"GET", "HEAD"} {
				nm := do(h, method, path, "", "If-None-Match", `"0", `+etag)
				if nm.Code != http.StatusNotModified || nm.Header().Get("Etag") != etag || nm.Header().Get("X-Memcached-Flags") != get.Header().Get("X-Memcached-Flags") {
					t.Errorf("%s with If-None-Match %s = %d, ETag %q, flags %q; want 304 with GET's", method, etag, nm.Code, nm.Header().Get("Etag"), nm.Header().Get("X-Memcached-Flags"))
				}
			}
			for _, rg := range []struct{ hdr, body, contentRange string }{
				{"bytes=0-0", "1", "bytes 0-0/" + strconv.Itoa(tt.size)},
				{"bytes=-1", "1", "bytes " + strconv.Itoa(tt.size-1) + "-" + strconv.Itoa(tt.size-1) + "/" + strconv.Itoa(tt.size)},
			} {
				w := do(h, "GET", path, "", "Range", rg.hdr)
				if w.Code != http.StatusPartialContent || strconv.Itoa(w.Body.Len()) != rg.body || w.Header().Get("Content-Range") != rg.contentRange {
					t.Errorf("Range %s = %d with %d bytes, Content-Range %q; want 206, %s byte, %q", rg.hdr, w.Code, w.Body.Len(), w.Header().Get("Content-Range"), rg.body, rg.contentRange)
				}
				// A HEAD ignores Range (RFC 9110 §14.2): GET's whole headers.
				same(t, "HEAD with Range "+rg.hdr, do(h, "HEAD", path, "", "Range", rg.hdr).Header(), get.Header())
			}

			// Inflating once allocates the decompressed length; none of
			// these may, reps times over.
			for _, req := range []struct {
				method string
				hdr    []string
			}{
				{"HEAD", nil},
				{"GET", []string{"If-None-Match", etag}},
				{"HEAD", []string{"If-None-Match", etag}},
			} {
				n := allocated(func() {
					for range reps {
						do(h, req.method, path, "", req.hdr...)
					}
				})
				if n > uint64(reps*tt.size/4) {
					t.Errorf("%d × %s %v allocated %d bytes, as if it inflated the %d-byte value", reps, req.method, req.hdr, n, tt.size)
				}
			}
		})
	}
}
