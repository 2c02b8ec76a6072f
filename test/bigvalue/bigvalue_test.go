//go:build linux

// Package bigvalue runs values stored in chunks (MEMCGATE_BIG_VALUE_MAX_BYTES)
// through the real binary, built without the race detector so that its
// memory is what a deployment would see (it reads /proc, so Linux only):
//
//   - TestBigValueHolders (make test) has clients make the gateway hold
//     20 MB values the most they can, and checks that the byte budget
//     decides: the RSS stays bounded, what does not fit gets 503, and
//     everything is given back;
//   - TestBigValueThroughput (BIGVALUE_BENCH=1) measures 20 MB PUTs and
//     GETs, and prints the table of docs/benchmarks.md.
package bigvalue

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/gatewaytest"
	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/test/slowreader"
)

var binary string

func TestMain(m *testing.M) { gatewaytest.Main(m, false, &binary) }

// valueSize is the size of the values: 21 chunks of the default 1,048,000.
const valueSize = 20 << 20

// rssBound is the most RSS the holders may make the gateway take: the
// default budget is 64 MiB.
const rssBound = 256 << 20

// rig is one memcached and a memcgate with values in chunks on (up to
// 64 MiB) and every other setting at its default.
type rig struct {
	mc  *memcachedtest.Server
	gw  *gatewaytest.Gateway
	url string
}

func newRig(t *testing.T, env ...string) *rig {
	t.Helper()
	return newRigOn(t, memcachedtest.Start(t, "-m", "2048"), env...)
}

// newRigOn is newRig in front of mc.
func newRigOn(t *testing.T, mc *memcachedtest.Server, env ...string) *rig {
	t.Helper()
	vars := map[string]string{"MEMCGATE_SERVERS": mc.Addr, "MEMCGATE_BIG_VALUE_MAX_BYTES": strconv.Itoa(64 << 20), "MEMCGATE_ACCESS_LOG": "false"}
	for i := 0; i+1 < len(env); i += 2 {
		vars[env[i]] = env[i+1]
	}
	gw := gatewaytest.New(t, binary, vars)
	gw.Start(t)
	return &rig{mc: mc, gw: gw, url: "http://" + gw.DataAddr}
}

// proc is a field of the gateway's /proc/PID/status, in bytes (VmRSS,
// VmHWM).
func (r *rig) proc(t *testing.T, field string) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(r.gw.Pid()) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no %s in /proc status", field)
	return 0
}

