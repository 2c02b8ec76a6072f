package gateway

import (
	"context"
	"hash/maphash"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/gateway/budget"
	"github.com/memcgate/memcgate/upstream/op"
)

// asyncQueue applies writes accepted with Prefer: respond-async. It is
// bounded in writes and in value bytes, and holds its values against the
// gateway's budget: a full queue answers 503, nothing is dropped. A write
// is accepted only while its key's node is up, so a 202 is never given
// for a write that cannot be applied. Writes are sharded by key onto one
// worker per shard, so writes to one key apply in the order they were
// accepted (with a quiet setter, only those that waited in the queue
// together: see applyAll); the writes waiting for one worker may take only a share of
// the queue (shareOf), so that one key written faster than its worker
// applies cannot fill the queue for every other key; and the values on their way to memcached are capped in bytes
// (inFlight) so that large ones cannot fill the node's connections ahead
// of other clients' requests. Run drains it before returning: an
// accepted write is applied (or counted as failed), never forgotten.
type asyncQueue struct {
	ex        *executor   // runs each write as the synchronous path would
	quiet     QuietSetter // nil: sets go through ex
	budget    *budget.Budget
	timeout   time.Duration
	capacity  int64
	maxBytes  int64
	queued    atomic.Int64 // reserved or waiting jobs
	bytes     atomic.Int64 // their value bytes
	share     int64        // the most jobs one shard may have reserved or waiting
	shareB    int64        // the most value bytes one shard may have reserved or waiting (past one job)
	closed    atomic.Bool  // set once Run is draining: no more jobs
	seed      maphash.Seed
	shards    []*shard
	inFlight  byteGate // value bytes being applied
	rejectFor map[string]prometheus.Counter

	applied     prometheus.Counter
	unconfirmed prometheus.Counter            // sets sent as UDP datagrams: neither applied nor failed as far as anyone knows
	failed      map[string]prometheus.Counter // by reason (asyncFailReasons)
}

// asyncFailReasons label memcgate_async_writes_failed_total.
var asyncFailReasons = []string{"node_down", "timeout", "connection", "refused", "error"}

// asyncRejectReasons label memcgate_async_writes_rejected_total.
var asyncRejectReasons = []string{"queue_full", "key_share", "node_down", "budget", "shutdown"}

// shard is one worker's queue.
type shard struct {
	mu   sync.Mutex // guards jobs
	jobs []op.Op
	wake chan struct{} // capacity 1: "jobs is not empty"

	queued atomic.Int64 // jobs reserved or waiting, as asyncQueue.queued counts them
	bytes  atomic.Int64 // their value bytes

	// Scratch of lastOfKey, kept for the next slice; the worker's alone.
	last  []bool
	later map[string]struct{}
}

// shareOf is the part of the queue (of capacity writes or bytes) the
// writes waiting for one of workers may take: an eighth with 16 workers
// or more, half with fewer, all with one. A key's writes wait for its
// worker, applied one after another, a round trip each (about 2,000 a
// second): four clients writing one key filled the whole queue, and
// every other client's asynchronous writes got 503s.
func shareOf(capacity int64, workers int) int64 {
	switch {
	case workers <= 1:
		return capacity
	case workers < 16:
		return (capacity + 1) / 2
	}
	return (capacity + 7) / 8
}

