package gateway

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"github.com/memcgate/memcgate/upstream"
)

// batchOp is one operation of a POST / batch.
type batchOp struct {
	Op       string          `json:"op"`
	Key      string          `json:"key"`
	Value    *string         `json:"value,omitempty"`
	Encoding string          `json:"encoding,omitempty"` // "" (UTF-8 text) or "base64"
	Exptime  *int64          `json:"exptime,omitempty"`
	Flags    *uint64         `json:"flags,omitempty"`
	CAS      json.RawMessage `json:"cas,omitempty"` // "123", 123 or the ETag "\"123\""
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
}

// parsedOp is a parsed, checked batch operation.
type parsedOp struct {
	kind    string
	item    upstream.Item
	delta   uint64
	hasTTL  bool
	invalid error // the op is not run; its result is this error
}

var writeOps = map[string]bool{"set": true, "add": true, "replace": true, "cas": true, "delete": true, "incr": true, "decr": true, "touch": true}

// multiGet serves GET /?key=a&key=b: every key's result in one JSON
// answer, read with one multi-key get per node.
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
		writeError(w, badRequest("multi-get of "+strconv.Itoa(len(keys))+" keys; at most "+strconv.Itoa(h.opts.BatchMaxOps)))
		return
	}
	for _, k := range keys {
		if err := checkKey(k, h.opts.MaxKeyLen); err != nil {
			writeError(w, badRequest(strconv.Quote(k)+": "+err.Error()))
			return
		}
	}
	results := make([]batchResult, len(keys))
	room := h.newAnswerRoom()
	h.getAll(r, keys, room, func(i int) *batchResult { return &results[i] })
	h.writeResults(w, r, results)
}

// answerRoom is what is left, in bytes, of the values a multi-get's or
// batch's answer may carry (BatchMaxResponseBytes), so that however the
// keys repeat or the values grow, the answer is bounded; a value that
// does not fit answers 507 for its key. Safe for concurrent use.
type answerRoom struct{ left atomic.Int64 }

