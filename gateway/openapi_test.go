package gateway

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/upstream"
	"github.com/memcgate/memcgate/upstream/op"
)

// recipe makes a request that must get one documented status.
type recipe struct {
	method, target, body string
	hdr                  []string
	opts                 Options
	preset               map[string]string
	storeErr             error
	late                 bool // the body stops, and its next read times out (the read deadline passed)
}

// lateBody is a body whose first bytes come and whose next read fails
// as a connection's read past its deadline does.
type lateBody struct{ sent bool }

func (b *lateBody) Read(p []byte) (int, error) {
	if !b.sent {
		b.sent = true
		return copy(p, "[{"), nil
	}
	return 0, os.ErrDeadlineExceeded
}

var tokenOpts = Options{Tokens: NewTokens(map[string]Scope{"reader-0123456789": ScopeRead, "admin-01234567890": ScopeAdmin})}

// hostOpts check the Host against a name httptest's requests
// (example.com) do not send.
var hostOpts = Options{Hosts: NewHostCheck(NewAllowedHosts([]string{"cache.internal"}), slog.New(slog.DiscardHandler), prometheus.NewRegistry())}

const (
	readerAuth = "Bearer reader-0123456789"
	adminAuth  = "Bearer admin-01234567890" // no data scope at all
)

// recipes cover every status docs/openapi.json documents, per route.
var recipes = map[string]recipe{
	"GET /{key} 200": {method: "GET", target: "/k", preset: map[string]string{"k": "v"}},
	"GET /{key} 206": {method: "GET", target: "/k", preset: map[string]string{"k": "value"}, hdr: []string{"Range", "bytes=1-2"}},
	"GET /{key} 304": {method: "GET", target: "/k", preset: map[string]string{"k": "v"}, hdr: []string{"If-None-Match", `"1"`}},
	"GET /{key} 400": {method: "GET", target: "/a%20b"},
	"GET /{key} 401": {method: "GET", target: "/k", opts: tokenOpts},
	"GET /{key} 403": {method: "GET", target: "/k", opts: tokenOpts, hdr: []string{"Authorization", adminAuth}},
	"GET /{key} 404": {method: "GET", target: "/k"},
	"GET /{key} 416": {method: "GET", target: "/k", preset: map[string]string{"k": "v"}, hdr: []string{"Range", "bytes=5-"}},
	"GET /{key} 421": {method: "GET", target: "/k", preset: map[string]string{"k": "v"}, opts: hostOpts},
	"GET /{key} 502": {method: "GET", target: "/k", storeErr: &upstream.NodeError{Node: "n", Op: "get", Err: io.EOF}},
	"GET /{key} 503": {method: "GET", target: "/k", storeErr: upstream.ErrNoNodes},
	"GET /{key} 504": {method: "GET", target: "/k", storeErr: errTimeout},

	"HEAD /{key} 200": {method: "HEAD", target: "/k", preset: map[string]string{"k": "v"}},
	"HEAD /{key} 304": {method: "HEAD", target: "/k", preset: map[string]string{"k": "v"}, hdr: []string{"If-None-Match", `"1"`}},
	"HEAD /{key} 400": {method: "HEAD", target: "/a%20b"},
	"HEAD /{key} 401": {method: "HEAD", target: "/k", opts: tokenOpts},
	"HEAD /{key} 403": {method: "HEAD", target: "/k", opts: tokenOpts, hdr: []string{"Authorization", adminAuth}},
	"HEAD /{key} 404": {method: "HEAD", target: "/k"},
	"HEAD /{key} 502": {method: "HEAD", target: "/k", storeErr: &upstream.NodeError{Node: "n", Op: "mg", Err: io.EOF}},
	"HEAD /{key} 503": {method: "HEAD", target: "/k", storeErr: upstream.ErrNoNodes},
	"HEAD /{key} 504": {method: "HEAD", target: "/k", storeErr: errTimeout},
	"HEAD /{key} 421": {method: "HEAD", target: "/k", preset: map[string]string{"k": "v"}, opts: hostOpts},

	"PUT /{key} 201": {method: "PUT", target: "/k?exptime=5&flags=1", body: "v"},
	"PUT /{key} 202": {method: "PUT", target: "/k", body: "v", hdr: []string{"Prefer", "respond-async"}},
	"PUT /{key} 400": {method: "PUT", target: "/k?exptime=x", body: "v"},
	"PUT /{key} 401": {method: "PUT", target: "/k", body: "v", opts: tokenOpts},
	"PUT /{key} 403": {method: "PUT", target: "/k", body: "v", opts: Options{ReadOnly: true}},
	"PUT /{key} 412": {method: "PUT", target: "/k", body: "v", hdr: []string{"If-Match", "*"}},
	"PUT /{key} 408": {method: "PUT", target: "/k", late: true},
	"PUT /{key} 413": {method: "PUT", target: "/k", body: strings.Repeat("x", 65)},
	"PUT /{key} 421": {method: "PUT", target: "/k", body: "v", opts: hostOpts},
	"PUT /{key} 502": {method: "PUT", target: "/k", body: "v", storeErr: upstream.ErrServer},
	"PUT /{key} 503": {method: "PUT", target: "/k", body: "v", storeErr: upstream.ErrNoNodes},
	"PUT /{key} 504": {method: "PUT", target: "/k", body: "v", storeErr: errTimeout},

	"DELETE /{key} 202": {method: "DELETE", target: "/k", hdr: []string{"Prefer", "respond-async"}},
	"DELETE /{key} 204": {method: "DELETE", target: "/k", preset: map[string]string{"k": "v"}},
	"DELETE /{key} 400": {method: "DELETE", target: "/a%00"},
	"DELETE /{key} 401": {method: "DELETE", target: "/k", opts: tokenOpts},
	"DELETE /{key} 403": {method: "DELETE", target: "/k", opts: Options{ReadOnly: true}},
	"DELETE /{key} 404": {method: "DELETE", target: "/k"},
	"DELETE /{key} 412": {method: "DELETE", target: "/k", preset: map[string]string{"k": "v"}, hdr: []string{"If-Match", `"9"`}},
	"DELETE /{key} 501": {method: "DELETE", target: "/k", hdr: []string{"If-Match", `"9"`}, storeErr: upstream.ErrNoMeta},
	"DELETE /{key} 421": {method: "DELETE", target: "/k", preset: map[string]string{"k": "v"}, opts: hostOpts},
	"DELETE /{key} 502": {method: "DELETE", target: "/k", storeErr: upstream.ErrServer},
	"DELETE /{key} 503": {method: "DELETE", target: "/k", storeErr: upstream.ErrNoNodes},
	"DELETE /{key} 504": {method: "DELETE", target: "/k", storeErr: errTimeout},

	"POST /{key} 200": {method: "POST", target: "/k?op=incr&delta=2", preset: map[string]string{"k": "40"}},
	"POST /{key} 201": {method: "POST", target: "/k?op=append", body: "x", preset: map[string]string{"k": "v"}},
	"POST /{key} 204": {method: "POST", target: "/k?op=touch&exptime=9", preset: map[string]string{"k": "v"}},
	"POST /{key} 400": {method: "POST", target: "/k?op=nope"},
	"POST /{key} 401": {method: "POST", target: "/k?op=incr", opts: tokenOpts},
	"POST /{key} 403": {method: "POST", target: "/k?op=incr", opts: tokenOpts, hdr: []string{"Authorization", readerAuth}},
	"POST /{key} 404": {method: "POST", target: "/k?op=prepend", body: "x"},
	"POST /{key} 409": {method: "POST", target: "/k?op=incr", storeErr: upstream.ErrNotNumeric},
	"POST /{key} 408": {method: "POST", target: "/k?op=append", preset: map[string]string{"k": "v"}, late: true},
	"POST /{key} 413": {method: "POST", target: "/k?op=append", body: strings.Repeat("x", 65)},
	"POST /{key} 421": {method: "POST", target: "/k?op=incr", preset: map[string]string{"k": "40"}, opts: hostOpts},
	"POST /{key} 502": {method: "POST", target: "/k?op=incr", storeErr: upstream.ErrServer},
	"POST /{key} 503": {method: "POST", target: "/k?op=incr", storeErr: upstream.ErrNoNodes},
	"POST /{key} 504": {method: "POST", target: "/k?op=incr", storeErr: errTimeout},

	"GET / 200": {method: "GET", target: "/?key=a&key=b", preset: map[string]string{"a": "1"}},
	"GET / 400": {method: "GET", target: "/"},
	"GET / 401": {method: "GET", target: "/?key=a", opts: tokenOpts},
	"GET / 403": {method: "GET", target: "/?key=a", opts: tokenOpts, hdr: []string{"Authorization", adminAuth}},
	"GET / 421": {method: "GET", target: "/?key=a", preset: map[string]string{"a": "1"}, opts: hostOpts},
	"GET / 503": {method: "GET", target: "/?key=a&key=b", storeErr: upstream.ErrNoNodes},

	"POST / 200": {method: "POST", target: "/", body: `{"ops":[{"op":"set","key":"a","value":"1"}]}`},
	"POST / 202": {method: "POST", target: "/", body: `[{"op":"set","key":"a","value":"1"}]`, hdr: []string{"Prefer", "respond-async"}},
	"POST / 400": {method: "POST", target: "/", body: `{"ops":`},
	"POST / 401": {method: "POST", target: "/", body: `[]`, opts: tokenOpts},
	"POST / 403": {method: "POST", target: "/", body: `[{"op":"get","key":"a"}]`, opts: Options{ReadOnly: true}},
	"POST / 408": {method: "POST", target: "/", late: true},
	"POST / 413": {method: "POST", target: "/", body: `[{"op":"get","key":"` + strings.Repeat("a", 200) + `"}]`, opts: Options{BatchMaxBytes: 100}},
	"POST / 421": {method: "POST", target: "/", body: `[{"op":"set","key":"a","value":"1"}]`, opts: hostOpts},
	"POST / 503": {method: "POST", target: "/", body: `[{"op":"set","key":"a","value":"1"},{"op":"set","key":"b","value":"1"}]`, hdr: []string{"Prefer", "respond-async"}, opts: Options{AsyncQueue: 1}},
}

