package memc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"html"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/gateway"
	"github.com/memcgate/memcgate/gateway/budget"
	"github.com/memcgate/memcgate/gateway/chunk"
	"github.com/memcgate/memcgate/gateway/storetest"
	"github.com/memcgate/memcgate/upstream"
	"github.com/memcgate/memcgate/upstream/op"
)

func TestNginxArg(t *testing.T) {
	tests := []struct {
		query, name string
		want        string
		wantOK      bool
	}{
		{"key=a", "key", "a", true},
		{"cmd=set&key=a%20b&val=x", "key", "a%20b", true},
		{"KEY=up", "key", "up", true},
		{"kEy=mixed&key=second", "key", "mixed", true},
		{"key=first&key=second", "key", "first", true},
		{"key&key=x", "key", "x", true},
		{"key", "key", "", false},
		{"monkey=1&key=2", "key", "2", true},
		{"xkey=1", "key", "", false},
		{"key=a;cmd=set", "key", "a;cmd=set", true},
		{"a=1&&key=", "key", "", true},
		{"val=hello%20world+x", "val", "hello%20world+x", true},
		{"", "key", "", false},
		{"ke", "key", "", false},
		{"key=", "key", "", true},
		{"\u212aey=kelvin", "key", "", false},
	}
	for _, tt := range tests {
		got, ok := nginxArg(tt.query, tt.name)
		if got != tt.want || ok != tt.wantOK {
			t.Errorf("nginxArg(%q, %q) = %q, %v; want %q, %v", tt.query, tt.name, got, ok, tt.want, tt.wantOK)
		}
	}
}

func TestSplitTarget(t *testing.T) {
	tests := []struct{ target, path, query string }{
		{"/memc?key=a", "/memc", "key=a"},
		{"/memc", "/memc", ""},
		{"/memc?key=a#frag&val=x", "/memc", "key=a"},
		{"/key/a#b?c", "/key/a", ""},
		{"http://host:80/memc?key=a", "/memc", "key=a"},
		{"http://host?key=a", "/", "key=a"},
		{"http://host", "/", ""},
		{"/a?b?c", "/a", "b?c"},
	}
	for _, tt := range tests {
		p, q := splitTarget(tt.target)
		if p != tt.path || q != tt.query {
			t.Errorf("splitTarget(%q) = %q, %q; want %q, %q", tt.target, p, q, tt.path, tt.query)
		}
	}
}

func TestNginxPath(t *testing.T) {
	tests := []struct {
		raw, want  string
		wantQuoted bool
		wantErr    bool
	}{
		{raw: "/key/a", want: "/key/a"},
		{raw: "/key/a%20b", want: "/key/a b", wantQuoted: true},
		{raw: "/key/a+b", want: "/key/a+b", wantQuoted: true},
		{raw: "/key/x%2Fy", want: "/key/x/y", wantQuoted: true},
		{raw: "/key/x%2F%2Fy", want: "/key/x/y", wantQuoted: true},
		{raw: "/key/x//y", want: "/key/x/y"},
		{raw: "/key/x%2F..%2Fy", want: "/key/y", wantQuoted: true},
		{raw: "/key/a/%2e%2e/b", want: "/key/b", wantQuoted: true},
		{raw: "/key/x/.", want: "/key/x/"},
		{raw: "/key/x/..", want: "/key/"},
		{raw: "/key/x/", want: "/key/x/"},
		{raw: "/key/x/.hidden", want: "/key/x/.hidden"},
		{raw: "/key/x/...", want: "/key/x/..."},
		{raw: "/key/..", want: "/"},
		{raw: "/key/../x", want: "/x"},
		{raw: "/", want: "/"},
		{raw: "/key/a%2520b", want: "/key/a%20b", wantQuoted: true},
		{raw: "/key/../../x", wantErr: true},
		{raw: "/..", wantErr: true},
		{raw: "/key/%00", wantErr: true},
		{raw: "/key/x%", wantErr: true},
		{raw: "/key/x%zz", wantErr: true},
		{raw: "/key/x%2", wantErr: true},
		{raw: "/key/a\x01b", wantErr: true},
		{raw: "/key/a\x7fb", wantErr: true},
		{raw: "/key/a%01b", want: "/key/a\x01b", wantQuoted: true},
		{raw: "key", wantErr: true},
		{raw: "", wantErr: true},
	}
	for _, tt := range tests {
		got, quoted, err := nginxPath(tt.raw)
		if (err != nil) != tt.wantErr {
			t.Errorf("nginxPath(%q) error = %v, want error %v", tt.raw, err, tt.wantErr)
			continue
		}
		if err == nil && (got != tt.want || quoted != tt.wantQuoted) {
			t.Errorf("nginxPath(%q) = %q, quoted %v; want %q, %v", tt.raw, got, quoted, tt.want, tt.wantQuoted)
		}
	}
}

