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
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/gatewaytest"
	"github.com/memcgate/memcgate/test/memcachedtest"
)

// TestOpenFileLimit holds more connections than the gateway's open-file
// limit allows, so that accepting fails with EMFILE, then lets them go.
// The gateway must wait that out, saying so in its log (and, on the fast
// path, in memcgate_http_accept_errors_total), and serve again once
// descriptors are free: one client that opens enough connections must
// not be able to take the listener down for good.
func TestOpenFileLimit(t *testing.T) {
	const limit, hoard = 256, 400
	mc := memcachedtest.Start(t)
	// The limit is set by a shell that then becomes the gateway.
	wrapper := filepath.Join(t.TempDir(), "memcgate-nofile")
	script := "#!/bin/sh\nulimit -n " + strconv.Itoa(limit) + " || exit 1\nexec '" + binary + "'\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, fast := range []string{"true", "false"} {
		t.Run("FAST_PATH="+fast, func(t *testing.T) {
			gw := gatewaytest.New(t, wrapper, map[string]string{"MEMCGATE_SERVERS": mc.Addr, "MEMCGATE_FAST_PATH": fast, "MEMCGATE_DRAIN_DELAY": "0s"})
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