// newAsyncQueue returns a queue whose writes ex (or quiet, for sets) runs
// on workers goroutines, holding their values against bg, with at most
// inFlight value bytes on their way to memcached at once.
func newAsyncQueue(ex *executor, quiet QuietSetter, bg *budget.Budget, inFlight int64, workers, capacity int, maxBytes int64, timeout time.Duration, reg prometheus.Registerer) *asyncQueue {
	workers = max(workers, 1)
	q := &asyncQueue{ex: ex, quiet: quiet, budget: bg, timeout: timeout, capacity: int64(capacity), maxBytes: maxBytes, seed: maphash.MakeSeed(),
		share: shareOf(int64(capacity), workers), shareB: shareOf(maxBytes, workers)}
	q.inFlight.max = inFlight
	for range workers {
		q.shards = append(q.shards, &shard{wake: make(chan struct{}, 1)})
	}
	q.applied = prometheus.NewCounter(prometheus.CounterOpts{Name: "memcgate_async_writes_applied_total", Help: "Asynchronous writes memcached applied."})
	q.unconfirmed = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "memcgate_async_writes_unconfirmed_total",
		Help: "Asynchronous sets sent as UDP datagrams (MEMCGATE_UDP_PORTS): memcached does not confirm them, so the gateway cannot tell applied from lost.",
	})
	failed := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "memcgate_async_writes_failed_total",
		Help: "Asynchronous writes accepted (202) and then not applied, by reason: node_down, timeout, connection, refused (memcached said no), error.",
	}, []string{"reason"})
	q.failed = map[string]prometheus.Counter{}
	for _, r := range asyncFailReasons {
		q.failed[r] = failed.WithLabelValues(r) // exported from zero
	}
	rejected := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "memcgate_async_writes_rejected_total",
		Help: "Asynchronous writes refused with 503, by reason: queue_full (MEMCGATE_ASYNC_QUEUE or _BYTES), key_share (the writes waiting for the key's worker hold its share of the queue), node_down, budget (MEMCGATE_MAX_BUFFERED_BYTES), shutdown.",
	}, []string{"reason"})
	q.rejectFor = map[string]prometheus.Counter{}
	for _, r := range asyncRejectReasons {
		q.rejectFor[r] = rejected.WithLabelValues(r)
	}
	depth := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "memcgate_async_queue_depth", Help: "Asynchronous writes accepted and not yet applied."},
		func() float64 { return float64(q.queued.Load()) })
	depthBytes := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "memcgate_async_queue_bytes", Help: "Value bytes of asynchronous writes accepted and not yet applied."},
		func() float64 { return float64(q.bytes.Load()) })
	reg.MustRegister(q.applied, q.unconfirmed, failed, rejected, depth, depthBytes)
	return q
}

// Why enqueue refused a batch of writes: the answer's message.
var (
	errAsyncFull     = &overloadError{"asynchronous write queue is full (MEMCGATE_ASYNC_QUEUE, MEMCGATE_ASYNC_QUEUE_BYTES); retry shortly or write synchronously"}
	errAsyncShare    = &overloadError{"too many asynchronous writes wait for this key's worker (a share of MEMCGATE_ASYNC_QUEUE and _BYTES; writes to one key are applied one after another); retry shortly or write synchronously"}
	errAsyncNodeDown = &overloadError{"the key's memcached node is down, so the write could not be applied; retry shortly"}
	errAsyncClosed   = &overloadError{"the gateway is shutting down; retry on another one"}
)

// enqueue accepts all ops or none, and says why not: the queue is full in
// writes or bytes, a key's worker has its share, the budget refuses the
// values, a key's node is down, or the queue is shutting down.
func (q *asyncQueue) enqueue(ops []op.Op) error {
	n, size := int64(len(ops)), int64(0)
	for _, o := range ops {
		size += int64(len(o.Item.Value))
	}
	reject := func(reason string, err error) error {
		q.rejectFor[reason].Add(float64(n))
		return err
	}
	if q.closed.Load() {
		return reject("shutdown", errAsyncClosed)
	}
	for _, o := range ops {
		if !q.ex.store.Up(o.Item.Key) {
			return reject("node_down", errAsyncNodeDown)
		}
	}
	if cur := q.queued.Add(n); cur > q.capacity {
		q.queued.Add(-n)
		return reject("queue_full", errAsyncFull)
	}
	if cur := q.bytes.Add(size); cur > q.maxBytes && cur != size { // one write of any allowed size fits an empty queue
		q.bytes.Add(-size)
		q.queued.Add(-n)
		return reject("queue_full", errAsyncFull)
	}
	for i, o := range ops {
		if !q.shardOf(o).reserve(int64(len(o.Item.Value)), q.share, q.shareB) {
			for _, o := range ops[:i] {
				q.shardOf(o).unreserve(int64(len(o.Item.Value)))
			}
			q.bytes.Add(-size)
			q.queued.Add(-n)
			return reject("key_share", errAsyncShare)
		}
	}
	if q.budget.Acquire(size) != nil {
		for _, o := range ops {
			q.shardOf(o).unreserve(int64(len(o.Item.Value)))
		}
		q.bytes.Add(-size)
		q.queued.Add(-n)
		return reject("budget", errBudget)
	}
	q.push(ops)
	return nil
}

