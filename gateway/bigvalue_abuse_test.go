package gateway

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/memcgate/memcgate/gateway/chunk"
	"github.com/memcgate/memcgate/test/slowreader"
	"github.com/memcgate/memcgate/upstream"
	"github.com/memcgate/memcgate/upstream/op"
)

// Values in chunks against a hostile or broken memcached: index items
// written there directly, chunks that do not match, readers that do not
// read. What a client gets must never look like a whole value when it is
// not: an error status before the headers, or a connection closed short
// of the Content-Length it was sent.

// TestBigValueForgedIndex: index items written to memcached by something
// other than the gateway, malformed or naming chunks that are not
// there, are answered with a status before any byte (502 for an index
// that cannot be one, 404 for a value whose chunks are not there, the
// index then dropped), or cut short once the bytes that are the value's
// run out. None makes the gateway hold more than the budget allows.
func TestBigValueForgedIndex(t *testing.T) {
	g := newBigRig(t, nil)
	const size = 5*rigChunk + 17 // 6 chunks, the last of 17 bytes
	v := value(size, "real")
	g.mustPut("/other", v)
	other := g.index("other")
	set := func(key string, flags uint32, b []byte) {
		t.Helper()
		if res := g.cluster.Do(t.Context(), op.Op{Verb: op.Set, Item: op.Item{Key: key, Value: b, Flags: flags}}); res.Err != nil {
			t.Fatal(res.Err)
		}
	}
	withFormat := func(x chunk.Index, format byte) []byte {
		b := x.Encode()
		b[4] = format
		return b
	}
	tests := []struct {
		name    string
		real    bool                                  // the key holds v, in chunks, before forge
		forge   func(real chunk.Index) (index []byte) // the index then written under the key
		status  int
		body    string // a prefix of the error body
		sent    int    // bytes of v sent before the connection closed; -1: none expected
		dropped bool   // the index is gone after the read
	}{
		{name: "index of 5 bytes", forge: func(chunk.Index) []byte { return []byte("MGCX\x01") },
			status: 502, body: "stored value cannot be decoded: chunk: the index is corrupt: 5 bytes", sent: -1},
		{name: "unknown format", forge: func(chunk.Index) []byte { return withFormat(chunk.Index{Version: 1, Size: 10, ChunkSize: 5}, 9) },
			status: 502, body: "stored value cannot be decoded: chunk: the index is corrupt: 29 bytes, format 9", sent: -1},
		{name: "prepended to", real: true, forge: func(x chunk.Index) []byte { return append([]byte("P"), x.Encode()...) },
			status: 502, body: "stored value cannot be decoded: chunk: the index is corrupt: 1 bytes before its marker", sent: -1},
		{name: "chunk size zero", forge: func(chunk.Index) []byte { return chunk.Index{Version: 1, Size: 10}.Encode() },
			status: 502, body: "stored value cannot be decoded: chunk: the index is corrupt: 10 bytes in chunks of 0", sent: -1},
		{name: "chunk size over the largest", forge: func(chunk.Index) []byte {
			return chunk.Index{Version: 1, Size: 1 << 30, ChunkSize: chunk.MaxChunkSize + 1}.Encode()
		}, status: 502, body: "stored value cannot be decoded: chunk: the index is corrupt", sent: -1},
		{name: "more chunks than the most", forge: func(chunk.Index) []byte {
			return chunk.Index{Version: 1, Size: rigChunk*chunk.MaxChunks + 1, ChunkSize: rigChunk}.Encode()
		}, status: 502, body: "stored value cannot be decoded: chunk: the index is corrupt", sent: -1},
		{name: "the most chunks, none there", forge: func(chunk.Index) []byte {
			return chunk.Index{Version: 77, Size: rigChunk * chunk.MaxChunks, ChunkSize: rigChunk}.Encode()
		}, status: 404, body: "not found (a chunk of the value was gone)", sent: -1, dropped: true},
		{name: "chunks larger than the budget holds", forge: func(chunk.Index) []byte {
			return chunk.Index{Version: 77, Size: 4 * chunk.MaxChunkSize, ChunkSize: chunk.MaxChunkSize}.Encode()
		}, status: 503, body: "", sent: -1},
		{name: "another key's version", forge: func(chunk.Index) []byte { return other.Encode() },
			status: 404, sent: -1, dropped: true},
		{name: "another chunk size", real: true, forge: func(x chunk.Index) []byte {
			x.ChunkSize = rigChunk / 2
			return x.Encode()
		}, status: 404, sent: -1, dropped: true},
		{name: "longer than its chunks", real: true, forge: func(x chunk.Index) []byte {
			x.Size = 8 * rigChunk
			return x.Encode()
		}, status: 200, sent: 5 * rigChunk, dropped: true},
		{name: "shorter than its chunks", real: true, forge: func(x chunk.Index) []byte {
			x.Size = 4*rigChunk + rigChunk/2
			return x.Encode()
		}, status: 200, sent: 4 * rigChunk, dropped: true},
		{name: "empty", forge: func(chunk.Index) []byte { return chunk.Index{Version: 3, ChunkSize: rigChunk}.Encode() },
			status: 200, sent: 0},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := "forged" + strconv.Itoa(i)
			var x chunk.Index
			if tt.real {
				g.mustPut("/"+key, v)
				x = g.index(key)
			}
			set(key, chunk.IndexFlags, tt.forge(x))
			a := g.do("GET", "/"+key, nil)
			if a.status != tt.status {
				t.Fatalf("GET = %d %q, want %d", a.status, a.body, tt.status)
			}
			switch {
			case tt.sent < 0:
				if a.err != nil || !strings.HasPrefix(string(a.body), tt.body) {
					t.Errorf("GET = %d %q (%v), want a body starting %q", a.status, a.body, a.err, tt.body)
				}
			case tt.sent == 0:
				if a.err != nil || len(a.body) != 0 || a.hdr.Get("Content-Length") != "0" {
					t.Errorf("GET = %d, %d bytes, Content-Length %q (%v), want an empty value", a.status, len(a.body), a.hdr.Get("Content-Length"), a.err)
				}
			default:
				if !errors.Is(a.err, io.ErrUnexpectedEOF) || len(a.body) != tt.sent || !bytes.Equal(a.body, v[:tt.sent]) {
					t.Errorf("GET sent %d bytes (%v), want the value's first %d and the connection closed", len(a.body), a.err, tt.sent)
				}
			}
			_, err := g.item(key)
			if dropped := errors.Is(err, upstream.ErrNotFound); dropped != tt.dropped {
				t.Errorf("index dropped: %v (%v), want %v", dropped, err, tt.dropped)
			}
			if used := g.budget.Used(); used != 0 {
				t.Errorf("%d bytes of the budget held after the read", used)
			}
		})
	}
	if a := g.do("GET", "/other", nil); a.status != 200 || !bytes.Equal(a.body, v) {
		t.Errorf("GET of the value whose version was forged elsewhere = %d, %d bytes; want it whole", a.status, len(a.body))
	}
}

