package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/gateway/storetest"
	"github.com/memcgate/memcgate/upstream"
	"github.com/memcgate/memcgate/upstream/op"
)

// fakeStore is storetest's in-memory Store, as these tests name it.
type fakeStore = storetest.Store

func newFake() *fakeStore { return storetest.New() }

func newTestHandler(t *testing.T, s Store) http.Handler {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	return NewHandler(s, log, prometheus.NewRegistry(), Options{MaxValueBytes: 64})
}

func do(h http.Handler, method, target, body string, hdr ...string) *httptest.ResponseRecorder {
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req := httptest.NewRequest(method, target, r)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1]) // a name twice is two field lines
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return w
}

func TestRequests(t *testing.T) {
	tests := []struct {
		name       string
		method     string
		target     string
		body       string
		hdr        []string
		preset     map[string]string
		wantStatus int
		wantBody   string // prefix of the body
		wantHdr    map[string]string
		wantCalls  int // -1: any
	}{
		{name: "get hit", method: "GET", target: "/a/b", preset: map[string]string{"a/b": "v"}, wantStatus: 200, wantBody: "v",
			wantHdr: map[string]string{"Etag": `"1"`, "X-Memcached-Flags": "0", "Content-Length": "1"}, wantCalls: 1},
		{name: "get percent-decoded", method: "GET", target: "/caf%C3%A9%2Fx", preset: map[string]string{"café/x": "v"}, wantStatus: 200, wantBody: "v", wantCalls: 1},
		{name: "get miss", method: "GET", target: "/nope", wantStatus: 404, wantBody: "not found", wantCalls: 1},
		{name: "head hit", method: "HEAD", target: "/k", preset: map[string]string{"k": "value"}, wantStatus: 200, wantHdr: map[string]string{"Content-Length": "5"}, wantCalls: 1},
		{name: "get 304", method: "GET", target: "/k", hdr: []string{"If-None-Match", `"1"`}, preset: map[string]string{"k": "v"}, wantStatus: 304, wantCalls: 1},
		// Two If-None-Match lines are one list (RFC 9110 §5.3): the ETag
		// on the second names the item as surely as on the first.
		{name: "get 304 on a second line", method: "GET", target: "/k", hdr: []string{"If-None-Match", `"9"`, "If-None-Match", `"1"`}, preset: map[string]string{"k": "v"}, wantStatus: 304, wantCalls: 1},
		{name: "head 304 on a second line", method: "HEAD", target: "/k", hdr: []string{"If-None-Match", "", "If-None-Match", `W/"1"`}, preset: map[string]string{"k": "v"}, wantStatus: 304, wantCalls: 1},
		// A member is an entity-tag, a quoted string that may hold
		// commas (RFC 9110 §8.8.3), not what lies between two commas:
		// none of these lists names "1", though a piece cut at a comma
		// is "1".
		{name: "get 200 on a comma inside quotes", method: "GET", target: "/k", hdr: []string{"If-None-Match", `"a, "1"`}, preset: map[string]string{"k": "v"}, wantStatus: 200, wantBody: "v", wantCalls: 1},
		{name: "get 200 on a weak tag holding a comma", method: "GET", target: "/k", hdr: []string{"If-None-Match", `W/"x, "1"`}, preset: map[string]string{"k": "v"}, wantStatus: 200, wantBody: "v", wantCalls: 1},
		{name: "get 200 on an unbalanced quote", method: "GET", target: "/k", hdr: []string{"If-None-Match", `9", "1"`}, preset: map[string]string{"k": "v"}, wantStatus: 200, wantBody: "v", wantCalls: 1},
		{name: "get 304 on empty members", method: "GET", target: "/k", hdr: []string{"If-None-Match", ` , "9",, W/"1" ,`}, preset: map[string]string{"k": "v"}, wantStatus: 304, wantCalls: 1},
		{name: "get 200 on lines naming others", method: "GET", target: "/k", hdr: []string{"If-None-Match", `"9"`, "If-None-Match", `"2", "3"`}, preset: map[string]string{"k": "v"}, wantStatus: 200, wantBody: "v", wantCalls: 1},
		{name: "empty key", method: "GET", target: "/", wantStatus: 400, wantBody: "empty key", wantCalls: 0},
		{name: "key 251 bytes", method: "GET", target: "/" + strings.Repeat("k", 251), wantStatus: 400, wantBody: "key is 251 bytes", wantCalls: 0},
		{name: "key 250 bytes", method: "GET", target: "/" + strings.Repeat("k", 250), wantStatus: 404, wantCalls: 1},
		{name: "key with space", method: "PUT", target: "/a%20b", body: "x", wantStatus: 400, wantBody: "key has byte 0x20 at offset 1", wantCalls: 0},
		{name: "key with CRLF", method: "PUT", target: "/a%0D%0Aget%20x", body: "x", wantStatus: 400, wantBody: "key has byte 0x0d", wantCalls: 0},
		{name: "key with DEL", method: "DELETE", target: "/a%7F", wantStatus: 400, wantBody: "key has byte 0x7f", wantCalls: 0},
		{name: "put", method: "PUT", target: "/k?exptime=10&flags=7", body: "v", wantStatus: 201, wantCalls: 1},
		{name: "put bad exptime", method: "PUT", target: "/k?exptime=soon", body: "v", wantStatus: 400, wantBody: `exptime "soon"`, wantCalls: 0},
		{name: "put exptime overflow", method: "PUT", target: "/k?exptime=2147483648", body: "v", wantStatus: 400, wantCalls: 0},
		{name: "put bad flags", method: "PUT", target: "/k?flags=-1", body: "v", wantStatus: 400, wantBody: `flags "-1"`, wantCalls: 0},
		{name: "put flags overflow", method: "PUT", target: "/k?flags=4294967296", body: "v", wantStatus: 400, wantCalls: 0},
		{name: "put too large", method: "PUT", target: "/k", body: strings.Repeat("x", 65), wantStatus: 413, wantBody: "request body is 65 bytes; at most 64 are accepted (MEMCGATE_MAX_VALUE_BYTES)\n", wantCalls: 0},
		{name: "put at limit", method: "PUT", target: "/k", body: strings.Repeat("x", 64), wantStatus: 201, wantCalls: 1},
		{name: "add new", method: "PUT", target: "/k", body: "v", hdr: []string{"If-None-Match", "*"}, wantStatus: 201, wantCalls: 1},
		{name: "add exists", method: "PUT", target: "/k", body: "v", hdr: []string{"If-None-Match", "*"}, preset: map[string]string{"k": "v"}, wantStatus: 412, wantBody: "key exists", wantCalls: 1},
		{name: "replace missing", method: "PUT", target: "/k", body: "v", hdr: []string{"If-Match", "*"}, wantStatus: 412, wantBody: "key does not exist", wantCalls: 1},
		{name: "replace exists", method: "PUT", target: "/k", body: "v", hdr: []string{"If-Match", "*"}, preset: map[string]string{"k": "v"}, wantStatus: 201, wantCalls: 1},
		{name: "cas ok", method: "PUT", target: "/k", body: "v", hdr: []string{"If-Match", `"1"`}, preset: map[string]string{"k": "v"}, wantStatus: 201, wantCalls: 1},
		{name: "cas conflict", method: "PUT", target: "/k", body: "v", hdr: []string{"If-Match", `"9"`}, preset: map[string]string{"k": "v"}, wantStatus: 412, wantBody: "item changed", wantCalls: 1},
		{name: "cas malformed", method: "PUT", target: "/k", body: "v", hdr: []string{"If-Match", `W/"x"`}, wantStatus: 400, wantCalls: 0},
		{name: "both conditions", method: "PUT", target: "/k", body: "v", hdr: []string{"If-Match", "*", "If-None-Match", "*"}, wantStatus: 400, wantBody: "use If-None-Match: * (add), If-Match: * (replace) or If-Match: \"<etag>\" (cas), not both", wantCalls: 0},
		{name: "put if-none-match etag", method: "PUT", target: "/k", body: "v", hdr: []string{"If-None-Match", `"1"`}, wantStatus: 400, wantBody: "If-None-Match on a PUT takes * alone (add: stored only if the key is missing)", wantCalls: 0},
		// A DELETE with If-Match is a compare-and-delete (md C<cas>):
		// 412 when the item changed or is gone (RFC 9110 §13.1.1), and
		// If-Match: * deletes only an item that exists.
		{name: "delete if-match", method: "DELETE", target: "/k", hdr: []string{"If-Match", `"1"`}, preset: map[string]string{"k": "v"}, wantStatus: 204, wantCalls: 1},
		{name: "delete if-match changed", method: "DELETE", target: "/k", hdr: []string{"If-Match", `"9"`}, preset: map[string]string{"k": "v"}, wantStatus: 412, wantBody: "item changed since its ETag (or cas) was read, or is gone", wantCalls: 1},
		{name: "delete if-match gone", method: "DELETE", target: "/k", hdr: []string{"If-Match", `"1"`}, wantStatus: 412, wantBody: "item changed since its ETag (or cas) was read, or is gone", wantCalls: 1},
		{name: "delete if-match any", method: "DELETE", target: "/k", hdr: []string{"If-Match", "*"}, preset: map[string]string{"k": "v"}, wantStatus: 204, wantCalls: 1},
		{name: "delete if-match any gone", method: "DELETE", target: "/k", hdr: []string{"If-Match", "*"}, wantStatus: 412, wantCalls: 1},
		{name: "delete if-match malformed", method: "DELETE", target: "/k", hdr: []string{"If-Match", `W/"1"`}, preset: map[string]string{"k": "v"}, wantStatus: 400, wantBody: "If-Match takes * or one ETag", wantCalls: 0},
		{name: "delete if-match zero", method: "DELETE", target: "/k", hdr: []string{"If-Match", `"0"`}, preset: map[string]string{"k": "v"}, wantStatus: 400, wantBody: `If-Match "0" is not an ETag this gateway issued`, wantCalls: 0},
		// Prefer: respond-async is ignored (RFC 7240 lets it be): the
		// client needs memcached's answer to know whether it deleted.
		{name: "async delete if-match", method: "DELETE", target: "/k", hdr: []string{"If-Match", `"9"`, "Prefer", "respond-async"}, preset: map[string]string{"k": "v"}, wantStatus: 412, wantCalls: 1},
		{name: "delete if-none-match", method: "DELETE", target: "/k", hdr: []string{"If-None-Match", "*"}, preset: map[string]string{"k": "v"}, wantStatus: 400, wantBody: "DELETE takes no If-None-Match", wantCalls: 0},
		{name: "delete both conditions", method: "DELETE", target: "/k", hdr: []string{"If-Match", `"1"`, "If-None-Match", `"2"`}, preset: map[string]string{"k": "v"}, wantStatus: 400, wantBody: "DELETE takes no If-None-Match", wantCalls: 0},
		// A POST memcached cannot make conditional refuses a condition:
		// ignored, a stale ETag would change an item that changed
		// since, as a batch refuses a cas on these verbs.
		// A condition is read over all its field lines, and one sent
		// empty is refused: read from the first line alone, an empty or
		// unconditional first line hid the condition after it and the
		// write ran unconditionally.
		{name: "delete if-match empty", method: "DELETE", target: "/k", hdr: []string{"If-Match", ""}, preset: map[string]string{"k": "v"}, wantStatus: 400, wantBody: "If-Match has no value", wantCalls: 0},
		{name: "delete if-match empty line first", method: "DELETE", target: "/k", hdr: []string{"If-Match", "", "If-Match", `"9"`}, preset: map[string]string{"k": "v"}, wantStatus: 400, wantCalls: 0},
		{name: "delete if-match any line first", method: "DELETE", target: "/k", hdr: []string{"If-Match", "*", "If-Match", `"9"`}, preset: map[string]string{"k": "v"}, wantStatus: 400, wantCalls: 0},
		{name: "delete if-match two lines", method: "DELETE", target: "/k", hdr: []string{"If-Match", `"1"`, "If-Match", `"9"`}, preset: map[string]string{"k": "v"}, wantStatus: 400, wantCalls: 0},
		{name: "delete if-none-match empty", method: "DELETE", target: "/k", hdr: []string{"If-None-Match", ""}, preset: map[string]string{"k": "v"}, wantStatus: 400, wantBody: "If-None-Match has no value", wantCalls: 0},
		{name: "put if-match empty", method: "PUT", target: "/k", body: "w", hdr: []string{"If-Match", ""}, preset: map[string]string{"k": "v"}, wantStatus: 400, wantBody: "If-Match has no value", wantCalls: 0},
		{name: "put if-match empty line first", method: "PUT", target: "/k", body: "w", hdr: []string{"If-Match", "", "If-Match", `"9"`}, preset: map[string]string{"k": "v"}, wantStatus: 400, wantCalls: 0},
		{name: "put if-none-match empty line first", method: "PUT", target: "/k", body: "w", hdr: []string{"If-None-Match", "", "If-None-Match", "*"}, preset: map[string]string{"k": "v"}, wantStatus: 400, wantCalls: 0},
		{name: "post if-match empty", method: "POST", target: "/k?op=append", body: "w", hdr: []string{"If-Match", ""}, preset: map[string]string{"k": "v"}, wantStatus: 400, wantBody: "POST takes no If-Match", wantCalls: 0},
		{name: "post if-match empty line first", method: "POST", target: "/k?op=append", body: "w", hdr: []string{"If-Match", "", "If-Match", `"9"`}, preset: map[string]string{"k": "v"}, wantStatus: 400, wantBody: "POST takes no If-Match", wantCalls: 0},
		{name: "post if-match", method: "POST", target: "/k?op=append", body: "w", hdr: []string{"If-Match", `"9"`}, preset: map[string]string{"k": "v"}, wantStatus: 400, wantBody: "POST takes no If-Match", wantCalls: 0},
		{name: "delete", method: "DELETE", target: "/k", preset: map[string]string{"k": "v"}, wantStatus: 204, wantCalls: 1},
		{name: "delete missing", method: "DELETE", target: "/k", wantStatus: 404, wantCalls: 1},
		{name: "append", method: "POST", target: "/k?op=append", body: "w", preset: map[string]string{"k": "v"}, wantStatus: 201, wantCalls: 1},
		{name: "append missing", method: "POST", target: "/k?op=append", body: "w", wantStatus: 404, wantCalls: 1},
		{name: "prepend", method: "POST", target: "/k?op=prepend", body: "w", preset: map[string]string{"k": "v"}, wantStatus: 201, wantCalls: 1},
		{name: "incr", method: "POST", target: "/k?op=incr&delta=2", preset: map[string]string{"k": "42"}, wantStatus: 200, wantBody: "44", wantCalls: 1},
		{name: "decr default delta", method: "POST", target: "/k?op=decr", preset: map[string]string{"k": "42"}, wantStatus: 200, wantBody: "41", wantCalls: 1},
		{name: "incr bad delta", method: "POST", target: "/k?op=incr&delta=-1", wantStatus: 400, wantBody: `delta "-1"`, wantCalls: 0},
		{name: "touch", method: "POST", target: "/k?op=touch&exptime=5", preset: map[string]string{"k": "v"}, wantStatus: 204, wantCalls: 1},
		{name: "touch missing", method: "POST", target: "/k?op=touch&exptime=5", wantStatus: 404, wantCalls: 1},
		{name: "touch without exptime", method: "POST", target: "/k?op=touch", wantStatus: 400, wantCalls: 0},
		{name: "post no op", method: "POST", target: "/k", wantStatus: 400, wantBody: "POST needs ?op=append, ?op=prepend, ?op=incr, ?op=decr or ?op=touch\n", wantCalls: 0},
		{name: "post bad op", method: "POST", target: "/k?op=explode", wantStatus: 400, wantBody: `unknown op "explode"`, wantCalls: 0},
		{name: "patch", method: "PATCH", target: "/k", wantStatus: 405, wantHdr: map[string]string{"Allow": allowed}, wantCalls: 0},
		// Another method's parameter is refused, not ignored: ignored,
		// a PUT ?op=append replaced the value it meant to add to.
		{name: "put op", method: "PUT", target: "/k?op=append", body: "x", preset: map[string]string{"k": "v"}, wantStatus: 400, wantBody: "PUT does not take ?op=; POST /{key}?op= does", wantCalls: 0},
		{name: "get op", method: "GET", target: "/k?op=incr", wantStatus: 400, wantBody: "GET does not take ?op=", wantCalls: 0},
		{name: "delete op", method: "DELETE", target: "/k?exptime=5&op=touch", wantStatus: 400, wantBody: "DELETE does not take ?op=", wantCalls: 0},
		{name: "put delta", method: "PUT", target: "/k?delta=5", body: "1", wantStatus: 400, wantBody: "PUT does not take ?delta=; POST /{key}?op=incr", wantCalls: 0},
		{name: "put touch", method: "PUT", target: "/k?touch=60", body: "x", wantStatus: 400, wantBody: "PUT does not take ?touch=; GET does", wantCalls: 0},
		{name: "post touch", method: "POST", target: "/k?op=append&touch=60", body: "x", wantStatus: 400, wantBody: "POST does not take ?touch=", wantCalls: 0},
		{name: "get other params ignored", method: "GET", target: "/k?exptime=5&_=1700000000", preset: map[string]string{"k": "v"}, wantStatus: 200, wantBody: "v", wantCalls: 1},
		{name: "post incr delta", method: "POST", target: "/n?op=incr&delta=5", preset: map[string]string{"n": "1"}, wantStatus: 200, wantBody: "6", wantCalls: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newFake()
			for k, v := range tt.preset {
				s.Put(op.Item{Key: k, Value: []byte(v)})
			}
			h := newTestHandler(t, s)
			w := do(h, tt.method, tt.target, tt.body, tt.hdr...)
			if w.Code != tt.wantStatus {
				t.Errorf("%s %s = %d %q, want %d", tt.method, tt.target, w.Code, w.Body.String(), tt.wantStatus)
			}
			if !strings.HasPrefix(w.Body.String(), tt.wantBody) {
				t.Errorf("%s %s body = %q, want prefix %q", tt.method, tt.target, w.Body.String(), tt.wantBody)
			}
			for k, v := range tt.wantHdr {
				if got := w.Header().Get(k); got != v {
					t.Errorf("%s %s header %s = %q, want %q", tt.method, tt.target, k, got, v)
				}
			}
			if w.Code >= 400 && !strings.HasPrefix(w.Header().Get("Content-Type"), "text/plain") {
				t.Errorf("%s %s error Content-Type = %q, want text/plain", tt.method, tt.target, w.Header().Get("Content-Type"))
			}
			if got := s.Calls; tt.wantCalls >= 0 && got != tt.wantCalls {
				t.Errorf("%s %s made %d store calls, want %d", tt.method, tt.target, got, tt.wantCalls)
			}
		})
	}
}

