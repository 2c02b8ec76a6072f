package pools

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The load: a steady mixed stream over HTTP from a few paced workers, 90%
// GETs of any key and 10% PUTs, each worker writing only its own keys
// with an increasing version, so that a read can tell a stale value: a
// GET that returns a version older than the last one acknowledged for
// its key when the GET was sent is stale.

// loadKeys is the key space; every key is written before the load starts.
const loadKeys = 2000

// valueSize pads values to the size of a small session.
const valueSize = 200

// sample is one request of the load.
type sample struct {
	at   time.Time // when it was sent
	took time.Duration
	get  bool
	hit  bool // a GET answered 200
	// slowMiss: a GET answered 404 after at least the gateway's socket
	// timeout, so one replica timed out and the other missed; with a
	// node already down that is a second fault (the machine stalled),
	// not the first one's doing.
	slowMiss bool
	err      bool // anything but 200/201 for a PUT, or 200/404 for a GET, or no answer
	stale    bool
}

// loader runs the load against one gateway.
type loader struct {
	base     string
	client   *http.Client
	workers  int
	period   time.Duration  // between one worker's requests
	readPct  int            // the share of GETs
	timeout  time.Duration  // the gateway's MEMCGATE_TIMEOUT, which tells a slow miss
	answered atomic.Int64   // requests of the load answered (or failed) so far
	acked    []atomic.Int64 // per key, the last version a PUT of it was answered 201 for
	tried    []atomic.Int64 // per key, the last version a PUT of it sent
	samples  [][]sample     // per worker
	errs     []string       // the first few error descriptions
	misses   []string       // the first few misses, with their time
	errMu    sync.Mutex     // guards errs, misses
	stop     chan struct{}
	wg       sync.WaitGroup
}

// newLoader returns a loader of workers against the gateway at base whose
// MEMCGATE_TIMEOUT is timeout.
func newLoader(base string, workers int, period time.Duration, readPct int, timeout time.Duration) *loader {
	return &loader{
		base: base, workers: workers, period: period, readPct: readPct, timeout: timeout,
		// Past any REQUEST_TIMEOUT the tests set: the gateway's own
		// answer, not the client giving up, says how a request ended.
		client: &http.Client{Timeout: time.Minute, Transport: &http.Transport{
			MaxIdleConnsPerHost: workers * 2, DisableCompression: true,
		}},
		acked:   make([]atomic.Int64, loadKeys),
		tried:   make([]atomic.Int64, loadKeys),
		samples: make([][]sample, workers),
		stop:    make(chan struct{}),
	}
}

func key(i int) string { return fmt.Sprintf("session:%05d", i) }

func value(i int, version int64) []byte {
	v := []byte(key(i) + ":" + strconv.FormatInt(version, 10) + ":")
	return append(v, bytes.Repeat([]byte("x"), valueSize-len(v))...)
}

// version reads the version out of a value, -1 if it has none.
func version(b []byte) int64 {
	parts := strings.SplitN(string(b), ":", 4)
	if len(parts) < 4 {
		return -1
	}
	v, err := strconv.ParseInt(parts[2], 10, 64)
	if err != nil {
		return -1
	}
	return v
}

func (l *loader) put(ctx context.Context, i int, ver int64) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, l.base+"/"+key(i), bytes.NewReader(value(i, ver)))
	if err != nil {
		return 0, err
	}
	resp, err := l.client.Do(req)
	if err != nil {
		return 0, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

func (l *loader) get(ctx context.Context, i int) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, l.base+"/"+key(i), nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := l.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// preload writes every key once (version 1). A write answered with an
// error is sent again, up to putTries times in all, as docs/pools.md
// tells a client that needs the outcome to do (a set is idempotent): the
// preload sets the scene, and a stall of the shared machine past the
// gateway's timeout is not what the tests are about.
func (l *loader) preload(t *testing.T) {
	t.Helper()
	var wg sync.WaitGroup
	var failed, retried atomic.Int64
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < loadKeys; i += 8 {
				ok := false
				for try := range putTries {
					if try > 0 {
						retried.Add(1)
					}
					if code, err := l.put(t.Context(), i, 1); err == nil && code == http.StatusCreated {
						ok = true
						break
					}
				}
				if !ok {
					failed.Add(1)
					continue
				}
				l.acked[i].Store(1)
			}
		})
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		t.Fatalf("preload: %d writes failed %d times each", n, putTries)
	}
	if n := retried.Load(); n > 0 {
		t.Logf("preload: %d writes sent again after an error", n)
	}
}

