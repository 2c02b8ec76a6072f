package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/memcgate/memcgate/test/memcachedtest"
)

// TestNodeAnswersAnotherKey runs the binary against a node that passes
// its health checks but answers every read with another key's value: a
// GET, with or without touch, gets 502 (or 503 once the node is
// ejected), never the other key's bytes. A GET with touch (memcached's
// gat) was answered 200 with them.
func TestNodeAnswersAnotherKey(t *testing.T) {
	node := memcachedtest.StartRaw(t, func(c net.Conn, br *bufio.Reader) {
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return
			}
			var reply string
			switch f := strings.Fields(line); {
			case len(f) == 0:
				reply = "ERROR\r\n"
			case f[0] == "version":
				reply = "VERSION 1.6.21\r\n"
			case f[0] == "gets", f[0] == "gats", f[0] == "get", f[0] == "gat":
				reply = "VALUE other 0 6 1\r\nsecret\r\nEND\r\n"
			case f[0] == "mg":
				reply = "EN\r\n"
			default:
				reply = "ERROR\r\n"
			}
			if _, err := c.Write([]byte(reply)); err != nil {
				return
			}
		}
	})
	g := startGateway(t, map[string]string{"MEMCGATE_SERVERS": node})
	for _, path := range []string{"/mine?touch=60", "/mine"} {
		r := g.do("GET", path, nil)
		if r.status != http.StatusBadGateway && r.status != http.StatusServiceUnavailable || strings.Contains(r.body, "secret") {
			t.Errorf("GET %s = %d %q, want 502 (or 503 once the node is down), never the other key's value", path, r.status, r.body)
		}
	}
}

