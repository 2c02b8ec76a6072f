package e2e

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/faultproxy"
	"github.com/memcgate/memcgate/test/memcachedtest"
)

// TestSeedLatency reproduces seed 000 (memcached TCP vs UDP under 100 ms of
// delay): our delay relay holds every chunk or datagram for the delay in
// each direction between the gateway and a real memcached, then 101 keys
// are written serially, as one batch, as async PUTs and as async PUTs that
// go out as UDP sets, and every key is read back. It asserts correctness
// and round-trip counts, never wall-clock limits. The delay defaults to
// 25ms per direction to keep make test short; `make seed` runs it at the
// seed's 100ms (MEMCGATE_TEST_SEED_DELAY) and prints the table.
func TestSeedLatency(t *testing.T) {
	t.Parallel() // its own gateway, memcached and relays; it mostly waits on the relays' delay
	delay := 25 * time.Millisecond
	if v := os.Getenv("MEMCGATE_TEST_SEED_DELAY"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("MEMCGATE_TEST_SEED_DELAY=%q: %v", v, err)
		}
		delay = d
	}
	const n = 101
	mc := memcachedtest.StartUDP(t)
	tcp := faultproxy.NewTCP(mc.Addr)
	udp := faultproxy.NewUDP("127.0.0.1:" + strconv.Itoa(mc.UDPPort))
	for _, s := range []interface{ Start() error }{tcp, udp} {
		if err := s.Start(); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { tcp.Close(); udp.Close() })
	_, udpPort, _ := net.SplitHostPort(udp.Addr())
	g := startGateway(t, map[string]string{
		"MEMCGATE_SERVERS":         tcp.Addr(),
		"MEMCGATE_UDP_PORTS":       tcp.Addr() + "=" + udpPort,
		"MEMCGATE_TIMEOUT":         (4*delay + time.Second).String(),
		"MEMCGATE_HEALTH_TIMEOUT":  (4*delay + time.Second).String(),
		"MEMCGATE_REQUEST_TIMEOUT": "60s",
		"MEMCGATE_ACCESS_LOG":      "false",
	})
	tcp.SetLatency(delay)
	udp.SetLatency(delay)

	// One round trip through the relay, measured with a warm connection:
	// the best of three, as one sample can wait for a busy CPU (seen with
	// the other packages' tests running at once).
	g.do("PUT", "/warm", []byte("x"))
	rtt := time.Duration(1<<63 - 1)
	for range 3 {
		start := time.Now()
		g.do("GET", "/warm", nil)
		rtt = min(rtt, time.Since(start))
	}
	start := time.Now()

	value := func(phase string, i int) string { return phase + "-" + strconv.Itoa(i) }
	key := func(phase string, i int) string { return phase + "_" + strconv.Itoa(i) }

	// 1. Serial PUTs: one round trip each.
	for i := range n {
		if r := g.do("PUT", "/"+key("serial", i), []byte(value("serial", i))); r.status != 201 {
			t.Fatalf("serial PUT %d = %d %q", i, r.status, r.body)
		}
	}
	serial := time.Since(start)

	// 2. One batch: writes spread over the node's connections.
	var ops []map[string]any
	for i := range n {
		ops = append(ops, map[string]any{"op": "set", "key": key("batch", i), "value": value("batch", i)})
	}
	body, _ := json.Marshal(map[string]any{"ops": ops})
	// The best of three, as the round trip and the multi-gets are timed:
	// one sample can wait for a busy CPU (5.4 round trips seen in CI,
	// with the fuzz targets running beside the tests). The same sets
	// again store the same values.
	batch := time.Duration(1<<63 - 1)
	for range 3 {
		start = time.Now()
		r := g.do("POST", "/", body)
		batch = min(batch, time.Since(start))
		if r.status != 200 || strings.Count(r.body, `"status":201`) != n {
			t.Fatalf("batch of %d sets = %d, %d stored: %.200s", n, r.status, strings.Count(r.body, `"status":201`), r.body)
		}
	}

	// 3. Async PUTs over TCP (the UDP port is for this node, so use a
	// gateway path that cannot use UDP: a value too large for a datagram).
	big := strings.Repeat("z", 2000)
	start = time.Now()
	for i := range n {
		if r := g.do("PUT", "/"+key("async", i), []byte(value("async", i)+big), "Prefer", "respond-async"); r.status != 202 {
			t.Fatalf("async PUT %d = %d %q", i, r.status, r.body)
		}
	}
	asyncAccepted := time.Since(start)
	asyncApplied := waitQueueEmpty(t, g, start)

	// 4. Async PUTs that go out as UDP sets.
	start = time.Now()
	for i := range n {
		if r := g.do("PUT", "/"+key("udp", i), []byte(value("udp", i)), "Prefer", "respond-async"); r.status != 202 {
			t.Fatalf("UDP async PUT %d = %d %q", i, r.status, r.body)
		}
	}
	udpAccepted := time.Since(start)
	udpApplied := waitQueueEmpty(t, g, start)

	// Read everything back with multi-gets (one round trip each).
	counts := map[string]int{}
	var readBack time.Duration
	for _, phase := range []string{"serial", "batch", "async", "udp"} {
		var q []string
		for i := range n {
			q = append(q, "key="+key(phase, i))
		}
		deadline := time.Now().Add(10*time.Second + 20*delay)
		for {
			got := multiGet(t, g, strings.Join(q, "&"))
			counts[phase] = 0
			for i := range n {
				want := value(phase, i)
				if phase == "async" {
					want += big
				}
				if got[key(phase, i)] == want {
					counts[phase]++
				}
			}
			// UDP sets are fire-and-forget: give datagrams in the delay line
			// their time before calling any lost.
			if counts[phase] == n || time.Now().After(deadline) {
				break
			}
			time.Sleep(delay)
		}
		// Timing: the best of three, because under a parallel -race run
		// one multi-get can wait two round trips for a CPU (seen in CI);
		// the claim is one round trip instead of one per key, and the
		// best attempt shows that without flaking on a busy machine.
		best := time.Duration(1<<63 - 1)
		for range 3 {
			start = time.Now()
			multiGet(t, g, strings.Join(q, "&"))
			best = min(best, time.Since(start))
		}
		readBack = max(readBack, best)
	}

	rounds := func(d time.Duration) float64 { return float64(d) / float64(rtt) }
	t.Logf("delay %v each way, measured round trip %v, pipelined connections (the default)", delay, rtt.Round(time.Millisecond))
	t.Logf("| %-36s | %12s | %8s | %9s |", "101 keys", "time", "rounds", "read back")
	t.Logf("| %-36s | %12v | %8.1f | %5d/%d |", "serial PUT", serial.Round(time.Millisecond), rounds(serial), counts["serial"], n)
	t.Logf("| %-36s | %12v | %8.1f | %5d/%d |", "one batch (POST /, best of 3)", batch.Round(time.Millisecond), rounds(batch), counts["batch"], n)
	t.Logf("| %-36s | %12v | %8.1f | %5d/%d |", "async PUT, 202 answers", asyncAccepted.Round(time.Millisecond), rounds(asyncAccepted), counts["async"], n)
	t.Logf("| %-36s | %12v | %8.1f |           |", "async PUT, all applied", asyncApplied.Round(time.Millisecond), rounds(asyncApplied))
	t.Logf("| %-36s | %12v | %8.1f | %5d/%d |", "UDP async set, 202 answers", udpAccepted.Round(time.Millisecond), rounds(udpAccepted), counts["udp"], n)
	t.Logf("| %-36s | %12v | %8.1f |           |", "UDP async set, all sent", udpApplied.Round(time.Millisecond), rounds(udpApplied))
	t.Logf("| %-36s | %12v | %8.1f |           |", "multi-get of 101 keys (best of 3)", readBack.Round(time.Millisecond), rounds(readBack))

	for _, phase := range []string{"serial", "batch", "async"} {
		if counts[phase] != n {
			t.Errorf("%s: %d of %d keys read back with the right value", phase, counts[phase], n)
		}
	}
	// UDP may drop datagrams by design; on loopback it should not.
	if counts["udp"] != n {
		t.Errorf("udp: %d of %d keys read back (loopback should lose none)", counts["udp"], n)
	}
	// The batch: its sets leave together on the node's pipelined
	// connections, one round trip, plus slack for dialling and
	// scheduling: far below 101.
	if maxRounds := 5.0; rounds(batch) > maxRounds {
		t.Errorf("batch of %d took %.1f round trips, want at most %.0f (one, and slack)", n, rounds(batch), maxRounds)
	}
	if rounds(serial) < float64(n)*0.8 {
		t.Errorf("serial PUTs took %.1f round trips, want about %d: is the delay relay in the path?", rounds(serial), n)
	}
	// About 1.6 round trips on an idle machine; scheduling under -race on
	// a busy one adds up to 100 ms to the 50 ms trip. Far below one trip
	// per key either way.
	if rounds(readBack) > 6 {
		t.Errorf("a multi-get of %d keys took %.1f round trips, want about 1", n, rounds(readBack))
	}
}

// waitQueueEmpty polls the async queue depth until it is 0 and returns
// the time since start.
func waitQueueEmpty(t *testing.T, g *gateway, start time.Time) time.Duration {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get(g.Admin + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for line := range bytes.SplitSeq(b, []byte("\n")) {
			if v, ok := bytes.CutPrefix(line, []byte("memcgate_async_queue_depth ")); ok && string(v) == "0" {
				return time.Since(start)
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("async queue did not empty within 60s")
	return 0
}

func multiGet(t *testing.T, g *gateway, query string) map[string]string {
	t.Helper()
	r := g.do("GET", "/?"+query, nil)
	if r.status != 200 {
		t.Fatalf("multi-get = %d %q", r.status, r.body)
	}
	var res struct {
		Results []struct {
			Key    string  `json:"key"`
			Status int     `json:"status"`
			Value  *string `json:"value"`
		} `json:"results"`
	}
	if err := json.Unmarshal([]byte(r.body), &res); err != nil {
		t.Fatalf("multi-get answer: %v", err)
	}
	out := map[string]string{}
	for _, it := range res.Results {
		if it.Status == 200 && it.Value != nil {
			out[it.Key] = *it.Value
		}
	}
	return out
}
