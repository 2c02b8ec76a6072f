package gateway

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"github.com/memcgate/memcgate/gateway/chunk"
	"github.com/memcgate/memcgate/upstream"
	"github.com/memcgate/memcgate/upstream/op"
	"github.com/memcgate/memcgate/upstream/panicguard"
)

// batchOp is one operation of a POST / batch.
type batchOp struct {
	Op       string          `json:"op"`
	Key      string          `json:"key"`
	Value    *string         `json:"value,omitempty"`
	Encoding string          `json:"encoding,omitempty"` // "" (UTF-8 text) or "base64"
	Exptime  *int64          `json:"exptime,omitempty"`
	Flags    *uint64         `json:"flags,omitempty"`
	CAS      json.RawMessage `json:"cas,omitempty"` // "123", 123 or the ETag "\"123\""; "123@0a1b2c3d" where a get named its node
	Delta    *uint64         `json:"delta,omitempty"`
}

// batchResult is one operation's outcome, with the status the single-key
// endpoint would give.
type batchResult struct {
	Key      string  `json:"key"`
	Status   int     `json:"status"`
	Value    *string `json:"value,omitempty"`
	Encoding string  `json:"encoding,omitempty"` // "base64" when the value is not valid UTF-8
	Flags    *uint32 `json:"flags,omitempty"`
	CAS      string  `json:"cas,omitempty"`
	PHPType  string  `json:"php_type,omitempty"` // with MEMCGATE_VALUE_CODEC=php
	Error    string  `json:"error,omitempty"`

	// value is a found value as read, written into the answer as Value
	// would be (base64 with Encoding "base64"), without a copy as a
	// string (see appendResults).
	value []byte
	// valueLen is value's length in the answer, without its quotes. The
	// room of an answer is counted with it, so it must not count short:
	// U+2028 and U+2029, 3 bytes of UTF-8, are written as the 6 of \u2028.
	valueLen    int
	unreachable bool // memcached could not be asked (unreachable)
	retry       bool // the single-key answer would carry Retry-After
}

// parsedOp is a parsed, checked batch operation.
type parsedOp struct {
	op      op.Op
	invalid error // the op is not run; its result is this error
}

// multiGet serves GET /?key=a&key=b: every key's result in one JSON
// answer, read with one multi-key get per node, unless its client has
// gone (Client).
func (h *handler) multiGet(w http.ResponseWriter, r *http.Request) {
	q, err := url.ParseQuery(r.URL.RawQuery)
	keys := q["key"]
	switch {
	case err != nil:
		writeError(w, badRequest("malformed query: "+err.Error()))
		return
	case len(keys) == 0:
		writeError(w, badRequest("empty key: use /{key}, or GET /?key=a&key=b for several"))
		return
	case len(keys) > h.opts.BatchMaxOps:
		writeError(w, badRequest("multi-get of "+strconv.Itoa(len(keys))+" keys; at most "+strconv.Itoa(h.opts.BatchMaxOps)+" (MEMCGATE_BATCH_MAX_OPS)"))
		return
	}
	for _, k := range keys {
		if err := checkKey(k, h.opts.MaxKeyLen); err != nil {
			writeError(w, badRequest(quoted(k)+": "+err.Error()))
			return
		}
	}
	if clientGone(r) {
		writeError(w, errClientGone)
		return
	}
	if err := h.holdOps(r, len(keys)); err != nil {
		writeError(w, err)
		return
	}
	room := h.newAnswerRoom()
	vr := h.lim.valueRoom(reqCtx(r), true)
	// Gat is told by the raw name, as scopeFor tells the scope it needs:
	// a name that only decodes to "touch" (%74ouch) is not one.
	if hasQuery(r.URL.RawQuery, "touch") {
		exp, err := parseExptime(r.URL.RawQuery, "touch", 0)
		if err != nil {
			writeError(w, err)
			return
		}
		h.writeResults(w, r, h.touchAll(r, keys, exp, room, vr), vr)
		return
	}
	results := make([]batchResult, len(keys))
	h.getAll(r, keys, room, vr, func(i int) *batchResult { return &results[i] })
	h.writeResults(w, r, results, vr)
}