// TestBigValueForgedCount: an index that claims the most chunks an index
// may have, none of which exist, costs touch and DELETE one chunk
// operation each, not one per chunk claimed (2^24 round trips).
func TestBigValueForgedCount(t *testing.T) {
	g := newBigRig(t, nil)
	forged := chunk.Index{Version: 5, Size: rigChunk * chunk.MaxChunks, ChunkSize: rigChunk}.Encode()
	tests := []struct {
		method, target string
		status         int
	}{
		{"POST", "/huge?op=touch&exptime=60", 204},
		{"GET", "/huge?touch=60", 404}, // the first chunk is gone: the value is lost
		{"DELETE", "/huge", 204},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.target, func(t *testing.T) {
			if res := g.cluster.Do(t.Context(), op.Op{Verb: op.Set, Item: op.Item{Key: "huge", Value: forged, Flags: chunk.IndexFlags}}); res.Err != nil {
				t.Fatal(res.Err)
			}
			start := time.Now()
			if a := g.do(tt.method, tt.target, nil); a.status != tt.status {
				t.Errorf("%s %s = %d %q, want %d", tt.method, tt.target, a.status, a.body, tt.status)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("%s %s took %v: a chunk operation per chunk claimed?", tt.method, tt.target, d)
			}
		})
	}
}

