package gateway

import (
	"context"
	"errors"
	"hash/maphash"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/gateway/budget"
	"github.com/memcgate/memcgate/upstream"
	"github.com/memcgate/memcgate/upstream/loggate"
	"github.com/memcgate/memcgate/upstream/op"
	"github.com/memcgate/memcgate/upstream/panicguard"
)

// asyncQueue applies writes accepted with Prefer: respond-async. It is
// bounded in writes and in value bytes, and holds its values against the
// gateway's budget: a full queue answers 503, nothing is dropped. A write
// is accepted only while its key's node is up, so a 202 is never given
// for a write that cannot be applied.
//
// Each node's writes wait in a lane of their own (with owners; one lane
// for all without): the lane of a node is a part of the shards, whose
// workers serve that node only, and its writes may take only a share of
// the queue (shareOf over the nodes). A write waits for its node's
// answer before its worker takes the next, so a node answering slowly
// holds its own workers and fills its own share, and the other nodes'
// writes are neither delayed nor refused. Within a lane writes are
// sharded by key onto one worker per shard, so writes to one key apply
// in the order they were accepted as long as the key keeps its lane
// (its home node, which health does not change: see place; with a
// quiet setter, only those that waited in the queue together: see
// applyAll); the writes waiting for one worker may take only a share of
// the queue (shareOf over the workers), so that one key written faster
// than its worker applies cannot fill the queue for every other key; and
// each lane's values on their way to memcached are capped in bytes
// (lane.inFlight) so that large ones cannot fill the node's connections
// ahead of other clients' requests. Run drains it before returning: an
// accepted write is applied (or counted as failed), never forgotten.
//
// A shard's worker is a goroutine only while the shard has writes, and
// workerIdle after: push starts it (startWorker) when the shard has none,
// under the shard's lock it takes anyway, and it ends once it has waited
// workerIdle with nothing to apply. A worker for every shard waiting
// from the start would hold 512 stacks (the default) with no write
// coming (docs/benchmarks.md, "Asynchronous write workers started on
// demand").
// Run owns them all: pushes start them only while it runs, and it waits
// for them before it returns.
type asyncQueue struct {
	ex        *executor   // runs each write as the synchronous path would (run: it waits for nothing)
	order     *WriteOrder // counts each write from enqueue until it is applied or failed
	quiet     QuietSetter // nil: sets go through ex
	owners    Owners      // nil: one lane
	budget    *budget.Budget
	timeout   atomic.Int64 // each write's deadline, in nanoseconds: RequestTimeout, which a reload may change
	capacity  int64
	maxBytes  int64
	queued    atomic.Int64 // reserved or waiting jobs
	bytes     atomic.Int64 // their value bytes
	share     int64        // the most jobs one shard may have reserved or waiting
	shareB    int64        // the most value bytes one shard may have reserved or waiting (past one job)
	closed    atomic.Bool  // set once Run is draining: no more jobs
	entering  atomic.Int64 // enqueues that may have found closed unset and not pushed yet: Run waits for none before it drains
	seed      maphash.Seed
	shards    []*shard
	workers   sync.WaitGroup // the shards' workers, which Run waits for (startWorker)
	stop      chan struct{}  // closed by Run once ctx is done: workers apply what they hold and end
	idle      time.Duration  // how long a worker waits with nothing to apply before it ends: workerIdle
	lanes     []lane         // by node index (Owners.Owner), as many as shards: a node has one shard at least
	rejectFor map[string]prometheus.Counter

	applied     prometheus.Counter
	unconfirmed prometheus.Counter            // sets sent as UDP datagrams: neither applied nor failed as far as anyone knows
	failed      map[string]prometheus.Counter // by reason (asyncFailReasons)
	panics      *panicguard.Site              // where a write's application stops a panic; nil: nowhere

	log     *slog.Logger  // failures, a line a second at most; nil: none
	fails   atomic.Uint64 // writes failed, for the log line
	failLog loggate.Gate  // failures logged
}

// asyncFailReasons label memcgate_async_writes_failed_total.
var asyncFailReasons = []string{"node_down", "busy", "timeout", "connection", "refused", "error"}

