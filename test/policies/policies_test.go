// Package policies runs the built binary against real memcached processes
// with the warm-up and shadow policies, over HTTP: a cold pool filling
// itself from a warm one under steady reads (its hit ratio per interval,
// the values byte for byte, the TTLs carried), and a shadow pool's
// comparison counters. Each warm-up interval lasts
// MEMCGATE_TEST_POLICIES_INTERVAL (1s by default).
package policies

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/memcgate/memcgate/test/gatewaytest"
	"github.com/memcgate/memcgate/test/memcachedtest"
)

var binary string

func TestMain(m *testing.M) { gatewaytest.Main(m, false, &binary) }

func interval(t *testing.T) time.Duration {
	if v := os.Getenv("MEMCGATE_TEST_POLICIES_INTERVAL"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("MEMCGATE_TEST_POLICIES_INTERVAL=%q: %v", v, err)
		}
		return d
	}
	return time.Second
}

func startGateway(t *testing.T, env map[string]string) *gatewaytest.Gateway {
	t.Helper()
	base := map[string]string{"MEMCGATE_DRAIN_DELAY": "0s", "MEMCGATE_LOG_FORMAT": "text", "MEMCGATE_ACCESS_LOG": "false",
		"MEMCGATE_TIMEOUT": "1s", "MEMCGATE_REQUEST_TIMEOUT": "5s"}
	for k, v := range env {
		base[k] = v
	}
	g := gatewaytest.New(t, binary, base)
	g.Start(t)
	return g
}

// counter sums the samples of metric name whose labels include every
// name="value" pair of want.
func counter(t *testing.T, g *gatewaytest.Gateway, name string, want ...string) float64 {
	t.Helper()
	text, err := g.Metrics(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
next:
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		for i := 0; i+1 < len(want); i += 2 {
			if !strings.Contains(line, want[i]+`="`+want[i+1]+`"`) {
				continue next
			}
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		sum += v
	}
	return sum
}

// value is key i's value: binary, of varying size, with bytes a text
// protocol would trip on.
func value(i int) []byte {
	r := rand.New(rand.NewPCG(uint64(i), 7))
	b := make([]byte, 1+r.IntN(3000))
	for j := range b {
		b[j] = byte(r.UintN(256))
	}
	return append(b, "\r\nEND\r\n"...)
}

func key(i int) string { return fmt.Sprintf("item:%05d", i) }

func httpGet(client *http.Client, url string) (int, []byte, http.Header, error) {
	resp, err := client.Get(url)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, resp.Header, err
}

// metaTTL is the remaining TTL memcached at addr reports for key (-1:
// none), and whether it has the key.
func metaTTL(t *testing.T, addr, key string) (int, bool) {
	t.Helper()
	var ttl int
	var found bool
	conn, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "mg %s t\r\n", key)
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	if strings.HasPrefix(line, "HD") {
		found = true
		for _, f := range strings.Fields(line)[1:] {
			if strings.HasPrefix(f, "t") {
				ttl, _ = strconv.Atoi(f[1:])
			}
		}
	}
	return ttl, found
}