func TestRegexCapture(t *testing.T) {
	tests := []struct {
		path, want string
		wantOK     bool
	}{
		{"/key/a", "a", true},
		{"/key/", "", false},
		{"/memc", "", false},
		{"/key/ab\n", "ab", true},
		{"/key/a\nb", "", false},
		{"/key/\n", "", false},
		{"/key/ab\n\n", "", false},
		{"/key/a\rb", "a\rb", true},
	}
	for _, tt := range tests {
		got, ok := regexCapture(tt.path, "/key/")
		if got != tt.want || ok != tt.wantOK {
			t.Errorf("regexCapture(%q) = %q, %v; want %q, %v", tt.path, got, ok, tt.want, tt.wantOK)
		}
	}
}

func TestEscapes(t *testing.T) {
	tests := []struct {
		name string
		f    func(string) string
		in   string
		want string
	}{
		{"memc: plain", memcEscape, "abc/ä€", "abc/ä€"},
		{"memc: space, percent", memcEscape, "a b%c", "a%20b%25c"},
		{"memc: controls", memcEscape, "\x00\x01\r\n\x1f", "%00%01%0D%0A%1F"},
		{"memc: DEL (memcgate only)", memcEscape, "a\x7fb", "a%7Fb"},
		{"memc: what nginx leaves", memcEscape, "\"#&+;<>?\\^`{|}~", "\"#&+;<>?\\^`{|}~"},
		{"args: table", argsEscape, " \"#%&+;<>?\\^`{|}", "%20%22%23%25%26%2B%3B%3C%3E%3F%5C%5E%60%7B%7C%7D"},
		{"args: what stays", argsEscape, "az09/!$'()*,-.:=@[]_~", "az09/!$'()*,-.:=@[]_~"},
		{"args: bytes", argsEscape, "\x01\x7f\x80\xff", "%01%7F%80%FF"},
	}
	for _, tt := range tests {
		if got := tt.f(tt.in); got != tt.want {
			t.Errorf("%s: escape(%q) = %q, want %q", tt.name, tt.in, got, tt.want)
		}
	}
}

func TestDigitsAndRanges(t *testing.T) {
	digitTests := []struct {
		s    string
		max  int
		want bool
	}{
		{"0", 10, true}, {"0000000007", 10, true}, {"12345678901", 10, false}, {"", 10, false},
		{"-1", 10, false}, {"+1", 10, false}, {"1a", 10, false}, {"9999999999999999999", 19, true},
		{"00000000000000000001", 19, false}, {" 1", 10, false},
	}
	for _, tt := range digitTests {
		if got := digits(tt.s, tt.max); got != tt.want {
			t.Errorf("digits(%q, %d) = %v, want %v", tt.s, tt.max, got, tt.want)
		}
	}
	flagTests := []struct {
		s    string
		want uint32
	}{{"", 0}, {"7", 7}, {"0000000007", 7}, {"4294967295", 4294967295}, {"4294967297", 1}, {"9999999999", 1410065407}}
	for _, tt := range flagTests {
		if got := memcFlags(tt.s); got != tt.want {
			t.Errorf("memcFlags(%q) = %d, want %d", tt.s, got, tt.want)
		}
	}
	expTests := []struct {
		s    string
		want int32
	}{{"", 0}, {"1", 1}, {"2147483647", 2147483647}, {"2147483648", -2147483648}, {"4294967295", -1}, {"4294967296", 0}, {"9999999999", 1410065407}}
	for _, tt := range expTests {
		if got := memcExptime(tt.s); got != tt.want {
			t.Errorf("memcExptime(%q) = %d, want %d", tt.s, got, tt.want)
		}
	}
}

// memcCommands lists the command names the module (and so memcgate)
// supports, in the module's order.
func memcCommands() []string {
	out := make([]string, 0, memcCmdCount-1)
	for c := memcGet; c < memcCmdCount; c++ {
		out = append(out, c.String())
	}
	return out
}

func TestParseMemcCmd(t *testing.T) {
	for _, name := range memcCommands() {
		if c := parseMemcCmd(name); c == memcNone || c.String() != name {
			t.Errorf("parseMemcCmd(%q) = %v, want the command", name, c)
		}
	}
	for _, name := range []string{"", "GET", "Set", "gets", "cas", "touch", "gat", "verbosity", "quit", "flush%5Fall"} {
		if c := parseMemcCmd(name); c != memcNone {
			t.Errorf("parseMemcCmd(%q) = %v, want none", name, c)
		}
	}
	if got := len(memcCommands()); got != 12 {
		t.Errorf("memcCommands() has %d names, want 12", got)
	}
}

// memcFake is a Store (storetest's) and a Cluster whose replies a test
// sets.
type memcFake struct {
	*storetest.Store
	cmu      sync.Mutex // guards replies, delays
	replies  []upstream.NodeReply
	delays   []int32
	lastCall string
}

func newMemcFake() *memcFake { return &memcFake{Store: storetest.New()} }

func (f *memcFake) cluster(cmd string) []upstream.NodeReply {
	f.cmu.Lock()
	defer f.cmu.Unlock()
	f.lastCall = cmd
	return append([]upstream.NodeReply(nil), f.replies...)
}

