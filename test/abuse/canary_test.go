//go:build linux

package abuse

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"
)

const (
	canaryKey   = "abuse-canary"
	canaryValue = "a small value a well-behaved client reads"
	canaryEvery = 20 * time.Millisecond
	// canaryTimeout bounds one canary request: far above the 1 s the
	// suite allows, so that a late answer is measured, not cut off.
	canaryTimeout = 15 * time.Second
)

// connKind is how the canary reaches the gateway.
type connKind int

const (
	keepAlive connKind = iota // one connection, opened before the attack
	newConn                   // a new connection per request
	nKinds
)

func (k connKind) String() string {
	if k == keepAlive {
		return "keep-alive"
	}
	return "new conn"
}

// sample is one canary request.
type sample struct {
	start  time.Time
	took   time.Duration // until the whole answer was read, or the error
	status int           // 0 if no answer came
	err    string        // errKind, when status is 0
}

// canary is a well-behaved client that GETs a small value every
// canaryEvery on two kinds of connection while an attack runs, recording
// every latency and status. Its methods are safe for concurrent use.
type canary struct {
	addr string
	stop chan struct{}
	wg   sync.WaitGroup

	mu       sync.Mutex // guards samples, cur, redials
	samples  [nKinds][]sample
	cur      [nKinds]net.Conn // the connection each loop is using, so that close can cut it short
	redials  int              // keep-alive connections opened again after an error
	stopOnce sync.Once
}

var (
	canaryReq      = []byte("GET /" + canaryKey + " HTTP/1.1\r\nHost: canary\r\n\r\n")
	canaryReqClose = []byte("GET /" + canaryKey + " HTTP/1.1\r\nHost: canary\r\nConnection: close\r\n\r\n")
)

// startCanary opens the keep-alive connection, checks that it is served
// (so that it is an idle keep-alive connection, parked or waiting, by
// the time the attack begins) and starts both loops, which run until
// close (called when the test ends at the latest).
func startCanary(t *testing.T, addr string) *canary {
	t.Helper()
	c := &canary{addr: addr, stop: make(chan struct{})}
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatalf("canary: %v", err)
	}
	br := bufio.NewReader(conn)
	if status, err := roundTrip(conn, br, canaryReq); err != nil || status != http.StatusOK {
		conn.Close()
		t.Fatalf("canary GET before the attack = %d %v, want 200", status, err)
	}
	c.wg.Add(2)
	go c.loop(keepAlive, conn, br)
	go c.loop(newConn, nil, nil)
	t.Cleanup(c.close)
	return c
}

// loop sends a request of kind every canaryEvery (or at once when the
// last one took longer) until close.
func (c *canary) loop(kind connKind, conn net.Conn, br *bufio.Reader) {
	defer c.wg.Done()
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	tick := time.NewTicker(canaryEvery)
	defer tick.Stop()
	for {
		var s sample
		if kind == keepAlive {
			s, conn, br = c.keepAliveOnce(conn, br)
		} else {
			s = c.newConnOnce()
		}
		select {
		case <-c.stop:
			return // a request cut short by close is not a sample
		default:
		}
		c.mu.Lock()
		c.samples[kind] = append(c.samples[kind], s)
		c.mu.Unlock()
		select {
		case <-c.stop:
			return
		case <-tick.C:
		}
	}
}

// keepAliveOnce sends one request on conn, opening a new connection
// first if the last one failed, and returns the connection to use next
// (nil after an error).
func (c *canary) keepAliveOnce(conn net.Conn, br *bufio.Reader) (sample, net.Conn, *bufio.Reader) {
	s := sample{start: time.Now()}
	if conn == nil {
		var err error
		if conn, err = net.DialTimeout("tcp", c.addr, canaryTimeout); err != nil {
			s.took, s.err = time.Since(s.start), "connect "+errKind(err)
			return s, nil, nil
		}
		br = bufio.NewReader(conn)
		c.mu.Lock()
		c.redials++
		c.mu.Unlock()
	}
	c.setCur(keepAlive, conn)
	status, err := roundTrip(conn, br, canaryReq)
	s.took, s.status = time.Since(s.start), status
	if err != nil {
		s.err = errKind(err)
		conn.Close()
		return s, nil, nil
	}
	return s, conn, br
}

