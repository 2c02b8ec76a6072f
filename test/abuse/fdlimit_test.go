//go:build linux

package abuse

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/gatewaytest"
	"github.com/memcgate/memcgate/test/memcachedtest"
)

// TestOpenFileLimit holds more connections than the gateway's open-file
// limit allows, with the cap on client connections off
// (MEMCGATE_MAX_CLIENT_CONNS=-1), so that accepting fails with EMFILE,
// then lets them go.
// The gateway must wait that out, saying so in its log (and, on the fast
// path, in memcgate_http_accept_errors_total), and serve again once
// descriptors are free: one client that opens enough connections must
// not be able to take the listener down for good.
func TestOpenFileLimit(t *testing.T) {
	const limit, hoard = 256, 400
	mc := memcachedtest.Start(t)
	// The limit is set by a shell that then becomes the gateway.
	wrapper := nofileWrapper(t, limit)
	for _, fast := range []string{"true", "false"} {
		t.Run("FAST_PATH="+fast, func(t *testing.T) {
			gw := gatewaytest.New(t, wrapper, map[string]string{"MEMCGATE_SERVERS": mc.Addr, "MEMCGATE_FAST_PATH": fast, "MEMCGATE_DRAIN_DELAY": "0s", "MEMCGATE_MAX_CLIENT_CONNS": "-1"})
			gw.Start(t)
			client := &http.Client{Timeout: 2 * time.Second}
			url := "http://" + gw.DataAddr + "/fdlimit"
			req, _ := http.NewRequest(http.MethodPut, url, strings.NewReader("kept"))
			resp, err := client.Do(req)
			if err != nil || resp.StatusCode/100 != 2 {
				t.Fatalf("PUT: %v %v", resp, err)
			}
			resp.Body.Close()
			client.CloseIdleConnections()

			// Each connection sends part of a head, so that it is accepted
			// at once and then waits for the rest.
			var held []net.Conn
			defer func() {
				for _, c := range held {
					c.Close()
				}
			}()
			for range hoard {
				c, err := net.DialTimeout("tcp", gw.DataAddr, time.Second)
				if err != nil {
					t.Fatalf("dial: %v", err)
				}
				held = append(held, c)
				io.WriteString(c, "GET /fdlimit HTTP/1.1\r\n")
			}
			deadline := time.Now().Add(10 * time.Second)
			for !strings.Contains(gw.Logs(), "too many open files") {
				if time.Now().After(deadline) {
					t.Fatalf("no accept failure logged with %d connections held and a limit of %d:\n%s", hoard, limit, gatewaytest.Tail(gw.Logs(), 2000))
				}
				time.Sleep(20 * time.Millisecond)
			}
			for _, c := range held {
				c.Close()
			}
			held = nil

			var last string
			for deadline := time.Now().Add(10 * time.Second); ; {
				if exit, done := gw.Wait(0); done {
					t.Fatalf("the gateway exited: %v\n%s", exit, gatewaytest.Tail(gw.Logs(), 2000))
				}
				resp, err := client.Get(url)
				if err == nil {
					body, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if resp.StatusCode == http.StatusOK && string(body) == "kept" {
						break
					}
					last = resp.Status + " " + string(body)
				} else {
					last = err.Error()
				}
				if time.Now().After(deadline) {
					t.Fatalf("no GET served within 10s of the connections closing; last: %s\n%s", last, gatewaytest.Tail(gw.Logs(), 2000))
				}
				time.Sleep(50 * time.Millisecond)
			}
			if fast == "true" {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				fams, err := gw.Families(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if f := fams["memcgate_http_accept_errors_total"]; f == nil || f.Sum == 0 {
					t.Errorf("memcgate_http_accept_errors_total is 0 or missing after EMFILE")
				}
			}
		})
	}
}

// nofileWrapper returns a script that runs the gateway with an open-file
// limit of limit: a shell that sets it, then becomes the gateway.
func nofileWrapper(t *testing.T, limit int) string {
	wrapper := filepath.Join(t.TempDir(), "memcgate-nofile")
	script := "#!/bin/sh\nulimit -n " + strconv.Itoa(limit) + " || exit 1\nexec '" + binary + "'\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return wrapper
}

// TestClientConnCap runs the gateway with an open-file limit of 256 and
// the default cap on client connections (the limit less a quarter: 192).
// One client opens 400 connections that each send part of a PUT body,
// which the gateway never closes to make room: those over the cap get
// 503 at once instead of exhausting the descriptors, so the gateway
// still has some for memcached, and re-admits a memcached that restarted
// meanwhile (/readyz). Then the client opens 400 connections that each
// send part of a head: each new connection closes the oldest such one to
// make room, so another client's new connection is served.
func TestClientConnCap(t *testing.T) {
	const limit, hoard, capped = 256, 400, 256 - 256/4
	mc := memcachedtest.Start(t)
	gw := gatewaytest.New(t, nofileWrapper(t, limit), map[string]string{"MEMCGATE_SERVERS": mc.Addr, "MEMCGATE_DRAIN_DELAY": "0s",
		"MEMCGATE_HEALTH_INTERVAL": "100ms"})
	gw.Start(t)
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	url := "http://" + gw.DataAddr + "/capped"
	get := func() (int, string) {
		resp, err := client.Get(url)
		if err != nil {
			return 0, err.Error()
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(b)
	}
	ready := func() bool {
		resp, err := client.Get("http://" + gw.AdminAddr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
	waitReady := func(want bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ready() != want; time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("/readyz not %v within 10s\n%s", want, gatewaytest.Tail(gw.Logs(), 3000))
			}
		}
	}
	req, _ := http.NewRequest(http.MethodPut, url, strings.NewReader("kept"))
	if resp, err := client.Do(req); err != nil || resp.StatusCode/100 != 2 {
		t.Fatalf("PUT: %v %v", resp, err)
	}

	var held []net.Conn
	release := func() {
		for _, c := range held {
			c.Close()
		}
		held = nil
	}
	defer release()
	hold := func(what string) {
		for range hoard {
			c, err := net.DialTimeout("tcp", gw.DataAddr, time.Second)
			if err != nil {
				t.Fatalf("dial: %v", err)
			}
			held = append(held, c)
			io.WriteString(c, what)
		}
	}
	hold("PUT /hoard HTTP/1.1\r\nHost: a\r\nContent-Length: 1000\r\n\r\npart of it")
	// Those held answer nothing: each is read on its own goroutine, as an
	// expired deadline would fail a read of an answer already there.
	var refused atomic.Int32
	var wg sync.WaitGroup
	for _, c := range held {
		wg.Go(func() {
			c.SetReadDeadline(time.Now().Add(time.Second))
			b, _ := io.ReadAll(c)
			if s := string(b); strings.HasPrefix(s, "HTTP/1.1 503 ") && strings.Contains(s, "Retry-After: 1") &&
				strings.HasSuffix(s, "MEMCGATE_MAX_CLIENT_CONNS are open, none idle or quiet to close for room; retry shortly\n") {
				refused.Add(1)
			}
		})
	}
	wg.Wait()
	if n := int(refused.Load()); n != hoard-capped {
		t.Errorf("%d of %d connections with bodies on their way got 503, want the %d over the cap", n, hoard, hoard-capped)
	}
	if code, body := get(); code != http.StatusServiceUnavailable {
		t.Errorf("another client's GET while bodies hold every place: %d %q, want 503", code, body)
	}
	mc.Kill()
	waitReady(false)
	mc.Restart()
	waitReady(true) // the probe needed a descriptor
	if strings.Contains(gw.Logs(), "too many open files") {
		t.Errorf("the gateway ran out of descriptors under the cap:\n%s", gatewaytest.Tail(gw.Logs(), 2000))
	}
	release()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for { // until the gateway has closed them too
		fams, err := gw.Families(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if f := fams["memcgate_http_connections"]; f != nil && f.Sum == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}

	hold("GET /hoard HTTP/1.1\r\n")
	if code, body := get(); code != http.StatusNotFound { // memcached restarted empty
		t.Errorf("another client's GET while silent connections fill every place: %d %q, want 404", code, body)
	}
	fams, err := gw.Families(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]float64{"memcgate_http_connections_max": capped,
		"memcgate_http_connections_refused_total": hoard - capped + 1} { // and another client's GET
		if f := fams[name]; f == nil || f.Sum != want {
			t.Errorf("%s = %v, want %v", name, f, want)
		}
	}
	if f := fams["memcgate_http_connections_reclaimed_total"]; f == nil || f.Sum < hoard-capped+1 {
		t.Errorf("memcgate_http_connections_reclaimed_total = %v, want at least %d", f, hoard-capped+1)
	}
}