func (f *memcFake) FlushAll(_ context.Context, delay int32) []upstream.NodeReply {
	f.cmu.Lock()
	f.delays = append(f.delays, delay)
	f.cmu.Unlock()
	return f.cluster("flush_all")
}
func (f *memcFake) Stats(context.Context) []upstream.NodeReply   { return f.cluster("stats") }
func (f *memcFake) Version(context.Context) []upstream.NodeReply { return f.cluster("version") }

// newMemcHandler is the gateway with the compatible endpoints of mo
// (both on by default) over f; opts' Tokens and ReadOnly apply to both.
func newMemcHandler(t *testing.T, f *memcFake, opts gateway.Options, mo Options) http.Handler {
	t.Helper()
	mo.Store, mo.Cluster = f, f
	opts.Access = gateway.NewAccess(opts.Tokens, opts.ReadOnly)
	mo.Access = opts.Access
	if mo.MaxKeyLen == 0 {
		mo.MaxKeyLen = opts.MaxKeyLen
	}
	if mo.Path == "" && mo.KeyPath == "" {
		mo.Path, mo.KeyPath = "/memc", "/key/"
	}
	rt, _ := New(mo)
	opts.Routes = []gateway.Route{rt}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	return gateway.NewHandler(f, log, prometheus.NewRegistry(), opts)
}

// memcDo sends a request whose target is used raw (RequestURI), as a
// server would see it.
func memcDo(h http.Handler, method, target string, body io.Reader, hdr ...string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, "/", body)
	req.RequestURI = target
	u, err := url.ParseRequestURI(target)
	if err != nil {
		panic(err)
	}
	req.URL = u
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return w
}

