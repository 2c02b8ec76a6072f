package gateway

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/memcgate/memcgate/gateway/budget"
	"github.com/memcgate/memcgate/gateway/bufpool"
	"github.com/memcgate/memcgate/gateway/h1"
	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream"
)

// TestReleasedRequestsUnderFaults (issue #20) drives the detached path,
// whose requests h1 reuses once they end (ReleaseRequest), through what
// ends a request other than a plain hit: PUTs (some with Expect:
// 100-continue, some with their body read ahead), 304s, ranges, values
// in chunks (streamed on a goroutine of their own), misses and routed
// HEADs, pipelined on several connections, each request with an ID of its
// own; while clients reset their connections mid-answer, while memcached
// is paused past the request timeout (answers from a failed
// connection's callbacks), and while a node is killed and restarted
// (reads retried on the next node on a goroutine of their own). Every
// answer must be its own request's: a hit's body its key's, byte for
// byte, a GET of a connection's own key the value it PUT last (or, under
// faults, one it PUT); and every access log line its request's method,
// path and the status its client got. Under -race a read of a request
// after its end is also a race with the parse of the request that
// reuses it.
func TestReleasedRequestsUnderFaults(t *testing.T) {
	tests := []struct {
		name  string
		nodes int
		fault string
	}{
		{"clean", 1, ""},
		{"client resets", 1, "resets"},
		{"memcached paused", 1, "pause"},
		{"node killed", 2, "kill"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			nodes := memcachedtest.StartN(t, tt.nodes)
			recs := &accessRecords{recs: map[string]string{}}
			addr, _ := startStackOn(t, nodes, func(o *upstream.Options) {
				if tt.fault == "pause" {
					o.Timeout = 300 * time.Millisecond
				}
			}, func(o *Options) {
				o.AccessLog, o.AccessLogger = true, slog.New(recs)
				o.BigValueMaxBytes = 3 << 20
				// As cmd/memcgate: bodies read ahead are taken whole, in
				// buffers h1 and the handler share, held in one budget.
				o.TakeBody, o.Budget, o.Buffers = h1.TakeAhead, budget.New(64<<20), bufpool.New(64<<20)
				if tt.fault == "pause" {
					o.RequestTimeout = 250 * time.Millisecond
				}
			})
			w := newReuseWorld(t, addr, nodes, tt.fault != "kill")
			stop := make(chan struct{})
			var faults sync.WaitGroup
			switch tt.fault {
			case "resets":
				for i := range 3 {
					faults.Go(func() { resetClient(t, addr, w, i, stop) })
				}
			case "pause":
				faults.Go(func() { every150ms(stop, nodes[0].Pause, 400*time.Millisecond, nodes[0].Resume) })
			case "kill":
				faults.Go(func() {
					every150ms(stop, nodes[0].Kill, 200*time.Millisecond, func() {
						nodes[0].Restart()
						w.setRaw(t, nodes[0])
					})
				})
			}
			// Resets are other clients': these ones' answers are all due.
			faulty := tt.fault == "pause" || tt.fault == "kill"
			rounds := 6
			if tt.fault == "kill" {
				rounds = 15 // long enough for several kills and restarts
			}
			answered := w.drive(t, addr, faulty, 6, rounds, 10)
			close(stop)
			faults.Wait()
			if t.Failed() {
				return
			}
			w.checkLog(t, recs, answered)
			statuses := map[string]int{}
			for _, a := range answered {
				statuses[a[strings.LastIndexByte(a, ' ')+1:]]++
			}
			w.mu.Lock()
			t.Logf("%d requests sent, %d answered: %v", len(w.sent), len(answered), statuses)
			w.mu.Unlock()
		})
	}
}

// reuseReq is one request of TestReleasedRequestsUnderFaults.
type reuseReq struct {
	id, method, key string
	rng, inm        string // Range, If-None-Match
	body            string // a PUT's
	expect100       bool   // Expect: 100-continue
	split           bool   // the body comes in a write of its own, after a pause: read ahead
}

func (q *reuseReq) line() string { return q.method + " /" + q.key }

// reuseWorld is the values of TestReleasedRequestsUnderFaults's keys.
type reuseWorld struct {
	vals   map[string][]byte // stored before the clients start, never written again
	etags  map[string]string // of vals, as GET answered them before the clients started
	static []string          // vals's keys and keys never stored
	mu     sync.Mutex
	sent   map[string]string // request ID → its line, for every request sent
}

