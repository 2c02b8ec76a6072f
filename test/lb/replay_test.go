package lb

import (
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/gatewaytest"
	"github.com/memcgate/memcgate/test/memcachedtest"
)

// answerEater is a TCP relay in front of one gateway. While armed it
// passes requests on as usual, but at the first byte of an answer it
// resets the balancer's connection (RST) instead of relaying it: the
// gateway has applied the request, and all the balancer sees is the
// connection dying with no response. That is a gateway crashing, or a
// network path failing, at the worst moment, made deterministic. The arm
// is shared by the relays of both gateways and fires once, so whichever
// gateway the balancer picks first loses its answer and a replay reaches
// the other one intact.
type answerEater struct {
	addr   string
	target string
	armed  *atomic.Bool

	mu    sync.Mutex // guards conns
	conns map[net.Conn]struct{}
}

// startEater relays a listener on a free loopback port to target until the
// test ends.
func startEater(t *testing.T, target string, armed *atomic.Bool) *answerEater {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &answerEater{addr: ln.Addr().String(), target: target, armed: armed, conns: map[net.Conn]struct{}{}}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { e.relay(c) })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		e.mu.Lock()
		for c := range e.conns {
			c.Close()
		}
		e.mu.Unlock()
		wg.Wait()
	})
	return e
}

// track adds c to the connections closed at cleanup.
func (e *answerEater) track(c net.Conn) {
	e.mu.Lock()
	e.conns[c] = struct{}{}
	e.mu.Unlock()
}

func (e *answerEater) untrack(c net.Conn) {
	e.mu.Lock()
	delete(e.conns, c)
	e.mu.Unlock()
}

// relay copies the balancer's bytes to the gateway and the gateway's back,
// unless the arm fires on an answer.
func (e *answerEater) relay(c net.Conn) {
	e.track(c)
	defer e.untrack(c)
	u, err := net.Dial("tcp", e.target)
	if err != nil {
		c.Close()
		return
	}
	e.track(u)
	defer e.untrack(u)
	requests := make(chan struct{})
	go func() {
		defer close(requests)
		_, _ = io.Copy(u, c)
		_ = u.(*net.TCPConn).CloseWrite()
	}()
	defer func() {
		c.Close()
		u.Close()
		<-requests
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := u.Read(buf)
		if n > 0 && e.armed.CompareAndSwap(true, false) {
			_ = c.(*net.TCPConn).SetLinger(0) // Close sends RST
			return
		}
		if n > 0 {
			if _, werr := c.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			_ = c.(*net.TCPConn).CloseWrite()
			return
		}
	}
}

// replayCase is one request sent through a balancer while the first
// gateway to answer it loses its answer. {k} in target is replaced by the
// case's own key, {etag} in a header by the key's ETag after setup.
type replayCase struct {
	method, target string
	header         map[string]string
	body           string
	initial        string // the key's value before the request; "" = absent
	// replay: the request is safe to replay, and the balancer must send it
	// to the other gateway, whose answer is status. Otherwise it must
	// reach a gateway exactly once and the client gets the balancer's 502.
	replay bool
	status int
	// applied, if set, tells from the key's value afterwards how many
	// times the request was applied.
	applied func(value string) int
}

// countX counts appended or prepended "x"s.
func countX(v string) int { return strings.Count(v, "x") }

// counter reads an incr'd value that started at 0.
func counter(v string) int { n, _ := strconv.Atoi(v); return n }