func TestMemcRequests(t *testing.T) {
	nodeDown := &upstream.NodeError{Node: "n:1", Op: "get", Err: errors.New("connection refused")}
	tests := []struct {
		name       string
		mo         Options
		opts       gateway.Options
		preset     map[string]string
		err        error // injected into every store call
		method     string
		target     string
		body       string
		hdr        []string
		wantStatus int
		wantBody   string // exact, unless wantPage
		wantPage   bool   // an nginx-style text/html page
		wantReason string // in the page's footer, with wantPage
		wantHdr    map[string]string
		wantCalls  int // store calls; -1 any
	}{
		{name: "set", mo: Options{FlagsHeader: "X-Memc-Flags"}, target: "/memc?cmd=set&key=k&val=v", wantStatus: 201, wantBody: "STORED\r\n", wantHdr: map[string]string{"X-Memc-Flags": "0", "Content-Type": "text/plain"}, wantCalls: 1},
		{name: "get hit", preset: map[string]string{"k": "v"}, target: "/memc?key=k", wantStatus: 200, wantBody: "v", wantHdr: map[string]string{"Content-Length": "1"}, wantCalls: 1},
		{name: "get miss", target: "/memc?key=k", wantStatus: 404, wantPage: true, wantCalls: 1},
		{name: "HEAD get", method: "HEAD", preset: map[string]string{"k": "vvv"}, target: "/memc?key=k", wantStatus: 200, wantHdr: map[string]string{"Content-Length": "3"}, wantCalls: 1},
		{name: "POST is add", method: "POST", preset: map[string]string{"k": "v"}, target: "/memc?key=k&val=x", wantStatus: 200, wantBody: "NOT_STORED\r\n", wantCalls: 1},
		{name: "DELETE", method: "DELETE", preset: map[string]string{"k": "v"}, target: "/memc?key=k", wantStatus: 200, wantBody: "DELETED\r\n", wantCalls: 1},
		{name: "OPTIONS", method: "OPTIONS", target: "/memc?key=k", wantStatus: 400, wantPage: true, wantHdr: map[string]string{"Connection": "close"}},
		{name: "unknown command", target: "/memc?cmd=gets&key=k", wantStatus: 400, wantPage: true},
		{name: "not allowed", mo: Options{Path: "/ro", CmdsAllowed: []string{"get", "version"}}, target: "/ro?cmd=set&key=k&val=v", wantStatus: 403, wantPage: true},
		{name: "not allowed beats missing key", mo: Options{Path: "/ro", CmdsAllowed: []string{"get"}}, target: "/ro?cmd=delete", wantStatus: 403, wantPage: true},
		{name: "unknown beats not allowed", mo: Options{Path: "/ro", CmdsAllowed: []string{"get"}}, target: "/ro?cmd=nope", wantStatus: 400, wantPage: true},
		{name: "bad exptime beats missing key", target: "/memc?cmd=set&val=1&exptime=x", wantStatus: 400, wantPage: true},
		{name: "exptime unchecked for get", preset: map[string]string{"k": "v"}, target: "/memc?key=k&exptime=x", wantStatus: 200, wantBody: "v", wantCalls: 1},
		{name: "bad flags", target: "/memc?cmd=set&key=k&val=1&flags=-1", wantStatus: 400, wantPage: true},
		{name: "bad delta", target: "/memc?cmd=incr&key=k&val=1x", wantStatus: 400, wantPage: true, wantReason: "incr needs ?val= with a delta of 1 to 19 digits"},
		// The path style has no delta source (the reference location sets
		// no $memc_value): the refusal says where a delta can go, not to
		// send one the endpoint cannot take.
		{name: "path: incr has no delta", method: "POST", target: "/key/k?cmd=incr", body: "5", wantStatus: 400, wantPage: true, wantReason: "incr takes its delta from ?val= on the query endpoint"},
		{name: "missing key", target: "/memc?cmd=set&val=1", wantStatus: 500, wantPage: true, wantHdr: map[string]string{"Connection": "close"}},
		{name: "declared body too large beats unknown command", mo: Options{MaxBodyBytes: 4}, target: "/memc?cmd=nope", body: "12345", wantStatus: 413, wantPage: true, wantReason: "request body is 5 bytes; at most 4 are accepted (MEMCGATE_MEMC_MAX_BODY_BYTES)"},
		{name: "body at the limit", mo: Options{MaxBodyBytes: 4}, method: "PUT", target: "/key/k", body: "1234", wantStatus: 201, wantBody: "STORED\r\n", wantCalls: 1},
		{name: "path: no body is 500", method: "PUT", target: "/key/k", wantStatus: 500, wantPage: true},
		{name: "path: Content-Length 0 stores empty", method: "PUT", target: "/key/k", hdr: []string{"Content-Length", "0"}, wantStatus: 201, wantCalls: 1},
		{name: "path: not under the prefix after normalising", target: "/key/x/..", wantStatus: 404, wantPage: true},
		{name: "path: above the root", target: "/key/../../x", wantStatus: 400, wantPage: true},
		{name: "path: into the query endpoint", preset: map[string]string{"k": "v"}, target: "/key/../memc?key=k", wantStatus: 200, wantBody: "v", wantCalls: 1},
		{name: "path: escaped key", preset: map[string]string{"a%2520b": "v"}, target: "/key/a%20b", wantStatus: 200, wantBody: "v", wantCalls: 1},
		{name: "query: escaped key", preset: map[string]string{"a%2520b%20c": "v"}, target: "/memc?key=a%20b%20c", wantStatus: 404, wantPage: true, wantCalls: 1},
		{name: "key over 250 after escaping is never sent (set)", target: "/memc?cmd=set&val=1&key=" + strings.Repeat("k", 246) + "%20", wantStatus: 502, wantBody: "CLIENT_ERROR bad command line format\r\n", wantCalls: 0},
		{name: "key over 250 after escaping is never sent (get)", target: "/memc?key=" + strings.Repeat("k", 251), wantStatus: 502, wantPage: true, wantCalls: 0},
		{name: "key limit is MaxKeyLen (prefix)", opts: gateway.Options{MaxKeyLen: 10}, target: "/memc?cmd=delete&key=" + strings.Repeat("k", 11), wantStatus: 502, wantBody: "CLIENT_ERROR bad command line format\r\n", wantCalls: 0},
		{name: "delete with exptime is answered, not sent", target: "/memc?cmd=delete&key=k&exptime=5", wantStatus: 502, wantBody: "CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]\r\n", wantCalls: 0},
		{name: "delete with exptime 0", preset: map[string]string{"k": "v"}, target: "/memc?cmd=delete&key=k&exptime=0", wantStatus: 200, wantBody: "DELETED\r\n", wantCalls: 1},
		{name: "incr", preset: map[string]string{"n": "41"}, target: "/memc?cmd=incr&key=n&val=1", wantStatus: 201, wantBody: "42\r\n", wantCalls: 1},
		{name: "incr not numeric", preset: map[string]string{"n": "x"}, target: "/memc?cmd=incr&key=n&val=1", wantStatus: 502, wantBody: "CLIENT_ERROR cannot increment or decrement non-numeric value\r\n", wantCalls: 1},
		{name: "too large", err: fmt.Errorf("%w: set n:1", upstream.ErrTooLarge), target: "/memc?cmd=set&key=k&val=v", wantStatus: 502, wantBody: "SERVER_ERROR object too large for cache\r\n", wantCalls: 1},
		{name: "out of memory", err: fmt.Errorf("%w: set n:1", upstream.ErrNoMemory), target: "/memc?cmd=set&key=k&val=v", wantStatus: 502, wantBody: "SERVER_ERROR out of memory storing object\r\n", wantCalls: 1},
		{name: "other server error", err: fmt.Errorf("%w: set n:1: x", upstream.ErrServer), target: "/memc?cmd=set&key=k&val=v", wantStatus: 502, wantBody: "SERVER_ERROR memcached answered with an error\r\n", wantCalls: 1},
		{name: "server error on get is a page", err: fmt.Errorf("%w: get n:1: x", upstream.ErrServer), target: "/memc?key=k", wantStatus: 502, wantPage: true, wantCalls: 1},
		{name: "no nodes is 502, not 503", err: upstream.ErrNoNodes, target: "/memc?key=k", wantStatus: 502, wantPage: true, wantCalls: 1},
		{name: "refused is 502", err: nodeDown, target: "/memc?cmd=set&key=k&val=v", wantStatus: 502, wantPage: true, wantCalls: 1},
		{name: "a slow node past its share is 502", err: &upstream.BusyError{Node: "n:1", Share: 5000}, target: "/memc?cmd=get&key=k", wantStatus: 502, wantPage: true, wantCalls: 1},
		{name: "deadline is 504", err: context.DeadlineExceeded, target: "/memc?key=k", wantStatus: 504, wantPage: true, wantCalls: 1},
		{name: "a write that waited for async writes past its deadline is 504", err: fmt.Errorf("%w: %w", gateway.ErrWaitedForAsync, context.DeadlineExceeded), target: "/memc?cmd=set&key=k&val=v", wantStatus: 504, wantPage: true, wantCalls: 1},
		{name: "flags header", mo: Options{FlagsHeader: "X-Memc-Flags"}, target: "/memc?cmd=set&key=k&val=v&flags=0007", wantStatus: 201, wantHdr: map[string]string{"X-Memc-Flags": "0007"}, wantCalls: 1},
		{name: "no flags header on errors", mo: Options{FlagsHeader: "X-Memc-Flags"}, target: "/memc?key=k&flags=3", wantStatus: 404, wantPage: true, wantHdr: map[string]string{"X-Memc-Flags": ""}, wantCalls: 1},
		{name: "Last-Modified", mo: Options{FlagsToLastModified: true}, target: "/memc?key=lm", wantStatus: 200, wantHdr: map[string]string{"Last-Modified": "Thu, 28 Jan 2010 12:09:23 GMT"}, wantCalls: 1},
		{name: "content type", mo: Options{ContentType: "application/octet-stream"}, preset: map[string]string{"k": "v"}, target: "/memc?key=k", wantStatus: 200, wantHdr: map[string]string{"Content-Type": "application/octet-stream"}, wantCalls: 1},
		{name: "tokens: none is 401", opts: gateway.Options{Tokens: gateway.NewTokens(map[string]gateway.Scope{"read-token-0123456789": gateway.ScopeRead})}, target: "/memc?key=k", wantStatus: 401, wantPage: true, wantHdr: map[string]string{"WWW-Authenticate": `Bearer realm="memcgate"`}},
		{name: "tokens: read may get", opts: gateway.Options{Tokens: gateway.NewTokens(map[string]gateway.Scope{"read-token-0123456789": gateway.ScopeRead})}, preset: map[string]string{"k": "v"}, target: "/memc?key=k", hdr: []string{"Authorization", "Bearer read-token-0123456789"}, wantStatus: 200, wantCalls: 1},
		{name: "tokens: GET ?cmd=set needs write", opts: gateway.Options{Tokens: gateway.NewTokens(map[string]gateway.Scope{"read-token-0123456789": gateway.ScopeRead})}, target: "/memc?cmd=set&key=k&val=v", hdr: []string{"Authorization", "Bearer read-token-0123456789"}, wantStatus: 403, wantPage: true},
		{name: "tokens: flush_all needs admin", opts: gateway.Options{Tokens: gateway.NewTokens(map[string]gateway.Scope{"write-token-0123456789": gateway.ScopeWrite})}, target: "/memc?cmd=flush_all", hdr: []string{"Authorization", "Bearer write-token-0123456789"}, wantStatus: 403, wantPage: true},
		{name: "read-only: GET ?cmd=incr", opts: gateway.Options{ReadOnly: true}, target: "/memc?cmd=incr&key=n&val=1", wantStatus: 403, wantPage: true},
		{name: "read-only: get", opts: gateway.Options{ReadOnly: true}, preset: map[string]string{"k": "v"}, target: "/memc?key=k", wantStatus: 200, wantCalls: 1},
		{name: "other paths reach the native API", preset: map[string]string{"memcx": "native"}, target: "/memcx", wantStatus: 200, wantBody: "native", wantCalls: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newMemcFake()
			for k, v := range tt.preset {
				f.Put(op.Item{Key: k, Value: []byte(v)})
			}
			f.Put(op.Item{Key: "lm", Value: []byte("x"), Flags: 1264680563})
			f.Calls = 0
			f.Err = tt.err
			h := newMemcHandler(t, f, tt.opts, tt.mo)
			method := tt.method
			if method == "" {
				method = "GET"
			}
			var body io.Reader
			if tt.body != "" {
				body = strings.NewReader(tt.body)
			}
			w := memcDo(h, method, tt.target, body, tt.hdr...)
			if w.Code != tt.wantStatus {
				t.Fatalf("%s %s = %d %q, want %d", method, tt.target, w.Code, w.Body.String(), tt.wantStatus)
			}
			ct := w.Header().Get("Content-Type")
			switch {
			case tt.wantPage:
				if ct != "text/html" || !strings.Contains(w.Body.String(), "<title>"+strconv.Itoa(tt.wantStatus)) {
					t.Errorf("%s %s: Content-Type %q body %q, want an nginx-style page", method, tt.target, ct, w.Body.String())
				}
				if !strings.Contains(w.Body.String(), html.EscapeString(tt.wantReason)) {
					t.Errorf("%s %s: page %q, want the reason %q", method, tt.target, w.Body.String(), tt.wantReason)
				}
			case tt.wantBody != "" && w.Body.String() != tt.wantBody:
				t.Errorf("%s %s: body %q, want %q", method, tt.target, w.Body.String(), tt.wantBody)
			}
			for k, v := range tt.wantHdr {
				if got := w.Header().Get(k); got != v {
					t.Errorf("%s %s: header %s = %q, want %q", method, tt.target, k, got, v)
				}
			}
			if tt.wantCalls >= 0 && f.Calls != tt.wantCalls {
				t.Errorf("%s %s: %d store calls, want %d", method, tt.target, f.Calls, tt.wantCalls)
			}
		})
	}
}

