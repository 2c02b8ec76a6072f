package e2e

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/gatewaytest"
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
	fams, err := g.Families(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if f := fams["memcgate_upstream_ejections_total"]; f != nil && f.Sum != 0 {
		t.Errorf("%v ejections of nodes that answered every request in time; log:\n%s", f.Sum, gatewaytest.Tail(g.Logs(), 4000))
	}
}