// push appends ops to their shards' jobs and wakes the workers. With a
// quiet setter, each shard gets its part of ops under one lock, so that
// its worker takes a batch's writes to one key in the same slice (take):
// those are the writes whose order survives UDP (see applyAll).
func (q *asyncQueue) push(ops []op.Op) {
	if q.quiet == nil || len(ops) == 1 {
		for _, o := range ops {
			sh := q.shardOf(o)
			sh.mu.Lock()
			sh.jobs = append(sh.jobs, o)
			sh.mu.Unlock()
			sh.wakeUp()
		}
		return
	}
	idx := make([]int, len(ops)) // each op's shard; -1 once pushed
	for i, o := range ops {
		idx[i] = q.shardIndex(o)
	}
	for i, s := range idx {
		if s < 0 {
			continue
		}
		sh := q.shards[s]
		sh.mu.Lock()
		for j := i; j < len(ops); j++ {
			if idx[j] == s {
				sh.jobs = append(sh.jobs, ops[j])
				idx[j] = -1
			}
		}
		sh.mu.Unlock()
		sh.wakeUp()
	}
}

// wakeUp tells the shard's worker that jobs is not empty.
func (sh *shard) wakeUp() {
	select {
	case sh.wake <- struct{}{}:
	default:
	}
}

// shardOf is the shard of o's key.
func (q *asyncQueue) shardOf(o op.Op) *shard { return q.shards[q.shardIndex(o)] }

// shardIndex is the index in shards of the shard of o's key.
func (q *asyncQueue) shardIndex(o op.Op) int {
	return int(maphash.String(q.seed, o.Item.Key) % uint64(len(q.shards)))
}

// reserve takes room for a job of size value bytes, unless the shard
// would then pass share jobs or shareB bytes (one job of any size fits a
// shard that holds nothing).
func (sh *shard) reserve(size, share, shareB int64) bool {
	if sh.queued.Add(1) > share {
		sh.queued.Add(-1)
		return false
	}
	if b := sh.bytes.Add(size); b > shareB && b != size {
		sh.unreserve(size)
		return false
	}
	return true
}

// unreserve gives back what reserve took.
func (sh *shard) unreserve(size int64) {
	sh.bytes.Add(-size)
	sh.queued.Add(-1)
}

// Run applies queued writes until ctx is done, then stops accepting and
// applies what is left before it returns. The caller stops the HTTP
// server first, so nothing enqueues after Run has drained.
func (q *asyncQueue) Run(ctx context.Context) error {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, sh := range q.shards {
		wg.Go(func() { q.work(stop, sh) })
	}
	<-ctx.Done()
	q.closed.Store(true)
	close(stop)
	wg.Wait()
	for _, sh := range q.shards { // whatever raced with closing
		q.applyAll(sh, sh.take())
	}
	return nil
}

func (sh *shard) take() []op.Op {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	jobs := sh.jobs
	sh.jobs = nil
	return jobs
}

func (q *asyncQueue) work(stop <-chan struct{}, sh *shard) {
	for {
		jobs := sh.take()
		q.applyAll(sh, jobs)
		if len(jobs) > 0 {
			continue
		}
		select {
		case <-sh.wake:
		case <-stop:
			if jobs := sh.take(); len(jobs) > 0 {
				q.applyAll(sh, jobs)
				continue
			}
			return
		}
	}
}