// newReuseWorld stores the static values: raw ones on every node (so
// that a read failed over finds them too), and, with chunked, one in
// chunks through the gateway.
func newReuseWorld(t *testing.T, addr string, nodes []*memcachedtest.Server, chunked bool) *reuseWorld {
	w := &reuseWorld{vals: map[string][]byte{}, etags: map[string]string{}, sent: map[string]string{}}
	for i := range 2 {
		small := []byte(fmt.Sprintf("small-%d-", i) + strings.Repeat(strconv.Itoa(i), 300+i*500))
		large := make([]byte, 700_000+i*100_000)
		rng := rand.New(rand.NewPCG(uint64(i), 11))
		for j := range large {
			large[j] = byte(rng.IntN(256))
		}
		w.vals[fmt.Sprintf("small%d", i)], w.vals[fmt.Sprintf("large%d", i)] = small, large
	}
	for _, m := range nodes {
		w.setRaw(t, m)
	}
	if chunked {
		big := make([]byte, 2_300_000)
		rng := rand.New(rand.NewPCG(3, 11))
		for j := range big {
			big[j] = byte(rng.IntN(256))
		}
		req, _ := http.NewRequest(http.MethodPut, "http://"+addr+"/chunked0", bytes.NewReader(big))
		req.Header.Set("X-Request-Id", "setup-put")
		w.sent["setup-put"] = "PUT /chunked0"
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			t.Fatalf("PUT /chunked0: %d", resp.StatusCode)
		}
		w.vals["chunked0"] = big
	}
	for k := range w.vals {
		req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/"+k, nil)
		req.Header.Set("X-Request-Id", "setup-"+k)
		w.sent["setup-"+k] = "GET /" + k
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || !bytes.Equal(body, w.vals[k]) {
			t.Fatalf("GET /%s before the clients: %d, %d bytes, %v", k, resp.StatusCode, len(body), err)
		}
		w.etags[k] = resp.Header.Get("Etag")
		w.static = append(w.static, k)
	}
	slices.Sort(w.static)
	w.static = append(w.static, "miss0", "miss1")
	return w
}

// every150ms takes a node down and, after hold, up again, 150 ms after
// each time it came back, until stop is closed.
func every150ms(stop <-chan struct{}, down func(), hold time.Duration, up func()) {
	for {
		select {
		case <-stop:
			return
		case <-time.After(150 * time.Millisecond):
		}
		down()
		time.Sleep(hold)
		up()
	}
}