// putTries is how many times a write that sets the scene is sent before
// the test gives up on it.
const putTries = 3

func (l *loader) noteErr(format string, args ...any) {
	l.errMu.Lock()
	defer l.errMu.Unlock()
	if len(l.errs) < 10 {
		l.errs = append(l.errs, time.Now().Format("15:04:05.000")+" "+fmt.Sprintf(format, args...))
	}
}

func (l *loader) noteMiss(i int, took time.Duration) {
	l.errMu.Lock()
	defer l.errMu.Unlock()
	if len(l.misses) < 10 {
		l.misses = append(l.misses, fmt.Sprintf("%s GET %s (%v)", time.Now().Format("15:04:05.000"), key(i), took.Round(time.Microsecond)))
	}
}

// start runs the workers until stop.
func (l *loader) start() {
	for w := range l.workers {
		l.wg.Go(func() { l.work(w) })
	}
}

func (l *loader) work(w int) {
	rng := rand.New(rand.NewPCG(uint64(w), 42))
	ctx := context.Background()
	tick := time.NewTicker(l.period)
	defer tick.Stop()
	own := loadKeys / l.workers
	for {
		select {
		case <-l.stop:
			return
		case <-tick.C:
		}
		s := sample{at: time.Now()}
		if rng.IntN(100) < l.readPct {
			s.get = true
			i := rng.IntN(loadKeys)
			before := l.acked[i].Load()
			code, body, err := l.get(ctx, i)
			s.took = time.Since(s.at)
			switch {
			case err != nil:
				s.err = true
				l.noteErr("GET %s: %v", key(i), err)
			case code == http.StatusOK:
				s.hit = true
				if v := version(body); v < before {
					s.stale = true
					l.noteErr("GET %s: version %d, %d was acknowledged before the read", key(i), v, before)
				}
			case code == http.StatusNotFound:
				l.noteMiss(i, s.took)
				s.slowMiss = s.took >= l.timeout
			default:
				s.err = true
				l.noteErr("GET %s: %d %s", key(i), code, strings.TrimSpace(string(body)))
			}
		} else {
			i := w + l.workers*rng.IntN(own) // a key of this worker's
			ver := l.acked[i].Load() + 1
			l.tried[i].Store(ver)
			code, err := l.put(ctx, i, ver)
			s.took = time.Since(s.at)
			switch {
			case err != nil:
				s.err = true
				l.noteErr("PUT %s: %v", key(i), err)
			case code != http.StatusCreated:
				s.err = true
				l.noteErr("PUT %s: %d", key(i), code)
			default:
				l.acked[i].Store(ver)
			}
		}
		l.samples[w] = append(l.samples[w], s)
		l.answered.Add(1)
	}
}

// await returns once d has passed and the load has had n more requests
// answered, whichever comes last: d is the phase the figures measure,
// and n makes the phase hold real load on a machine too busy to send
// much of it in d. It fails t if the load does not get there within
// a minute.
func (l *loader) await(t *testing.T, d time.Duration, n int64) {
	t.Helper()
	from := l.answered.Load()
	time.Sleep(d) // the measured phase, not a synchronisation
	waitFor(t, time.Minute, fmt.Sprintf("%d requests of the load answered", n), func() bool {
		return l.answered.Load()-from >= n
	})
}