// asyncRejectReasons label memcgate_async_writes_rejected_total.
var asyncRejectReasons = []string{"queue_full", "node_share", "key_share", "node_down", "budget", "shutdown"}

// job is a queued write and the lane it is counted in.
type job struct {
	op.Op
	lane int
	seq  uint64 // its number among its key's writes (WriteOrder.accepted)
}

// shard is one worker's queue.
type shard struct {
	mu      sync.Mutex // guards jobs, working and open
	jobs    []job
	working bool          // its worker runs (startWorker)
	open    bool          // Run runs: push may start its worker
	wake    chan struct{} // capacity 1: "jobs is not empty", for a worker that runs

	held // jobs reserved or waiting, as asyncQueue.queued counts them

	// Scratch of lastOfKey, kept for the next slice; the worker's alone.
	last  []bool
	later map[string]struct{}
}

// lane is the part of the queue of one node's writes: what they hold of
// it, and their value bytes on the way to memcached. Must not be copied.
type lane struct {
	held
	inFlight byteGate
}

// held counts the jobs a shard or a lane has reserved or waiting, and
// their value bytes, against its share of the queue.
type held struct {
	queued atomic.Int64
	bytes  atomic.Int64
}

// placement is where one write of a batch waits: its lane and its
// shard, and the number of nodes its lane was chosen among.
type placement struct{ lane, shard, nodes int }

// shareOf is the part of the queue (of capacity writes or bytes) the
// writes waiting for one of parts (workers, or nodes) may take: an eighth
// with 16 parts or more, half with fewer, all with one. A key's writes
// wait for its worker, applied one after another, a round trip each:
// a few clients writing one key fill the whole queue, and every other
// client's asynchronous writes get 503s (docs/benchmarks.md, "Attacks
// from review"). A node's writes wait for its workers: a slow one fills
// the queue as surely (decisions/0022).
func shareOf(capacity int64, parts int) int64 {
	switch {
	case parts <= 1:
		return capacity
	case parts < 16:
		return (capacity + 1) / 2
	}
	return (capacity + 7) / 8
}

// workerIdle is how long a shard's worker waits with nothing to apply
// before it ends (the h1 poller's idle workers wait as long).
const workerIdle = 10 * time.Second

// newAsyncQueue returns a queue whose writes ex (or quiet, for sets) runs
// on workers goroutines, shared out among the nodes owners names (one
// lane without), holding their values against bg, with at most inFlight
// value bytes of one node on their way to memcached at once. order counts
// each write from its acceptance until it is applied or fails.
func newAsyncQueue(ex *executor, order *WriteOrder, quiet QuietSetter, owners Owners, bg *budget.Budget, inFlight int64, workers, capacity int, maxBytes int64, timeout time.Duration, log *slog.Logger, reg prometheus.Registerer) *asyncQueue {
	workers = max(workers, 1)
	q := &asyncQueue{ex: ex, order: order, quiet: quiet, owners: owners, budget: bg, capacity: int64(capacity), maxBytes: maxBytes, seed: maphash.MakeSeed(), log: log,
		share: shareOf(int64(capacity), workers), shareB: shareOf(maxBytes, workers), stop: make(chan struct{}), idle: workerIdle}
	q.timeout.Store(int64(timeout))
	for range workers {
		q.shards = append(q.shards, &shard{wake: make(chan struct{}, 1)})
	}
	q.lanes = make([]lane, workers)
	for i := range q.lanes {
		q.lanes[i].inFlight.max = inFlight
	}
	q.applied = prometheus.NewCounter(prometheus.CounterOpts{Name: "memcgate_async_writes_applied_total", Help: "Asynchronous writes memcached applied (a delete of a key it did not hold among them)."})
	q.unconfirmed = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "memcgate_async_writes_unconfirmed_total",
		Help: "Asynchronous sets sent as UDP datagrams (MEMCGATE_UDP_PORTS): memcached does not confirm them, so the gateway cannot tell applied from lost.",
	})
	failed := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "memcgate_async_writes_failed_total",
		Help: "Asynchronous writes accepted (202) and then not applied, by reason: node_down, busy (the node is up but slow: its requests held their share of MEMCGATE_MAX_REQUESTS), timeout, connection, refused (memcached said no), error.",
	}, []string{"reason"})
	q.failed = map[string]prometheus.Counter{}
	for _, r := range asyncFailReasons {
		q.failed[r] = failed.WithLabelValues(r) // exported from zero
	}
	rejected := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "memcgate_async_writes_rejected_total",
		Help: "Asynchronous writes refused with 503, by reason: queue_full (MEMCGATE_ASYNC_QUEUE or _BYTES), node_share (the writes waiting for the key's node hold its share of the queue: the node applies them slower than they come), key_share (the writes waiting for the key's worker hold its share of the queue), node_down, budget (MEMCGATE_MAX_BUFFERED_BYTES), shutdown.",
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
	errAsyncFull      = &overloadError{"asynchronous write queue is full (MEMCGATE_ASYNC_QUEUE, MEMCGATE_ASYNC_QUEUE_BYTES); retry shortly or write synchronously"}
	errAsyncNodeShare = &overloadError{"too many asynchronous writes wait for this key's memcached node, which applies them slower than they come (each node's writes may hold a share of MEMCGATE_ASYNC_QUEUE and _BYTES: half with fewer than 16 nodes, an eighth with more; the other nodes' writes are still accepted); retry shortly or write synchronously"}
	errAsyncShare     = &overloadError{"too many asynchronous writes wait for this key's worker (a share of MEMCGATE_ASYNC_QUEUE and _BYTES; writes to one key are applied one after another); retry shortly or write synchronously"}
	errAsyncNodeDown  = &overloadError{"the key's memcached node is down, so the write could not be applied; retry shortly"}
	errAsyncClosed    = &overloadError{"the gateway is shutting down; retry on another one"}
)

