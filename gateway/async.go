package gateway

import (
	"context"
	"hash/maphash"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/upstream"
)

// quietSetter is implemented by stores that can set without waiting for
// memcached's answer (UDP). *upstream.Cluster implements it.
type quietSetter interface {
	SetQuiet(ctx context.Context, it upstream.Item) error
}

// asyncQueue applies writes accepted with Prefer: respond-async. It is
// bounded (a full queue answers 503, nothing is dropped), and sharded by
// key onto one worker per shard, so writes to one key apply in the order
// they were accepted. Run drains it before returning: an accepted write is
// applied (or counted as failed), never forgotten.
type asyncQueue struct {
	h        *handler // runs each write as the synchronous path would
	store    Store
	quiet    quietSetter // nil: sets go through store.Set
	timeout  time.Duration
	capacity int64
	queued   atomic.Int64 // reserved or waiting jobs
	closed   atomic.Bool  // set once Run is draining: no more jobs
	seed     maphash.Seed
	shards   []*shard
	log      *slog.Logger

	applied  prometheus.Counter
	failed   prometheus.Counter
	rejected prometheus.Counter
}

// shard is one worker's queue.
type shard struct {
	mu   sync.Mutex // guards jobs
	jobs []parsedOp
	wake chan struct{} // capacity 1: "jobs is not empty"
}

func newAsyncQueue(h *handler, s Store, workers, capacity int, timeout time.Duration, log *slog.Logger, reg prometheus.Registerer) *asyncQueue {
	q := &asyncQueue{h: h, store: s, timeout: timeout, capacity: int64(capacity), seed: maphash.MakeSeed(), log: log}
	q.quiet, _ = s.(quietSetter)
	for range max(workers, 1) {
		q.shards = append(q.shards, &shard{wake: make(chan struct{}, 1)})
	}
	q.applied = prometheus.NewCounter(prometheus.CounterOpts{Name: "memcgate_async_writes_applied_total", Help: "Asynchronous writes memcached applied."})
	q.failed = prometheus.NewCounter(prometheus.CounterOpts{Name: "memcgate_async_writes_failed_total", Help: "Asynchronous writes that failed (memcached refused them or could not be reached)."})
	q.rejected = prometheus.NewCounter(prometheus.CounterOpts{Name: "memcgate_async_writes_rejected_total", Help: "Asynchronous writes refused with 503 because the queue was full or shutting down."})
	depth := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "memcgate_async_queue_depth", Help: "Asynchronous writes accepted and not yet applied."},
		func() float64 { return float64(q.queued.Load()) })
	reg.MustRegister(q.applied, q.failed, q.rejected, depth)
	return q
}

// enqueue accepts all ops or none: false if the queue has no room for all
// of them or is shutting down.
func (q *asyncQueue) enqueue(ops []parsedOp) bool {
	n := int64(len(ops))
	for {
		cur := q.queued.Load()
		if q.closed.Load() || cur+n > q.capacity {
			q.rejected.Add(float64(n))
			return false
		}
		if q.queued.CompareAndSwap(cur, cur+n) {
			break
		}
	}
	for _, o := range ops {
		sh := q.shards[maphash.String(q.seed, o.item.Key)%uint64(len(q.shards))]
		sh.mu.Lock()
		sh.jobs = append(sh.jobs, o)
		sh.mu.Unlock()
		select {
		case sh.wake <- struct{}{}:
		default:
		}
	}
	return true
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
		for _, o := range sh.take() {
			q.apply(o)
		}
	}
	return nil
}

func (sh *shard) take() []parsedOp {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	jobs := sh.jobs
	sh.jobs = nil
	return jobs
}

func (q *asyncQueue) work(stop <-chan struct{}, sh *shard) {
	for {
		jobs := sh.take()
		for _, o := range jobs {
			q.apply(o)
		}
		if len(jobs) > 0 {
			continue
		}
		select {
		case <-sh.wake:
		case <-stop:
			if jobs := sh.take(); len(jobs) > 0 {
				for _, o := range jobs {
					q.apply(o)
				}
				continue
			}
			return
		}
	}
}

// apply runs one write with its own deadline: the request that queued it
// is long gone, so its context is not used.
func (q *asyncQueue) apply(o parsedOp) {
	defer q.queued.Add(-1)
	ctx, cancel := context.WithTimeout(context.Background(), q.timeout)
	defer cancel()
	ok := true
	if o.kind == "set" && q.quiet != nil {
		ok = q.h.prepare(&o.item) == nil && q.quiet.SetQuiet(ctx, o.item) == nil
	} else {
		var res batchResult
		q.h.runOp(ctx, o, &res)
		ok = res.Status < 400
	}
	if ok {
		q.applied.Inc()
	} else {
		q.failed.Inc()
	}
}

// preferAsync reports whether the request asks for Prefer: respond-async
// (RFC 7240).
func preferAsync(r *http.Request) bool {
	for _, v := range r.Header.Values("Prefer") {
		for pref := range strings.SplitSeq(v, ",") {
			name, _, _ := strings.Cut(strings.TrimSpace(pref), ";")
			if strings.EqualFold(strings.TrimSpace(name), "respond-async") {
				return true
			}
		}
	}
	return false
}

// accepted answers 202 for queued writes, or 503 if the queue is full.
func (h *handler) accepted(w http.ResponseWriter, ops []parsedOp, body bool) {
	if !h.async.enqueue(ops) {
		w.Header().Set("Retry-After", "1")
		writeError(w, &requestError{http.StatusServiceUnavailable, "asynchronous write queue is full; retry shortly or write synchronously"})
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

// batchAsync queues a batch of writes.
func (h *handler) batchAsync(w http.ResponseWriter, ops []parsedOp) {
	for i, o := range ops {
		if o.invalid != nil {
			_, msg, _ := errorStatus(o.invalid)
			writeError(w, badRequest("operation "+strconv.Itoa(i)+": "+msg+" (an asynchronous batch is queued whole or not at all)"))
			return
		}
		if o.kind == "get" {
			writeError(w, badRequest("operation "+strconv.Itoa(i)+": an asynchronous batch may only contain writes"))
			return
		}
	}
	h.accepted(w, ops, true)
}