func TestErrorStatus(t *testing.T) {
	tests := []struct {
		name       string
		err        error
		wantStatus int
		wantRetry  bool
	}{
		{"not found", upstream.ErrNotFound, 404, false},
		{"exists", upstream.ErrExists, 409, false},
		{"cas", upstream.ErrCASConflict, 412, false},
		{"not numeric", upstream.ErrNotNumeric, 409, false},
		{"bad key", upstream.ErrBadKey, 400, false},
		{"too large", upstream.ErrTooLarge, 413, false},
		{"out of memory", upstream.ErrNoMemory, 503, true},
		{"no nodes", upstream.ErrNoNodes, 503, true},
		{"no fit", upstream.ErrNoFit, 503, true},
		{"node busy", &upstream.BusyError{Node: "n", Share: 5000}, 503, true},
		{"refused", &upstream.NodeError{Node: "n", Op: "get", Err: errors.New("connection refused")}, 502, true},
		{"server error", upstream.ErrServer, 502, false},
		{"deadline", context.DeadlineExceeded, 504, false},
		{"canceled", context.Canceled, 499, false},
		{"wrapped", errors.Join(errors.New("x"), upstream.ErrNotFound), 404, false},
		{"unknown", errors.New("boom"), 500, false},
		{"request", badRequest("bad"), 400, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, msg, retry := errorStatus(tt.err)
			if status != tt.wantStatus || retry != tt.wantRetry {
				t.Errorf("errorStatus(%v) = %d, %v, want %d, %v", tt.err, status, retry, tt.wantStatus, tt.wantRetry)
			}
			if msg == "" || strings.Contains(msg, "\n") {
				t.Errorf("errorStatus(%v) message %q, want one non-empty line", tt.err, msg)
			}
		})
	}
}