// newConnOnce connects, sends one request with Connection: close and
// reads the answer; the connect time counts.
func (c *canary) newConnOnce() sample {
	s := sample{start: time.Now()}
	conn, err := net.DialTimeout("tcp", c.addr, canaryTimeout)
	if err != nil {
		s.took, s.err = time.Since(s.start), "connect "+errKind(err)
		return s
	}
	defer conn.Close()
	c.setCur(newConn, conn)
	s.status, err = roundTrip(conn, bufio.NewReader(conn), canaryReqClose)
	s.took = time.Since(s.start)
	if err != nil {
		s.err = errKind(err)
	}
	return s
}

func (c *canary) setCur(kind connKind, conn net.Conn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cur[kind] = conn
	select {
	case <-c.stop:
		_ = conn.SetDeadline(time.Now())
	default:
	}
}

// close stops both loops, cutting a request in progress short, and waits
// for them. It may be called more than once.
func (c *canary) close() {
	c.stopOnce.Do(func() {
		c.mu.Lock()
		close(c.stop)
		for _, conn := range c.cur {
			if conn != nil {
				_ = conn.SetDeadline(time.Now())
			}
		}
		c.mu.Unlock()
	})
	c.wg.Wait()
}

// roundTrip writes req on conn and reads the whole answer, within
// canaryTimeout, and returns its status.
func roundTrip(conn net.Conn, br *bufio.Reader, req []byte) (int, error) {
	_ = conn.SetDeadline(time.Now().Add(canaryTimeout))
	if _, err := conn.Write(req); err != nil {
		return 0, err
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return 0, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, err
}

// since returns the samples of kind that began at or after from (and
// before to, unless to is zero).
func (c *canary) since(kind connKind, from, to time.Time) []sample {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []sample
	for _, s := range c.samples[kind] {
		if !s.start.Before(from) && (to.IsZero() || s.start.Before(to)) {
			out = append(out, s)
		}
	}
	return out
}

// hold blocks while an attack goes on: for at least window from now, and
// until the canary has finished n requests of each kind begun since,
// but no longer than limit.
func (c *canary) hold(window, limit time.Duration, n int) {
	from := time.Now()
	tick := time.NewTicker(canaryEvery)
	defer tick.Stop()
	for range tick.C {
		elapsed := time.Since(from)
		if elapsed >= limit {
			return
		}
		if elapsed >= window && len(c.since(keepAlive, from, time.Time{})) >= n && len(c.since(newConn, from, time.Time{})) >= n {
			return
		}
	}
}

// recovered reports whether the last n requests of each kind begun
// since from were answered 200 within fast.
func (c *canary) recovered(from time.Time, n int, fast time.Duration) bool {
	for kind := range nKinds {
		ss := c.since(kind, from, time.Time{})
		if len(ss) < n {
			return false
		}
		for _, s := range ss[len(ss)-n:] {
			if s.status != http.StatusOK || s.took >= fast {
				return false
			}
		}
	}
	return true
}

// summary is what the canary saw on one kind of connection over a span.
type summary struct {
	n             int
	p50, p99, max time.Duration
	bad           tally // answers other than 200 (by status), errors (by kind), and 200s later than the bound ("slow")
}

// summarize returns the canary's figures of kind for requests begun in
// [from, to), counting as bad what was not a 200 within bound.
func (c *canary) summarize(kind connKind, from, to time.Time, bound time.Duration) *summary {
	ss := c.since(kind, from, to)
	out := &summary{n: len(ss)}
	if len(ss) == 0 {
		return out
	}
	ds := make([]time.Duration, len(ss))
	for i, s := range ss {
		ds[i] = s.took
		switch {
		case s.status == 0:
			out.bad.add(s.err, 1)
		case s.status != http.StatusOK:
			out.bad.add(strconv.Itoa(s.status), 1)
		case s.took >= bound:
			out.bad.add("slow", 1)
		}
	}
	slices.Sort(ds)
	out.p50, out.p99, out.max = rank(ds, 50), rank(ds, 99), ds[len(ds)-1]
	return out
}

// rank returns the nearest-rank p-th percentile of sorted ds.
func rank(ds []time.Duration, p int) time.Duration {
	i := (len(ds)*p + 99) / 100
	return ds[max(i-1, 0)]
}

func (s *summary) String() string {
	if s.n == 0 {
		return "no requests"
	}
	return dur(s.p50) + " / " + dur(s.p99) + " / " + dur(s.max) + " (n=" + strconv.Itoa(s.n) + ")"
}