func TestMemcCluster(t *testing.T) {
	stats := func(pid string) []byte { return []byte("STAT pid " + pid + "\r\nSTAT uptime 1\r\nEND\r\n") }
	down := fmt.Errorf("%w: n3 is down", upstream.ErrNoNodes)
	refused := &upstream.NodeError{Node: "n2", Op: "command", Err: errors.New("connection refused")}
	tests := []struct {
		name       string
		target     string
		replies    []upstream.NodeReply
		wantStatus int
		wantBody   string // "" with a page
		wantDelay  int32
	}{
		{"stats of every node, one END", "/memc?cmd=stats", []upstream.NodeReply{{Node: "n1", Reply: stats("1")}, {Node: "n2", Reply: stats("2")}}, 200,
			"STAT pid 1\r\nSTAT uptime 1\r\nSTAT pid 2\r\nSTAT uptime 1\r\nEND\r\n", 0},
		{"stats skips a node held down", "/memc?cmd=stats", []upstream.NodeReply{{Node: "n1", Reply: stats("1")}, {Node: "n3", Err: down}}, 200,
			"STAT pid 1\r\nSTAT uptime 1\r\nEND\r\n", 0},
		{"stats with a failing node", "/memc?cmd=stats", []upstream.NodeReply{{Node: "n1", Reply: stats("1")}, {Node: "n2", Err: refused}}, 502, "", 0},
		{"stats with every node down", "/memc?cmd=stats", []upstream.NodeReply{{Node: "n3", Err: down}}, 502, "", 0},
		{"flush_all", "/memc?cmd=flush_all", []upstream.NodeReply{{Node: "n1", Reply: []byte("OK\r\n")}, {Node: "n2", Reply: []byte("OK\r\n")}}, 200, "OK\r\n", 0},
		{"flush_all with a delay", "/memc?cmd=flush_all&exptime=30", []upstream.NodeReply{{Node: "n1", Reply: []byte("OK\r\n")}}, 200, "OK\r\n", 30},
		{"flush_all with a truncated delay", "/memc?cmd=flush_all&exptime=4294967295", []upstream.NodeReply{{Node: "n1", Reply: []byte("OK\r\n")}}, 200, "OK\r\n", -1},
		{"flush_all with an error line", "/memc?cmd=flush_all", []upstream.NodeReply{{Node: "n1", Reply: []byte("OK\r\n")}, {Node: "n2", Reply: []byte("CLIENT_ERROR flush_all not allowed\r\n")}}, 502,
			"CLIENT_ERROR flush_all not allowed\r\n", 0},
		{"flush_all with a failing node", "/memc?cmd=flush_all", []upstream.NodeReply{{Node: "n1", Reply: []byte("OK\r\n")}, {Node: "n2", Err: refused}}, 502, "", 0},
		{"version of the first node", "/memc?cmd=version", []upstream.NodeReply{{Node: "n1", Reply: []byte("VERSION 1.6.18\r\n")}, {Node: "n2", Reply: []byte("VERSION 1.6.9\r\n")}}, 200, "VERSION 1.6.18\r\n", 0},
		{"version skips a failing node", "/memc?cmd=version", []upstream.NodeReply{{Node: "n2", Err: refused}, {Node: "n1", Reply: []byte("VERSION 1.6.18\r\n")}}, 200, "VERSION 1.6.18\r\n", 0},
		{"version with no node", "/memc?cmd=version", []upstream.NodeReply{{Node: "n2", Err: refused}}, 502, "", 0},
		{"version timeout", "/memc?cmd=version", []upstream.NodeReply{{Node: "n2", Err: &upstream.NodeError{Node: "n2", Op: "command", Err: context.DeadlineExceeded}}}, 504, "", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newMemcFake()
			f.replies = tt.replies
			h := newMemcHandler(t, f, gateway.Options{}, Options{})
			w := memcDo(h, "GET", tt.target, nil)
			if w.Code != tt.wantStatus {
				t.Fatalf("GET %s = %d %q, want %d", tt.target, w.Code, w.Body.String(), tt.wantStatus)
			}
			if tt.wantBody == "" {
				if ct := w.Header().Get("Content-Type"); ct != "text/html" {
					t.Errorf("GET %s: Content-Type %q, want an nginx-style page", tt.target, ct)
				}
			} else if got := w.Body.String(); got != tt.wantBody {
				t.Errorf("GET %s: body %q, want %q", tt.target, got, tt.wantBody)
			}
			if len(f.delays) > 0 && f.delays[0] != tt.wantDelay {
				t.Errorf("GET %s: flush_all delay %d, want %d", tt.target, f.delays[0], tt.wantDelay)
			}
		})
	}
}