// phaseRequests is the fewest requests of the load a phase holds.
const phaseRequests = 200

// versions returns the last acknowledged version of every key.
func (l *loader) versions() []int64 {
	out := make([]int64, loadKeys)
	for i := range out {
		out[i] = l.acked[i].Load()
	}
	return out
}

// finish stops the workers and waits for them.
func (l *loader) finish() {
	close(l.stop)
	l.wg.Wait()
}

// stats are the load's figures over one phase.
type stats struct {
	Requests, Gets, Hits, Errors, Stale int
	SlowMisses                          int           // GET misses that waited out a replica's timeout
	P50, P99, Max                       time.Duration // of GETs
}

func (s stats) HitRatio() float64 {
	if s.Gets == 0 {
		return 0
	}
	return float64(s.Hits) / float64(s.Gets)
}

// HitRatioOneFault is the hit ratio without the GETs that missed after
// a replica timed out: the figure one fault may not lower.
func (s stats) HitRatioOneFault() float64 {
	if s.Gets-s.SlowMisses == 0 {
		return 0
	}
	return float64(s.Hits) / float64(s.Gets-s.SlowMisses)
}

// between returns the figures of the requests sent in [from, to).
func (l *loader) between(from, to time.Time) stats {
	var st stats
	var lat []time.Duration
	for _, ws := range l.samples {
		for _, s := range ws {
			if s.at.Before(from) || !s.at.Before(to) {
				continue
			}
			st.Requests++
			if s.err {
				st.Errors++
			}
			if s.stale {
				st.Stale++
			}
			if s.get {
				st.Gets++
				lat = append(lat, s.took)
				if s.hit {
					st.Hits++
				}
				if s.slowMiss {
					st.SlowMisses++
				}
			}
		}
	}
	if len(lat) > 0 {
		slices.Sort(lat)
		st.P50, st.P99, st.Max = lat[len(lat)*50/100], lat[len(lat)*99/100], lat[len(lat)-1]
	}
	return st
}

// verify reads every key back and counts the ones that do not hold the
// last acknowledged version: stale ones hold an older version (the
// after-the-outage check), unacked ones a newer version whose PUT was
// answered with an error (a replicated write that failed on one replica
// may have been applied on another: the error says it did not reach them
// all, not that it reached none).
//
// A key answered anything but 200 is read again, up to readTries times
// in all: a miss can be the documented answer of a read whose replica
// timed out while the other missed (docs/pools.md), a stall of the
// machine, not a lost write, which would miss every time. A value is
// never read again: one stale answer is a failure.
func (l *loader) verify(t *testing.T) (stale, unacked, missing int) {
	t.Helper()
	reread := 0
	defer func() {
		if reread > 0 {
			t.Logf("verify: %d reads sent again after an answer other than 200", reread)
		}
	}()
	for i := range loadKeys {
		var code int
		var body []byte
		var err error
		for try := range readTries {
			if try > 0 {
				reread++
			}
			if code, body, err = l.get(t.Context(), i); err == nil && code == http.StatusOK {
				break
			}
		}
		want, tried := l.acked[i].Load(), l.tried[i].Load()
		switch got := version(body); {
		case err != nil || code != http.StatusOK && code != http.StatusNotFound:
			t.Errorf("verify GET %s: %d %v", key(i), code, err)
		case code == http.StatusNotFound:
			missing++
		case got == want:
		case got > want && got <= tried:
			unacked++
			t.Logf("verify GET %s: version %d, whose PUT was answered with an error (%d acknowledged)", key(i), got, want)
		case got > want:
			t.Errorf("verify GET %s: version %d was never sent (%d acknowledged)", key(i), got, want)
		default:
			stale++
			if stale <= 5 {
				t.Logf("verify GET %s: version %d, want %d", key(i), got, want)
			}
		}
	}
	return stale, unacked, missing
}

// readTries is how many times verify reads a key that is not answered
// 200 before counting it missing.
const readTries = 3
