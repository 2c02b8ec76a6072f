package gateway

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// slotWatch is a request body that reports, when a read of it begins
// with at bytes read, how many MaxRequests slots are held then.
type slotWatch struct {
	io.ReadCloser
	n, at int
	h     *Handler
	seen  chan int64
}

func (b *slotWatch) Read(p []byte) (int, error) {
	if b.n == b.at && b.seen != nil {
		b.seen <- b.h.RequestsInFlight()
		b.seen = nil
	}
	n, err := b.ReadCloser.Read(p)
	b.n += n
	return n, err
}

// TestBigPutWaitsWithoutSlot: a chunked PUT of a value that may be
// stored in chunks holds no in-flight slot (MaxRequests) while it waits
// for the client, wherever its client stops: after the head, after
// exactly a chunk's worth (where the byte after it tells a value that
// fits one item from a larger one: a client that sends its last chunk
// but not the end of the body waits there too), in its second chunk,
// in a chunk's size line, between a chunk's data and its CRLF, or
// after the last chunk without the final CRLF. A slot is taken only while a chunk goes to
// memcached, so that a client cannot hold the slots by sending a chunk
// and stopping (security.md, rule 3).
func TestBigPutWaitsWithoutSlot(t *testing.T) {
	chunk := func(n int) string { return fmt.Sprintf("%x\r\n%s\r\n", n, strings.Repeat("v", n)) }
	tests := []struct {
		name string
		sent string // the body sent before the client stops
		at   int    // the body bytes read when the handler waits for more
	}{
		{"after its head", "", 0},
		{"after a chunk's worth", chunk(rigChunk), rigChunk},
		{"in its second chunk", chunk(rigChunk + 10), rigChunk + 10},
		{"in a chunk's size line", "3", 0},
		{"after a chunk's data, before its CRLF", "a\r\n" + strings.Repeat("v", 10), 10},
		{"after a second chunk's data, before its CRLF", chunk(rigChunk) + "a\r\n" + strings.Repeat("v", 10), rigChunk + 10},
		// net/http's read that returns the data waits for the trailer.
		{"after the last chunk, before the final CRLF", chunk(10) + "0\r\n", 0},
		{"after the last chunk of a large value, before the final CRLF", chunk(rigChunk+10) + "0\r\n", 0},
	}
	g := newBigRig(t, nil)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			seen := make(chan int64, 1)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				r.Body = &slotWatch{ReadCloser: r.Body, at: tt.at, h: g.h, seen: seen}
				g.h.ServeHTTP(w, r)
			}))
			defer srv.Close()
			c, err := net.Dial("tcp", srv.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			io.WriteString(c, "PUT /slot HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"+tt.sent)
			select {
			case n := <-seen:
				if n != 0 {
					t.Errorf("waiting for the client after %d bytes of the body, the PUT holds %d in-flight slots, want 0", tt.at, n)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("the handler did not wait for the body after %d bytes", tt.at)
			}
		})
	}
}