func TestUpstreamErrorsOverHTTP(t *testing.T) {
	s := newFake()
	s.Err = upstream.ErrNoNodes
	w := do(newTestHandler(t, s), "GET", "/k", "")
	if w.Code != 503 || w.Header().Get("Retry-After") == "" {
		t.Errorf("GET with no nodes = %d Retry-After %q, want 503 with Retry-After", w.Code, w.Header().Get("Retry-After"))
	}
}

func TestPanicBecomes500(t *testing.T) {
	s := newFake()
	h := newTestHandler(t, panicStore{s})
	w := do(h, "GET", "/k", "")
	if w.Code != 500 {
		t.Errorf("GET with a panicking store = %d, want 500", w.Code)
	}
}

// TestPanicLineSharesTheRequestID: a panic's log line and the request's
// access log line carry the same generated request ID.
func TestPanicLineSharesTheRequestID(t *testing.T) {
	var logs bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&logs, nil))
	h := NewHandler(panicStore{newFake()}, log, prometheus.NewRegistry(), Options{AccessLog: true})
	if w := do(h, "GET", "/k", ""); w.Code != 500 {
		t.Fatalf("GET with a panicking store = %d, want 500", w.Code)
	}
	ids := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var rec struct {
			Msg       string `json:"msg"`
			RequestID string `json:"request_id"`
		}
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		ids[rec.Msg] = rec.RequestID
	}
	if p, a := ids["handler panicked"], ids["request"]; p == "" || p != a {
		t.Errorf("request_id of the panic line %q, of the access line %q; want the same, not empty", p, a)
	}
}

