package gateway

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream"
)

// TestClientGoneSendsNothing: on h1, a multi-get or a batch whose client
// has closed its connection (here half-closed it, after pipelining the
// request behind one the server holds until it sees the close) sends
// nothing to memcached, writes nothing, and is counted as 499; the same
// requests from a client still there are answered. The held request
// waits for the close through the same Client the gateway asks, so the
// order is certain.
func TestClientGoneSendsNothing(t *testing.T) {
	hold := Route{
		Owns: func(p string) bool { return p == "/hold" },
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Query().Has("untilgone") {
				for c := reqCtx(r).client; !c.Gone(); {
					time.Sleep(time.Millisecond)
				}
			}
			io.WriteString(w, "held")
		}),
	}
	g := newBigRig(t, func(o *Options, _ *upstream.Cluster) { o.Routes = []Route{hold} })
	addr := g.serveH1()
	for i := range 4 {
		g.mustPut("/cg-"+strconv.Itoa(i), []byte("value"))
	}
	const body = `[{"op":"get","key":"cg-0"},{"op":"get","key":"cg-1"},{"op":"get","key":"cg-2"}]`
	tests := []struct {
		name, method, req string
	}{
		{"multi-get", "GET", "GET /?key=cg-0&key=cg-1&key=cg-2&key=cg-3 HTTP/1.1\r\nHost: x\r\n\r\n"},
		{"multi-get with touch", "GET", "GET /?key=cg-0&key=cg-1&touch=60 HTTP/1.1\r\nHost: x\r\n\r\n"},
		{"batch", "POST", "POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body},
	}
	sent := func() int {
		return memcachedtest.SumStat(t, "cmd_get", g.mcs...) + memcachedtest.SumStat(t, "cmd_touch", g.mcs...)
	}
	for _, tt := range tests {
		for _, gone := range []bool{false, true} {
			name := tt.name + "/there"
			if gone {
				name = tt.name + "/gone"
			}
			t.Run(name, func(t *testing.T) {
				before, closed := sent(), countOf(t, g.reg, tt.method, "499")
				nc, err := net.Dial("tcp", addr)
				if err != nil {
					t.Fatal(err)
				}
				defer nc.Close()
				nc.SetDeadline(time.Now().Add(30 * time.Second))
				c := nc.(*net.TCPConn)
				first := "GET /hold HTTP/1.1\r\nHost: x\r\n\r\n"
				if gone {
					first = "GET /hold?untilgone HTTP/1.1\r\nHost: x\r\n\r\n"
				}
				if _, err := io.WriteString(c, first+tt.req); err != nil {
					t.Fatal(err)
				}
				if gone {
					c.CloseWrite()
				}
				br := bufio.NewReader(c)
				resp, err := http.ReadResponse(br, nil)
				if err != nil || resp.StatusCode != http.StatusOK {
					t.Fatalf("held request = %v, %v; want 200", resp, err)
				}
				io.ReadAll(resp.Body)
				resp2, err := http.ReadResponse(br, nil)
				if gone {
					if err == nil {
						t.Fatalf("a client gone got an answer: %d", resp2.StatusCode)
					}
					if n := sent() - before; n != 0 {
						t.Errorf("memcached served %d gets and touches for a client gone, want 0", n)
					}
					if n := countOf(t, g.reg, tt.method, "499") - closed; n != 1 {
						t.Errorf("memcgate_http_requests_total{code=\"499\"} rose by %v, want 1", n)
					}
					return
				}
				if err != nil || resp2.StatusCode != http.StatusOK {
					t.Fatalf("answer to a client there = %v, %v; want 200", resp2, err)
				}
				io.ReadAll(resp2.Body)
				if sent() == before {
					t.Error("memcached served nothing for a client there")
				}
				if countOf(t, g.reg, tt.method, "499") != closed {
					t.Error("a request answered was counted as 499")
				}
			})
		}
	}
}

// TestClientGoneNetHTTP: served without a Client (net/http), a multi-get
// or batch whose request context is cancelled already, as net/http
// cancels it when the client goes, sends nothing to memcached, writes
// nothing, and is counted as 499.
func TestClientGoneNetHTTP(t *testing.T) {
	g := newBigRig(t, nil)
	g.mustPut("/cgn-0", []byte("value"))
	const body = `[{"op":"get","key":"cgn-0"},{"op":"set","key":"cgn-1","value":"x"}]`
	tests := []struct {
		name, method, target, body string
	}{
		{"multi-get", "GET", "/?key=cgn-0&key=cgn-1", ""},
		{"multi-get with touch", "GET", "/?key=cgn-0&touch=60", ""},
		{"batch", "POST", "/", body},
	}
	sent := func() int {
		return memcachedtest.SumStat(t, "cmd_get", g.mcs...) + memcachedtest.SumStat(t, "cmd_touch", g.mcs...) + memcachedtest.SumStat(t, "cmd_set", g.mcs...)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before, closed := sent(), countOf(t, g.reg, tt.method, "499")
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			r := httptest.NewRequestWithContext(ctx, tt.method, tt.target, strings.NewReader(tt.body))
			w := httptest.NewRecorder()
			aborted := func() (p any) {
				defer func() { p = recover() }()
				g.h.ServeHTTP(w, r)
				return nil
			}()
			if aborted != http.ErrAbortHandler {
				t.Errorf("handler ended with %v, want http.ErrAbortHandler (the connection closed, nothing sent)", aborted)
			}
			if w.Body.Len() != 0 || w.Flushed || len(w.Header()) != 0 {
				t.Errorf("answered %q (header %v) to a client gone, want nothing written", w.Body, w.Header())
			}
			if n := sent() - before; n != 0 {
				t.Errorf("memcached served %d commands for a client gone, want 0", n)
			}
			if n := countOf(t, g.reg, tt.method, "499") - closed; n != 1 {
				t.Errorf("memcgate_http_requests_total{code=\"499\"} rose by %v, want 1", n)
			}
		})
	}
}
