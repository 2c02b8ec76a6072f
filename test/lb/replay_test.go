package lb

import (
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// dropper stands in for a gateway that dies with the request in hand: it
// reads each request, counts it and closes the connection without an
// answer. Its admin listener answers /readyz 200 so HAProxy keeps it UP.
type dropper struct {
	data      string
	adminPort int

	mu  sync.Mutex // guards got
	got int
}

func startDropper(t *testing.T) *dropper {
	t.Helper()
	d := &dropper{}
	serve := func(h http.HandlerFunc) net.Listener {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		t.Cleanup(func() { srv.Close() })
		return ln
	}
	data := serve(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		d.mu.Lock()
		d.got++
		d.mu.Unlock()
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
	})
	admin := serve(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	d.data = data.Addr().String()
	d.adminPort = admin.Addr().(*net.TCPAddr).Port
	return d
}

func (d *dropper) take() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := d.got
	d.got = 0
	return n
}

// TestReplayPolicy sends one request of each kind through the shipped
// configurations to two gateways that both drop it after reading it, and
// counts how often the balancer sent it: twice or more for requests that
// are safe to replay, exactly once for the others. This is the policy both
// files promise: GET, HEAD, PUT, DELETE are replayed; POST (append, incr…)
// and HttpMemcModule-style commands that write through a GET are not.
func TestReplayPolicy(t *testing.T) {
	cases := []struct {
		method, path string
		replay       bool
	}{
		{"GET", "/k", true},
		{"HEAD", "/k", true},
		{"PUT", "/k", true},
		{"DELETE", "/k", true},
		{"POST", "/k?op=incr", false},
		{"POST", "/k?op=append", false},
		{"GET", "/memc?cmd=get&key=k", true},
		{"GET", "/memc?key=k", true},
		{"PUT", "/memc?cmd=set&key=k", true},
		{"GET", "/memc?cmd=incr&key=k&val=1", false},
		{"PUT", "/memc?cmd=append&key=k", false},
		{"GET", "/memc?cmd=flush_all", false},
	}
	for _, lb := range []struct {
		name  string
		start func(*testing.T, [2]upstream) *balancer
		// fresh: a balancer per request. nginx remembers failures
		// (max_fails) and would skip the droppers after two; HAProxy only
		// believes its checks, which pass.
		fresh bool
	}{{"nginx", startNginx, true}, {"haproxy", startHAProxy, false}} {
		t.Run(lb.name, func(t *testing.T) {
			a, b := startDropper(t), startDropper(t)
			ups := [2]upstream{{a.data, a.adminPort}, {b.data, b.adminPort}}
			var shared *balancer
			if !lb.fresh {
				shared = lb.start(t, ups)
			}
			for _, c := range cases {
				t.Run(c.method+" "+c.path, func(t *testing.T) {
					bal := shared
					if lb.fresh {
						bal = lb.start(t, ups)
					}
					a.take()
					b.take()
					var body io.Reader
					if c.method == "PUT" || c.method == "POST" {
						body = strings.NewReader("v")
					}
					req, err := http.NewRequestWithContext(t.Context(), c.method, bal.url+c.path, body)
					if err != nil {
						t.Fatal(err)
					}
					// A connection per request: a balancer may close the
					// client's connection after an error of its own.
					client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
					resp, err := client.Do(req)
					if err != nil {
						t.Fatalf("%s %s: %v", c.method, c.path, err)
					}
					resp.Body.Close()
					sent := a.take() + b.take()
					if resp.StatusCode != http.StatusBadGateway {
						t.Errorf("%s %s: %d, want 502 (every gateway dropped it)", c.method, c.path, resp.StatusCode)
					}
					if c.replay && sent < 2 {
						t.Errorf("%s %s reached the gateways %d time(s); it is safe to replay and should have been retried", c.method, c.path, sent)
					}
					if !c.replay && sent != 1 {
						t.Errorf("%s %s reached the gateways %d times; it must never be replayed", c.method, c.path, sent)
					}
				})
			}
		})
	}
}
