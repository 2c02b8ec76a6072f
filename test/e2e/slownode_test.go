package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/faultproxy"
	"github.com/memcgate/memcgate/test/memcachedtest"
)

// TestSlowNodeHoldsItsShare puts one of two nodes behind our relay with
// 150 ms of delay each way: it answers slowly but in time, so it is
// never ejected. 48 clients read its keys without pause, as many as
// MAX_REQUESTS; 8 more read the healthy node's keys. The slow node's
// requests may hold only half of the request slots, so every read of a
// healthy key is answered, and the slow node's reads past its share are
// refused at once with a 503 that names it. Without the share, the slow
// node's requests held every slot and the healthy reads got 503s.
func TestSlowNodeHoldsItsShare(t *testing.T) {
	mcs := memcachedtest.StartN(t, 2)
	px := faultproxy.NewTCP(mcs[1].Addr)
	if err := px.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { px.Close() })
	const slots = 48
	g := startGateway(t, map[string]string{
		"MEMCGATE_SERVERS":        mcs[0].Addr + "," + px.Addr(),
		"MEMCGATE_MAX_REQUESTS":   fmt.Sprint(slots),
		"MEMCGATE_TIMEOUT":        "1s",
		"MEMCGATE_HEALTH_TIMEOUT": "1s",
		"MEMCGATE_ACCESS_LOG":     "false",
	})
	// Eight keys on each node, by the gateway's own placement.
	keysOf := map[string][]string{}
	for i := 0; len(keysOf[mcs[0].Addr]) < 8 || len(keysOf[px.Addr()]) < 8; i++ {
		key := fmt.Sprint("k", i)
		resp, err := http.Get(g.Admin + "/debug/owners?key=" + key)
		if err != nil {
			t.Fatal(err)
		}
		var place struct {
			Serving string `json:"serving"`
		}
		err = json.NewDecoder(resp.Body).Decode(&place)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		keysOf[place.Serving] = append(keysOf[place.Serving], key)
		if r := g.do("PUT", "/"+key, []byte("v")); r.status != http.StatusCreated {
			t.Fatalf("PUT %s = %d %s", key, r.status, r.body)
		}
	}
	px.SetLatency(150 * time.Millisecond)

	var stop atomic.Bool
	var mu sync.Mutex
	answers := map[string]map[string]int{"slow": {}, "healthy": {}}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 10 * time.Second}
	read := func(kind string, keys []string, c int) {
		for i := c; !stop.Load(); i++ {
			resp, err := client.Get(g.URL + "/" + keys[i%len(keys)])
			answer := "error"
			if err == nil {
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				answer = fmt.Sprint(resp.StatusCode)
				if resp.StatusCode != http.StatusOK {
					answer += " " + strings.TrimSpace(string(body))
				}
			}
			mu.Lock()
			answers[kind][answer]++
			mu.Unlock()
			if answer != "200" {
				time.Sleep(20 * time.Millisecond) // a client that honours Retry-After a little
			}
		}
	}
	var wg sync.WaitGroup
	for c := range slots {
		wg.Go(func() { read("slow", keysOf[px.Addr()], c) })
	}
	time.Sleep(500 * time.Millisecond) // the slow node's requests take what they may
	for c := range 8 {
		wg.Go(func() { read("healthy", keysOf[mcs[0].Addr], c) })
	}
	time.Sleep(2 * time.Second)
	stop.Store(true)
	wg.Wait()
	t.Logf("answers: %v", answers)

	healthy := answers["healthy"]
	if len(healthy) != 1 || healthy["200"] == 0 {
		t.Errorf("reads of the healthy node's keys: %v, want all 200", healthy)
	}
	slow := answers["slow"]
	refused := 0
	for answer, n := range slow {
		switch {
		case answer == "200":
		case strings.HasPrefix(answer, "503 memcached node "+px.Addr()+" has its share of MEMCGATE_MAX_REQUESTS"):
			refused += n
		default:
			t.Errorf("a read of the slow node's keys got %q (%d times)", answer, n)
		}
	}
	if slow["200"] == 0 || refused == 0 {
		t.Errorf("reads of the slow node's keys: %v, want some 200 and some refused as past its share", slow)
	}
	text, err := g.Metrics(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	busy := 0
	for _, line := range strings.Split(text, "\n") {
		switch {
		case strings.HasPrefix(line, "memcgate_upstream_node_up{") && !strings.HasSuffix(line, " 1"):
			t.Errorf("%s: a slow node that answers in time must stay up", line)
		case strings.HasPrefix(line, "memcgate_upstream_ops_total{") && strings.Contains(line, `result="busy"`) && !strings.HasSuffix(line, " 0"):
			if !strings.Contains(line, `node="`+px.Addr()+`"`) {
				t.Errorf("%s: only the slow node may be busy", line)
			}
			busy++
		}
	}
	if busy == 0 {
		t.Error(`memcgate_upstream_ops_total{result="busy"} is 0 for the slow node`)
	}
}