// metric is the value of one sample of the gateway's metrics.
func (r *rig) metric(t *testing.T, sample string) float64 {
	t.Helper()
	text, err := r.gw.Metrics(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(text, "\n") {
		if rest, ok := strings.CutPrefix(line, sample+" "); ok {
			v, err := strconv.ParseFloat(rest, 64)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
	}
	t.Fatalf("no sample %s", sample)
	return 0
}

func randomValue(n int, seed byte) []byte {
	v := make([]byte, n)
	rand.NewChaCha8([32]byte{seed}).Read(v)
	return v
}

func (r *rig) put(t *testing.T, key string, v []byte) time.Duration {
	t.Helper()
	start := time.Now()
	req, _ := http.NewRequest("PUT", r.url+"/"+key, bytes.NewReader(v))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 201 {
		t.Fatalf("PUT %s = %d", key, resp.StatusCode)
	}
	return time.Since(start)
}

// get reads key and returns its SHA-256 and how long it took.
func (r *rig) get(t *testing.T, key string) ([32]byte, time.Duration) {
	start := time.Now()
	resp, err := http.Get(r.url + "/" + key)
	if err != nil {
		t.Error(err)
		return [32]byte{}, 0
	}
	defer resp.Body.Close()
	h := sha256.New()
	n, err := io.Copy(h, resp.Body)
	if err != nil || resp.StatusCode != 200 || n != valueSize {
		t.Errorf("GET %s = %d, %d bytes, %v", key, resp.StatusCode, n, err)
	}
	var sum [32]byte
	h.Sum(sum[:0])
	return sum, time.Since(start)
}

// TestBigValueHolders: 64 clients GET a 20 MB value and read nothing,
// then 100 clients PUT 3 MiB each at once, each pausing after 1.5 MiB
// (a chunk and a half) until the first refusal or a few seconds, so that
// they hold their chunks together however fast the machine. The budget
// (64 MiB by default) lets those it can hold go on, two chunks for each
// GET and one for each PUT, and answers the others 503 at once; the RSS
// stays bounded; every GET held is served whole once its client reads;
// and when they are done the budget is empty again.
func TestBigValueHolders(t *testing.T) {
	const clients, putters, putSize = 64, 100, 3 << 20
	// memcached is not what is tested: a loaded machine must not get it
	// ejected for a stall of half a second, the default timeout.
	r := newRig(t, "MEMCGATE_TIMEOUT", "1s")
	v := randomValue(valueSize, 1)
	want := sha256.Sum256(v)
	r.put(t, "big", v)

	// GETs that read nothing for a second.
	conns := make([]net.Conn, clients)
	for i := range conns {
		c := slowreader.Dial(t, r.gw.DataAddr, 16<<10)
		io.WriteString(c, "GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
		conns[i] = c
	}
	time.Sleep(time.Second)
	start := time.Now()
	held, rss := r.metric(t, "memcgate_buffered_bytes"), r.proc(t, "VmRSS")
	var served, refused int
	var wg sync.WaitGroup
	var mu sync.Mutex
	for _, c := range conns {
		wg.Go(func() {
			c.SetReadDeadline(time.Now().Add(30 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Errorf("GET: %v", err)
				return
			}
			h := sha256.New()
			io.Copy(h, resp.Body)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case resp.StatusCode == 503 && resp.Header.Get("Retry-After") != "":
				refused++
			case resp.StatusCode == 200 && bytes.Equal(h.Sum(nil), want[:]):
				served++
			default:
				t.Errorf("GET = %d, not the value", resp.StatusCode)
			}
		})
	}
	wg.Wait()
	t.Logf("%d GETs not reading: %d served whole once read (in %v), %d refused (503); %.0f MiB of the budget held, RSS %d MiB", clients, served, time.Since(start).Round(time.Millisecond), refused, held/(1<<20), rss>>20)
	if served == 0 || refused == 0 {
		t.Errorf("served %d, refused %d: want the budget to take some and refuse the rest", served, refused)
	}

	// PUTs all at once, paused mid-body until the first refusal.
	start = time.Now()
	var stored, putRefused, putLate int
	full := make(chan struct{})
	var fullOnce sync.Once
	open := func() { fullOnce.Do(func() { close(full) }) }
	timer := time.AfterFunc(5*time.Second, open)
	defer timer.Stop()
	for i := range putters {
		wg.Go(func() {
			body := io.MultiReader(bytes.NewReader(v[:putSize/2]), gate(full), bytes.NewReader(v[putSize/2:putSize]))
			req, _ := http.NewRequest("PUT", r.url+"/put"+strconv.Itoa(i), body)
			req.ContentLength = putSize
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Errorf("PUT: %v", err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			mu.Lock()
			defer mu.Unlock()
			switch resp.StatusCode {
			case 201:
				stored++
			case 503:
				putRefused++
				open()
			case 504:
				// Accepted, but its chunks queued for the write slots
				// past the request deadline: a slow machine's refusal.
				putLate++
			default:
				t.Errorf("PUT = %d", resp.StatusCode)
			}
		})
	}
	wg.Wait()
	peak := r.proc(t, "VmHWM")
	t.Logf("%d PUTs of 3 MiB at once: %d stored, %d refused (503), %d past the request deadline (504) in %v; peak RSS %d MiB", putters, stored, putRefused, putLate, time.Since(start).Round(time.Millisecond), peak>>20)
	if stored == 0 || putRefused == 0 {
		t.Errorf("stored %d, refused %d: want the budget to take some and refuse the rest", stored, putRefused)
	}
	if peak > rssBound {
		t.Errorf("peak RSS %d MiB, want at most %d MiB", peak>>20, rssBound>>20)
	}
	if held := r.metric(t, "memcgate_buffered_bytes"); held != 0 {
		t.Errorf("%v bytes of the budget still held after every request ended", held)
	}
}

// gate is a reader of nothing that waits, when first read, for open to
// be closed.
type gate chan struct{}

func (g gate) Read([]byte) (int, error) {
	<-g
	return 0, io.EOF
}

// TestBigValueThroughput measures 20 MB values with default settings:
// PUT and GET one after the other and 8 at a time, a Range of 1 MB from
// the middle, and a 1 MB value stored whole for comparison; each row on
// a fresh gateway, so that its peak RSS is that row's.
func TestBigValueThroughput(t *testing.T) {
	if os.Getenv("BIGVALUE_BENCH") != "1" {
		t.Skip("BIGVALUE_BENCH=1 runs it")
	}
	const rounds = 20
	v := randomValue(valueSize, 2)
	mib := func(bytes int64, d time.Duration) string {
		return fmt.Sprintf("%.0f MiB/s", float64(bytes)/(1<<20)/d.Seconds())
	}
	type row struct{ what, rate, per, rss string }
	var rows []row
	measure := func(what string, per func(d time.Duration, n int) string, run func(r *rig) (bytes int64, n int)) {
		r := newRig(t)
		r.put(t, "v", v) // what every row reads
		start := time.Now()
		n, count := run(r)
		d := time.Since(start)
		rows = append(rows, row{what, mib(n, d), per(d, count), fmt.Sprintf("%d MiB", r.proc(t, "VmHWM")>>20)})
	}
	each := func(d time.Duration, n int) string {
		return (d / time.Duration(n)).Round(100 * time.Microsecond).String()
	}
	measure(fmt.Sprintf("PUT 20 MiB, %d one after the other", rounds), each, func(r *rig) (int64, int) {
		for i := range rounds {
			r.put(t, "p"+strconv.Itoa(i), v)
		}
		return rounds * valueSize, rounds
	})
	measure(fmt.Sprintf("GET 20 MiB, %d one after the other", rounds), each, func(r *rig) (int64, int) {
		for range rounds {
			r.get(t, "v")
		}
		return rounds * valueSize, rounds
	})
	concurrent := func(op func(r *rig, i int)) func(r *rig) (int64, int) {
		return func(r *rig) (int64, int) {
			var wg sync.WaitGroup
			for c := range 8 {
				wg.Go(func() {
					for i := range rounds / 4 {
						op(r, c*rounds+i)
					}
				})
			}
			wg.Wait()
			return 8 * rounds / 4 * valueSize, 8 * rounds / 4
		}
	}
	measure(fmt.Sprintf("PUT 20 MiB, 8 clients × %d", rounds/4), each, concurrent(func(r *rig, i int) { r.put(t, "p"+strconv.Itoa(i), v) }))
	measure(fmt.Sprintf("GET 20 MiB, 8 clients × %d", rounds/4), each, concurrent(func(r *rig, _ int) { r.get(t, "v") }))
	measure("GET bytes=10000000-11048575 (1 MiB, 2 chunks), 200 times", each, func(r *rig) (int64, int) {
		for range 200 {
			req, _ := http.NewRequestWithContext(context.Background(), "GET", r.url+"/v", nil)
			req.Header.Set("Range", "bytes=10000000-11048575")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			n, _ := io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 206 || n != 1<<20 {
				t.Fatalf("Range = %d, %d bytes", resp.StatusCode, n)
			}
		}
		return 200 << 20, 200
	})
	measure("GET 1 MB stored whole (no chunks), 400 times", each, func(r *rig) (int64, int) {
		one := v[:1_000_000]
		r.put(t, "one", one)
		for range 400 {
			resp, err := http.Get(r.url + "/one")
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		return 400 * int64(len(one)), 400
	})
	var b strings.Builder
	b.WriteString("| what | throughput | per request | peak RSS |\n|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", r.what, r.rate, r.per, r.rss)
	}
	t.Logf("values in chunks, loopback, default settings:\n\n%s", b.String())
}

// direct is a plain memcached text-protocol client on one connection:
// what storing a large value as 1,048,000-byte items costs without the
// gateway, the baseline of TestBigValueVersusDirect.
type direct struct {
	c  net.Conn
	br *bufio.Reader
}

func dialDirect(t *testing.T, addr string) *direct {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &direct{c: c, br: bufio.NewReaderSize(c, 64<<10)}
}

const itemSize = 1_048_000 // MEMCGATE_MAX_VALUE_BYTES's default, the chunk size

// put stores v as items of itemSize under key.0, key.1, …
func (d *direct) put(t *testing.T, key string, v []byte) {
	t.Helper()
	for i := 0; len(v) > 0; i++ {
		n := min(itemSize, len(v))
		fmt.Fprintf(d.c, "set %s.%d 0 0 %d\r\n", key, i, n)
		d.c.Write(v[:n])
		io.WriteString(d.c, "\r\n")
		if line, err := d.br.ReadString('\n'); err != nil || line != "STORED\r\n" {
			t.Fatalf("set %s.%d: %q %v", key, i, line, err)
		}
		v = v[n:]
	}
}

// get reads the n bytes put stored under key into h.
func (d *direct) get(t *testing.T, key string, n int, h io.Writer) {
	t.Helper()
	for i := 0; n > 0; i++ {
		fmt.Fprintf(d.c, "get %s.%d\r\n", key, i)
		line, err := d.br.ReadString('\n')
		f := strings.Fields(line)
		if err != nil || len(f) != 4 {
			t.Fatalf("get %s.%d: %q %v", key, i, line, err)
		}
		size, _ := strconv.Atoi(f[3])
		if _, err := io.CopyN(h, d.br, int64(size)); err != nil {
			t.Fatal(err)
		}
		if _, err := d.br.Discard(len("\r\nEND\r\n")); err != nil {
			t.Fatal(err)
		}
		n -= size
	}
}

// getOne returns the value memcached holds under key, nil if none.
func (d *direct) getOne(t *testing.T, key string) []byte {
	t.Helper()
	fmt.Fprintf(d.c, "get %s\r\n", key)
	line, err := d.br.ReadString('\n')
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	if line == "END\r\n" {
		return nil
	}
	f := strings.Fields(line)
	if len(f) != 4 {
		t.Fatalf("get %s: %q", key, line)
	}
	size, _ := strconv.Atoi(f[3])
	v := make([]byte, size)
	if _, err := io.ReadFull(d.br, v); err != nil {
		t.Fatal(err)
	}
	if _, err := d.br.Discard(len("\r\nEND\r\n")); err != nil {
		t.Fatal(err)
	}
	return v
}

// TestBigValueVersusDirect (BIGVALUE_BENCH=1) sets the gateway beside
// memcached itself: 20 MiB PUT and GET through the gateway, and the same
// bytes as 1,048,000-byte items over one memcached connection, taken in
// turns so that a machine shared with other work slows both alike; then
// 8 clients each reading a 20 MiB value at 4 MiB/s at once, on a fresh
// gateway, with its peak RSS and the most of its budget held.
func TestBigValueVersusDirect(t *testing.T) {
	if os.Getenv("BIGVALUE_BENCH") != "1" {
		t.Skip("BIGVALUE_BENCH=1 runs it")
	}
	const rounds = 10
	r := newRig(t)
	d := dialDirect(t, r.mc.Addr)
	v := randomValue(valueSize, 3)
	want := sha256.Sum256(v)
	var gwPut, gwGet, dPut, dGet time.Duration
	for i := range rounds {
		key := "v" + strconv.Itoa(i)
		start := time.Now()
		d.put(t, key, v)
		dPut += time.Since(start)
		gwPut += r.put(t, key, v)
		start = time.Now()
		h := sha256.New()
		d.get(t, key, len(v), h)
		dGet += time.Since(start)
		if !bytes.Equal(h.Sum(nil), want[:]) {
			t.Fatalf("direct get %s: not the value", key)
		}
		sum, took := r.get(t, key)
		gwGet += took
		if sum != want {
			t.Fatalf("GET %s: not the value", key)
		}
	}
	rate := func(d time.Duration) float64 { return rounds * valueSize / (1 << 20) / d.Seconds() }
	var b strings.Builder
	b.WriteString("| 20 MiB, one after the other | memcached direct | through memcgate | memcgate / direct |\n|---|---|---|---|\n")
	fmt.Fprintf(&b, "| PUT | %.0f MiB/s | %.0f MiB/s | %.2f |\n", rate(dPut), rate(gwPut), rate(gwPut)/rate(dPut))
	fmt.Fprintf(&b, "| GET | %.0f MiB/s | %.0f MiB/s | %.2f |\n", rate(dGet), rate(gwGet), rate(gwGet)/rate(dGet))
	t.Logf("%d rounds, taken in turns:\n\n%s", rounds, b.String())

	// 8 slow readers at once, on a fresh gateway: its peak RSS is theirs.
	const readers, perSecond = 8, 4 << 20
	r = newRig(t)
	r.put(t, "v0", v)
	rssBefore := r.proc(t, "VmRSS")
	stop := make(chan struct{})
	var peakHeld float64
	var sampler sync.WaitGroup
	sampler.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
				peakHeld = max(peakHeld, r.metric(t, "memcgate_buffered_bytes"))
			}
		}
	})
	start := time.Now()
	var wg sync.WaitGroup
	for range readers {
		wg.Go(func() {
			resp, err := http.Get(r.url + "/v0")
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			h := sha256.New()
			buf := make([]byte, 64<<10)
			began, n := time.Now(), 0
			for {
				k, err := resp.Body.Read(buf)
				h.Write(buf[:k])
				n += k
				if err != nil {
					break
				}
				// Read no faster than perSecond.
				if ahead := time.Duration(float64(n)/perSecond*float64(time.Second)) - time.Since(began); ahead > 0 {
					time.Sleep(ahead)
				}
			}
			if resp.StatusCode != 200 || n != valueSize || !bytes.Equal(h.Sum(nil), want[:]) {
				t.Errorf("slow GET = %d, %d bytes, not the value", resp.StatusCode, n)
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	close(stop)
	sampler.Wait()
	t.Logf("%d readers at %d MiB/s each, 20 MiB each: %v, %.0f MiB/s together; budget held at most %.1f MiB; RSS %d MiB before, peak (VmHWM) %d MiB",
		readers, perSecond>>20, took.Round(time.Millisecond), float64(readers*valueSize)/(1<<20)/took.Seconds(), peakHeld/(1<<20), rssBefore>>20, r.proc(t, "VmHWM")>>20)
}
