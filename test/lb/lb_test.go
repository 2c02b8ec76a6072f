// Package lb runs the shipped load-balancer configurations
// (deploy/nginx/memcgate-lb.conf, deploy/haproxy/haproxy.cfg) with a real
// nginx and a real HAProxy in front of two real memcgate processes and
// three real memcached, all on loopback, and checks what a client sees
// under steady load when one gateway is stopped (SIGTERM: the drain),
// killed (SIGKILL: the balancer's retries) and started again, and which
// requests the balancers replay on another gateway when the first one lost
// its answer (replay_test.go).
//
// The configurations are used as shipped; only addresses and ports are
// replaced (each replacement must match exactly), and HAProxy's chroot,
// user and group lines are dropped because the test is unprivileged.
// make test installs nginx and haproxy; a missing one skips the test, or
// fails it under CI or MEMCGATE_TEST_REQUIRE_MEMCACHED (gatewaytest.Tool).
package lb

import (
	"bytes"
	"context"
	"encoding/csv"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/gatewaytest"
	"github.com/memcgate/memcgate/test/memcachedtest"
)

const root = "../.."

var binary string

func TestMain(m *testing.M) { gatewaytest.Main(m, false, &binary) }

// Timings of the scenario. The drain is shorter than production's 5s to
// keep the test short, but longer than HAProxy's worst-case detection with
// the shipped check settings (inter 1s + fastinter 500ms), so that the
// check, not a retry, is what takes a draining gateway out. Twice that
// worst case, not 2s: HAProxy's own timers, its checks' round trips and
// the 25 ms polling of its stats add to the 1.5s, and on a loaded
// machine the gateway was seen marked down 1.48s after SIGTERM,
// half a second from failing a test that is not about those timers.
const (
	drainDelay = 3 * time.Second
	phaseLen   = 3*time.Second + drainDelay
	actionAt   = 500 * time.Millisecond
	workers    = 8
	pace       = 4 * time.Millisecond // per worker: at most ~2000 requests/s in all
)

func TestBalancers(t *testing.T) {
	if testing.Short() {
		t.Skip("runs nginx, HAProxy, two gateways and memcached for ~40s")
	}
	for _, lb := range []struct {
		name  string
		start func(*testing.T, [2]upstream) *balancer
	}{{"nginx", startNginx}, {"haproxy", startHAProxy}} {
		t.Run(lb.name, func(t *testing.T) {
			t.Parallel() // its own gateways, memcached and balancer
			scenario(t, lb.start)
		})
	}
}

// balancer is a running nginx or HAProxy.
type balancer struct {
	url string
	// report summarises what the balancer saw since the last call (retries,
	// errors it logged), for the test log.
	report func() string
	// downAfter, if set, watches the balancer's view of gw from now on and
	// returns a func that tells when it first marked gw down (0: never).
	downAfter func(gw string) func() time.Duration
}

// upstream is where a balancer sends traffic: a gateway's data address and
// the port of its admin listener (for HAProxy's check).
type upstream struct {
	data      string
	adminPort int
}