// enqueue accepts all ops or none, and says why not: the queue is full in
// writes or bytes, a key's node or a key's worker has its share, the
// budget refuses the values, a key's node is down, or the queue is
// shutting down.
func (q *asyncQueue) enqueue(ops []op.Op) error {
	// Counted before closed is read, and until its jobs are pushed: Run
	// sets closed before it reads the count, so either this enqueue sees
	// closed or Run sees it counted and waits for its push (both are
	// sequentially consistent atomics). Without it, a handler still
	// running when the data server was closed at the shutdown timeout
	// could pass the check, push after Run's last pass and answer 202
	// for a write nobody applies.
	q.entering.Add(1)
	defer q.entering.Add(-1)
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
	// Each write's placement is taken once, so that its lane and shard
	// give back what they reserved even if the server list changes; and
	// once per key of a batch, so that a list changing under the batch
	// cannot put two writes of one key in two lanes, out of order.
	var small [8]placement
	pl := small[:0]
	var placed map[string]placement // of a batch's keys placed already
	if len(ops) > 1 {
		placed = make(map[string]placement, len(ops))
	}
	for _, o := range ops {
		p, seen := placed[o.Item.Key]
		if !seen {
			p.lane, p.shard, p.nodes = q.place(o.Item.Key)
			if placed != nil {
				placed[o.Item.Key] = p
			}
		}
		pl = append(pl, p)
		if !q.lanes[p.lane].reserve(int64(len(o.Item.Value)), shareOf(q.capacity, p.nodes), shareOf(q.maxBytes, p.nodes)) {
			q.unreserveLanes(ops, pl[:len(pl)-1])
			q.bytes.Add(-size)
			q.queued.Add(-n)
			return reject("node_share", errAsyncNodeShare)
		}
	}
	for i, o := range ops {
		if !q.shards[pl[i].shard].reserve(int64(len(o.Item.Value)), q.share, q.shareB) {
			q.unreserveShards(ops[:i], pl)
			q.unreserveLanes(ops, pl)
			q.bytes.Add(-size)
			q.queued.Add(-n)
			return reject("key_share", errAsyncShare)
		}
	}
	if q.budget.Acquire(size) != nil {
		q.unreserveShards(ops, pl)
		q.unreserveLanes(ops, pl)
		q.bytes.Add(-size)
		q.queued.Add(-n)
		return reject("budget", errBudget)
	}
	seqs := make([]uint64, len(ops))
	for i, o := range ops { // before any can be applied, and before the 202
		seqs[i] = q.order.accepted(o.Item.Key)
	}
	q.push(ops, pl, seqs)
	return nil
}