// TestBigValueCutShort: a chunk gone in the middle of a response, whose
// Content-Length is sent, closes the connection on both servers: the
// client reads fewer bytes than announced and an error, and a request
// pipelined behind it is never answered, so no reply can be taken for
// the rest of the value.
func TestBigValueCutShort(t *testing.T) {
	g := newBigRig(t, nil)
	v := value(5*rigChunk+17, "cut")
	g.mustPut("/small", []byte("small"))
	tests := []struct {
		name string
		addr string
	}{
		{name: "net/http", addr: strings.TrimPrefix(g.url, "http://")},
		{name: "h1", addr: g.serveH1()},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := "cut" + strconv.Itoa(i)
			g.mustPut("/"+key, v)
			x := g.index(key)
			if res := g.cluster.Do(t.Context(), op.Op{Verb: op.Delete, Item: op.Item{Key: chunk.Key(key, x.Version, 3)}, HashKey: key}); res.Err != nil {
				t.Fatal(res.Err)
			}
			c, err := net.Dial("tcp", tt.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			fmt.Fprintf(c, "GET /%s HTTP/1.1\r\nHost: x\r\n\r\nGET /small HTTP/1.1\r\nHost: x\r\n\r\n", key)
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(resp.Body)
			if resp.StatusCode != 200 || resp.ContentLength != int64(len(v)) || !errors.Is(err, io.ErrUnexpectedEOF) || !bytes.Equal(body, v[:3*rigChunk]) {
				t.Errorf("GET = %d, Content-Length %d, %d bytes (%v); want %d bytes of the value and the connection closed", resp.StatusCode, resp.ContentLength, len(body), err, 3*rigChunk)
			}
			if resp, err := http.ReadResponse(br, nil); err == nil {
				t.Errorf("the request pipelined behind it was answered %d: the connection stayed open", resp.StatusCode)
			} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Errorf("the connection stayed open (read: %v)", err)
			}
		})
	}
}

// TestBigValueSlowReader: a client that reads nothing for longer than the
// chunks' grace period is cut off once the chunks fetched before it
// passed are sent, never served chunks that may have been retired since;
// the gateway holds two chunks meanwhile and nothing after.
func TestBigValueSlowReader(t *testing.T) {
	const chunkSize = 256 << 10
	g := newBigRig(t, func(o *Options, _ *upstream.Cluster) { o.MaxValueBytes, o.BigValueMaxBytes = chunkSize, 64<<20 })
	v := value(16<<20, "slow") // more than loopback socket buffers take
	g.mustPut("/slow", v)
	tests := []struct {
		name string
		addr string
	}{
		{name: "net/http", addr: strings.TrimPrefix(g.url, "http://")},
		{name: "h1", addr: g.serveH1()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			aborted := g.counter("memcgate_chunked_reads_total", "result", "aborted")
			c := slowreader.Dial(t, tt.addr, 16<<10)
			fmt.Fprintf(c, "GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
			peak := int64(0)
			for deadline := time.Now().Add(rigGrace); time.Now().Before(deadline); { // the client reads nothing
				time.Sleep(20 * time.Millisecond)
				peak = max(peak, g.budget.Used())
			}
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(resp.Body)
			if resp.StatusCode != 200 || !errors.Is(err, io.ErrUnexpectedEOF) || len(body) >= len(v) || !bytes.Equal(body, v[:len(body)]) {
				t.Errorf("GET = %d, %d of %d bytes (%v); want a prefix of the value and the connection closed", resp.StatusCode, len(body), len(v), err)
			}
			t.Logf("%d of %d bytes sent before the grace period passed; budget held at most %d bytes", len(body), len(v), peak)
			if peak > 2*chunkSize+64<<10 {
				t.Errorf("budget held %d bytes while the client did not read, want at most two chunks (%d)", peak, 2*chunkSize)
			}
			waitFor(t, "the read to end", func() bool {
				return g.counter("memcgate_chunked_reads_total", "result", "aborted") == aborted+1 && g.budget.Used() == 0
			})
		})
	}
}
