package e2e

import (
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