// tight reports whether a batch of up to maxOps writes might not fit the
// queue's count of writes now, or the queue is shutting down: then
// roomFor is worth asking before the batch is decoded.
func (q *asyncQueue) tight(maxOps int) bool {
	return q.closed.Load() || q.queued.Load()+int64(maxOps) > q.capacity
}

// roomFor refuses, as enqueue would, a batch of n writes the queue has
// no room for in its count of writes now, or any batch while the queue
// is shutting down; nil means they may fit (enqueue decides). It lets a
// batch be refused before its body is decoded: under a flood of async
// batches at a full queue, each was decoded (2 ms for a thousand
// writes) only to be refused.
func (q *asyncQueue) roomFor(n int) error {
	switch {
	case q.closed.Load():
		q.rejectFor["shutdown"].Add(float64(n))
		return errAsyncClosed
	case n > 0 && q.queued.Load()+int64(n) > q.capacity:
		q.rejectFor["queue_full"].Add(float64(n))
		return errAsyncFull
	}
	return nil
}

// unreserveLanes gives back what the lanes of the first len(pl) ops
// reserved for them.
func (q *asyncQueue) unreserveLanes(ops []op.Op, pl []placement) {
	for i, p := range pl {
		q.lanes[p.lane].unreserve(int64(len(ops[i].Item.Value)))
	}
}

// unreserveShards gives back what the shards of ops reserved for them.
func (q *asyncQueue) unreserveShards(ops []op.Op, pl []placement) {
	for i, o := range ops {
		q.shards[pl[i].shard].unreserve(int64(len(o.Item.Value)))
	}
}

// place returns where a write of key waits: the lane of its home node
// (Owners.Owner; lane 0 without owners), a shard of that lane's part of
// the shards, chosen by key, and how many nodes there are now. The n
// nodes share the shards out in n contiguous parts; with more nodes
// than shards, nodes share parts. A key keeps its lane and shard as long
// as the server list does not change; a new list may move them, and its
// writes then wait in two places for a while (docs/http-api.md says
// what order survives).
func (q *asyncQueue) place(key string) (ln, sh, nodes int) {
	w := len(q.shards)
	i, n := 0, 1
	if q.owners != nil {
		if i, n = q.owners.Owner(key); n < 1 || i < 0 || i >= n {
			i, n = 0, 1 // a server list changing under the owner's feet: any lane will do
		}
	}
	if n > w {
		i, n = i*w/n, w
	}
	lo, hi := i*w/n, (i+1)*w/n
	return i, lo + int(maphash.String(q.seed, key)%uint64(hi-lo)), n
}

// push appends ops, numbered seqs among their keys' writes, to the
// shards of their placements pl and wakes the workers. With a quiet
// setter, each shard gets its part of ops under one lock, so that its
// worker takes a batch's writes to one key in the same slice (take):
// those are the writes whose order survives UDP (see applyAll). It takes
// pl's shards over, marking the pushed ones -1.
func (q *asyncQueue) push(ops []op.Op, pl []placement, seqs []uint64) {
	if q.quiet == nil || len(ops) == 1 {
		for i, o := range ops {
			sh := q.shards[pl[i].shard]
			sh.mu.Lock()
			sh.jobs = append(sh.jobs, job{o, pl[i].lane, seqs[i]})
			q.wakeLocked(sh)
		}
		return
	}
	for i, p := range pl {
		s := p.shard
		if s < 0 {
			continue
		}
		sh := q.shards[s]
		sh.mu.Lock()
		for j := i; j < len(ops); j++ {
			if pl[j].shard == s {
				sh.jobs = append(sh.jobs, job{ops[j], pl[j].lane, seqs[j]})
				pl[j].shard = -1
			}
		}
		q.wakeLocked(sh)
	}
}