// TestMemcChunkedTooLarge: a chunked body over the cap is 413 only after
// the command checks, as nginx reads it there.
func TestMemcChunkedTooLarge(t *testing.T) {
	f := newMemcFake()
	h := newMemcHandler(t, f, gateway.Options{}, Options{MaxBodyBytes: 4})
	for _, tt := range []struct {
		target string
		want   int
	}{{"/memc?cmd=nope", 400}, {"/memc?key=k", 413}, {"/memc?cmd=set", 413}} {
		req := httptest.NewRequest("PUT", tt.target, io.MultiReader(strings.NewReader("123"), strings.NewReader("45")))
		req.ContentLength = -1
		req.TransferEncoding = []string{"chunked"}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != tt.want {
			t.Errorf("chunked PUT %s = %d, want %d", tt.target, w.Code, tt.want)
		}
		if tt.want == 413 && !strings.Contains(w.Body.String(), "are accepted (MEMCGATE_MEMC_MAX_BODY_BYTES)") {
			t.Errorf("chunked PUT %s: page %q, want the limit named", tt.target, w.Body.String())
		}
	}
	if f.Calls != 0 {
		t.Errorf("%d store calls, want 0", f.Calls)
	}
}

func FuzzNginxArg(f *testing.F) {
	for _, s := range []string{"key=a", "KEY=a&key=b", "key&key=x", "xkey=1&key=2", "a=1&&key=", "key=a;b"} {
		f.Add(s, "key")
	}
	f.Fuzz(func(t *testing.T, q, name string) {
		if name == "" || strings.ContainsAny(name, "&=") {
			return
		}
		v, ok := nginxArg(q, name)
		if !ok {
			if v != "" {
				t.Fatalf("nginxArg(%q, %q) = %q without a match", q, name, v)
			}
			return
		}
		if strings.Contains(v, "&") {
			t.Fatalf("nginxArg(%q, %q) = %q crosses an &", q, name, v)
		}
		found := false
		for _, arg := range strings.Split(q, "&") {
			if n, val, has := strings.Cut(arg, "="); has && asciiEqualFold(n, name) {
				found = val == v
				break
			}
		}
		if !found {
			t.Fatalf("nginxArg(%q, %q) = %q, not the first %s= argument", q, name, v, name)
		}
	})
}