func scenario(t *testing.T, start func(*testing.T, [2]upstream) *balancer) {
	env := map[string]string{
		"MEMCGATE_SERVERS":          memcachedtest.Addrs(memcachedtest.StartN(t, 3)),
		"MEMCGATE_DRAIN_DELAY":      drainDelay.String(),
		"MEMCGATE_SHUTDOWN_TIMEOUT": "5s",
		"MEMCGATE_HEALTH_INTERVAL":  "200ms",
		"MEMCGATE_ACCESS_LOG":       "false",
		"MEMCGATE_LOG_FORMAT":       "text",
	}
	a := gatewaytest.New(t, binary, env)
	b := gatewaytest.New(t, binary, env)
	a.Start(t)
	b.Start(t)
	lb := start(t, [2]upstream{{a.DataAddr, a.AdminPort}, {b.DataAddr, b.AdminPort}})
	waitServing(t, lb, a)
	waitServing(t, lb, b)
	lb.report()

	t.Run("SIGTERM", func(t *testing.T) {
		var down func() time.Duration
		res := runLoad(t, lb.url, phaseLen, func() {
			if lb.downAfter != nil {
				down = lb.downAfter("memcgate-1")
			}
			a.Signal(syscall.SIGTERM)
		})
		exit, ok := a.Wait(10 * time.Second)
		if !ok || exit != nil {
			t.Errorf("gateway after SIGTERM: exited=%v err=%v, want a clean exit", ok, exit)
		}
		t.Logf("SIGTERM: %s; balancer: %s", res, lb.report())
		if down != nil {
			d := down()
			t.Logf("SIGTERM: the balancer marked the gateway down %v after the signal (drain %v)", d.Round(time.Millisecond), drainDelay)
			if d == 0 || d >= drainDelay {
				t.Errorf("the health check did not take the draining gateway out before its listener closed (down after %v, drain %v)", d, drainDelay)
			}
		}
		if res.failed() > 0 {
			t.Errorf("SIGTERM (drain): %d failed requests, want 0; first: %v", res.failed(), res.firstErrs)
		}
	})

	a.Start(t)
	waitServing(t, lb, a)
	lb.report()

	t.Run("SIGKILL", func(t *testing.T) {
		res := runLoad(t, lb.url, phaseLen-drainDelay, func() { a.Signal(syscall.SIGKILL) })
		a.Wait(10 * time.Second)
		t.Logf("SIGKILL: %s; balancer: %s", res, lb.report())
		t.Logf("SIGKILL: failed GET %d, failed PUT %d; first: %v", res.fail["GET"], res.fail["PUT"], res.firstErrs)
		if res.ok["GET"] == 0 || res.ok["PUT"] == 0 {
			t.Errorf("no successful requests while one gateway was down: %s", res)
		}
	})

	t.Run("restart", func(t *testing.T) {
		res := runLoad(t, lb.url, phaseLen, func() { a.Start(t) })
		served, err := a.Served(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("restart: %s; the restarted gateway served %.0f of them; balancer: %s", res, served, lb.report())
		if served == 0 {
			t.Error("the restarted gateway got no traffic from the balancer")
		}
		if res.failed() > 0 {
			t.Errorf("restart: %d failed requests, want 0; first: %v", res.failed(), res.firstErrs)
		}
	})
}

// waitServing sends requests through the balancer until gw has answered
// some of them.
func waitServing(t *testing.T, lb *balancer, gw *gatewaytest.Gateway) {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second}
	start, _ := gw.Served(t.Context())
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); {
		for i := range 10 {
			if resp, err := client.Get(fmt.Sprintf("%s/warmup/%d", lb.url, i)); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}
		if n, err := gw.Served(t.Context()); err == nil && n > start {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("gateway %s got no traffic through the balancer within 20s", gw.DataAddr)
}

// loadResult counts requests by method and outcome.
type loadResult struct {
	mu        sync.Mutex // guards all fields while the load runs
	ok, fail  map[string]int
	firstErrs []string
	maxLat    time.Duration
}

func (r *loadResult) failed() int { return r.fail["GET"] + r.fail["PUT"] }

func (r *loadResult) String() string {
	return fmt.Sprintf("%d requests (GET %d ok / %d failed, PUT %d ok / %d failed, slowest %v)",
		r.ok["GET"]+r.ok["PUT"]+r.failed(), r.ok["GET"], r.fail["GET"], r.ok["PUT"], r.fail["PUT"], r.maxLat.Round(time.Millisecond))
}

// runLoad runs workers × (PUT, GET) through url for d, paced, and calls
// action on the test goroutine actionAt after the start. A PUT must answer
// 201 and a GET 200 or 404; anything else, or no answer, is a failure.
func runLoad(t *testing.T, url string, d time.Duration, action func()) *loadResult {
	t.Helper()
	res := &loadResult{ok: map[string]int{}, fail: map[string]int{}}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	client := &http.Client{
		Timeout:   10 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: workers, DisableCompression: true},
	}
	defer client.CloseIdleConnections()
	begin := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			tick := time.NewTicker(pace)
			defer tick.Stop()
			for i := 0; ; i++ {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				method, want := http.MethodPut, []int{http.StatusCreated}
				if i%2 == 1 {
					method, want = http.MethodGet, []int{http.StatusOK, http.StatusNotFound}
				}
				key := fmt.Sprintf("%s/lb/%d/%d", url, w, (i/2)%64)
				var body io.Reader
				if method == http.MethodPut {
					body = strings.NewReader(fmt.Sprintf("value-%d-%d", w, i))
				}
				req, _ := http.NewRequest(method, key, body)
				t0 := time.Now()
				resp, err := client.Do(req)
				lat := time.Since(t0)
				var failure string
				if err != nil {
					failure = err.Error()
				} else {
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if !slices.Contains(want, resp.StatusCode) {
						failure = fmt.Sprintf("%d %s", resp.StatusCode, bytes.TrimSpace(b))
					}
				}
				if ctx.Err() != nil && err != nil {
					return // stopped, not failed
				}
				res.mu.Lock()
				res.maxLat = max(res.maxLat, lat)
				if failure == "" {
					res.ok[method]++
				} else {
					res.fail[method]++
					if len(res.firstErrs) < 5 {
						res.firstErrs = append(res.firstErrs, fmt.Sprintf("%s at +%v: %s", method, time.Since(begin).Round(time.Millisecond), failure))
					}
				}
				res.mu.Unlock()
			}
		})
	}
	time.Sleep(actionAt)
	action()
	if rest := d - time.Since(begin); rest > 0 {
		time.Sleep(rest)
	}
	cancel()
	wg.Wait()
	return res
}