// applyAll applies jobs, a slice sh.take returned, in order. A write
// waits for memcached's answer before the next starts, which keeps one
// key's writes in order, except a set sent as a UDP datagram: nobody
// answers it, and memcached (whose threads all read its UDP socket) may
// apply it after a later write of its key. So a set may go out quietly
// only if no later job of its key is in jobs; otherwise it goes over TCP
// like the others.
func (q *asyncQueue) applyAll(sh *shard, jobs []op.Op) {
	if q.quiet == nil {
		for _, o := range jobs {
			q.apply(sh, o, false)
		}
		return
	}
	last := sh.lastOfKey(jobs)
	for i, o := range jobs {
		q.apply(sh, o, last[i])
	}
}

// lastOfKey reports, for each job, whether it is the last of its key in
// jobs. The result and the set it needs are the shard's, reused: only
// its worker (or Run once the workers are done) calls it.
func (sh *shard) lastOfKey(jobs []op.Op) []bool {
	sh.last = slices.Grow(sh.last[:0], len(jobs))[:len(jobs)]
	if len(jobs) == 1 {
		sh.last[0] = true
		return sh.last
	}
	if sh.later == nil {
		sh.later = map[string]struct{}{}
	}
	for i := len(jobs) - 1; i >= 0; i-- {
		k := jobs[i].Item.Key
		_, seen := sh.later[k]
		sh.last[i] = !seen
		if !seen {
			sh.later[k] = struct{}{}
		}
	}
	clear(sh.later)
	return sh.last
}

// apply runs one write of sh with its own deadline: the request that
// queued it is long gone, so its context is not used. quiet allows a set
// to go through the quiet setter (UDP), if there is one.
func (q *asyncQueue) apply(sh *shard, o op.Op, quiet bool) {
	size := int64(len(o.Item.Value))
	q.inFlight.acquire(size)
	defer func() {
		q.inFlight.release(size)
		sh.unreserve(size)
		q.budget.Release(size)
		q.bytes.Add(-size)
		q.queued.Add(-1)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), q.timeout)
	defer cancel()
	var err error
	udp := false
	if quiet && o.Verb == op.Set && q.quiet != nil {
		if err = q.ex.codec.prepare(&o.Item); err == nil {
			udp, err = q.quiet.SetQuiet(ctx, o.Item)
		}
	} else {
		err = q.ex.exec(ctx, o).Err
	}
	switch {
	case udp:
		q.unconfirmed.Inc()
		return
	case err == nil:
		q.applied.Inc()
		return
	}
	q.failed[asyncFailReason(o.Verb, err)].Inc()
}

// asyncFailReason names why a queued write failed, for the failed
// counter.
func asyncFailReason(v op.Verb, err error) string {
	switch status, _, _ := outcome(v, err); {
	case status == http.StatusServiceUnavailable:
		return "node_down"
	case status == http.StatusGatewayTimeout:
		return "timeout"
	case status == http.StatusBadGateway:
		return "connection"
	case status >= 400 && status < 500:
		return "refused"
	}
	return "error"
}

// byteGate lets through at most max bytes at once, and any one request
// of more when nothing else is in.
type byteGate struct {
	max  int64
	mu   sync.Mutex
	cond *sync.Cond // on mu; made on first use
	used int64      // guarded by mu
}

func (g *byteGate) acquire(n int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cond == nil {
		g.cond = sync.NewCond(&g.mu)
	}
	for g.used > 0 && g.used+n > g.max {
		g.cond.Wait()
	}
	g.used += n
}

func (g *byteGate) release(n int64) {
	g.mu.Lock()
	g.used -= n
	g.mu.Unlock()
	if g.cond != nil {
		g.cond.Broadcast()
	}
}

// accept queues ops and answers 202, or 503 with why they were not
// queued; with body, the answer says how many were.
func (q *asyncQueue) accept(w http.ResponseWriter, ops []op.Op, body bool) {
	if err := q.enqueue(ops); err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Preference-Applied", "respond-async")
	if !body {
		w.WriteHeader(http.StatusAccepted)
		return
	}
	b := `{"accepted":` + strconv.Itoa(len(ops)) + "}\n"
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(http.StatusAccepted)
	_, _ = w.Write([]byte(b))
}