// TestWarmUp: a cold pool (SERVERS, empty) in front of a warm one (POOLS
// "old", filled directly), under steady uniform reads over HTTP. The cold
// pool's hit ratio per interval must rise toward 100 %; every answer is
// the warm value byte for byte, with its flags; a copy carries the warm
// item's TTL, so a key that expires in the warm pool expires in the cold
// one no later.
func TestWarmUp(t *testing.T) {
	const keys = 2000
	// One warm node, filled directly (a client of its own would place keys
	// on several nodes by another ring than the gateway's); two cold ones.
	cold, warm := memcachedtest.StartN(t, 2), memcachedtest.StartN(t, 1)
	wc := memcache.New(warm[0].Addr)
	for i := range keys {
		if err := wc.Set(&memcache.Item{Key: key(i), Value: value(i), Flags: uint32(i)}); err != nil {
			t.Fatal(err)
		}
	}
	// Expiring keys: copied into the cold pool by the first read, they
	// must be gone from it once their warm TTL has passed.
	const expiring, expTTL = 20, 6
	expStart := time.Now()
	for i := range expiring {
		if err := wc.Set(&memcache.Item{Key: fmt.Sprint("exp:", i), Value: []byte("short-lived"), Expiration: expTTL}); err != nil {
			t.Fatal(err)
		}
	}
	g := startGateway(t, map[string]string{
		"MEMCGATE_SERVERS":   memcachedtest.Addrs(cold),
		"MEMCGATE_POOLS":     "old servers=" + memcachedtest.Addrs(warm),
		"MEMCGATE_WARM_POOL": "old",
	})
	base := "http://" + g.DataAddr
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 16}}

	for i := range expiring {
		code, b, _, err := httpGet(client, base+"/"+fmt.Sprint("exp:", i))
		if err != nil || code != http.StatusOK || string(b) != "short-lived" {
			t.Fatalf("GET exp:%d = %d %q %v", i, code, b, err)
		}
	}

	// Steady reads: paced workers, uniform keys.
	const workers = 4
	period := 4 * time.Millisecond
	var bad atomic.Int64
	var firstBad atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 1))
			tick := time.NewTicker(period)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				i := r.IntN(keys)
				code, b, h, err := httpGet(client, base+"/"+key(i))
				if err != nil || code != http.StatusOK || !bytes.Equal(b, value(i)) || h.Get("X-Memcached-Flags") != strconv.Itoa(i) {
					bad.Add(1)
					firstBad.CompareAndSwap(nil, fmt.Sprintf("GET %s = %d, %d bytes, flags %q, %v", key(i), code, len(b), h.Get("X-Memcached-Flags"), err))
				}
			}
		})
	}
	type row struct {
		at                     time.Duration
		cold, warmHit, miss, e float64
	}
	var rows []row
	read := func() row {
		return row{
			cold:    counter(t, g, "memcgate_warmup_reads_total", "result", "cold_hit"),
			warmHit: counter(t, g, "memcgate_warmup_reads_total", "result", "warm_hit"),
			miss:    counter(t, g, "memcgate_warmup_reads_total", "result", "miss"),
			e:       counter(t, g, "memcgate_warmup_reads_total", "result", "warm_error"),
		}
	}
	start := time.Now()
	prev := read()
	const intervals = 10
	for range intervals {
		time.Sleep(interval(t))
		cur := read()
		cur.at = time.Since(start)
		rows = append(rows, row{at: cur.at, cold: cur.cold - prev.cold, warmHit: cur.warmHit - prev.warmHit, miss: cur.miss - prev.miss, e: cur.e - prev.e})
		prev = cur
	}
	close(stop)
	wg.Wait()

	var table strings.Builder
	fmt.Fprintf(&table, "\n| until | reads | cold hits | from warm | misses | warm errors | cold hit ratio |\n|---|---|---|---|---|---|---|\n")
	ratio := make([]float64, len(rows))
	for i, r := range rows {
		n := r.cold + r.warmHit + r.miss
		if n > 0 {
			ratio[i] = r.cold / n
		}
		fmt.Fprintf(&table, "| %.1fs | %.0f | %.0f | %.0f | %.0f | %.0f | %.1f %% |\n", r.at.Seconds(), n, r.cold, r.warmHit, r.miss, r.e, 100*ratio[i])
	}
	t.Logf("warm-up of an empty pool from a warm one, %d keys, %d paced readers:%s", keys, workers, table.String())

	if n := bad.Load(); n > 0 {
		t.Errorf("%d reads did not return the warm value byte for byte; the first: %v", n, firstBad.Load())
	}
	if last := ratio[len(ratio)-1]; last < 0.85 {
		t.Errorf("cold hit ratio in the last interval = %.1f %%, want at least 85 %% (rising toward 100 %%)", 100*last)
	}
	if ratio[len(ratio)-1] <= ratio[0] {
		t.Errorf("cold hit ratio did not rise: first interval %.1f %%, last %.1f %%", 100*ratio[0], 100*ratio[len(ratio)-1])
	}
	if misses := counter(t, g, "memcgate_warmup_reads_total", "result", "miss"); misses != 0 {
		t.Errorf("%v misses: every key is in the warm pool", misses)
	}

	// Copies in the cold pool: byte for byte, with their flags.
	copied := 0
	for i := range keys {
		for _, m := range cold {
			it, err := memcache.New(m.Addr).Get(key(i))
			if err != nil {
				continue
			}
			copied++
			if !bytes.Equal(it.Value, value(i)) || it.Flags != uint32(i) {
				t.Errorf("cold copy of %s on %s: %d bytes flags %d, want the warm item's %d bytes flags %d", key(i), m.Addr, len(it.Value), it.Flags, len(value(i)), i)
			}
		}
	}
	t.Logf("%d of %d keys copied into the cold pool; write-backs %v stored, %v dropped; TTLs from the warm pool %v, default %v",
		copied, keys, counter(t, g, "memcgate_warmup_writebacks_total", "result", "stored"),
		counter(t, g, "memcgate_warmup_writebacks_total", "result", "dropped"),
		counter(t, g, "memcgate_warmup_ttl_total", "source", "warm"), counter(t, g, "memcgate_warmup_ttl_total", "source", "default"))

	// TTLs carried: each expiring key's copy has at most the warm TTL left,
	// and is gone from the cold pool once the warm item expired.
	for i := range expiring {
		k := fmt.Sprint("exp:", i)
		found := false
		for _, m := range cold {
			if ttl, ok := metaTTL(t, m.Addr, k); ok {
				found = true
				if left := expTTL - int(time.Since(expStart).Seconds()); ttl < 0 || ttl > left+1 {
					t.Errorf("cold copy of %s has %d s left, the warm item had at most %d", k, ttl, left+1)
				}
			}
		}
		if !found && time.Since(expStart) < expTTL*time.Second-time.Second {
			t.Errorf("%s was not copied into the cold pool", k)
		}
	}
	if wait := time.Until(expStart.Add(expTTL*time.Second + 1100*time.Millisecond)); wait > 0 {
		time.Sleep(wait) // memcached's clock ticks in whole seconds: the deadline itself plus one tick
	}
	for i := range expiring {
		k := fmt.Sprint("exp:", i)
		for _, m := range cold {
			if _, ok := metaTTL(t, m.Addr, k); ok {
				t.Errorf("%s outlived the warm item in the cold pool (%s)", k, m.Addr)
			}
		}
		if code, _, _, err := httpGet(client, base+"/"+k); err != nil || code != http.StatusNotFound {
			t.Errorf("GET %s after its TTL = %d, %v; want 404", k, code, err)
		}
	}
}