// errTimeout stands for a node that did not answer in time: the gateway
// maps the request deadline and a timed-out node the same way (504).
var errTimeout = context.DeadlineExceeded

// TestOpenAPI: every route, method and status in docs/openapi.json exists:
// a request made for it gets exactly that status, and every recipe is
// documented.
func TestOpenAPI(t *testing.T) {
	b, err := os.ReadFile("../docs/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	var spec struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(b, &spec); err != nil {
		t.Fatalf("docs/openapi.json: %v", err)
	}
	documented := map[string]bool{}
	mediaTypes := map[string][]string{} // name → the content types documented for it
	for path, methods := range spec.Paths {
		for method, raw := range methods {
			if method == "parameters" {
				continue
			}
			var op struct {
				Responses map[string]struct {
					Content map[string]json.RawMessage `json:"content"`
				} `json:"responses"`
			}
			if err := json.Unmarshal(raw, &op); err != nil {
				t.Fatalf("%s %s: %v", method, path, err)
			}
			for status, resp := range op.Responses {
				name := strings.ToUpper(method) + " " + path + " " + status
				documented[name] = true
				for mt := range resp.Content {
					mediaTypes[name] = append(mediaTypes[name], mt)
				}
			}
		}
	}
	var names []string
	for name := range documented {
		names = append(names, name)
	}
	sort.Strings(names)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, name := range names {
		rc, ok := recipes[name]
		if !ok {
			t.Errorf("docs/openapi.json documents %s, but no test request produces it", name)
			continue
		}
		want, _ := strconv.Atoi(name[strings.LastIndexByte(name, ' ')+1:])
		s := newFake()
		for k, v := range rc.preset {
			s.Put(op.Item{Key: k, Value: []byte(v)})
		}
		s.Err = rc.storeErr
		opts := rc.opts
		if opts.MaxValueBytes == 0 {
			opts.MaxValueBytes = 64
		}
		h := NewHandler(s, log, prometheus.NewRegistry(), opts)
		var body io.Reader
		if rc.body != "" {
			body = strings.NewReader(rc.body)
		}
		if rc.late {
			body = &lateBody{}
		}
		req := httptest.NewRequest(rc.method, rc.target, body)
		if rc.late {
			req.ContentLength = 10
		}
		for i := 0; i+1 < len(rc.hdr); i += 2 {
			req.Header.Set(rc.hdr[i], rc.hdr[i+1])
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != want {
			t.Errorf("%s: %s %s = %d %q, want %d", name, rc.method, rc.target, w.Code, w.Body.String(), want)
		}
		// Errors are text/plain, but for the answers documented as
		// carrying JSON (a multi-get or batch of which no item reached
		// memcached still gives every item's result).
		ct, _, _ := strings.Cut(w.Header().Get("Content-Type"), ";")
		if w.Code >= 400 && ct != "text/plain" && !slices.Contains(mediaTypes[name], ct) {
			t.Errorf("%s: error Content-Type %q, want text/plain or one of those documented, %v", name, ct, mediaTypes[name])
		}
	}
	for name := range recipes {
		if !documented[name] {
			t.Errorf("test request %s is not documented in docs/openapi.json", name)
		}
	}
}