// TestNotMemcached runs the binary with a real memcached and, beside it,
// a node that is some other service: an HTTP server, an SSH server (its
// banner comes first), Redis, a TLS server, or a stream of bytes that
// never ends. Its health check fails, so its keys go to memcached
// (MEMCGATE_FAILOVER) or get an error status, never anything it sent;
// the real node's keys are read and written as before; and the gateway
// says the node is down once, not once per request.
func TestNotMemcached(t *testing.T) {
	httpSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "VALUE k 0 5\r\nhello\r\nEND\r\n")
	}))
	t.Cleanup(httpSrv.Close)
	tlsSrv := httptest.NewTLSServer(http.NotFoundHandler())
	t.Cleanup(tlsSrv.Close)
	impostors := []struct {
		name string
		addr string
	}{
		{"http", strings.TrimPrefix(httpSrv.URL, "http://")},
		{"tls", strings.TrimPrefix(tlsSrv.URL, "https://")},
		{"ssh", memcachedtest.StartRaw(t, func(c net.Conn, br *bufio.Reader) {
			c.Write([]byte("SSH-2.0-OpenSSH_9.6\r\n"))
			br.ReadString('\n')
			c.Write([]byte("Invalid SSH identification string.\r\n"))
		})},
		{"redis", memcachedtest.StartRaw(t, func(c net.Conn, br *bufio.Reader) {
			for {
				line, err := br.ReadString('\n')
				if err != nil {
					return
				}
				cmd, _, _ := strings.Cut(strings.TrimSpace(line), " ")
				fmt.Fprintf(c, "-ERR unknown command '%s', with args beginning with: \r\n", cmd)
			}
		})},
		{"endless", memcachedtest.StartRaw(t, func(c net.Conn, br *bufio.Reader) {
			junk := []byte(strings.Repeat("VALUE x 0 1\r\n", 4096))
			for {
				if _, err := c.Write(junk); err != nil {
					return
				}
			}
		})},
	}
	// The same services behind a memcached that answers the health
	// checks: its data connections get the other service.
	for _, im := range []struct {
		name  string
		serve func(c net.Conn, br *bufio.Reader)
	}{
		{"http behind probes", func(c net.Conn, br *bufio.Reader) {
			c.Write([]byte("HTTP/1.1 400 Bad Request\r\nContent-Length: 11\r\nConnection: close\r\n\r\nBad Request"))
		}},
		{"redis behind probes", func(c net.Conn, br *bufio.Reader) {
			for {
				c.Write([]byte("-ERR unknown command\r\n"))
				if _, err := br.ReadString('\n'); err != nil {
					return
				}
			}
		}},
		{"endless behind probes", func(c net.Conn, br *bufio.Reader) {
			junk := []byte(strings.Repeat("VALUE x 0 1\r\n", 4096))
			for {
				if _, err := c.Write(junk); err != nil {
					return
				}
			}
		}},
		{"endless line behind probes", func(c net.Conn, br *bufio.Reader) {
			junk := []byte(strings.Repeat("SERVER_ERROR ", 4096))
			for {
				if _, err := c.Write(junk); err != nil {
					return
				}
			}
		}},
	} {
		impostors = append(impostors, struct {
			name string
			addr string
		}{im.name, memcachedtest.StartRaw(t, func(c net.Conn, br *bufio.Reader) {
			line, err := br.Peek(7)
			if err != nil || string(line) != "version" {
				im.serve(c, br)
				return
			}
			for {
				if _, err := br.ReadString('\n'); err != nil {
					return
				}
				c.Write([]byte("VERSION 1.6.21\r\n"))
			}
		})})
	}
	mc := memcachedtest.Start(t)
	for _, im := range impostors {
		t.Run(im.name, func(t *testing.T) {
			// Each case has its own gateway and keys of its own on the
			// shared memcached, and asserts no timing.
			t.Parallel()
			g := startGateway(t, map[string]string{
				"MEMCGATE_SERVERS":    mc.Addr + "," + im.addr,
				"MEMCGATE_ACCESS_LOG": "false",
			})
			// Keys of each node, by the gateway's own placement.
			keysOf := map[string][]string{}
			for i := 0; len(keysOf[mc.Addr]) < 8 || len(keysOf[im.addr]) < 8; i++ {
				key := fmt.Sprint(strings.ReplaceAll(im.name, " ", "-"), i)
				resp, err := http.Get(g.Admin + "/debug/owners?key=" + key)
				if err != nil {
					t.Fatal(err)
				}
				var place struct {
					Chain []struct {
						Node string `json:"node"`
					} `json:"chain"`
				}
				err = json.NewDecoder(resp.Body).Decode(&place)
				resp.Body.Close()
				if err != nil || len(place.Chain) == 0 {
					t.Fatalf("/debug/owners?key=%s: %+v, %v", key, place, err)
				}
				owner := place.Chain[0].Node
				keysOf[owner] = append(keysOf[owner], key)
			}
			for round := 0; round < 3; round++ {
				for _, key := range keysOf[im.addr][:8] {
					put := g.do("PUT", "/"+key, []byte("v"))
					get := g.do("GET", "/"+key, nil)
					for _, r := range []response{put, get} {
						if strings.Contains(r.body, "VALUE") || strings.Contains(r.body, "SSH") || strings.Contains(r.body, "ERR") || strings.Contains(r.body, "hello") {
							t.Errorf("/%s on the %s node = %d %q: bytes it sent", key, im.name, r.status, r.body)
						}
					}
					if get.status == http.StatusOK && get.body != "v" || put.status == http.StatusCreated && get.status != http.StatusOK {
						t.Errorf("/%s on the %s node: PUT %d, then GET %d %q", key, im.name, put.status, get.status, get.body)
					}
				}
				for _, key := range keysOf[mc.Addr][:8] {
					if r := g.do("PUT", "/"+key, []byte("v"+key)); r.status != http.StatusCreated {
						t.Errorf("PUT /%s on memcached = %d %q", key, r.status, r.body)
					}
					if r := g.do("GET", "/"+key, nil); r.status != http.StatusOK || r.body != "v"+key {
						t.Errorf("GET /%s on memcached = %d %q", key, r.status, r.body)
					}
				}
			}
			g.Signal(syscall.SIGTERM) // the log is written behind the requests: whole once the process exits
			if _, ok := g.Wait(30 * time.Second); !ok {
				t.Fatal("memcgate did not exit on SIGTERM")
			}
			if n := strings.Count(g.Logs(), `"node down"`); n > 1 {
				t.Errorf("%d node down lines for one node that stayed down, want at most one:\n%s", n, g.Logs())
			}
		})
	}
}