// touchAll reads keys with get-and-touch, each distinct key once (a batch
// of gats), and gives every position of keys its key's result, as getAll
// does: a repeat answers from the one read, its value taking room in the
// answer again (507 when it does not fit). Without this a key named 1000
// times made memcached send its value 1000 times for an 8 KB request.
func (h *handler) touchAll(r *http.Request, keys []string, exp int32, room *answerRoom, vr *valueRoom) []batchResult {
	first := make(map[string]int, len(keys)) // key → its index in ops
	var ops []parsedOp
	for _, k := range keys {
		if _, ok := first[k]; !ok {
			first[k] = len(ops)
			ops = append(ops, parsedOp{op: op.Op{Verb: op.GAT, Item: op.Item{Key: k, Expiration: exp}}})
		}
	}
	read := h.run(r, ops, room, vr)
	if len(ops) == len(keys) {
		return read
	}
	results := make([]batchResult, len(keys))
	used := make([]bool, len(read))
	for i, k := range keys {
		j := first[k]
		results[i] = read[j]
		if !used[j] {
			used[j] = true
			continue
		}
		if res := &results[i]; res.Status == http.StatusOK && !room.take(res.valueLen) {
			*res = batchResult{Key: k}
			res.setError(upstream.ErrOverLimit)
		}
	}
	return results
}

// answerRoom is what is left, in bytes, of the values a multi-get's or
// batch's answer may carry (BatchMaxResponseBytes), so that however the
// keys repeat or the values grow, the answer is bounded; a value that
// does not fit answers 507 for its key. It also bounds what the request's
// reads one at a time (runOp: gats, and gets of keys the batch writes)
// may make memcached send: such a read is not sent once the answer has
// no room left, once a value of its key did not fit, or once the values
// read, kept or dropped, reach twice the answer room (sent); and at most
// readParallel of them are on their way at once. So memcached sends at
// most 2 × BatchMaxResponseBytes plus readParallel values for them,
// whatever the keys. Safe for concurrent use.
type answerRoom struct {
	left atomic.Int64
	// sent is what is left of the bytes of values the reads one at a time
	// may still have memcached send.
	sent  atomic.Int64
	reads chan struct{} // a token per read one at a time on its way
	mu    sync.Mutex
	over  map[string]bool // keys whose value did not fit
}

// readParallel is how many reads one at a time of one multi-get or batch
// may be on their way at once: each may bring a value as large as an
// item may be before the answer room (answerRoom.sent) says to stop, so
// they bound what memcached sends past it. 16 keep pipelined connections
// busy for small values.
const readParallel = 16

// newAnswerRoom returns a full room for one multi-get's or batch's answer.
func (h *handler) newAnswerRoom() *answerRoom {
	a := &answerRoom{reads: make(chan struct{}, readParallel)}
	a.left.Store(h.opts.BatchMaxResponseBytes)
	a.sent.Store(2 * h.opts.BatchMaxResponseBytes)
	return a
}

// take claims n bytes, if they are left.
func (a *answerRoom) take(n int) bool {
	if a.left.Add(-int64(n)) < 0 {
		a.left.Add(int64(n))
		return false
	}
	return true
}

// overflow records that a value of key did not fit: the room only
// shrinks, so a read of key would not fit again.
func (a *answerRoom) overflow(key string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.over == nil {
		a.over = map[string]bool{}
	}
	a.over[key] = true
}