// wakeLocked, called with sh.mu held and jobs pushed, unlocks it and
// tells sh's worker there are jobs: it wakes the worker that runs, or
// starts one while Run runs (before, the jobs wait for Run).
func (q *asyncQueue) wakeLocked(sh *shard) {
	start := sh.open && !sh.working
	if start {
		q.startWorker(sh)
	}
	sh.mu.Unlock()
	if !start {
		sh.wakeUp()
	}
}

// startWorker starts sh's worker; sh.mu is held, sh.open set and no
// worker runs. Run, which closes the shards before it waits for the
// workers, sees every worker started this way.
func (q *asyncQueue) startWorker(sh *shard) {
	sh.working = true
	q.workers.Add(1)
	go func() {
		defer q.workers.Done()
		q.work(sh)
	}()
}

// wakeUp tells the shard's worker that jobs is not empty.
func (sh *shard) wakeUp() {
	select {
	case sh.wake <- struct{}{}:
	default:
	}
}

// reserve takes room for a job of size value bytes, unless that would
// pass share jobs or shareB bytes (one job of any size fits when nothing
// is held).
func (h *held) reserve(size, share, shareB int64) bool {
	if h.queued.Add(1) > share {
		h.queued.Add(-1)
		return false
	}
	if b := h.bytes.Add(size); b > shareB && b != size {
		h.unreserve(size)
		return false
	}
	return true
}

// unreserve gives back what reserve took.
func (h *held) unreserve(size int64) {
	h.bytes.Add(-size)
	h.queued.Add(-1)
}

// Run applies queued writes until ctx is done, then stops accepting and
// applies what is left before it returns: each write enqueue accepted,
// including one of a request still running when its server was closed
// at the shutdown timeout (it waits for enqueues under way: entering).
// It is called once. While it runs, each shard's worker runs while the
// shard has writes (see asyncQueue).
func (q *asyncQueue) Run(ctx context.Context) error {
	for _, sh := range q.shards {
		sh.mu.Lock()
		sh.open = true
		if len(sh.jobs) > 0 { // pushed before Run
			q.startWorker(sh)
		}
		sh.mu.Unlock()
	}
	<-ctx.Done()
	q.closed.Store(true)
	// An enqueue past its closed check pushes soon: nothing between the
	// check and the push waits for more than a lock.
	for q.entering.Load() > 0 {
		time.Sleep(time.Millisecond)
	}
	for _, sh := range q.shards {
		sh.mu.Lock()
		sh.open = false // no worker starts after this: Wait sees them all
		sh.mu.Unlock()
	}
	close(q.stop)
	q.workers.Wait()
	for _, sh := range q.shards { // whatever raced with closing
		q.applyAll(sh, sh.take())
	}
	return nil
}

func (sh *shard) take() []job {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	jobs := sh.jobs
	sh.jobs = nil
	return jobs
}

// work is sh's worker: it applies sh's jobs as they come, and ends once
// Run stops it, or once it has waited q.idle with no job (then a push
// starts another).
func (q *asyncQueue) work(sh *shard) {
	idle := time.NewTimer(q.idle)
	defer idle.Stop()
	for {
		jobs := sh.take()
		q.applyAll(sh, jobs)
		if len(jobs) > 0 {
			continue
		}
		idle.Reset(q.idle)
		select {
		case <-sh.wake:
		case <-idle.C:
			if sh.retire() {
				return
			}
		case <-q.stop:
			if jobs := sh.take(); len(jobs) > 0 {
				q.applyAll(sh, jobs)
				continue
			}
			return
		}
	}
}

// retire ends sh's worker, unless a job came meanwhile: it reports
// whether the worker is to return.
func (sh *shard) retire() bool {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if len(sh.jobs) > 0 {
		return false
	}
	sh.working = false
	return true
}