// replayCases are the requests TestReplayPolicy sends, one of each kind:
// reads and plain writes (set, delete) that a balancer should retry, and
// every write whose replay changes the outcome, on the REST API, on the
// HttpMemcModule-compatible query endpoint (/memc) and on its path-style
// endpoint (/key/), which the gateways run with MEMCGATE_MEMC_KEY_PATH.
var replayCases = []replayCase{
	// REST API.
	{method: "GET", target: "/{k}", initial: "v", replay: true, status: http.StatusOK},
	{method: "HEAD", target: "/{k}", initial: "v", replay: true, status: http.StatusOK},
	{method: "GET", target: "/{k}", header: map[string]string{"If-None-Match": "{etag}"}, initial: "v", replay: true, status: http.StatusNotModified},
	{method: "PUT", target: "/{k}", body: "w", replay: true, status: http.StatusCreated},
	{method: "PUT", target: "/{k}", header: map[string]string{"Prefer": "respond-async"}, body: "w", replay: true, status: http.StatusAccepted},
	// The state is the same either way; the answer is the replay's.
	{method: "DELETE", target: "/{k}", initial: "v", replay: true, status: http.StatusNotFound},
	{method: "PUT", target: "/{k}", header: map[string]string{"If-None-Match": "*"}, body: "w"},
	{method: "PUT", target: "/{k}", header: map[string]string{"If-Match": "*"}, body: "w", initial: "v"},
	{method: "PUT", target: "/{k}", header: map[string]string{"If-Match": "{etag}"}, body: "w", initial: "v"},
	{method: "POST", target: "/{k}?op=append", body: "x", initial: "v", applied: countX},
	{method: "POST", target: "/{k}?op=incr", initial: "0", applied: counter},
	{method: "POST", target: "/", body: `{"ops":[{"op":"incr","key":"{k}","delta":1}]}`, initial: "0", applied: counter},
	// HttpMemcModule query style: the command comes from ?cmd=, whatever
	// the method; the argument's name is case-insensitive and its first
	// occurrence wins.
	{method: "GET", target: "/memc?cmd=get&key={k}", initial: "v", replay: true, status: http.StatusOK},
	{method: "GET", target: "/memc?key={k}", initial: "v", replay: true, status: http.StatusOK},
	{method: "PUT", target: "/memc?cmd=set&key={k}&val=w", replay: true, status: http.StatusCreated},
	{method: "GET", target: "/memc?cmd=incr&key={k}&val=1", initial: "0", applied: counter},
	{method: "GET", target: "/memc?CMD=incr&key={k}&val=1", initial: "0", applied: counter},
	{method: "GET", target: "/memc?cmd=incr&cmd=get&key={k}&val=1", initial: "0", applied: counter},
	{method: "PUT", target: "/memc?cmd=append&key={k}&val=x", initial: "v", applied: countX},
	{method: "GET", target: "/memc?cmd=version", replay: true, status: http.StatusOK},
	// HttpMemcModule path style: the value is the body (so incr and decr,
	// which need $memc_value, are 400 there).
	{method: "GET", target: "/key/{k}", initial: "v", replay: true, status: http.StatusOK},
	{method: "PUT", target: "/key/{k}", body: "w", replay: true, status: http.StatusCreated},
	{method: "DELETE", target: "/key/{k}", initial: "v", replay: true, status: http.StatusNotFound},
	{method: "PUT", target: "/key/{k}?cmd=append", body: "x", initial: "v", applied: countX},
	{method: "PUT", target: "/key/{k}?cmd=prepend", body: "x", initial: "v", applied: countX},
	{method: "PUT", target: "/key/{k}?cmd=add", body: "w"},
	{method: "POST", target: "/key/{k}", body: "w"}, // add
	// Last: they empty memcached (the keys above are each case's own).
	{method: "GET", target: "/memc?cmd=flush_all"},
	{method: "GET", target: "/key/{k}?cmd=flush_all"},
}

// TestReplayPolicy checks the promise of both shipped configurations: a
// balancer retries a request on the other gateway after the first one
// failed only when replaying it cannot change the outcome. Each request
// of replayCases goes through the balancer to two real gateways (both
// with the HttpMemcModule endpoints on) behind answer eaters, so the first
// gateway applies it and its answer is lost; the test counts how many
// times it reached a gateway and, for appends and counters, how many times
// memcached applied it. Regression test for #16 (the nginx configuration
// retried PUT /key/k?cmd=append, and both retried conditional PUTs).
func TestReplayPolicy(t *testing.T) {
	if testing.Short() {
		t.Skip("runs nginx, HAProxy, three gateways and memcached")
	}
	mc := memcachedtest.Start(t)
	env := map[string]string{
		"MEMCGATE_SERVERS":       mc.Addr,
		"MEMCGATE_MEMC_KEY_PATH": "/key/",
		"MEMCGATE_ACCESS_LOG":    "false",
		"MEMCGATE_LOG_FORMAT":    "text",
	}
	// a and b sit behind the balancer; direct sets keys up and reads them
	// back, so that a's and b's request counters count only what the
	// balancer sent.
	a, b, direct := gatewaytest.New(t, binary, env), gatewaytest.New(t, binary, env), gatewaytest.New(t, binary, env)
	for _, g := range []*gatewaytest.Gateway{a, b, direct} {
		g.Start(t)
	}
	var armed atomic.Bool
	ups := [2]upstream{
		{startEater(t, a.DataAddr, &armed).addr, a.AdminPort},
		{startEater(t, b.DataAddr, &armed).addr, b.AdminPort},
	}
	for _, lb := range []struct {
		name  string
		start func(*testing.T, [2]upstream) *balancer
		// fresh: a balancer per request. nginx remembers failures
		// (max_fails) and would skip a gateway after two; HAProxy only
		// believes its checks, which pass.
		fresh bool
	}{{"nginx", startNginx, true}, {"haproxy", startHAProxy, false}} {
		t.Run(lb.name, func(t *testing.T) {
			var shared *balancer
			if !lb.fresh {
				shared = lb.start(t, ups)
			}
			for i, c := range replayCases {
				key := fmt.Sprintf("replay-%s-%02d", lb.name, i)
				target := strings.ReplaceAll(c.target, "{k}", key)
				// The name becomes part of nginx's temporary directory, whose
				// path nginx.conf holds unquoted: no braces.
				name := c.method + " " + target
				for _, h := range slices.Sorted(maps.Keys(c.header)) {
					name += " " + h + ":" + strings.ReplaceAll(c.header[h], "{etag}", "ETag")
				}
				t.Run(name, func(t *testing.T) {
					bal := shared
					if lb.fresh {
						bal = lb.start(t, ups)
					}
					etag := setUp(t, direct, key, c.initial)
					before := served(t, a, b)
					armed.Store(true)
					status := send(t, bal.url, c, target, key, etag)
					if armed.Swap(false) {
						t.Fatalf("%s: no gateway answered through the balancer (got %d)", name, status)
					}
					want := 1
					if c.replay {
						want = 2
					}
					sent := waitServed(t, a, b, before, want)
					applied, note := -1, ""
					if c.applied != nil {
						applied = c.applied(value(t, direct, key))
						note = fmt.Sprintf(", applied %d time(s)", applied)
					}
					t.Logf("%s: reached the gateways %d time(s)%s, client got %d", name, sent, note, status)
					switch {
					case c.replay && (sent != 2 || status != c.status):
						t.Errorf("%s reached the gateways %d time(s) and answered %d; it is safe to replay: want 2 and %d", name, sent, status, c.status)
					case !c.replay && sent != 1:
						t.Errorf("%s reached the gateways %d times%s and answered %d; it must never be replayed once sent", name, sent, note, status)
					case !c.replay && status != http.StatusBadGateway:
						t.Errorf("%s answered %d, want the balancer's 502", name, status)
					case c.applied != nil && applied != sent:
						t.Errorf("%s applied %d time(s), reached the gateways %d time(s)", name, applied, sent)
					}
				})
			}
		})
	}
}