// TestPanicsCountedAndLogGated: any client that finds a request that
// panics can repeat it at will, so its error line (with a stack of some
// kilobytes) is written a second at most, with the panics it stands
// for, and every panic is counted in memcgate_http_panics_total for the
// alert that a 5xx ratio below 1 % would not raise.
func TestPanicsCountedAndLogGated(t *testing.T) {
	var logs bytes.Buffer
	reg := prometheus.NewRegistry()
	h := NewHandler(panicStore{newFake()}, slog.New(slog.NewJSONHandler(&logs, nil)), reg, Options{})
	start := time.Now()
	for range 50 {
		if w := do(h, "GET", "/k", ""); w.Code != 500 {
			t.Fatalf("GET with a panicking store = %d, want 500", w.Code)
		}
	}
	most := 1 + int(time.Since(start)/time.Second)
	if n := strings.Count(logs.String(), `"msg":"handler panicked"`); n < 1 || n > most {
		t.Errorf("50 panics in %v logged %d lines, want 1 to %d", time.Since(start), n, most)
	}
	if got := counterValue(t, reg, "memcgate_http_panics_total"); got != 50 {
		t.Errorf("memcgate_http_panics_total = %v after 50 panics, want 50", got)
	}
}

type panicStore struct{ *fakeStore }