func (h *handler) newAnswerRoom() *answerRoom {
	a := new(answerRoom)
	a.left.Store(h.opts.BatchMaxResponseBytes)
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

// getAll reads keys with one GetMulti, each key once, and fills the
// result of each. The values read are held against the budget until the
// request ends.
func (h *handler) getAll(r *http.Request, keys []string, room *answerRoom, result func(i int) *batchResult) {
	found, failed := h.store.GetMulti(r.Context(), keys, int(max(room.left.Load(), 1)))
	total := 0
	for _, it := range found {
		total += len(it.Value)
	}
	if h.hold(reqCtx(r), total) != nil {
		for k := range found {
			failed[k] = errBudget
		}
		clear(found)
	}
	for i, k := range keys {
		res := result(i)
		res.Key = k
		if it, ok := found[k]; ok {
			h.setItem(res, it, room)
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
// answer has room for it.
func (h *handler) setItem(res *batchResult, it upstream.Item, room *answerRoom) {
	v, err := h.present(it)
	if err != nil {
		res.setError(err)
		return
	}
	if !room.take(jsonLen(v.body)) {
		res.setError(upstream.ErrOverLimit)
		return
	}
	flags := it.Flags
	res.Status, res.Flags, res.PHPType = http.StatusOK, &flags, v.phpType
	res.CAS = strconv.FormatUint(it.CAS, 10)
	res.setValue(v.body)
}

// jsonLen is at least the length of b as a JSON string in an answer:
// escaped as encoding/json escapes it, or base64 if it is not UTF-8.
func jsonLen(b []byte) int {
	if !utf8.Valid(b) {
		return base64.StdEncoding.EncodedLen(len(b))
	}
	n := 0
	for _, c := range b {
		switch {
		case c == '"' || c == '\\' || c == '\n' || c == '\r' || c == '\t':
			n += 2
		case c < 0x20 || c == '<' || c == '>' || c == '&':
			n += 6
		default:
			n++
		}
	}
	return n
}

func (res *batchResult) setValue(b []byte) {
	var v string
	if utf8.Valid(b) {
		v = string(b)
	} else {
		v, res.Encoding = base64.StdEncoding.EncodeToString(b), "base64"
	}
	res.Value = &v
}

func (res *batchResult) setError(err error) {
	status, msg, _ := errorStatus(err)
	res.Status, res.Error = status, msg
}

// batch serves POST /: a JSON list of operations, answered with one result
// per operation in the same order. Operations on the same key run in the
// order given; different keys run in parallel, each node's reads as one
// multi-key get and its writes spread over its connections. With
// Prefer: respond-async, writes are queued and the answer is 202.
func (h *handler) batch(w http.ResponseWriter, r *http.Request) {
	ops, err := h.readBatch(r)
	if err != nil {
		writeError(w, err)
		return
	}
	if preferAsync(r) {
		h.batchAsync(w, ops)
		return
	}
	results := make([]batchResult, len(ops))
	written := map[string]bool{}
	for _, o := range ops {
		if o.invalid == nil && o.kind != "get" {
			written[o.item.Key] = true
		}
	}
	// Reads of keys nothing in the batch writes: one multi-get.
	var getIdx []int
	var getKeys []string
	// Everything else, per key, in order.
	perKey := map[string][]int{}
	var order []string
	for i, o := range ops {
		results[i].Key = o.item.Key
		switch {
		case o.invalid != nil:
			results[i].setError(o.invalid)
		case o.kind == "get" && !written[o.item.Key]:
			getIdx = append(getIdx, i)
			getKeys = append(getKeys, o.item.Key)
		default:
			if _, ok := perKey[o.item.Key]; !ok {
				order = append(order, o.item.Key)
			}
			perKey[o.item.Key] = append(perKey[o.item.Key], i)
		}
	}
	ctx := r.Context()
	room := h.newAnswerRoom()
	var wg sync.WaitGroup
	if len(getKeys) > 0 {
		wg.Go(func() { h.getAll(r, getKeys, room, func(j int) *batchResult { return &results[getIdx[j]] }) })
	}
	for _, k := range order {
		wg.Go(func() {
			for _, i := range perKey[k] {
				h.runOp(ctx, ops[i], &results[i], room)
			}
		})
	}
	wg.Wait()
	h.writeResults(w, r, results)
}

// runOp runs one operation and records its single-key status. A read's
// value goes into the answer if room has space for it (nil: always).
func (h *handler) runOp(ctx context.Context, o parsedOp, res *batchResult, room *answerRoom) {
	s := h.store
	var err error
	status := http.StatusCreated
	switch o.kind {
	case "get":
		var it upstream.Item
		if it, err = s.Get(ctx, o.item.Key); err == nil {
			if room == nil {
				room = h.newAnswerRoom()
			}
			h.setItem(res, it, room)
			return
		}
	case "set", "add", "replace", "cas":
		if err = h.prepare(&o.item); err != nil {
			break
		}
		switch o.kind {
		case "set":
			err = s.Set(ctx, o.item)
		case "add":
			if err = s.Add(ctx, o.item); errors.Is(err, upstream.ErrExists) {
				err = &preconditionError{err, "key exists"}
			}
		case "replace":
			if err = s.Replace(ctx, o.item); errors.Is(err, upstream.ErrNotFound) {
				err = &preconditionError{err, "key does not exist"}
			}
		case "cas":
			if err = s.CompareAndSwap(ctx, o.item); errors.Is(err, upstream.ErrCASConflict) || errors.Is(err, upstream.ErrNotFound) {
				err = &preconditionError{err, "item changed or is gone since its cas was read"}
			}
		}
	case "delete":
		err, status = s.Delete(ctx, o.item.Key), http.StatusNoContent
	case "touch":
		err, status = s.Touch(ctx, o.item.Key, o.item.Expiration), http.StatusNoContent
	case "incr", "decr":
		var v uint64
		if o.kind == "incr" {
			v, err = s.Incr(ctx, o.item.Key, o.delta)
		} else {
			v, err = s.Decr(ctx, o.item.Key, o.delta)
		}
		if err == nil {
			s := strconv.FormatUint(v, 10)
			res.Status, res.Value = http.StatusOK, &s
			return
		}
	}
	if err != nil {
		res.setError(err)
		return
	}
	res.Status = status
}

// readBatch decodes and checks a batch body: {"ops":[…]} or a bare array.
// A malformed body, too many operations or too many bytes fail the whole
// batch; a bad operation only fails itself.
func (h *handler) readBatch(r *http.Request) ([]parsedOp, error) {
	body, err := h.readBody(r, h.opts.BatchMaxBytes, nil)
	if err != nil {
		return nil, err
	}
	raw, err := decodeBatch(body)
	if err != nil {
		return nil, err
	}
	if len(raw) == 0 {
		return nil, badRequest("batch has no operations")
	}
	if len(raw) > h.opts.BatchMaxOps {
		return nil, badRequest("batch has " + strconv.Itoa(len(raw)) + " operations; at most " + strconv.Itoa(h.opts.BatchMaxOps))
	}
	ops := make([]parsedOp, len(raw))
	for i, b := range raw {
		ops[i] = h.parseOp(b)
	}
	return ops, nil
}

func decodeBatch(body []byte) ([]batchOp, error) {
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	var raw []batchOp
	var err error
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	dec.DisallowUnknownFields()
	if len(trimmed) > 0 && trimmed[0] == '[' {
		err = dec.Decode(&raw)
	} else {
		var wrapped struct {
			Ops []batchOp `json:"ops"`
		}
		err = dec.Decode(&wrapped)
		raw = wrapped.Ops
	}
	if err != nil {
		return nil, badRequest("batch is not valid JSON ({\"ops\":[{\"op\":\"get\",\"key\":\"k\"},…]}): " + err.Error())
	}
	if dec.More() {
		return nil, badRequest("batch has data after its JSON value")
	}
	return raw, nil
}

// parseOp checks one operation the way the single-key endpoint checks a
// request.
func (h *handler) parseOp(b batchOp) parsedOp {
	o := parsedOp{kind: b.Op, item: upstream.Item{Key: b.Key}}
	fail := func(msg string) parsedOp { o.invalid = badRequest(msg); return o }
	if b.Op != "get" && !writeOps[b.Op] {
		return fail("unknown op " + strconv.Quote(b.Op) + "; use get, set, add, replace, cas, delete, incr, decr, touch")
	}
	if err := checkKey(b.Key, h.opts.MaxKeyLen); err != nil {
		o.invalid = err
		return o
	}
	needsValue := b.Op == "set" || b.Op == "add" || b.Op == "replace" || b.Op == "cas"
	switch {
	case needsValue && b.Value == nil:
		return fail(b.Op + " needs a value")
	case !needsValue && b.Value != nil:
		return fail(b.Op + " takes no value")
	case b.Value != nil:
		switch b.Encoding {
		case "":
			o.item.Value = []byte(*b.Value)
		case "base64":
			v, err := base64.StdEncoding.DecodeString(*b.Value)
			if err != nil {
				return fail("value is not valid base64: " + err.Error())
			}
			o.item.Value = v
		default:
			return fail("encoding " + strconv.Quote(b.Encoding) + " is not \"\" or \"base64\"")
		}
		if int64(len(o.item.Value)) > h.opts.MaxValueBytes {
			o.invalid = &requestError{http.StatusRequestEntityTooLarge, "value is " + strconv.Itoa(len(o.item.Value)) + " bytes; at most " + strconv.FormatInt(h.opts.MaxValueBytes, 10) + " are accepted"}
			return o
		}
	}
	o.item.Expiration = h.defaultTTL
	if b.Exptime != nil {
		if *b.Exptime < -1<<31 || *b.Exptime > 1<<31-1 {
			return fail("exptime " + strconv.FormatInt(*b.Exptime, 10) + " is not from -2147483648 to 2147483647")
		}
		o.item.Expiration, o.hasTTL = int32(*b.Exptime), true
	}
	if b.Op == "touch" && !o.hasTTL {
		return fail("touch needs an exptime")
	}
	if b.Flags != nil {
		if *b.Flags > 1<<32-1 {
			return fail("flags " + strconv.FormatUint(*b.Flags, 10) + " is not from 0 to 4294967295")
		}
		o.item.Flags = uint32(*b.Flags)
	}
	o.delta = 1
	if b.Delta != nil {
		if b.Op != "incr" && b.Op != "decr" {
			return fail(b.Op + " takes no delta")
		}
		o.delta = *b.Delta
	}
	if b.Op == "cas" {
		cas, err := parseCAS(b.CAS)
		if err != nil {
			o.invalid = err
			return o
		}
		o.item.CAS = cas
	} else if len(b.CAS) > 0 {
		return fail(b.Op + " takes no cas (use op cas)")
	}
	return o
}

// parseCAS accepts 123, "123" or the ETag form "\"123\"".
func parseCAS(raw json.RawMessage) (uint64, error) {
	if len(raw) == 0 {
		return 0, badRequest("cas needs the cas value a get returned")
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		s = string(raw)
	}
	if len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' {
		s = s[1 : len(s)-1]
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, badRequest("cas " + strconv.Quote(s) + " is not a cas value a get returned")
	}
	return v, nil
}

// writeResults answers a multi-get or batch with its results, the
// encoded answer held against the budget until the request ends.
func (h *handler) writeResults(w http.ResponseWriter, r *http.Request, results []batchResult) {
	body, err := json.Marshal(struct {
		Results []batchResult `json:"results"`
	}{results})
	if err == nil && h.hold(reqCtx(r), len(body)) != nil {
		err = errBudget
	}
	if err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)+1))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(append(body, '\n'))
}