// render returns the shipped file rel with each replacement applied; each
// old string must occur exactly once, so a change to the shipped file
// cannot silently leave the test running something else.
func render(t *testing.T, rel string, pairs ...string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for i := 0; i+1 < len(pairs); i += 2 {
		if n := strings.Count(s, pairs[i]); n != 1 {
			t.Fatalf("%s: %q occurs %d times, want once (update the test with the file)", rel, pairs[i], n)
		}
		s = strings.Replace(s, pairs[i], pairs[i+1], 1)
	}
	return s
}

func freePort(t *testing.T) int {
	t.Helper()
	p, err := memcachedtest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// process runs a balancer in the foreground and stops it when the test ends.
func process(t *testing.T, logs io.Writer, name string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	return cmd
}

// waitHTTP polls url until it answers at all.
func waitHTTP(t *testing.T, url string, logs func() string) {
	t.Helper()
	client := &http.Client{Timeout: time.Second}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if resp, err := client.Get(url); err == nil {
			resp.Body.Close()
			return
		}
	}
	t.Fatalf("%s did not answer within 10s:\n%s", url, logs())
}

func startNginx(t *testing.T, gws [2]upstream) *balancer {
	nginx := gatewaytest.Tool(t, "nginx", "nginx")
	dir := t.TempDir()
	port := freePort(t)
	conf := render(t, "deploy/nginx/memcgate-lb.conf",
		"server memcgate-1:8080 ", "server "+gws[0].data+" ",
		"server memcgate-2:8080 ", "server "+gws[1].data+" ",
		"listen 80;", "listen 127.0.0.1:"+strconv.Itoa(port)+";",
	)
	if err := os.WriteFile(filepath.Join(dir, "memcgate-lb.conf"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	errLog := filepath.Join(dir, "error.log")
	var main strings.Builder
	fmt.Fprintf(&main, "daemon off;\nmaster_process off;\npid %s/nginx.pid;\nerror_log %s warn;\n", dir, errLog)
	main.WriteString("events { worker_connections 1024; }\nhttp {\n  access_log off;\n")
	for _, p := range []string{"client_body", "proxy", "fastcgi", "uwsgi", "scgi"} {
		fmt.Fprintf(&main, "  %s_temp_path %s/%s;\n", p, dir, p)
	}
	fmt.Fprintf(&main, "  include %s/memcgate-lb.conf;\n}\n", dir)
	mainPath := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(mainPath, []byte(main.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	process(t, &out, nginx, "-p", dir, "-e", errLog, "-c", mainPath)
	readLog := func() string { b, _ := os.ReadFile(errLog); return out.String() + string(b) }
	url := "http://127.0.0.1:" + strconv.Itoa(port)
	gatewaytest.WaitListening(t, "nginx", "127.0.0.1:"+strconv.Itoa(port), readLog)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("nginx error.log (tail):\n%s", tailLines(readLog(), 30))
		}
	})

	// What nginx logged about the gateways since the last report.
	var offset int
	return &balancer{url: url, report: func() string {
		b, _ := os.ReadFile(errLog)
		lines := strings.Split(string(b[min(offset, len(b)):]), "\n")
		offset = len(b)
		kinds := []struct{ name, match string }{
			{"connect refused", "connect() failed (111"},
			{"reset", "(104: Connection reset"},
			{"closed early", "prematurely closed"},
			{"timeout", "timed out"},
			{"marked failed", "temporarily disabled"},
			{"no live upstreams", "no live upstreams"},
		}
		var parts []string
		for _, k := range kinds {
			n := 0
			for _, l := range lines {
				if strings.Contains(l, k.match) {
					n++
				}
			}
			if n > 0 {
				parts = append(parts, fmt.Sprintf("%s %d", k.name, n))
			}
		}
		if len(parts) == 0 {
			return "nginx logged no upstream errors"
		}
		return "nginx logged (each error retried on the other gateway where allowed): " + strings.Join(parts, ", ")
	}}
}

func startHAProxy(t *testing.T, gws [2]upstream) *balancer {
	haproxy := gatewaytest.Tool(t, "haproxy", "haproxy")
	dir := t.TempDir()
	// Two ports at once: two calls of freePort may get the same one, and
	// HAProxy would then bind both frontends to it, sharing it.
	ports, err := memcachedtest.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	port, statsPort := ports[0], ports[1]
	conf := render(t, "deploy/haproxy/haproxy.cfg",
		"    chroot /var/lib/haproxy\n", "",
		"    user haproxy\n", "",
		"    group haproxy\n", "",
		"bind :80", "bind 127.0.0.1:"+strconv.Itoa(port),
		"bind 127.0.0.1:8404", "bind 127.0.0.1:"+strconv.Itoa(statsPort),
		"memcgate-1:8080 check port 9090", gws[0].data+" check port "+strconv.Itoa(gws[0].adminPort),
		"memcgate-2:8080 check port 9090", gws[1].data+" check port "+strconv.Itoa(gws[1].adminPort),
	)
	path := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(haproxy, "-c", "-f", path).CombinedOutput(); err != nil {
		t.Fatalf("haproxy -c: %v\n%s", err, out)
	}
	logs := &gatewaytest.SyncBuffer{}
	process(t, logs, haproxy, "-db", "-f", path)
	url := "http://127.0.0.1:" + strconv.Itoa(port)
	statsURL := "http://127.0.0.1:" + strconv.Itoa(statsPort) + "/stats;csv"
	waitHTTP(t, statsURL, logs.String)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("haproxy log (tail):\n%s", tailLines(logs.String(), 30))
		}
	})
	stats := func() map[string]map[string]string {
		text, err := gatewaytest.Scrape(context.Background(), statsURL)
		if err != nil {
			return nil
		}
		r := csv.NewReader(strings.NewReader(strings.TrimPrefix(text, "# ")))
		r.FieldsPerRecord = -1
		recs, err := r.ReadAll()
		if err != nil || len(recs) < 2 {
			return nil
		}
		out := map[string]map[string]string{}
		for _, rec := range recs[1:] {
			row := map[string]string{}
			for i, h := range recs[0] {
				if i < len(rec) {
					row[h] = rec[i]
				}
			}
			if row["pxname"] == "memcgate" {
				out[row["svname"]] = row
			}
		}
		return out
	}
	// Both servers must pass their checks before traffic starts.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		s := stats()
		if s != nil && s["memcgate-1"]["status"] == "UP" && s["memcgate-2"]["status"] == "UP" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("HAProxy servers not UP within 10s: %v\n%s", s, logs.String())
		}
	}
	last := map[string]int{}
	return &balancer{
		url: url,
		report: func() string {
			s := stats()
			var parts []string
			for _, f := range []struct{ col, name string }{{"wretr", "retries"}, {"wredis", "redispatches"}, {"econ", "connect errors"}, {"eresp", "response errors"}} {
				n, _ := strconv.Atoi(s["BACKEND"][f.col])
				parts = append(parts, fmt.Sprintf("%s %d", f.name, n-last[f.col]))
				last[f.col] = n
			}
			return "HAProxy backend: " + strings.Join(parts, ", ") +
				fmt.Sprintf("; servers %s, %s", s["memcgate-1"]["status"], s["memcgate-2"]["status"])
		},
		downAfter: func(gw string) func() time.Duration {
			start := time.Now()
			var mu sync.Mutex
			var down time.Duration
			stop := make(chan struct{})
			done := make(chan struct{})
			go func() {
				defer close(done)
				for {
					if st := stats()[gw]["status"]; strings.HasPrefix(st, "DOWN") {
						mu.Lock()
						down = time.Since(start)
						mu.Unlock()
						return
					}
					select {
					case <-stop:
						return
					case <-time.After(25 * time.Millisecond):
					}
				}
			}()
			return func() time.Duration {
				close(stop)
				<-done
				mu.Lock()
				defer mu.Unlock()
				return down
			}
		},
	}
}

func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