func FuzzNginxPath(f *testing.F) {
	for _, s := range []string{"/key/a", "/key/x%2F..%2Fy", "/key/../..", "/a//b/./c/", "/%2e%2e", "/key/%00", "/k+y", "/\x00", "/a%0A\x7f"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		p, _, err := nginxPath(raw)
		if err != nil {
			return
		}
		if !strings.HasPrefix(p, "/") || strings.Contains(p, "//") || strings.IndexByte(p, 0) >= 0 {
			t.Fatalf("nginxPath(%q) = %q: not normalised", raw, p)
		}
		for _, seg := range strings.Split(p, "/") {
			if seg == "." || seg == ".." {
				t.Fatalf("nginxPath(%q) = %q keeps a dot segment", raw, p)
			}
		}
		reescaped := escapeBytes(p, func(c byte) bool { return c < ' ' || c == 0x7f || c == '%' })
		if again, _, err := nginxPath(reescaped); err != nil || again != p {
			t.Fatalf("nginxPath(%q) = %q is not stable: %q, %v", raw, p, again, err)
		}
	})
}

func FuzzMemcEscape(f *testing.F) {
	for _, s := range []string{"a b", "100%", "\x00\r\n", "ä€/", "\x7f"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		e := memcEscape(key)
		if i := strings.IndexFunc(e, func(r rune) bool { return r <= ' ' || r == 0x7f }); i >= 0 {
			t.Fatalf("memcEscape(%q) = %q, which memcached cannot carry (byte %d)", key, e, i)
		}
		back, err := url.PathUnescape(e)
		if err != nil || back != key {
			t.Fatalf("memcEscape(%q) = %q does not unescape back (%q, %v): keys could collide", key, e, back, err)
		}
		a := argsEscape(key)
		if back, err := url.PathUnescape(a); err != nil || back != key {
			t.Fatalf("argsEscape(%q) = %q does not unescape back (%q, %v)", key, a, back, err)
		}
	})
}

