//go:build linux

package bigvalue

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/memcachedtest"
)

// TestBigValueCanary (BIGVALUE_BENCH=1) measures what 20 MiB values in
// chunks do to small requests on the same node: BIGVALUE_CLIENTS clients
// (8) loop a PUT and a GET of a value each for BIGVALUE_SECONDS (10),
// while a canary on a connection of its own PUTs and GETs 5 bytes every
// 10 ms. With BIGVALUE_STOP_MS memcached is stopped (SIGSTOP) for that
// many milliseconds of every second; with BIGVALUE_LINK_MBPS it is
// reached through a link of that many MiB/s each way (slowLink); with
// BIGVALUE_PIPELINE_CONNS the gateway has that many connections per node. It logs the canary's p50, p99 and max, every answer
// that was not 2xx, and the node's ejections and memcached timeouts.
func TestBigValueCanary(t *testing.T) {
	if os.Getenv("BIGVALUE_BENCH") != "1" {
		t.Skip("BIGVALUE_BENCH=1 runs it")
	}
	envInt := func(name string, def int) int {
		if n, err := strconv.Atoi(os.Getenv(name)); err == nil {
			return n
		}
		return def
	}
	clients, seconds := envInt("BIGVALUE_CLIENTS", 8), envInt("BIGVALUE_SECONDS", 10)
	stop := time.Duration(envInt("BIGVALUE_STOP_MS", 0)) * time.Millisecond
	rate := envInt("BIGVALUE_LINK_MBPS", 0)
	var env []string
	mc := memcachedtest.Start(t, "-m", "2048")
	if rate > 0 {
		env = append(env, "MEMCGATE_SERVERS", slowLink(t, mc.Addr, rate<<20))
	}
	if pc := os.Getenv("BIGVALUE_PIPELINE_CONNS"); pc != "" {
		env = append(env, "MEMCGATE_PIPELINE_CONNS", pc)
	}
	r := newRigOn(t, mc, env...)
	v := randomValue(valueSize, 3)
	deadline := time.Now().Add(time.Duration(seconds) * time.Second)
	var codes sync.Map // "client PUT 504" → *atomic.Int64
	count := func(who, method string, code int) {
		n, _ := codes.LoadOrStore(fmt.Sprintf("%s %s %d", who, method, code), new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
	}
	var bigBytes atomic.Int64
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			cl := &http.Client{}
			key := "big" + strconv.Itoa(c)
			for time.Now().Before(deadline) {
				req, _ := http.NewRequest("PUT", r.url+"/"+key, bytes.NewReader(v))
				resp, err := cl.Do(req)
				if err != nil {
					count("client", "PUT", -1)
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				count("client", "PUT", resp.StatusCode)
				if resp.StatusCode == 201 {
					bigBytes.Add(valueSize)
				}
				resp, err = cl.Get(r.url + "/" + key)
				if err != nil {
					count("client", "GET", -1)
					continue
				}
				n, err := io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if err != nil || resp.StatusCode == 200 && n != valueSize {
					count("client", "GET cut", resp.StatusCode)
					continue
				}
				count("client", "GET", resp.StatusCode)
				bigBytes.Add(n)
			}
		})
	}
	if stop > 0 {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				time.Sleep(time.Second - stop)
				r.mc.Pause()
				time.Sleep(stop)
				r.mc.Resume()
			}
		})
	}
	var lat []time.Duration
	canary := &http.Client{}
	for i := 0; time.Now().Before(deadline); i++ {
		method := "GET"
		var body io.Reader
		if i%2 == 0 {
			method, body = "PUT", strings.NewReader("small")
		}
		req, _ := http.NewRequest(method, r.url+"/canary", body)
		start := time.Now()
		resp, err := canary.Do(req)
		if err != nil {
			count("canary", method, -1)
			continue
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		lat = append(lat, time.Since(start))
		count("canary", method, resp.StatusCode)
		time.Sleep(10 * time.Millisecond)
	}
	wg.Wait()
	slices.Sort(lat)
	pct := func(p float64) time.Duration { return lat[int(p*float64(len(lat)-1))].Round(10 * time.Microsecond) }
	var answers []string
	codes.Range(func(k, n any) bool {
		answers = append(answers, fmt.Sprintf("%s: %d", k, n.(*atomic.Int64).Load()))
		return true
	})
	slices.Sort(answers)
	text, err := r.gw.Metrics(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var upstream []string
	for line := range strings.SplitSeq(text, "\n") {
		if strings.HasPrefix(line, "memcgate_upstream_ejections_total") || strings.HasPrefix(line, "memcgate_upstream_node_up") ||
			strings.HasPrefix(line, "memcgate_upstream_ops_total") && !strings.Contains(line, `result="ok"`) && !strings.Contains(line, `result="miss"`) && !strings.HasSuffix(line, " 0") {
			upstream = append(upstream, line)
		}
	}
	var logged []string
	for line := range strings.SplitSeq(r.gw.Logs(), "\n") {
		if strings.Contains(line, "eject") || strings.Contains(line, "node") && strings.Contains(line, "down") {
			logged = append(logged, line)
		}
	}
	t.Logf("%d clients, %ds, link %d MiB/s (0: loopback), SIGSTOP %v a second: big values %.0f MiB/s; canary %d answers, p50 %v, p99 %v, max %v\nanswers:\n  %s\nupstream:\n  %s\nlog:\n  %s",
		clients, seconds, rate, stop, float64(bigBytes.Load())/(1<<20)/float64(seconds), len(lat), pct(0.5), pct(0.99), lat[len(lat)-1].Round(10*time.Microsecond),
		strings.Join(answers, "\n  "), strings.Join(upstream, "\n  "), strings.Join(logged, "\n  "))
}

// slowLink relays connections to target through a link of rate bytes a
// second each way, shared by every connection, as a network slower than
// loopback is, and returns the address to dial.
func slowLink(t *testing.T, target string, rate int) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	type link struct {
		mu   sync.Mutex
		next time.Time
	}
	up, down := &link{}, &link{}
	pass := func(l *link, dst, src net.Conn) {
		defer dst.Close()
		defer src.Close()
		buf := make([]byte, 16<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				l.mu.Lock()
				at := time.Now()
				if l.next.After(at) {
					at = l.next
				}
				l.next = at.Add(time.Duration(n) * time.Second / time.Duration(rate))
				due := l.next
				l.mu.Unlock()
				time.Sleep(time.Until(due))
				if _, err := dst.Write(buf[:n]); err != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			go pass(up, u, c)
			go pass(down, c, u)
		}
	}()
	return ln.Addr().String()
}
