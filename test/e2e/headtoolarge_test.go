package e2e

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/memcgate/memcgate/test/memcachedtest"
)

// TestHeadTooLargeNamesItsVariable: a request head over
// MEMCGATE_MAX_HEADER_BYTES (and the 4096 bytes net/http reads beyond
// it), in its header fields or its URL, is answered 431 with a body that
// names the variable, as a 413 names its own, on the fast path (which
// hands such a head to net/http) and with MEMCGATE_FAST_PATH=false.
func TestHeadTooLargeNamesItsVariable(t *testing.T) {
	mc := memcachedtest.Start(t)
	heads := []struct{ name, raw string }{
		{"header fields", "GET /k HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("b", 6000) + "\r\n\r\n"},
		{"URL", "GET /" + strings.Repeat("k", 6000) + " HTTP/1.1\r\nHost: x\r\n\r\n"},
	}
	for _, fast := range []string{"true", "false"} {
		t.Run("FAST_PATH="+fast, func(t *testing.T) {
			g := startGateway(t, map[string]string{"MEMCGATE_SERVERS": mc.Addr, "MEMCGATE_FAST_PATH": fast, "MEMCGATE_MAX_HEADER_BYTES": "1024"})
			for _, hd := range heads {
				c, br := dialRaw(t, g.DataAddr)
				if _, err := io.WriteString(c, hd.raw); err != nil {
					t.Fatal(err)
				}
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatalf("%s: %v", hd.name, err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge || !strings.Contains(string(body), "MEMCGATE_MAX_HEADER_BYTES=1024") {
					t.Errorf("%s over the limit: %d %q, want 431 naming MEMCGATE_MAX_HEADER_BYTES=1024", hd.name, resp.StatusCode, body)
				}
			}
		})
	}
}

// TestStoredValueLikeNetHTTPs431: a value whose bytes are net/http's own
// 431 answer, read back over a connection net/http serves through h1's
// guard, comes back as stored. net/http's buffered writer sends a
// response's last bytes in a Write of their own, so a client that pads
// the value can make that Write exactly net/http's 431; the guard, which
// rewrote every such Write, sent its longer answer in its place: a body
// not the value, with bytes past the Content-Length that a keep-alive
// client reads as a second answer.
func TestStoredValueLikeNetHTTPs431(t *testing.T) {
	mc := memcachedtest.Start(t)
	g := startGateway(t, map[string]string{"MEMCGATE_SERVERS": mc.Addr, "MEMCGATE_FAST_PATH": "false", "MEMCGATE_MAX_HEADER_BYTES": "1024"})
	const net431 = "HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n431 Request Header Fields Too Large"
	c, br := dialRaw(t, g.DataAddr)
	// The response head is some 150 bytes: some padding puts the value's
	// tail alone in the last Write of net/http's 4096-byte buffer.
	for pad := 3700; pad <= 4096; pad++ {
		val := strings.Repeat("p", pad) + net431
		req := fmt.Sprintf("PUT /v431 HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%sGET /v431 HTTP/1.1\r\nHost: x\r\n\r\n", len(val), val)
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatal(err)
		}
		for i, want := range []int{http.StatusCreated, http.StatusOK} {
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("padding %d, answer %d: %v", pad, i, err)
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || resp.StatusCode != want && !(i == 0 && resp.StatusCode == http.StatusNoContent) {
				t.Fatalf("padding %d, answer %d: %d %v", pad, i, resp.StatusCode, err)
			}
			if i == 1 && string(body) != val {
				t.Fatalf("padding %d: GET answered a body of %d bytes ending %q, want the %d bytes stored", pad, len(body), body[max(0, len(body)-60):], len(val))
			}
		}
	}
}