func (panicStore) Do(context.Context, op.Op) op.Result { panic("boom") }

func TestCheckKey(t *testing.T) {
	tests := []struct {
		key    string
		maxLen int
		ok     bool
	}{
		{"a", 250, true},
		{strings.Repeat("x", 250), 250, true},
		{strings.Repeat("x", 251), 250, false},
		{strings.Repeat("x", 241), 240, false},
		{"", 250, false},
		{"a b", 250, false},
		{"a\tb", 250, false},
		{"a\x00", 250, false},
		{"a\x7f", 250, false},
		{"café/ü", 250, true},
		{"a/b/c", 250, true},
		{"\xff\xfe", 250, true},
	}
	for _, tt := range tests {
		err := checkKey(tt.key, tt.maxLen)
		if (err == nil) != tt.ok {
			t.Errorf("checkKey(%q, %d) = %v, want ok=%v", tt.key, tt.maxLen, err, tt.ok)
		}
	}
}

func TestQuery(t *testing.T) {
	tests := []struct {
		raw, name, want string
		ok              bool
	}{
		{"a=1&b=2", "b", "2", true},
		{"a=1&a=2", "a", "1", true},
		{"a=%31+x", "a", "1 x", true},
		{"a", "a", "", true},
		{"b=1", "a", "", false},
		{"", "a", "", false},
	}
	for _, tt := range tests {
		got, ok := query(tt.raw, tt.name)
		if got != tt.want || ok != tt.ok {
			t.Errorf("query(%q, %q) = %q, %v, want %q, %v", tt.raw, tt.name, got, ok, tt.want, tt.ok)
		}
	}
}