// setUp stores initial under key through gw, or deletes key if initial is
// empty, and returns its ETag ("" if absent).
func setUp(t *testing.T, gw *gatewaytest.Gateway, key, initial string) string {
	t.Helper()
	url := "http://" + gw.DataAddr + "/" + key
	if initial == "" {
		if status, _, body := do(t, http.MethodDelete, url, nil, nil); status != http.StatusNoContent && status != http.StatusNotFound {
			t.Fatalf("DELETE %s: %d %s", url, status, body)
		}
		return ""
	}
	if status, _, body := do(t, http.MethodPut, url, nil, strings.NewReader(initial)); status != http.StatusCreated {
		t.Fatalf("PUT %s: %d %s", url, status, body)
	}
	_, header, _ := do(t, http.MethodHead, url, nil, nil)
	return header.Get("ETag")
}

// value reads key through gw ("" if absent).
func value(t *testing.T, gw *gatewaytest.Gateway, key string) string {
	t.Helper()
	status, _, body := do(t, http.MethodGet, "http://"+gw.DataAddr+"/"+key, nil, nil)
	if status == http.StatusNotFound {
		return ""
	}
	if status != http.StatusOK {
		t.Fatalf("GET %s: %d %s", key, status, body)
	}
	return body
}

// send sends c to the balancer at base on a connection of its own and
// returns the status.
func send(t *testing.T, base string, c replayCase, target, key, etag string) int {
	t.Helper()
	header := http.Header{}
	for k, v := range c.header {
		header.Set(k, strings.ReplaceAll(v, "{etag}", etag))
	}
	var body io.Reader
	if c.body != "" {
		body = strings.NewReader(strings.ReplaceAll(c.body, "{k}", key))
	}
	status, _, _ := do(t, c.method, base+target, header, body)
	return status
}

// do sends one request on a new connection (a balancer may close the
// client's connection after an error of its own) and returns the status,
// the header and the body of the answer.
func do(t *testing.T, method, url string, header http.Header, body io.Reader) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the answer: %v", method, url, err)
	}
	return resp.StatusCode, resp.Header, string(b)
}

// served is how many requests each of gws answered.
func served(t *testing.T, gws ...*gatewaytest.Gateway) []float64 {
	t.Helper()
	out := make([]float64, len(gws))
	for i, g := range gws {
		n, err := g.Served(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		out[i] = n
	}
	return out
}

// waitServed returns how many requests a and b answered since before,
// polling until that is at least want (a gateway counts a request just
// after writing its answer) or a deadline passes.
func waitServed(t *testing.T, a, b *gatewaytest.Gateway, before []float64, want int) int {
	t.Helper()
	var n int
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		now := served(t, a, b)
		n = int(now[0] - before[0] + now[1] - before[1])
		if n >= want || time.Now().After(deadline) {
			return n
		}
	}
}