// TestLyingLengthWithoutPipelining runs the binary on gomemcache's pool
// (MEMCGATE_PIPELINE_CONNS=0) against a node that passes its health
// checks but answers a read with a VALUE line claiming 600 MB or 2 GB,
// and then nothing. gomemcache allocates the length claimed before a
// byte of it comes: one GET cost the whole claim. A claim the byte
// budget cannot hold is 503, one past memcached's largest item (1 GiB)
// the node's 502, both at the VALUE line with next to nothing allocated.
func TestLyingLengthWithoutPipelining(t *testing.T) {
	node := memcachedtest.StartRaw(t, func(c net.Conn, br *bufio.Reader) {
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return
			}
			reply := "ERROR\r\n"
			switch f := strings.Fields(line); {
			case len(f) > 0 && f[0] == "version":
				reply = "VERSION 1.6.21\r\n"
			case len(f) > 1 && strings.HasPrefix(f[0], "get"):
				claim, _ := strings.CutPrefix(f[1], "claim")
				reply = "VALUE " + f[1] + " 0 " + claim + "\r\n"
			}
			if _, err := c.Write([]byte(reply)); err != nil {
				return
			}
		}
	})
	g := startGateway(t, map[string]string{
		"MEMCGATE_SERVERS":            node,
		"MEMCGATE_PIPELINE_CONNS":     "0",
		"MEMCGATE_MAX_BUFFERED_BYTES": "67108864",
		"MEMCGATE_TIMEOUT":            "5s",
		"MEMCGATE_REQUEST_TIMEOUT":    "10s",
		"MEMCGATE_ACCESS_LOG":         "false",
	})
	before := metricValue(t, g, "go_memstats_alloc_bytes_total")
	for _, tt := range []struct {
		claim string
		want  int
	}{
		{"600000000", http.StatusServiceUnavailable},
		{"2000000000", http.StatusBadGateway},
	} {
		if r := g.do("GET", "/claim"+tt.claim, nil); r.status != tt.want {
			t.Errorf("GET of a value claimed %s bytes long = %d %q, want %d", tt.claim, r.status, r.body, tt.want)
		}
	}
	if n := metricValue(t, g, "go_memstats_alloc_bytes_total") - before; n > 64<<20 {
		t.Errorf("the gateway allocated %.0f MiB for two GETs", n/(1<<20))
	}
}

// TestLargeValuesWithoutPipelining: on gomemcache's pool
// (MEMCGATE_PIPELINE_CONNS=0) a value longer than MAX_VALUE_BYTES (an
// item another client wrote) is held in the byte budget at its claimed
// length while it is read and given back after: a 1 MB value read twenty
// times through a 4 MiB budget comes whole every time, and a 5 MB one,
// which the budget can never hold, is 503 before it is read. A value up
// to MAX_VALUE_BYTES is read as before.
func TestLargeValuesWithoutPipelining(t *testing.T) {
	mc := memcachedtest.Start(t, "-I", "8m")
	g := startGateway(t, map[string]string{
		"MEMCGATE_SERVERS":            mc.Addr,
		"MEMCGATE_PIPELINE_CONNS":     "0",
		"MEMCGATE_MAX_VALUE_BYTES":    "65536",
		"MEMCGATE_MAX_BUFFERED_BYTES": "4194304",
		"MEMCGATE_ACCESS_LOG":         "false",
	})
	direct := memcachedClient(t, mc.Addr)
	values := map[string][]byte{
		"small": bytes.Repeat([]byte("s"), 65536),
		"big":   bytes.Repeat([]byte("0123456789abcdef"), 1_000_000/16),
		"huge":  bytes.Repeat([]byte("h"), 5_000_000),
	}
	for k, v := range values {
		if err := direct.Set(&memcache.Item{Key: k, Value: v}); err != nil {
			t.Fatalf("set %s: %v", k, err)
		}
	}
	for i := range 20 {
		for _, k := range []string{"small", "big"} {
			if r := g.do("GET", "/"+k, nil); r.status != http.StatusOK || r.body != string(values[k]) {
				t.Fatalf("GET /%s, %d = %d, %d bytes; want 200 and %d", k, i, r.status, len(r.body), len(values[k]))
			}
		}
	}
	if r := g.do("GET", "/huge", nil); r.status != http.StatusServiceUnavailable {
		t.Errorf("GET /huge = %d %q, want 503", r.status, r.body)
	}
	if r := g.do("GET", "/big", nil); r.status != http.StatusOK {
		t.Errorf("GET /big after /huge = %d %q, want 200", r.status, r.body)
	}
}