// applyAll applies jobs, a slice sh.take returned, in order. A write
// waits for memcached's answer before the next starts, which keeps one
// key's writes in order, except a set sent as a UDP datagram: nobody
// answers it, and memcached (whose threads all read its UDP socket) may
// apply it after a later write of its key. So a set may go out quietly
// only if no later job of its key is in jobs; otherwise it goes over TCP
// like the others.
func (q *asyncQueue) applyAll(sh *shard, jobs []job) {
	if q.quiet == nil {
		for _, j := range jobs {
			q.apply(sh, j, false)
		}
		return
	}
	last := sh.lastOfKey(jobs)
	for i, j := range jobs {
		q.apply(sh, j, last[i])
	}
}

// lastOfKey reports, for each job, whether it is the last of its key in
// jobs. The result and the set it needs are the shard's, reused: only
// its worker (or Run once the workers are done) calls it.
func (sh *shard) lastOfKey(jobs []job) []bool {
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
// to go through the quiet setter (UDP), if there is one, unless its key
// may hold an index: a datagram says nothing of what it replaced, and
// the chunks would be left behind (executor.mayHoldIndex).
func (q *asyncQueue) apply(sh *shard, j job, quiet bool) {
	o, ln := j.Op, &q.lanes[j.lane]
	size := int64(len(o.Item.Value))
	ln.inFlight.acquire(size)
	defer func() {
		ln.inFlight.release(size)
		ln.unreserve(size)
		sh.unreserve(size)
		q.budget.Release(size)
		q.bytes.Add(-size)
		q.queued.Add(-1)
		q.order.applied(o.Item.Key, j.seq) // applied, failed, or sent unconfirmed (UDP)
	}()
	// A write whose application panicked failed: its worker goes on
	// with the next ones.
	panicked := false
	defer func() {
		if panicked {
			q.failed["error"].Inc()
			q.logFailure(o.Verb, "error", panicguard.ErrPanicked)
		}
	}()
	defer q.panics.RecoverNoting(&panicked)
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(q.timeout.Load()))
	defer cancel()
	o.Queued = true // it holds no request slot: past a slow node's share it waits its turn
	var err error
	udp := false
	if quiet && o.Verb == op.Set && q.quiet != nil && !q.ex.mayHoldIndex(o.Item.Key) {
		if err = q.ex.codec.prepare(ctx, &o.Item); err == nil {
			udp, err = q.quiet.SetQuiet(ctx, o.Item)
		}
	} else {
		err = q.ex.run(ctx, o).Err
	}
	switch {
	case udp:
		q.unconfirmed.Inc()
		return
	case err == nil, o.Verb == op.Delete && errors.Is(err, upstream.ErrNotFound):
		// A delete of a key memcached does not hold leaves it absent,
		// as asked: an invalidation of a key already gone or evicted.
		q.applied.Inc()
		return
	}
	reason := asyncFailReason(o.Verb, err)
	q.failed[reason].Inc()
	q.logFailure(o.Verb, reason, err)
}

// logFailure logs a write answered 202 that was then not applied: its
// client was told it was accepted, and nothing else tells it otherwise.
// One line a second at most, with the count, as a node going down fails
// every write queued for it at once.
func (q *asyncQueue) logFailure(v op.Verb, reason string, err error) {
	n := q.fails.Add(1)
	if q.log == nil {
		return
	}
	if _, ok := q.failLog.Pass(); ok {
		q.log.Warn("an asynchronous write accepted with 202 was not applied", "verb", v.String(), "reason", reason, "err", err.Error(), "failed_so_far", n)
	}
}

// asyncFailReason names why a queued write failed, for the failed
// counter: node_down (no node could take it), busy (its node held its
// share of the request slots), timeout (no answer in time), connection
// (the connection failed), refused (memcached answered and did not apply
// it), error (anything else: an error line among them). The REST status
// of the failure decides, but for the answers memcached gave that the
// REST API maps to a 5xx: neither no memory for the item (503) nor an
// error line (502) says the node is down or its connection failed. They
// are counted as memcgate_upstream_ops_total counts them, rejected and
// error.
func asyncFailReason(v op.Verb, err error) string {
	var be *upstream.BusyError
	switch {
	case errors.As(err, &be):
		return "busy" // a 503 too, but the node is up: it is slow
	case errors.Is(err, upstream.ErrNoMemory):
		return "refused"
	case errors.Is(err, upstream.ErrServer):
		return "error"
	}
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
