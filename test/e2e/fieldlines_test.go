package e2e

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/memcgate/memcgate/test/memcachedtest"
)

// TestFieldLinesOnEveryPath sends fields on several lines of one name,
// on the fast path and on net/http (MEMCGATE_FAST_PATH=false), each on
// one keep-alive connection. If-None-Match is a list, and its lines one
// list (RFC 9110 §5.3): the item's ETag on the second line answers 304
// as on the first. Range and If-Range are not lists, so two lines of
// either make a Range the server may ignore (RFC 9110 §14.2): the whole
// value, 200.
func TestFieldLinesOnEveryPath(t *testing.T) {
	mc := memcachedtest.Start(t)
	for _, fast := range []string{"true", "false"} {
		t.Run("FAST_PATH="+fast, func(t *testing.T) {
			g := startGateway(t, map[string]string{"MEMCGATE_SERVERS": mc.Addr, "MEMCGATE_FAST_PATH": fast})
			c, br := dialRaw(t, g.DataAddr)
			ask := func(req string) (int, string, http.Header) {
				t.Helper()
				if _, err := io.WriteString(c, req); err != nil {
					t.Fatal(err)
				}
				resp, err := http.ReadResponse(br, &http.Request{Method: strings.Fields(req)[0]})
				if err != nil {
					t.Fatalf("%q: %v", req, err)
				}
				body, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil {
					t.Fatalf("%q: %v", req, err)
				}
				return resp.StatusCode, string(body), resp.Header
			}
			if code, _, _ := ask("PUT /fl/k HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"); code != http.StatusCreated {
				t.Fatalf("PUT = %d, want 201", code)
			}
			_, _, h := ask("GET /fl/k HTTP/1.1\r\nHost: x\r\n\r\n")
			etag := h.Get("Etag")
			tests := []struct {
				name   string
				req    string
				status int
				body   string
			}{
				{"GET, the ETag on the second If-None-Match line", "GET /fl/k HTTP/1.1\r\nHost: x\r\nIf-None-Match: \"999991\"\r\nIf-None-Match: " + etag + "\r\n\r\n", 304, ""},
				{"HEAD, the ETag on the second If-None-Match line", "HEAD /fl/k HTTP/1.1\r\nHost: x\r\nIf-None-Match: \"999991\"\r\nIf-None-Match: W/" + etag + "\r\n\r\n", 304, ""},
				{"GET, If-None-Match lines naming other ETags", "GET /fl/k HTTP/1.1\r\nHost: x\r\nIf-None-Match: \"999991\"\r\nIf-None-Match: \"999992\"\r\n\r\n", 200, "hello"},
				{"one Range line", "GET /fl/k HTTP/1.1\r\nHost: x\r\nRange: bytes=1-2\r\n\r\n", 206, "el"},
				{"two Range lines", "GET /fl/k HTTP/1.1\r\nHost: x\r\nRange: bytes=0-0\r\nRange: bytes=1-2\r\n\r\n", 200, "hello"},
				{"two If-Range lines", "GET /fl/k HTTP/1.1\r\nHost: x\r\nRange: bytes=1-2\r\nIf-Range: " + etag + "\r\nIf-Range: " + etag + "\r\n\r\n", 200, "hello"},
			}
			for _, tt := range tests {
				if code, body, _ := ask(tt.req); code != tt.status || body != tt.body {
					t.Errorf("%s: %d %q, want %d %q", tt.name, code, body, tt.status, tt.body)
				}
			}
		})
	}
}