// mayRead reports whether a read of key may still be sent (see
// answerRoom).
func (a *answerRoom) mayRead(key string) bool {
	if a.left.Load() <= 0 || a.sent.Load() <= 0 {
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return !a.over[key]
}

// sentRoom is the op.Room of a read one at a time: vr, counting each
// value memcached sends, taken or not, against its answerRoom's sent.
// Values it is not asked about (below op.LentValue, or all of them from
// gomemcache's pool) are counted by runOp once read, beyond counted.
type sentRoom struct {
	*valueRoom
	a       *answerRoom
	counted atomic.Int64 // bytes Reserve counted
}

// Reserve counts the n bytes of a value being read, and holds them as
// the valueRoom does (op.Room).
func (r *sentRoom) Reserve(n int) bool {
	r.a.sent.Add(-int64(n))
	r.counted.Add(int64(n))
	return r.valueRoom.Reserve(n)
}

// getAll reads keys with one GetMulti, each key once, and fills the
// result of each. The values read are held against the budget (vr) from
// before they are read until the request ends.
func (h *handler) getAll(r *http.Request, keys []string, room *answerRoom, vr *valueRoom, result func(i int) *batchResult) {
	found, failed := h.ex.store.GetMulti(r.Context(), keys, int(max(room.left.Load(), 1)), vr)
	for i, k := range keys {
		res := result(i)
		res.Key = k
		if it, ok := found[k]; ok {
			h.setItem(r.Context(), res, it, room, vr)
			continue
		}
		err := failed[k]
		if err == nil {
			err = upstream.ErrNotFound
		}
		res.setError(err)
	}
}

// setItem fills a found item's result, decoding it as GET would, if the
// answer has room for it. A compressed value is decompressed only into
// memory vr holds first, for the body and its place in the answer, and
// only while the answer has room for what it holds, and with a turn
// (cpuTurns) waited for within ctx when it is large.
func (h *handler) setItem(ctx context.Context, res *batchResult, it op.Item, room *answerRoom, vr *valueRoom) {
	if chunk.IsIndex(it.Flags, it.Value) { // streamed by GET /{key} only
		res.setError(chunk.ErrChunked)
		return
	}
	v, err := h.codec.present(ctx, it, func(n int) error {
		if int64(n) > room.left.Load() {
			return upstream.ErrOverLimit
		}
		return vr.hold(n)
	})
	if err != nil {
		res.setError(err)
		return
	}
	res.setValue(v.body)
	if !room.take(res.valueLen) {
		room.overflow(res.Key)
		res.value, res.Encoding = nil, ""
		res.setError(upstream.ErrOverLimit)
		return
	}
	flags := it.Flags
	res.Status, res.Flags, res.PHPType = http.StatusOK, &flags, v.phpType
	res.CAS = string(appendCAS(make([]byte, 0, 29), it.CAS, it.CASNode))
}

// setValue makes b the result's value, base64 in the answer if it is not
// UTF-8, and counts its length there (valueLen). b must not change until
// the answer is written.
func (res *batchResult) setValue(b []byte) {
	if b == nil {
		b = []byte{}
	}
	res.value = b
	if utf8.Valid(b) {
		res.valueLen = escapedLen(b)
	} else {
		res.Encoding, res.valueLen = "base64", base64.StdEncoding.EncodedLen(len(b)) // no base64 byte is escaped
	}
}

// setOutcome records verb v's result err, as the single-key endpoint
// would answer it.
func (res *batchResult) setOutcome(v op.Verb, err error) {
	res.Status, res.Error, res.retry = outcome(v, err)
	res.unreachable = unreachable(err)
}

// answerStatus is the status of a multi-get's or batch's answer (see
// docs/http-api.md): 200 with each result's own status inside,
// unless not one of them reached memcached (every result unreachable),
// then 503, with Retry-After if any result's single-key answer would carry
// it. A partial failure stays 200: its results say which keys failed.
func answerStatus(results []batchResult) (status int, retry bool) {
	if len(results) == 0 {
		return http.StatusOK, false
	}
	for _, r := range results {
		if !r.unreachable {
			return http.StatusOK, false
		}
		retry = retry || r.retry
	}
	return http.StatusServiceUnavailable, retry
}

func (res *batchResult) setError(err error) { res.setOutcome(0, err) }

// setPanicked records that verb v's operation panicked (a bug) on the
// goroutine that ran it: whatever it had set goes, and it answers 500.
func (res *batchResult) setPanicked(v op.Verb) {
	*res = batchResult{Key: res.Key}
	res.setOutcome(v, panicguard.ErrPanicked)
}

// batch serves POST /: a JSON list of operations, answered with one result
// per operation in the same order. Operations on the same key run in the
// order given; different keys run in parallel, each node's reads as one
// multi-key get and its writes spread over its connections. With
// Prefer: respond-async, writes are queued and the answer is 202.
func (h *handler) batch(w http.ResponseWriter, r *http.Request) {
	async := preferAsync(r)
	ops, err := h.readBatch(r, async)
	if err != nil {
		writeError(w, err)
		return
	}
	if e := h.readScope(r, ops); e != nil {
		writeError(w, e)
		return
	}
	if async {
		h.batchAsync(w, ops)
		return
	}
	vr := h.lim.valueRoom(reqCtx(r), true)
	h.writeResults(w, r, h.run(r, ops, h.newAnswerRoom(), vr), vr)
}

// readScope refuses a batch that reads a value (get, gat) for a token
// without the read scope. POST / needs the write scope (its body is read
// only for a token that has it); a token with write alone must not read
// through a batch the values a GET refuses it.
func (h *handler) readScope(r *http.Request, ops []parsedOp) *requestError {
	for i, o := range ops {
		if o.invalid != nil || o.op.Verb.Reply() != op.Items {
			continue
		}
		e := h.guard.a.rules().tokens.check(r, ScopeRead)
		if e != nil {
			e.msg += ": operation " + strconv.Itoa(i) + " (" + o.op.Verb.String() + ") reads a value"
		}
		return e
	}
	return nil
}

// run runs a batch's operations and returns their results. Operations on
// the same key run in the order given; different keys run in parallel,
// the plain reads of keys nothing in the batch writes as one multi-get.
// The values read go into the answer while room has space for them.
func (h *handler) run(r *http.Request, ops []parsedOp, room *answerRoom, vr *valueRoom) []batchResult {
	results := make([]batchResult, len(ops))
	written := map[string]bool{}
	for _, o := range ops {
		if o.invalid == nil && o.op.Verb != op.Get {
			written[o.op.Item.Key] = true
		}
	}
	// Reads of keys nothing in the batch writes: one multi-get.
	var getIdx []int
	var getKeys []string
	// Everything else, per key, in order.
	perKey := map[string][]int{}
	var order []string
	for i, o := range ops {
		k := o.op.Item.Key
		results[i].Key = k
		switch {
		case o.invalid != nil:
			results[i].setError(o.invalid)
		case o.op.Verb == op.Get && !written[k]:
			getIdx = append(getIdx, i)
			getKeys = append(getKeys, k)
		default:
			if _, ok := perKey[k]; !ok {
				order = append(order, k)
			}
			perKey[k] = append(perKey[k], i)
		}
	}
	ctx := r.Context()
	var wg sync.WaitGroup
	if len(getKeys) > 0 {
		wg.Go(func() {
			panicked := false
			defer func() {
				if panicked {
					for _, i := range getIdx {
						results[i].setPanicked(op.Get)
					}
				}
			}()
			defer h.batchPanics.RecoverNoting(&panicked)
			h.getAll(r, getKeys, room, vr, func(j int) *batchResult { return &results[getIdx[j]] })
		})
	}
	// A key's operations run on a goroutine of their own once a token of
	// h.batchOps is free: all batches together work on batchParallel keys
	// at most, whatever their number. A key with a read first takes one
	// of the request's room.reads (answerRoom), before the shared token,
	// so that a batch of reads waiting for its own turns holds none of
	// the other batches'.
	for n, k := range order {
		reads := readsIn(ops, perKey[k])
		ok := take(ctx, room.reads, reads)
		if ok && !take(ctx, h.batchOps, true) {
			if reads {
				<-room.reads
			}
			ok = false
		}
		if !ok {
			for _, k := range order[n:] {
				for _, i := range perKey[k] {
					results[i].setOutcome(ops[i].op.Verb, ctx.Err())
				}
			}
			wg.Wait()
			return results
		}
		wg.Go(func() {
			defer func() {
				<-h.batchOps
				if reads {
					<-room.reads
				}
			}()
			idx, ran := perKey[k], 0
			panicked := false
			defer func() {
				if panicked { // the operation that panicked, and those after it
					for _, i := range idx[ran:] {
						results[i].setPanicked(ops[i].op.Verb)
					}
				}
			}()
			defer h.batchPanics.RecoverNoting(&panicked)
			for _, i := range idx {
				h.runOp(ctx, ops[i].op, &results[i], room, vr)
				ran++
			}
		})
	}
	wg.Wait()
	return results
}

// readsIn reports whether any of the operations ops[i] of idx reads a
// value.
func readsIn(ops []parsedOp, idx []int) bool {
	for _, i := range idx {
		if ops[i].invalid == nil && ops[i].op.Verb.Reply() == op.Items {
			return true
		}
	}
	return false
}

// take takes a token of ch if need is true, waiting within ctx; it
// reports false, holding nothing, if ctx ended first.
func take(ctx context.Context, ch chan struct{}, need bool) bool {
	if !need {
		return true
	}
	select {
	case ch <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

// batchParallel is how many keys of batches (POST /) are worked on at
// once, over all batches: each holds a goroutine and, while its
// operation is on its way, one of its node's in-flight slots. With a
// goroutine per key (up to BATCH_MAX_OPS) for one request slot, 128
// connections each sending a batch of 1000 deletes make 128,000
// goroutines (1 GB of stacks and state), stall every other client for
// 3 s and keep memcached busy after they leave. 256 is
// a sixteenth of a node's default in-flight cap (MAX_IN_FLIGHT_PER_NODE),
// so that single-key requests always find slots, and many times what
// one batch needs to keep pipelined connections busy.
const batchParallel = 256

// runOp runs one operation and records its result as the single-key
// endpoint would answer it. A read's value goes into the answer if room
// has space for it; vr holds it from before it is read until the request
// ends. A read room says not to send (answerRoom.mayRead) is not: it
// answers 507, as a value that did not fit does, and a gat sends a touch
// instead, so that the expiration is still set (a miss then answers 404).
func (h *handler) runOp(ctx context.Context, o op.Op, res *batchResult, room *answerRoom, vr *valueRoom) {
	var sr *sentRoom
	if o.Verb.Reply() == op.Items {
		// run took a token of room.reads for o's key: mayRead sees what
		// the reads before it sent, but for readParallel at most.
		if !room.mayRead(o.Item.Key) {
			h.readUnsent(ctx, o, res)
			return
		}
		sr = &sentRoom{valueRoom: vr, a: room}
		o.Room = sr
	}
	r := h.ex.exec(ctx, o)
	if n := int64(len(r.Item.Value)); sr != nil && n > sr.counted.Load() {
		room.sent.Add(sr.counted.Load() - n) // a value the Room was not asked about
	}
	switch {
	case r.Err != nil:
		res.setOutcome(o.Verb, r.Err)
	case o.Verb.Reply() == op.Items && !vr.holdRead(r):
		res.setOutcome(o.Verb, upstream.ErrNoFit)
	case o.Verb.Reply() == op.Items:
		h.setItem(ctx, res, r.Item, room, vr)
	case o.Verb.Reply() == op.Number:
		res.setOutcome(o.Verb, nil)
		v := strconv.FormatUint(r.N, 10)
		res.Value = &v
	default:
		res.setOutcome(o.Verb, nil)
	}
}

// readUnsent answers o, a read whose value the answer has no room for,
// without reading it: 507 (upstream.ErrOverLimit), after a touch with
// o's expiration for a gat, whose own outcome it answers if the touch
// failed.
func (h *handler) readUnsent(ctx context.Context, o op.Op, res *batchResult) {
	if o.Verb == op.GAT {
		t := o
		t.Verb, t.Room, t.Item.Value = op.Touch, nil, nil
		if r := h.ex.exec(ctx, t); r.Err != nil {
			res.setOutcome(o.Verb, r.Err)
			return
		}
	}
	res.setOutcome(o.Verb, upstream.ErrOverLimit)
}

// readBatch decodes and checks a batch body: {"ops":[…]} or a bare array.
// A malformed body, too many operations or too many bytes fail the whole
// batch; a bad operation only fails itself. A body of turnBytes or more is
// decoded with a turn (cpuTurns). An async batch (Prefer: respond-async)
// the queue has no room for is refused before it is decoded; one whose
// client has gone (Client), before it is decoded too.
func (h *handler) readBatch(r *http.Request, async bool) ([]parsedOp, error) {
	body, err := h.lim.readBody(r, h.opts.BatchMaxBytes, "MEMCGATE_BATCH_MAX_BYTES")
	if err != nil {
		return nil, err
	}
	if !async && clientGone(r) {
		// Neither decoded nor sent. A queued batch is applied whoever
		// waits for its 202.
		return nil, errClientGone
	}
	if async && h.async.tight(h.opts.BatchMaxOps) {
		// Counting the operations costs a fraction of decoding them: a
		// batch the queue has no room for is refused before it is
		// decoded, so that a full queue costs no decoding.
		if err := h.async.roomFor(opsIn(body)); err != nil {
			return nil, err
		}
	}
	took, err := h.turns.take(r.Context(), len(body), "decode a batch of")
	if err != nil {
		return nil, err
	}
	if took {
		defer h.turns.done()
	}
	raw, err := decodeBatch(body, h.opts.BatchMaxOps)
	if err != nil {
		return nil, err
	}
	if len(raw) == 0 {
		return nil, badRequest("batch has no operations")
	}
	if err := h.holdOps(r, len(raw)); err != nil {
		return nil, err
	}
	ops := make([]parsedOp, len(raw))
	for i, b := range raw {
		ops[i] = h.parseOp(b)
	}
	return ops, nil
}

// batchOpBytes is what one operation of a batch, or key of a multi-get,
// costs the gateway beyond its value while its request runs: its parsed
// form, its result, its share of the multi-get's maps and the answer's
// encoding (about 0.7 KiB in the heap under a flood of 1,000-key batch
// gets). Nothing counted it: 1,500 such batches at once held 1 GiB of
// heap and 1.8 GB of RSS, with the byte budget at 10 MB.
const batchOpBytes = 1 << 10

// holdOps holds n operations' bookkeeping (batchOpBytes each) against
// the budget for r's request, or says it does not fit.
func (h *handler) holdOps(r *http.Request, n int) error {
	if h.lim.hold(reqCtx(r), n*batchOpBytes) != nil {
		return errBudget
	}
	return nil
}

// decodeBatch decodes a batch body, {"ops":[…]} or a bare array, one
// operation at a time, and fails as soon as it has decoded maxOps and
// another follows. So what it holds is bounded by maxOps operations (each
// at most the body's size), not by how many elements the body lists: a
// body of a million tiny elements costs no more than one of maxOps. The
// wrapper takes only "ops", matched as encoding/json matches field names
// (case-insensitively; the last "ops" wins), and an operation takes only
// batchOp's fields.
func decodeBatch(body []byte, maxOps int) ([]batchOp, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	tok, err := dec.Token()
	if err == io.EOF {
		return nil, badRequest(`batch body is empty: POST / takes {"ops":[…]}; one key's operation is POST /{key}?op=…`)
	}
	if err != nil {
		return nil, notJSON(err)
	}
	var ops []batchOp
	switch tok {
	case json.Delim('['):
		if ops, err = decodeOps(dec, maxOps); err != nil {
			return nil, err
		}
	case json.Delim('{'):
		if ops, err = decodeWrapper(dec, maxOps); err != nil {
			return nil, err
		}
	case nil: // null: no operations
	default:
		return nil, badRequest("batch is " + jsonKind(tok) + ", not {\"ops\":[…]} or an array of operations")
	}
	if len(bytes.TrimLeft(body[dec.InputOffset():], " \t\r\n")) > 0 {
		return nil, badRequest("batch has data after its JSON value")
	}
	return ops, nil
}

// decodeWrapper decodes the members of {"ops":[…]} after its '{', up to
// and with its '}'. A second "ops" is refused: each array is held to
// maxOps, but repeats would make the decoder work through any number.
func decodeWrapper(dec *json.Decoder, maxOps int) ([]batchOp, error) {
	var ops []batchOp
	seen := false
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, notJSON(err)
		}
		if name, _ := tok.(string); !strings.EqualFold(name, "ops") {
			return nil, notJSON(errors.New("json: unknown field " + quoted(name)))
		}
		if seen {
			return nil, badRequest("batch has more than one \"ops\" member")
		}
		seen = true
		if tok, err = dec.Token(); err != nil {
			return nil, notJSON(unexpectedEOF(err))
		}
		switch tok {
		case json.Delim('['):
			if ops, err = decodeOps(dec, maxOps); err != nil {
				return nil, err
			}
		case nil:
			ops = nil
		default:
			return nil, badRequest("batch \"ops\" is " + jsonKind(tok) + ", not an array of operations")
		}
	}
	if _, err := dec.Token(); err != nil {
		return nil, notJSON(unexpectedEOF(err))
	}
	return ops, nil
}

// decodeOps decodes the operations of an array after its '[', up to and
// with its ']'. An element that is not an object fails at once, as does
// the element after the first maxOps, before it is decoded.
func decodeOps(dec *json.Decoder, maxOps int) ([]batchOp, error) {
	var ops []batchOp
	for i := 0; dec.More(); i++ {
		if i == maxOps {
			return nil, badRequest("batch has more than " + strconv.Itoa(maxOps) + " operations; at most " + strconv.Itoa(maxOps) + " (MEMCGATE_BATCH_MAX_OPS)")
		}
		ops = append(ops, batchOp{})
		// Decoding into a pointer tells null apart: it sets p to nil.
		p := &ops[i]
		err := dec.Decode(&p)
		var te *json.UnmarshalTypeError
		switch {
		case errors.As(err, &te) && te.Field == "":
			return nil, badRequest("batch operation " + strconv.Itoa(i) + " is " + article(te.Value) + ", not an object")
		case err != nil:
			return nil, notJSON(unexpectedEOF(err))
		case p == nil:
			return nil, badRequest("batch operation " + strconv.Itoa(i) + " is null, not an object")
		}
	}
	if _, err := dec.Token(); err != nil {
		return nil, notJSON(unexpectedEOF(err))
	}
	return ops, nil
}

// opsIn counts the operations of a batch body as decodeBatch would find
// them, without decoding: the objects directly inside a bare array, or
// inside the array of a wrapper object's member. For a body that
// decodes, that is its number of operations; a malformed body may count
// anything, and fails to decode anyway. It looks at each byte once, and
// skips strings whole: a fraction of decoding's cost.
func opsIn(body []byte) int {
	var outer [2]byte // the kinds of the containers at depth 1 and 2
	depth, n := 0, 0
	for i := 0; i < len(body); i++ {
		switch c := body[i]; c {
		case '"':
			for i++; ; i += 2 { // past the string: to its closing quote
				j := bytes.IndexAny(body[i:], `"\`)
				if j < 0 {
					return n
				}
				if i += j; body[i] == '"' {
					break
				}
			}
		case '{', '[':
			if c == '{' && (depth == 1 && outer[0] == '[' || depth == 2 && outer[0] == '{' && outer[1] == '[') {
				n++
			}
			if depth < len(outer) {
				outer[depth] = c
			}
			depth++
		case '}', ']':
			if depth == 0 {
				return n
			}
			depth--
		}
	}
	return n
}

// notJSON is the 400 for a batch body encoding/json cannot decode.
func notJSON(err error) error {
	return badRequest("batch is not valid JSON ({\"ops\":[{\"op\":\"get\",\"key\":\"k\"},…]}): " + err.Error())
}

// unexpectedEOF is err, but io.ErrUnexpectedEOF for io.EOF: the body
// ended inside its JSON value.
func unexpectedEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// jsonKind names the kind of a JSON token: "a number", "a string",
// "true", "false", "null", "an object" or "an array".
func jsonKind(tok json.Token) string {
	switch t := tok.(type) {
	case json.Delim:
		if t == '{' {
			return "an object"
		}
		return "an array"
	case string:
		return "a string"
	case bool:
		return strconv.FormatBool(t)
	case nil:
		return "null"
	}
	return "a number"
}

// article puts "a" or "an" before what encoding/json calls a JSON value's
// kind ("number", "string", "array", "bool").
func article(kind string) string {
	if strings.IndexByte("aeiou", kind[0]) >= 0 {
		return "an " + kind
	}
	return "a " + kind
}

// parseOp checks one operation the way the single-key endpoint checks a
// request: what it must and may carry follows its verb (package op).
func (h *handler) parseOp(b batchOp) parsedOp {
	v := op.Parse(b.Op)
	p := parsedOp{op: op.Op{Verb: v, Item: op.Item{Key: b.Key}}}
	o := &p.op
	fail := func(msg string) parsedOp { p.invalid = badRequest(msg); return p }
	if !batched(v) {
		return fail("unknown op " + quoted(b.Op) + "; use " + verbNames())
	}
	if b.Key == "" {
		return fail(`empty key: every operation names its "key"`)
	}
	if err := checkKey(b.Key, h.opts.MaxKeyLen); err != nil {
		p.invalid = err
		return p
	}
	switch {
	case v.TakesValue() && b.Value == nil:
		return fail(b.Op + " needs a value")
	case !v.TakesValue() && b.Value != nil:
		return fail(b.Op + " takes no value")
	case b.Value != nil:
		switch b.Encoding {
		case "":
			o.Item.Value = []byte(*b.Value)
		case "base64":
			val, err := base64.StdEncoding.DecodeString(*b.Value)
			if err != nil {
				return fail("value is not valid base64: " + err.Error())
			}
			o.Item.Value = val
		default:
			return fail("encoding " + quoted(b.Encoding) + " is not \"\" or \"base64\"")
		}
		if int64(len(o.Item.Value)) > h.opts.MaxValueBytes {
			p.invalid = &requestError{kind: kindTooLarge, msg: "value is " + strconv.Itoa(len(o.Item.Value)) + " bytes; at most " + strconv.FormatInt(h.opts.MaxValueBytes, 10) + " are accepted (MEMCGATE_MAX_VALUE_BYTES)"}
			return p
		}
	}
	o.Item.Expiration = h.defaultTTL
	switch {
	case b.Exptime != nil && !v.TakesTTL():
		return fail(b.Op + " takes no exptime")
	case b.Exptime != nil:
		if *b.Exptime < -1<<31 || *b.Exptime > 1<<31-1 {
			return fail("exptime " + strconv.FormatInt(*b.Exptime, 10) + " is not from -2147483648 to 2147483647")
		}
		o.Item.Expiration = int32(*b.Exptime)
	case v == op.Touch:
		return fail("touch needs an exptime")
	}
	if b.Flags != nil {
		if !v.TakesValue() {
			return fail(b.Op + " takes no flags")
		}
		if *b.Flags > 1<<32-1 {
			return fail("flags " + strconv.FormatUint(*b.Flags, 10) + " is not from 0 to 4294967295")
		}
		o.Item.Flags = uint32(*b.Flags)
	}
	o.Delta = 1
	if b.Delta != nil {
		if !v.TakesDelta() {
			return fail(b.Op + " takes no delta")
		}
		o.Delta = *b.Delta
	}
	switch {
	case v == op.CAS, v == op.Delete && len(b.CAS) > 0:
		// A delete with a cas deletes only the item that cas names
		// (delete_cas, md C<cas>), as DELETE /{key} with If-Match.
		err := parseCAS(b.CAS, &o.Item)
		if err == nil && o.Item.CAS == 0 && v == op.Delete {
			err = badRequest("cas 0 is not a cas value a get returned")
		}
		if err != nil {
			p.invalid = err
			return p
		}
		if v == op.Delete {
			o.Verb = op.DeleteCAS
		}
	case len(b.CAS) > 0:
		return fail(b.Op + " takes no cas (a cas is taken by op cas, and by op delete)")
	}
	return p
}

// batched reports whether a batch takes verb v: every verb but the meta
// commands: head and head_touch, which answer a size (HEAD /{key}'s, and
// values in chunks'), a field a batch's answer does not have, append_cas
// and prepend_cas, which values in chunks send for an append or prepend
// (chunk.Values), and delete_cas, which a batch names as a delete with a
// cas.
func batched(v op.Verb) bool {
	return v.Valid() && v.Reply() != op.Meta && v.Reply() != op.MetaStored && v.Reply() != op.MetaDeleted
}

// verbNames lists the verbs a batch takes.
func verbNames() string {
	var names []string
	for _, v := range op.Verbs() {
		if batched(v) {
			names = append(names, v.String())
		}
	}
	return strings.Join(names, ", ")
}

// parseCAS reads a batch operation's cas into it: 123, "123" or the
// ETag form "\"123\"", and where a get named its node (a replica, a
// failover, a warm-up hit) "123@0a1b2c3d" or "\"123@0a1b2c3d\"" (the
// node that gave the value out, appendCAS).
func parseCAS(raw json.RawMessage, it *op.Item) error {
	if len(raw) == 0 {
		return badRequest("cas needs the cas value a get returned")
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		s = string(raw)
	}
	if len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' {
		s = s[1 : len(s)-1]
	}
	cas, node, why := parseCASValue(s)
	if why != "" {
		msg := "cas " + quoted(s) + " is not a cas value a get returned"
		if strings.Contains(s, "@") {
			msg += ": " + why
		}
		return badRequest(msg)
	}
	it.CAS, it.CASNode = cas, node
	return nil
}

// writeResults answers a multi-get or batch with its results, the
// encoded answer held against the budget until the request ends: the
// values' places in it were held as they were read (vr), and what else it
// takes (keys, statuses, escaping) once its size is known. The status is
// the one answerStatus gives them.
func (h *handler) writeResults(w http.ResponseWriter, r *http.Request, results []batchResult, vr *valueRoom) {
	size := answerSize(results)
	if h.lim.hold(reqCtx(r), size-vr.answered()) != nil {
		writeError(w, errBudget)
		return
	}
	body := appendResults(make([]byte, 0, size), results)
	for i := range results {
		results[i].value = nil // in body now
	}
	status, retry := answerStatus(results)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	if retry {
		w.Header().Set("Retry-After", "1")
	}
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// batchAsync queues a batch of writes.
func (h *handler) batchAsync(w http.ResponseWriter, ops []parsedOp) {
	queued := make([]op.Op, len(ops))
	for i, o := range ops {
		err := o.invalid
		switch {
		case err == nil && !o.op.Verb.Writes():
			err = badRequest("an asynchronous batch may only contain writes")
		case err == nil:
			err = h.codec.check(&o.op.Item)
		}
		if err != nil {
			_, msg, _ := errorStatus(err)
			writeError(w, badRequest("operation "+strconv.Itoa(i)+": "+msg+" (an asynchronous batch is queued whole or not at all)"))
			return
		}
		queued[i] = o.op
	}
	h.async.accept(w, queued, true)
}