// owners is the part of /debug/owners the shadow test reads.
type owners struct {
	Pool     string `json:"pool"`
	Shadow   string `json:"shadow"`
	Shadowed bool   `json:"shadowed"`
}

// TestShadow: half the keys are mirrored to a shadow pool. After a value
// differing from the primary's is written straight into the shadow pool
// for a few keys, reads count those as mismatches and the others as
// matches, and clients always get the primary's value; a shadow pool that
// stops answering costs the clients nothing.
func TestShadow(t *testing.T) {
	const keys = 200
	main, shadow := memcachedtest.StartN(t, 1), memcachedtest.StartN(t, 1)
	g := startGateway(t, map[string]string{
		"MEMCGATE_SERVERS":        memcachedtest.Addrs(main),
		"MEMCGATE_POOLS":          "next servers=" + memcachedtest.Addrs(shadow),
		"MEMCGATE_SHADOW_POOL":    "next",
		"MEMCGATE_SHADOW_PERCENT": "50",
	})
	base := "http://" + g.DataAddr
	client := &http.Client{Timeout: 10 * time.Second}

	var sampled []int
	for i := range keys {
		resp, err := client.Get("http://" + g.AdminAddr + "/debug/owners?key=" + key(i))
		if err != nil {
			t.Fatal(err)
		}
		var o owners
		err = json.NewDecoder(resp.Body).Decode(&o)
		resp.Body.Close()
		if err != nil || o.Shadow != "next" {
			t.Fatalf("/debug/owners?key=%s = %+v, %v; want shadow next", key(i), o, err)
		}
		if o.Shadowed {
			sampled = append(sampled, i)
		}
	}
	if len(sampled) < keys/4 || len(sampled) > keys*3/4 {
		t.Fatalf("%d of %d keys shadowed at 50 %%", len(sampled), keys)
	}

	for i := range keys {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPut, base+"/"+key(i), bytes.NewReader([]byte("primary-"+strconv.Itoa(i))))
		resp, err := client.Do(req)
		if err != nil || resp.StatusCode != http.StatusCreated {
			t.Fatalf("PUT %s: %v %v", key(i), resp, err)
		}
		resp.Body.Close()
	}
	waitFor(t, "mirrored sets compared", func() bool {
		return counter(t, g, "memcgate_shadow_total", "op", "set") == float64(len(sampled))
	})
	// The shadow pool holds exactly the sample, with the primary's values.
	sc := memcache.New(shadow[0].Addr)
	for i := range keys {
		_, err := sc.Get(key(i))
		if in := contains(sampled, i); in != (err == nil) {
			t.Errorf("shadow pool has %s: %v, want %v (in the sample)", key(i), err == nil, in)
		}
	}
	const differing = 5
	for _, i := range sampled[:differing] {
		if err := sc.Set(&memcache.Item{Key: key(i), Value: []byte("shadow-" + strconv.Itoa(i))}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range keys {
		code, b, _, err := httpGet(client, base+"/"+key(i))
		if err != nil || code != http.StatusOK || string(b) != "primary-"+strconv.Itoa(i) {
			t.Fatalf("GET %s = %d %q %v; want the primary's value", key(i), code, b, err)
		}
	}
	waitFor(t, "mirrored gets compared", func() bool {
		return counter(t, g, "memcgate_shadow_total", "op", "get") == float64(len(sampled))
	})
	match := counter(t, g, "memcgate_shadow_total", "op", "get", "result", "match")
	mismatch := counter(t, g, "memcgate_shadow_total", "op", "get", "result", "mismatch")
	errs := counter(t, g, "memcgate_shadow_total", "op", "get", "result", "error")
	t.Logf("shadow at 50 %%: %d of %d keys sampled; sets: %v match; gets: %v match, %v mismatch, %v error (%d values differ in the shadow pool)",
		len(sampled), keys, counter(t, g, "memcgate_shadow_total", "op", "set", "result", "match"), match, mismatch, errs, differing)
	if mismatch != differing || match != float64(len(sampled)-differing) || errs != 0 {
		t.Errorf("gets compared: %v match, %v mismatch, %v error; want %d, %d, 0", match, mismatch, errs, len(sampled)-differing, differing)
	}

	// A shadow pool that stops answering: the clients' reads are as fast
	// as before and still right; the comparisons end as errors.
	shadow[0].Pause()
	var slowest time.Duration
	for _, i := range sampled[:20] {
		start := time.Now()
		code, b, _, err := httpGet(client, base+"/"+key(i))
		slowest = max(slowest, time.Since(start))
		if err != nil || code != http.StatusOK || string(b) != "primary-"+strconv.Itoa(i) {
			t.Fatalf("GET %s with the shadow pool stopped = %d %q %v", key(i), code, b, err)
		}
	}
	t.Logf("shadow pool stopped: the slowest of 20 sampled reads took %v (memcached timeout 1s)", slowest)
	if slowest >= 500*time.Millisecond {
		t.Errorf("a read took %v with the shadow pool stopped: the shadow delays clients", slowest)
	}
	waitFor(t, "comparisons against the stopped shadow pool", func() bool {
		return counter(t, g, "memcgate_shadow_total", "op", "get", "result", "error") >= 1
	})
	shadow[0].Resume()
	t.Logf("with the shadow pool stopped: %v comparisons ended as errors, %v dropped",
		counter(t, g, "memcgate_shadow_total", "result", "error"), counter(t, g, "memcgate_shadow_dropped_total"))
}

func contains(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// waitFor polls cond for up to 20 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("%s: not within 20s", what)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
