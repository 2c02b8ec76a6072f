package memc

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/memcgate/memcgate/upstream"
)

// nginxPage is the body of the nginx error page memcgate answers with:
// the status in the title and heading, memcgate and the reason in the
// footer.
func nginxPage(title, reason string) string {
	return "<html>\r\n<head><title>" + title + "</title></head>\r\n<body>\r\n<center><h1>" + title +
		"</h1></center>\r\n<hr><center>memcgate: " + reason + "</center>\r\n</body>\r\n</html>\r\n"
}

// TestRefusalAnswer pins the whole answer (status, body, headers) to a
// request refused for each kind: the checks name a kind, and memcFailure
// is the only place a kind becomes an answer, so a change here changes
// what clients of the module see.
func TestRefusalAnswer(t *testing.T) {
	const reason = "why <it> was refused" // escaped on a page
	page := func(title string) string { return nginxPage(title, "why &lt;it&gt; was refused") }
	tests := []struct {
		name   string
		kind   checkKind
		cmd    memcCmd
		cause  error // kindBody: the read's error
		status int
		body   string
		header map[string]string // the headers beyond Content-Type and Content-Length the answer carries
	}{
		{name: "path", kind: kindPath, status: 400, body: page("400 Bad Request"), header: map[string]string{"Connection": "close"}},
		{name: "no location", kind: kindNoLocation, status: 404, body: page("404 Not Found")},
		{name: "too large", kind: kindTooLarge, status: 413, body: page("413 Request Entity Too Large"), header: map[string]string{"Connection": "close"}},
		{name: "no token", kind: kindNoToken, status: 401, body: page("401 Unauthorized"), header: map[string]string{"WWW-Authenticate": `Bearer realm="memcgate"`}},
		{name: "command", kind: kindCommand, status: 400, body: page("400 Bad Request"), header: map[string]string{"Connection": "close"}},
		{name: "not allowed", kind: kindNotAllowed, cmd: memcFlushAll, status: 403, body: page("403 Forbidden")},
		{name: "no scope", kind: kindNoScope, cmd: memcSet, status: 403, body: page("403 Forbidden")},
		{name: "other site", kind: kindOtherSite, cmd: memcSet, status: 403, body: page("403 Forbidden")},
		{name: "read-only", kind: kindReadOnly, cmd: memcSet, status: 403, body: page("403 Forbidden")},
		{name: "argument", kind: kindArgument, cmd: memcSet, status: 400, body: page("400 Bad Request"), header: map[string]string{"Connection": "close"}},
		{
			name: "body", kind: kindBody, cmd: memcSet, cause: upstream.ErrNoFit,
			status: 503, body: nginxPage("503 Service Unavailable", "the gateway holds as many bytes for clients as it may (MEMCGATE_MAX_BUFFERED_BYTES); retry shortly"),
			header: map[string]string{"Retry-After": "1"},
		},
		{name: "no key", kind: kindNoKey, cmd: memcGet, status: 500, body: page("500 Internal Server Error"), header: map[string]string{"Connection": "close"}},
		{name: "no value", kind: kindNoValue, cmd: memcSet, status: 500, body: page("500 Internal Server Error"), header: map[string]string{"Connection": "close"}},
		{name: "delete time", kind: kindDeleteTime, cmd: memcDelete, status: 502, body: "CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]\r\n"},
		{name: "key too long, get", kind: kindKeyTooLong, cmd: memcGet, status: 502, body: page("502 Bad Gateway")},
		{name: "key too long, set", kind: kindKeyTooLong, cmd: memcSet, status: 502, body: "CLIENT_ERROR bad command line format\r\n"},
		{name: "key too long, incr", kind: kindKeyTooLong, cmd: memcIncr, status: 502, body: "CLIENT_ERROR bad command line format\r\n"},
	}
	rt, _ := New(Options{Path: "/memc"})
	m := rt.Handler.(*memc)
	pinned := make(map[checkKind]bool)
	for _, tt := range tests {
		pinned[tt.kind] = true
		t.Run(tt.name, func(t *testing.T) {
			rf := &refusal{kind: tt.kind, reason: reason, err: tt.cause}
			// Wrapped, as a caller adding context would: the kind still
			// decides the answer, and errors.Is finds it.
			err := fmt.Errorf("serving: %w", rf)
			if !errors.Is(err, tt.kind) {
				t.Errorf("errors.Is(%v, %v) = false, want true", err, tt.kind)
			}
			for k := kindPath; k < kindEnd; k++ {
				if k != tt.kind && errors.Is(err, k) {
					t.Errorf("errors.Is(refusal of kind %v, %v) = true, want false", tt.kind, k)
				}
			}
			w := httptest.NewRecorder()
			m.fail(w, httptest.NewRequest(http.MethodGet, "/memc", nil), tt.cmd, err)
			if w.Code != tt.status || w.Body.String() != tt.body {
				t.Errorf("fail(%v, %v) = %d %q, want %d %q", tt.cmd, tt.kind, w.Code, w.Body.String(), tt.status, tt.body)
			}
			want := map[string]string{"Content-Type": "text/html", "Content-Length": strconv.Itoa(len(tt.body))}
			if tt.body[0] != '<' {
				want["Content-Type"] = "text/plain" // a raw line, in ContentType
			}
			for _, h := range []string{"Connection", "WWW-Authenticate", "Retry-After", "Last-Modified"} {
				want[h] = tt.header[h]
			}
			for h, v := range want {
				if got := w.Header().Get(h); got != v {
					t.Errorf("fail(%v, %v): %s = %q, want %q", tt.cmd, tt.kind, h, got, v)
				}
			}
		})
	}
	for k := kindPath; k < kindEnd; k++ {
		if !pinned[k] {
			t.Errorf("kind %d (%v) has no row: pin its answer here", k, k)
		}
	}
}
