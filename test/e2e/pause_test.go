package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/memcachedtest"
)

// TestGatewayPausedKeepsNodes stops the gateway itself for 0.8 s, four
// times, while clients keep requests in flight, as a host freeze, a
// throttled container or a process starved of CPU would: memcached
// answered every request in time, so no node may be ejected and no
// request may fail. Before the reader's late deadline was told from a
// memcached stall, each pause failed every call waiting on a connection
// with a timeout and ejected a healthy node.
func TestGatewayPausedKeepsNodes(t *testing.T) {
	mcs := memcachedtest.StartN(t, 3)
	var servers []string
	for _, m := range mcs {
		servers = append(servers, m.Addr)
	}
	g := startGateway(t, map[string]string{"MEMCGATE_SERVERS": strings.Join(servers, ",")})
	for i := range 64 {
		if r := g.do("PUT", fmt.Sprint("/p", i), []byte("v")); r.status != http.StatusCreated {
			t.Fatalf("PUT = %d %s", r.status, r.body)
		}
	}

	var stop atomic.Bool
	var mu sync.Mutex
	statuses := map[int]int{}
	var wg sync.WaitGroup
	value := strings.Repeat("v", 32<<10)
	for c := range 64 {
		wg.Go(func() {
			client := &http.Client{Timeout: 10 * time.Second}
			for i := c; !stop.Load(); i++ {
				url := fmt.Sprintf("%s/p%d", g.URL, i%64)
				var resp *http.Response
				var err error
				if i%3 == 0 {
					var req *http.Request
					req, err = http.NewRequest("PUT", url, strings.NewReader(value))
					if err == nil {
						resp, err = client.Do(req)
					}
				} else {
					resp, err = client.Get(url)
				}
				status := -1
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					status = resp.StatusCode
				}
				mu.Lock()
				statuses[status]++
				mu.Unlock()
			}
		})
	}
	time.Sleep(300 * time.Millisecond)
	for range 4 {
		g.Signal(syscall.SIGSTOP)
		time.Sleep(800 * time.Millisecond)
		g.Signal(syscall.SIGCONT)
		time.Sleep(700 * time.Millisecond)
	}
	stop.Store(true)
	wg.Wait()
	t.Logf("answers: %v", statuses)
	if len(statuses) != 2 || statuses[http.StatusOK] == 0 || statuses[http.StatusCreated] == 0 {
		t.Errorf("answers %v; want only 200s and 201s", statuses)
	}
	if n := sumMetric(t, g, "memcgate_upstream_ejections_total"); n != 0 {
		t.Errorf("%v ejections of nodes that answered every request in time; log:\n%s", n, gatewayLogTail(g))
	}
}

// sumMetric is the sum of every sample of a metric of the gateway's.
func sumMetric(t *testing.T, g *gateway, name string) float64 {
	t.Helper()
	resp, err := http.Get(g.Admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sum := 0.0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			t.Fatal(err)
		}
		sum += v
	}
	return sum
}

// gatewayLogTail is the end of the gateway's log, for a failure message.
func gatewayLogTail(g *gateway) string {
	l := g.Logs()
	if len(l) > 4000 {
		l = l[len(l)-4000:]
	}
	return l
}