// setRaw stores the raw values on m, as the raw codec would.
func (w *reuseWorld) setRaw(t *testing.T, m *memcachedtest.Server) {
	c, err := net.DialTimeout("tcp", m.Addr, 2*time.Second)
	if err != nil {
		t.Error(err)
		return
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	for k, v := range w.vals {
		if k == "chunked0" {
			continue
		}
		fmt.Fprintf(c, "set %s 0 0 %d\r\n", k, len(v))
		c.Write(v)
		io.WriteString(c, "\r\n")
		if line, err := br.ReadString('\n'); err != nil || line != "STORED\r\n" {
			t.Errorf("set %s on %s: %q, %v", k, m.Addr, line, err)
			return
		}
	}
}

// next makes a request of connection ci, with ID id.
func (w *reuseWorld) next(rng *rand.Rand, ci int, id string) reuseReq {
	q := reuseReq{id: id, method: http.MethodGet, key: w.static[rng.IntN(len(w.static))]}
	kind := rng.IntN(10)
	if q.key == "chunked0" && kind != 3 && rng.IntN(2) == 0 {
		q.key = "small0" // fewer whole reads of the largest value
	}
	switch kind {
	case 3:
		if v, ok := w.vals[q.key]; ok {
			from := rng.IntN(len(v))
			q.rng = fmt.Sprintf("bytes=%d-%d", from, from+rng.IntN(70_000))
		}
	case 4:
		q.inm = w.etags[q.key] // "" for a miss
	case 5:
		q.method = http.MethodHead
	case 6, 7:
		q.method, q.key = http.MethodPut, fmt.Sprintf("own%d", ci)
		q.body = id + "-" + strings.Repeat(string(rune('a'+rng.IntN(26))), rng.IntN(16_000-len(id)))
		q.expect100, q.split = rng.IntN(3) == 0, rng.IntN(3) == 0
	case 8, 9:
		q.key = fmt.Sprintf("own%d", ci)
	}
	return q
}

// ownKey is what a connection knows of its own key: every value it sent
// in a PUT, and the last one a PUT was answered stored for ("" none).
type ownKey struct {
	puts map[string]bool
	last string
}

// check reports what is wrong with status and body as q's answer;
// faulty allows the answers of memcached's failures.
func (w *reuseWorld) check(q *reuseReq, status int, body []byte, own *ownKey, faulty bool) error {
	failed := faulty && status >= 500
	if q.method == http.MethodPut {
		switch {
		case status/100 == 2:
			own.last = q.body
		case failed: // it may have been stored all the same
		default:
			return fmt.Errorf("status %d", status)
		}
		return nil
	}
	if q.method == http.MethodHead && len(body) > 0 {
		return fmt.Errorf("HEAD answered %d with a body of %d bytes", status, len(body))
	}
	if strings.HasPrefix(q.key, "own") {
		switch {
		case failed:
		case status == http.StatusNotFound && (own.last == "" || faulty):
		case status == http.StatusOK && q.method == http.MethodHead:
		case status == http.StatusOK && (string(body) == own.last || faulty && own.puts[string(body)]):
		default:
			return fmt.Errorf("status %d with %.40q (%d bytes), want %.40q (%d bytes)", status, body, len(body), own.last, len(own.last))
		}
		return nil
	}
	v, hit := w.vals[q.key]
	want, wantStatus := v, http.StatusOK
	switch {
	case !hit:
		want, wantStatus = nil, http.StatusNotFound
	case q.inm != "":
		want, wantStatus = nil, http.StatusNotModified
	case q.rng != "":
		var from, to int
		fmt.Sscanf(q.rng, "bytes=%d-%d", &from, &to)
		want, wantStatus = v[from:min(to+1, len(v))], http.StatusPartialContent
	}
	if q.method == http.MethodHead {
		want = nil
	}
	switch {
	case failed:
	case faulty && hit && status == http.StatusNotFound: // a node restarted empty
	case faulty && q.inm != "" && status == http.StatusOK && bytes.Equal(body, v): // read from the other node: another CAS
	case status == wantStatus && (!hit || bytes.Equal(body, want)):
	default:
		return fmt.Errorf("status %d with %d bytes, want %d with %d bytes (equal: %v)", status, len(body), wantStatus, len(want), bytes.Equal(body, want))
	}
	return nil
}

// drive runs conns clients, each pipelining rounds of depth requests on
// a keep-alive connection, and checks every answer; a client whose
// connection fails (only faulty allows it) dials again for its next
// round. It returns the line and status of every request answered, by
// ID.
func (w *reuseWorld) drive(t *testing.T, addr string, faulty bool, conns, rounds, depth int) map[string]string {
	var mu sync.Mutex
	answered := map[string]string{}
	var wg sync.WaitGroup
	for ci := range conns {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(ci), 5))
			own := &ownKey{puts: map[string]bool{}}
			var c net.Conn
			var br *bufio.Reader
			defer func() {
				if c != nil {
					c.Close()
				}
			}()
			for round := range rounds {
				if c == nil {
					var err error
					if c, err = net.Dial("tcp", addr); err != nil {
						t.Error(err)
						return
					}
					br = bufio.NewReader(c)
				}
				c.SetDeadline(time.Now().Add(30 * time.Second))
				batch := make([]reuseReq, depth)
				var segs [][]byte // written one after the other, a pause between
				var out bytes.Buffer
				for j := range batch {
					q := w.next(rng, ci, fmt.Sprintf("c%d-r%d-%d", ci, round, j))
					batch[j] = q
					if q.method == http.MethodPut {
						own.puts[q.body] = true // stored, maybe, even if its answer never comes
					}
					w.mu.Lock()
					w.sent[q.id] = q.line()
					w.mu.Unlock()
					fmt.Fprintf(&out, "%s /%s HTTP/1.1\r\nHost: x\r\nX-Request-Id: %s\r\n", q.method, q.key, q.id)
					if q.rng != "" {
						fmt.Fprintf(&out, "Range: %s\r\n", q.rng)
					}
					if q.inm != "" {
						fmt.Fprintf(&out, "If-None-Match: %s\r\n", q.inm)
					}
					if q.method == http.MethodPut {
						fmt.Fprintf(&out, "Content-Length: %d\r\n", len(q.body))
						if q.expect100 {
							out.WriteString("Expect: 100-continue\r\n")
						}
					}
					out.WriteString("\r\n")
					if q.split {
						out.WriteString(q.body[:len(q.body)/2])
						segs = append(segs, bytes.Clone(out.Bytes()))
						out.Reset()
						out.WriteString(q.body[len(q.body)/2:])
					} else {
						out.WriteString(q.body)
					}
				}
				segs = append(segs, out.Bytes())
				go func(c net.Conn) {
					for i, s := range segs {
						if i > 0 {
							time.Sleep(3 * time.Millisecond)
						}
						if _, err := c.Write(s); err != nil {
							return // the reads see the connection fail
						}
					}
				}(c)
				for i := range batch {
					q := &batch[i]
					status, body, err := readReuseAnswer(br, q.method)
					if err != nil {
						if !faulty {
							t.Errorf("%s (%s): %v", q.line(), q.id, err)
						}
						c.Close()
						c = nil
						break
					}
					if err := w.check(q, status, body, own, faulty); err != nil {
						t.Errorf("%s Range %q If-None-Match %q (%s): %v", q.line(), q.rng, q.inm, q.id, err)
						return
					}
					mu.Lock()
					answered[q.id] = q.line() + " " + strconv.Itoa(status)
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	return answered
}

// readReuseAnswer reads the answer to a request of method, after any
// 100 Continue.
func readReuseAnswer(br *bufio.Reader, method string) (int, []byte, error) {
	for {
		resp, err := http.ReadResponse(br, &http.Request{Method: method})
		if err != nil {
			return 0, nil, err
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return 0, nil, fmt.Errorf("body: %w", err)
		}
		if resp.StatusCode != http.StatusContinue {
			return resp.StatusCode, body, nil
		}
	}
}

// checkLog checks the access log against the requests: an answered
// request's line is its line and the status its client got; any other
// logged request's line its line; nothing logged twice.
func (w *reuseWorld) checkLog(t *testing.T, recs *accessRecords, answered map[string]string) {
	// A line is written before finish lets the answer go, but the
	// requests a client reset may still be ending.
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		recs.mu.Lock()
		n := 0
		for id := range answered {
			if _, ok := recs.recs[id]; ok {
				n++
			}
		}
		recs.mu.Unlock()
		if n == len(answered) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	recs.mu.Lock()
	defer recs.mu.Unlock()
	w.mu.Lock()
	defer w.mu.Unlock()
	bad := 0
	for id, got := range recs.recs {
		line, sent := w.sent[id]
		want, ok := answered[id]
		switch {
		case !sent:
			t.Errorf("access log line %q for request %q, never sent", got, id)
		case ok && got != want:
			t.Errorf("access log of request %s: %q, want %q", id, got, want)
		case !ok && !strings.HasPrefix(got, line+" "):
			t.Errorf("access log of request %s (not answered): %q, want %q and a status", id, got, line)
		default:
			continue
		}
		if bad++; bad > 20 {
			break
		}
	}
	for id := range answered {
		if _, ok := recs.recs[id]; !ok {
			t.Errorf("request %s answered, never logged", id)
		}
	}
}

// resetClient pipelines GETs of the large values and a PUT on
// connections it resets after the first bytes of their answers, until
// stop.
func resetClient(t *testing.T, addr string, w *reuseWorld, n int, stop <-chan struct{}) {
	rng := rand.New(rand.NewPCG(uint64(n), 9))
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		default:
		}
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Error(err)
			return
		}
		var out bytes.Buffer
		for j := range 8 {
			q := reuseReq{id: fmt.Sprintf("rst%d-%d-%d", n, i, j), method: http.MethodGet, key: w.static[rng.IntN(len(w.static))]}
			if j == 3 {
				q.method, q.key, q.body = http.MethodPut, fmt.Sprintf("rst%d", n), strings.Repeat("r", 5000)
			}
			w.mu.Lock()
			w.sent[q.id] = q.line()
			w.mu.Unlock()
			fmt.Fprintf(&out, "%s /%s HTTP/1.1\r\nHost: x\r\nX-Request-Id: %s\r\n", q.method, q.key, q.id)
			if q.body != "" {
				fmt.Fprintf(&out, "Content-Length: %d\r\n", len(q.body))
			}
			out.WriteString("\r\n" + q.body)
		}
		c.Write(out.Bytes())
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		var b [1 + 4<<10]byte
		io.ReadFull(c, b[:1+rng.IntN(4<<10)])
		c.(*net.TCPConn).SetLinger(0) // a reset, not a close
		c.Close()
	}
}
