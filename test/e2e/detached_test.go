package e2e

import (
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/memcgate/memcgate/test/memcachedtest"
)

// TestDetachedResponsesMatch sends one sequence of requests, on one
// keepalive connection, to a gateway that answers GET, HEAD and plain PUT
// from memcached's reply (MEMCGATE_DETACHED_RESPONSES=true, the default)
// and to one that answers every request on its own goroutine (false),
// each on its own memcached. Every response (status, headers but Date and
// the ETag's value, body) must be the same, and so must the request
// counts by method and status. The sequence takes every turn that leaves
// the detached path: tokens refused, read-only scope, bad keys and
// queries, conditional and large PUTs, and other methods.
func TestDetachedResponsesMatch(t *testing.T) {
	big := strings.Repeat("0123456789", 2000) // over the pooled 16 KiB: the routed PUT, a large GET
	const rtok, wtok, atok = "Bearer r-3c1f9a77e0d4b2a6", "Bearer w-8d2e0b41c9f7a315", "Bearer a-5b9d0e2c7f1a4e88"
	seq := []struct{ method, path, token, extra, body string }{
		{"PUT", "/k1", wtok, "", "hello"},
		{"GET", "/k1", rtok, "", ""},
		{"HEAD", "/k1", rtok, "", ""},
		{"GET", "/k1", rtok, "If-None-Match: *\r\n", ""},
		{"GET", "/missing", rtok, "", ""},
		{"PUT", "/k2?exptime=100&flags=3", wtok, "", "with flags"},
		{"GET", "/k2?ignored=1", rtok, "", ""},
		{"PUT", "/k3?flags=abc", wtok, "", "x"},
		{"GET", "/bad%20key", rtok, "", ""},
		{"GET", "/" + strings.Repeat("k", 251), rtok, "", ""},
		{"GET", "/k1", "", "", ""},
		{"GET", "/k1", "Bearer nope", "", ""},
		{"PUT", "/k1", rtok, "", "read scope"},
		{"PUT", "/k1", wtok, "If-None-Match: *\r\n", "add"},
		{"PUT", "/k4", wtok, "If-None-Match: *\r\n", "add"},
		{"PUT", "/k5", wtok, "Prefer: respond-async\r\n", "later"},
		{"PUT", "/big", wtok, "", big},
		{"GET", "/big", rtok, "", ""},
		{"PUT", "/empty", wtok, "", ""},
		{"GET", "/empty", rtok, "", ""},
		{"DELETE", "/k1", wtok, "", ""},
		{"GET", "/k1", rtok, "", ""},
		{"POST", "/k2?op=append", wtok, "", "!"},
		{"GET", "/k2", rtok, "", ""},
		{"OPTIONS", "/k2", rtok, "", ""},
		{"GET", "/", rtok, "", ""},
	}
	etag := regexp.MustCompile(`^Etag: "\d+"$`)
	run := func(detached string) (resps []string, counts map[string]float64, detachedCount float64) {
		mc := memcachedtest.Start(t)
		g := startGateway(t, map[string]string{
			"MEMCGATE_SERVERS": mc.Addr, "MEMCGATE_DETACHED_RESPONSES": detached,
			"MEMCGATE_AUTH_TOKENS": "read:" + strings.TrimPrefix(rtok, "Bearer ") + ",read+write:" + strings.TrimPrefix(wtok, "Bearer ") + ",admin:" + strings.TrimPrefix(atok, "Bearer "),
		})
		c, br := dialRaw(t, g.DataAddr)
		for _, s := range seq {
			req := s.method + " " + s.path + " HTTP/1.1\r\nHost: x\r\n" + s.extra
			if s.token != "" {
				req += "Authorization: " + s.token + "\r\n"
			}
			if s.method == "PUT" || s.method == "POST" {
				req += fmt.Sprintf("Content-Length: %d\r\n", len(s.body))
			}
			if _, err := io.WriteString(c, req+"\r\n"+s.body); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(br, &http.Request{Method: s.method})
			if err != nil {
				t.Fatalf("%s %s: %v", s.method, s.path, err)
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				t.Fatalf("%s %s: body: %v", s.method, s.path, err)
			}
			var hdr []string
			for k, vs := range resp.Header {
				for _, v := range vs {
					if line := k + ": " + v; k != "Date" {
						hdr = append(hdr, etag.ReplaceAllString(line, `Etag: "<cas>"`))
					}
				}
			}
			slices.Sort(hdr)
			resps = append(resps, fmt.Sprintf("%s %s -> %s\n%s\n%q", s.method, s.path, resp.Status, strings.Join(hdr, "\n"), body))
		}
		mreq, _ := http.NewRequest("GET", g.Admin+"/metrics", nil)
		mreq.Header.Set("Authorization", atok)
		mresp, err := http.DefaultClient.Do(mreq)
		if err != nil {
			t.Fatal(err)
		}
		raw, err := io.ReadAll(mresp.Body)
		mresp.Body.Close()
		if err != nil || mresp.StatusCode != http.StatusOK {
			t.Fatalf("metrics: %s %v", mresp.Status, err)
		}
		text := string(raw)
		counts = map[string]float64{}
		for _, line := range strings.Split(text, "\n") {
			var v float64
			if strings.HasPrefix(line, "memcgate_http_requests_total{") {
				i := strings.LastIndexByte(line, ' ')
				fmt.Sscan(line[i+1:], &v)
				counts[line[:i]] = v
			}
			if strings.HasPrefix(line, "memcgate_http_detached_responses_total ") {
				fmt.Sscan(strings.Fields(line)[1], &detachedCount)
			}
		}
		return resps, counts, detachedCount
	}
	on, onCounts, onDetached := run("true")
	off, offCounts, offDetached := run("false")
	for i := range seq {
		if on[i] != off[i] {
			t.Errorf("request %d differs:\ndetached:\n%s\nrouted:\n%s", i, on[i], off[i])
		}
	}
	if fmt.Sprint(onCounts) != fmt.Sprint(offCounts) {
		t.Errorf("request counts differ:\ndetached: %v\nrouted:   %v", onCounts, offCounts)
	}
	// Detached: GET k1, GET If-None-Match, GET missing, PUT k2, GET k2,
	// GET big, PUT empty, GET empty, GET k1 after DELETE, GET k2. Not the
	// first PUT: no connection to memcached is open yet, and detached
	// requests never dial, so it waits in place and dials. Not the HEAD:
	// an mg (op.Head) is routed, where a node without meta commands
	// falls back to a get.
	if onDetached != 10 || offDetached != 0 {
		t.Errorf("detached responses = %v with the default and %v with false, want 10 and 0", onDetached, offDetached)
	}
	t.Logf("%d responses identical; %v detached", len(seq), onDetached)
}
