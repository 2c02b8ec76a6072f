package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/faultproxy"
	"github.com/memcgate/memcgate/test/memcachedtest"
)

// TestSlowNodeHoldsItsShare puts one or two nodes behind our relay with
// 150 ms of delay each way, beside a healthy one: they answer slowly but
// in time, so they are never ejected. 48 clients read their keys without
// pause, as many as MAX_REQUESTS; 8 more read the healthy node's keys. A
// node's requests may hold only its share of the request slots (half;
// past its fair part, no more than are free), so every read of a healthy
// key is answered, and the slow nodes' reads past their share are
// refused at once with a 503 that names the node. Without the share, one
// slow node's requests held every slot and the healthy reads got 503s;
// with half each and no more, two slow nodes held every slot between
// them.
func TestSlowNodeHoldsItsShare(t *testing.T) {
	for _, slowNodes := range []int{1, 2} {
		t.Run(fmt.Sprint(slowNodes, " slow"), func(t *testing.T) { slowNodesHoldTheirShare(t, slowNodes) })
	}
}

func slowNodesHoldTheirShare(t *testing.T, slowNodes int) {
	mcs := memcachedtest.StartN(t, 1+slowNodes)
	healthy := mcs[0].Addr
	servers := []string{healthy}
	var pxs []*faultproxy.TCP
	for _, mc := range mcs[1:] {
		px := faultproxy.NewTCP(mc.Addr)
		if err := px.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { px.Close() })
		pxs = append(pxs, px)
		servers = append(servers, px.Addr())
	}
	slow := servers[1:]
	const slots = 48
	g := startGateway(t, map[string]string{
		"MEMCGATE_SERVERS":        strings.Join(servers, ","),
		"MEMCGATE_MAX_REQUESTS":   fmt.Sprint(slots),
		"MEMCGATE_TIMEOUT":        "1s",
		"MEMCGATE_HEALTH_TIMEOUT": "1s",
		"MEMCGATE_ACCESS_LOG":     "false",
	})
	// Eight keys on each node, by the gateway's own placement.
	keysOf := map[string][]string{}
	for i := 0; slices.ContainsFunc(servers, func(s string) bool { return len(keysOf[s]) < 8 }); i++ {
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
	for _, px := range pxs {
		px.SetLatency(150 * time.Millisecond)
	}

	var stop atomic.Bool
	var mu sync.Mutex
	answers := map[string]map[string]int{"healthy": {}}
	for _, s := range slow {
		answers[s] = map[string]int{}
	}
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
		s := slow[c%len(slow)]
		wg.Go(func() { read(s, keysOf[s], c) })
	}
	time.Sleep(500 * time.Millisecond) // the slow nodes' requests take what they may
	for c := range 8 {
		wg.Go(func() { read("healthy", keysOf[healthy], c) })
	}
	time.Sleep(2 * time.Second)
	stop.Store(true)
	wg.Wait()
	t.Logf("answers: %v", answers)

	if h := answers["healthy"]; len(h) != 1 || h["200"] == 0 {
		t.Errorf("reads of the healthy node's keys: %v, want all 200", h)
	}
	for _, s := range slow {
		refused := 0
		for answer, n := range answers[s] {
			switch {
			case answer == "200":
			case strings.HasPrefix(answer, "503 memcached node "+s+" has its share of MEMCGATE_MAX_REQUESTS"):
				refused += n
			default:
				t.Errorf("a read of slow node %s's keys got %q (%d times)", s, answer, n)
			}
		}
		if answers[s]["200"] == 0 || refused == 0 {
			t.Errorf("reads of slow node %s's keys: %v, want some 200 and some refused as past its share", s, answers[s])
		}
	}
	text, err := g.Metrics(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	busy := map[string]bool{}
	for _, line := range strings.Split(text, "\n") {
		switch {
		case strings.HasPrefix(line, "memcgate_upstream_node_up{") && !strings.HasSuffix(line, " 1"):
			t.Errorf("%s: a slow node that answers in time must stay up", line)
		case strings.HasPrefix(line, "memcgate_upstream_ops_total{") && strings.Contains(line, `result="busy"`) && !strings.HasSuffix(line, " 0"):
			if strings.Contains(line, `node="`+healthy+`"`) {
				t.Errorf("%s: only the slow nodes may be busy", line)
			}
			for _, s := range slow {
				if strings.Contains(line, `node="`+s+`"`) {
					busy[s] = true
				}
			}
		}
	}
	if len(busy) != len(slow) {
		t.Errorf(`memcgate_upstream_ops_total{result="busy"} counted for %v, want every slow node %v`, busy, slow)
	}
}