// TestMemcChunkedValue: a value the REST API stored in chunks is never
// served as its index's bytes: get answers 409 saying where to read it,
// and append refuses to change it (with the chunk-aware Store).
func TestMemcChunkedValue(t *testing.T) {
	f := newMemcFake()
	index := chunk.Index{Version: 1, Size: 2500, ChunkSize: 1000}.Encode()
	f.Put(op.Item{Key: "big", Value: index, Flags: chunk.IndexFlags})
	rt, _ := New(Options{Path: "/memc", KeyPath: "/key/", Store: chunk.New(f, chunk.Options{ChunkSize: 1000}, prometheus.NewRegistry()), Cluster: f})
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	h := gateway.NewHandler(f, log, prometheus.NewRegistry(), gateway.Options{Routes: []gateway.Route{rt}})
	for _, target := range []string{"/memc?key=big", "/key/big", "/memc?cmd=append&key=big&val=x", "/memc?cmd=prepend&key=big&val=x"} {
		w := memcDo(h, "GET", target, nil)
		if w.Code != 409 || !strings.Contains(w.Body.String(), "stored in chunks") || strings.Contains(w.Body.String(), string(index[:4])) {
			t.Errorf("GET %s = %d %q, want 409 saying the value is stored in chunks", target, w.Code, w.Body.String())
		}
	}
	if it := f.Items["big"]; !bytes.Equal(it.Value, index) {
		t.Errorf("the index was changed: %q", it.Value)
	}
	// A plain value is appended to, checked against its CAS.
	f.Put(op.Item{Key: "small", Value: []byte("v")})
	if w := memcDo(h, "GET", "/memc?cmd=append&key=small&val=x", nil); w.Code != 201 || f.Items["small"].Value == nil || string(f.Items["small"].Value) != "vx" {
		t.Errorf("append to a plain value = %d %q, value %q; want 201, vx", w.Code, w.Body.String(), f.Items["small"].Value)
	}
}

// TestMemcFailureChanging: an append whose item kept changing before it
// could be checked and sent is a 409 page that says nothing was appended.
func TestMemcFailureChanging(t *testing.T) {
	status, raw, reason := memcFailure(memcAppend, chunk.ErrChanging)
	if status != http.StatusConflict || raw != "" || !strings.Contains(reason, "nothing was appended") {
		t.Errorf("memcFailure = %d %q %q, want a 409 page saying nothing was appended", status, raw, reason)
	}
}

// TestMemcGetHoldsTheBudget: the module's get holds its value against
// the gateway's byte budget until it is written, as GET /{key} does, so
// that clients that never read cannot make the gateway hold values past
// the budget through this endpoint: past it, 503 with Retry-After and
// nothing held afterwards.
func TestMemcGetHoldsTheBudget(t *testing.T) {
	const size = 100_000
	tests := []struct {
		name       string
		budget     int64
		wantStatus int
	}{
		{"the budget has room", 1 << 20, http.StatusOK},
		{"the budget has none", 64 << 10, http.StatusServiceUnavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newMemcFake()
			f.Put(op.Item{Key: "big", Value: bytes.Repeat([]byte("v"), size)})
			bg := budget.New(tt.budget)
			h := newMemcHandler(t, f, gateway.Options{Budget: bg}, Options{})
			w := memcDo(h, "GET", "/memc?cmd=get&key=big", nil)
			if w.Code != tt.wantStatus {
				t.Fatalf("status %d, want %d (%.100q)", w.Code, tt.wantStatus, w.Body.String())
			}
			if w.Code == http.StatusOK && w.Body.Len() != size {
				t.Errorf("%d bytes, want %d", w.Body.Len(), size)
			}
			if w.Code == http.StatusServiceUnavailable && w.Header().Get("Retry-After") == "" {
				t.Errorf("503 without Retry-After")
			}
			if used := bg.Used(); used != 0 {
				t.Errorf("the budget holds %d bytes after the request", used)
			}
		})
	}
}

// TestMemcFailureWaitedForAsync: a write that gave up waiting for its
// key's asynchronous writes says so, rather than blaming memcached.
func TestMemcFailureWaitedForAsync(t *testing.T) {
	status, raw, reason := memcFailure(memcSet, fmt.Errorf("%w: %w", gateway.ErrWaitedForAsync, context.DeadlineExceeded))
	if status != http.StatusGatewayTimeout || raw != "" || !strings.Contains(reason, "asynchronous writes") {
		t.Errorf("memcFailure = %d %q %q, want a 504 page naming the asynchronous writes", status, raw, reason)
	}
}

// TestMemcFailurePartlyApplied: a replicated write that failed says it
// may be partly applied, whatever its replicas' failure was; a memcached
// error line is forwarded as it is, as the module forwards it.
func TestMemcFailurePartlyApplied(t *testing.T) {
	for _, tt := range []struct {
		name   string
		err    error
		status int
	}{
		{"no node", upstream.ErrNoNodes, http.StatusBadGateway},
		{"deadline", context.DeadlineExceeded, http.StatusGatewayTimeout},
	} {
		status, raw, reason := memcFailure(memcIncr, fmt.Errorf("incr reached 1 of 2 replicas: %w: %w", upstream.ErrPartlyApplied, tt.err))
		if status != tt.status || raw != "" || !strings.Contains(reason, "partly applied") {
			t.Errorf("%s: memcFailure = %d %q %q, want %d saying the write may be partly applied", tt.name, status, raw, reason, tt.status)
		}
	}
	if _, raw, _ := memcFailure(memcIncr, fmt.Errorf("%w: %w", upstream.ErrPartlyApplied, upstream.ErrNotNumeric)); raw == "" {
		t.Error("a memcached error line of a replicated write is not forwarded")
	}
}