// FuzzCheckKey: any key that passes can be put on a memcached command line
// without changing its meaning.
func FuzzCheckKey(f *testing.F) {
	for _, s := range []string{"a", "a b", "a\r\nset x 0 0 1", strings.Repeat("k", 251), "é", "\x7f"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		if checkKey(key, MaxKeyLen) != nil {
			return
		}
		if len(key) == 0 || len(key) > MaxKeyLen || strings.ContainsAny(key, " \r\n\t\x00\x7f") {
			t.Fatalf("checkKey(%q) passed a key memcached would misread", key)
		}
		for i := 0; i < len(key); i++ {
			if key[i] <= ' ' {
				t.Fatalf("checkKey(%q) passed control byte at %d", key, i)
			}
		}
	})
}

// FuzzArguments: the query-string parsers never panic, and whatever they
// accept is in memcached's range.
func FuzzArguments(f *testing.F) {
	for _, s := range []string{"exptime=10&flags=7&delta=3", "exptime=-1", "flags=4294967296", "delta=%31%32", "exptime=+5&exptime=6", "op=incr&delta=18446744073709551615"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		if _, err := parseExptime(raw, "exptime", 0); err != nil && !strings.Contains(err.Error(), "exptime") {
			t.Fatalf("parseExptime(%q) error %q does not name exptime", raw, err)
		}
		if _, err := parseFlags(raw); err != nil && !strings.Contains(err.Error(), "flags") {
			t.Fatalf("parseFlags(%q) error %q does not name flags", raw, err)
		}
		if _, err := parseDelta(raw); err != nil && !strings.Contains(err.Error(), "delta") {
			t.Fatalf("parseDelta(%q) error %q does not name delta", raw, err)
		}
	})
}

func TestRequestCtx(t *testing.T) {
	t.Run("no timer until asked", func(t *testing.T) {
		c := newRequestCtx(context.Background(), time.Now(), time.Hour)
		defer c.stop()
		if err := c.Err(); err != nil {
			t.Fatalf("Err before the deadline = %v, want nil", err)
		}
		if c.armed.Load() {
			t.Fatal("Err armed a timer before the deadline")
		}
		if d, ok := c.Deadline(); !ok || time.Until(d) < 59*time.Minute {
			t.Fatalf("Deadline = %v, %v; want about an hour from now", d, ok)
		}
	})
	t.Run("deadline passes", func(t *testing.T) {
		c := newRequestCtx(context.Background(), time.Now(), 20*time.Millisecond)
		defer c.stop()
		select {
		case <-c.Done():
		case <-time.After(time.Second):
			t.Fatal("Done not closed a second after a 20ms deadline")
		}
		if err := c.Err(); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Err after the deadline = %v, want DeadlineExceeded", err)
		}
	})
	t.Run("Err after the deadline closes Done", func(t *testing.T) {
		c := newRequestCtx(context.Background(), time.Now(), -time.Millisecond)
		defer c.stop()
		if err := c.Err(); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Err = %v, want DeadlineExceeded", err)
		}
		select {
		case <-c.Done():
		default:
			t.Fatal("Err is not nil but Done is open")
		}
	})
	t.Run("parent cancelled", func(t *testing.T) {
		parent, cancel := context.WithCancel(context.Background())
		c := newRequestCtx(parent, time.Now(), time.Hour)
		defer c.stop()
		child, childCancel := context.WithCancel(c) // goes through AfterFunc
		defer childCancel()
		cancel()
		select {
		case <-child.Done():
		case <-time.After(time.Second):
			t.Fatal("a child of the request context was not cancelled with its parent")
		}
		if err := c.Err(); !errors.Is(err, context.Canceled) {
			t.Fatalf("Err = %v, want Canceled", err)
		}
	})
	t.Run("earlier parent deadline wins", func(t *testing.T) {
		parent, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		c := newRequestCtx(parent, time.Now(), time.Hour)
		if d, _ := c.Deadline(); time.Until(d) > 2*time.Minute {
			t.Fatalf("Deadline = %v, want the parent's, a minute from now", d)
		}
	})
}

func TestNewContext(t *testing.T) {
	s := newFake()
	s.Put(op.Item{Key: "k", Value: []byte("v")})
	h := newTestHandler(t, s).(*Handler)
	other := newTestHandler(t, s).(*Handler)
	base := httptest.NewRequest("GET", "/k", nil)
	used := h.NewContext(context.Background(), time.Now(), nil).(*requestCtx)
	h.ServeHTTP(httptest.NewRecorder(), base.WithContext(used))
	tests := []struct {
		name  string
		ctx   context.Context
		taken bool // ServeHTTP serves the request with ctx, not a copy of its own
	}{
		{"its own, new", h.NewContext(context.Background(), time.Now(), nil), true},
		{"another handler's", other.NewContext(context.Background(), time.Now(), nil), false},
		{"its own, served before", used, false},
		{"any other", context.Background(), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rc, _ := tt.ctx.(*requestCtx)
			var before bool
			if rc != nil {
				before = rc.used
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, base.WithContext(tt.ctx))
			if w.Code != http.StatusOK || w.Body.String() != "v" {
				t.Fatalf("GET /k = %d %q, want 200 \"v\"", w.Code, w.Body)
			}
			if got := rc != nil && !before && rc.used; got != tt.taken {
				t.Errorf("ServeHTTP took the request's context: %v, want %v", got, tt.taken)
			}
		})
	}
}

// FuzzConditions: whatever If-Match lines a DELETE or PUT sends, it is
// either refused or conditional: a header sent never leaves an
// unconditional delete or set, and the CAS a verb carries is the number
// its ETag names, with the replica a replicated pool's ETag names; what
// memcached is sent for it is the CAS value's digits, on one line. The
// same lines as If-None-Match on a GET or HEAD make it conditional on
// every line: it is 304 for an item whose ETag one of them names (or *),
// as if the lines were one, whichever line that is.
func FuzzConditions(f *testing.F) {
	for _, s := range []string{"", "*", `"1"`, "\x00\"1\"", "*\x00\"9\"", `"18446744073709551616"`, `W/"1"`, `"1", "2"`, `"0"`, "\"1\"\x00\"7\"", "\x00W/\"7\"",
		`"1@0a1b2c3d"`, `"0@0a1b2c3d"`, `"x, "7"`, `"7", "x`, `"a,"7"`, `W/"7,"`, "\"7\", ,\t", `"7",`, `"1@00000000"`, `"1@0A1B2C3D"`, `"1@"`, `"@0a1b2c3d"`, `"1@0a1b2c3d@1"`, "\"1@0a1b\r\nc3d\""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		h := http.Header{"If-Match": strings.Split(raw, "\x00")} // NUL: a line break between field lines
		ifNoneMatch(t, strings.Split(raw, "\x00"))
		for _, method := range []string{"DELETE", "PUT"} {
			r := httptest.NewRequest(method, "/k", nil)
			r.Header = h
			kr, err := keyParser{maxKeyLen: MaxKeyLen}.parseKeyRequest(r)
			if err != nil {
				continue
			}
			switch v := kr.op.Verb; {
			case v == op.Delete || v == op.Set:
				t.Fatalf("%s with If-Match lines %q ran as %v, unconditionally", method, h["If-Match"], v)
			case v == op.DeleteCAS || v == op.CAS:
				lines := h["If-Match"]
				one := strings.TrimSpace(lines[0])
				// "<cas>", or "<cas>@<node>" naming the replica that
				// gave it out: 8 lowercase hex digits, never all 0.
				digits, tag, replica := strings.Cut(strings.Trim(one, `"`), "@")
				n, err := strconv.ParseUint(digits, 10, 64)
				it := kr.op.Item
				named := err == nil && len(one) > 2 && one[0] == '"' && one[len(one)-1] == '"' && n == it.CAS &&
					(!replica && it.CASNode == 0 || replica && it.CASNode != 0 && tag == fmt.Sprintf("%08x", it.CASNode))
				if len(lines) != 1 || !named && !(v == op.DeleteCAS && one == "*" && it.CAS == 0 && it.CASNode == 0) {
					t.Fatalf("%s with If-Match lines %q ran as %v of CAS %d node %#x", method, lines, v, it.CAS, it.CASNode)
				}
				// The lines are one list of one member, * or a strong
				// ETag (its number is checked above).
				members, ok := refETagList(lines)
				if !ok || len(members) != 1 || members[0] != "*" && members[0][0] != '"' {
					t.Fatalf("%s with If-Match lines %q (members %q, parsed %v) ran as %v of CAS %d node %#x", method, lines, members, ok, v, it.CAS, it.CASNode)
				}
				// What memcached is sent: the CAS value's digits, one line.
				line := string(op.EncodeHead(nil, &kr.op, "k"))
				if want := "C" + strconv.FormatUint(it.CAS, 10) + "\r\n"; v == op.DeleteCAS && it.CAS != 0 && !strings.HasSuffix(line, " "+want) ||
					strings.Count(line, "\r\n") != 1 || strings.ContainsAny(line, "@\"") {
					t.Fatalf("%s with If-Match lines %q sends %q", method, lines, line)
				}
			}
		}
	})
}

// ifNoneMatch checks what a GET and a HEAD with If-None-Match lines make
// of an item whose ETag is "7" (FuzzConditions).
func ifNoneMatch(t *testing.T, lines []string) {
	const etag = `"7"`
	members, ok := refETagList(lines)
	want := false
	for _, m := range members {
		want = want || ok && (m == "*" || strings.TrimPrefix(m, "W/") == etag)
	}
	for _, method := range []string{"GET", "HEAD"} {
		r := httptest.NewRequest(method, "/k", nil)
		r.Header = http.Header{"If-None-Match": lines}
		kr, err := keyParser{maxKeyLen: MaxKeyLen}.parseKeyRequest(r)
		if err != nil {
			t.Fatalf("%s with If-None-Match lines %q: %v", method, lines, err)
		}
		if got := notModified(kr.etags, op.Item{CAS: 7}); got != want {
			t.Fatalf("%s with If-None-Match lines %q: not modified for ETag %s: %v, want %v", method, lines, etag, got, want)
		}
	}
}

// refETagList is FuzzConditions' reading of If-Match or If-None-Match
// lines, made another way than etagListHas: the lines joined by commas
// (RFC 9110 §5.3), cut at the commas outside quotes, each piece, OWS
// trimmed, empty (an empty member), * or [W/] DQUOTE *etagc DQUOTE
// (RFC 9110 §8.8.3). members are the non-empty pieces as sent; ok is
// false when one of them is neither * nor an entity-tag.
func refETagList(lines []string) (members []string, ok bool) {
	list := strings.Join(lines, ", ")
	var pieces []string
	quoted, from := false, 0
	for i, c := range []byte(list) {
		switch {
		case c == '"':
			quoted = !quoted
		case c == ',' && !quoted:
			pieces = append(pieces, list[from:i])
			from = i + 1
		}
	}
	pieces = append(pieces, list[from:])
	ok = true
	for _, p := range pieces {
		p = strings.Trim(p, " \t")
		if p == "" {
			continue
		}
		members = append(members, p)
		if p == "*" {
			continue
		}
		q := strings.TrimPrefix(p, "W/")
		inner := strings.TrimSuffix(strings.TrimPrefix(q, `"`), `"`)
		if len(q) < 2 || q[0] != '"' || q[len(q)-1] != '"' || strings.ContainsFunc(inner, func(r rune) bool {
			return r == '"' || r >= 0 && r < 0x21 || r == 0x7f
		}) {
			ok = false
		}
	}
	return members, ok
}

// TestNotModifiedAllocs: reading a one-line If-None-Match list member by
// member allocates nothing.
func TestNotModifiedAllocs(t *testing.T) {
	r := httptest.NewRequest("GET", "/k", nil)
	r.Header.Set("If-None-Match", `"a,b", W/"9", , "7@0a1b2c3d", "7"`)
	kr, err := keyParser{maxKeyLen: MaxKeyLen}.parseKeyRequest(r)
	if err != nil {
		t.Fatal(err)
	}
	it := op.Item{CAS: 7}
	if n := testing.AllocsPerRun(100, func() {
		if !notModified(kr.etags, it) {
			t.Fatal("not modified: false, want true")
		}
	}); n != 0 {
		t.Errorf("notModified: %v allocations, want 0", n)
	}
}
