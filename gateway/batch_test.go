package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/http/httptest"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/memcgate/memcgate/gateway/budget"
	"github.com/memcgate/memcgate/upstream"
	"github.com/memcgate/memcgate/upstream/op"
)

type results struct {
	Results []batchResult `json:"results"`
}

func decodeResults(t *testing.T, body string) []batchResult {
	t.Helper()
	var r results
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		t.Fatalf("response %q is not results JSON: %v", body, err)
	}
	return r.Results
}

func TestMultiGet(t *testing.T) {
	s := newFake()
	s.Put(op.Item{Key: "a", Value: []byte("text"), Flags: 3})
	s.Put(op.Item{Key: "bin", Value: []byte{0xff, 0x00, 0x01}})
	h := newTestHandler(t, s)
	w := do(h, "GET", "/?key=a&key=missing&key=bin", "")
	if w.Code != 200 || w.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("multi-get = %d %s %q, want 200 JSON", w.Code, w.Header().Get("Content-Type"), w.Body.String())
	}
	res := decodeResults(t, w.Body.String())
	if len(res) != 3 {
		t.Fatalf("multi-get gave %d results, want 3", len(res))
	}
	if r := res[0]; r.Key != "a" || r.Status != 200 || *r.Value != "text" || *r.Flags != 3 || r.CAS != "1" || r.Encoding != "" {
		t.Errorf("result a = %+v", r)
	}
	if r := res[1]; r.Key != "missing" || r.Status != 404 || r.Value != nil {
		t.Errorf("result missing = %+v, want 404 without value", r)
	}
	if r := res[2]; r.Status != 200 || r.Encoding != "base64" || *r.Value != "/wAB" {
		t.Errorf("result bin = %+v, want base64 /wAB", r)
	}
	if s.Calls != 1 {
		t.Errorf("multi-get made %d store calls, want 1 GetMulti", s.Calls)
	}
	for _, target := range []string{"/", "/?key=a%20b", "/?key=" + strings.Repeat("k", 251)} {
		if w := do(h, "GET", target, ""); w.Code != 400 {
			t.Errorf("GET %s = %d, want 400", target, w.Code)
		}
	}
}

func TestBatch(t *testing.T) {
	s := newFake()
	s.Put(op.Item{Key: "old", Value: []byte("x")})
	h := newTestHandler(t, s)
	body := `{"ops":[
		{"op":"set","key":"a","value":"1","exptime":10,"flags":2},
		{"op":"incr","key":"a","delta":5},
		{"op":"get","key":"a"},
		{"op":"get","key":"old"},
		{"op":"add","key":"old","value":"y"},
		{"op":"replace","key":"nope","value":"y"},
		{"op":"delete","key":"old"},
		{"op":"set","key":"b","value":"AAEC","encoding":"base64"},
		{"op":"get","key":"bad key"},
		{"op":"explode","key":"k"},
		{"op":"set","key":"c"},
		{"op":"touch","key":"a"},
		{"op":"cas","key":"a","value":"z","cas":"999"},
		{"op":"get","key":"never"},
		{"op":"head","key":"a"},
		{"op":"head_touch","key":"a"},
		{"op":"append_cas","key":"a","value":"x"},
		{"op":"prepend_cas","key":"a","value":"x"},
		{"op":"delete_cas","key":"a","cas":"1"},
		{"op":"delete","key":"a","cas":"999"},
		{"op":"delete","key":"b","cas":"0"},
		{"op":"incr","key":"a","cas":"1"},
		{"op":"delete","key":"nope","cas":"\"5\""}
	]}`
	w := do(h, "POST", "/", body)
	if w.Code != 200 {
		t.Fatalf("batch = %d %q, want 200", w.Code, w.Body.String())
	}
	res := decodeResults(t, w.Body.String())
	want := []int{201, 200, 200, 200, 412, 412, 204, 201, 400, 400, 400, 400, 412, 404, 400, 400, 400, 400, 400, 412, 400, 400, 412}
	if len(res) != len(want) {
		t.Fatalf("batch gave %d results, want %d", len(res), len(want))
	}
	for i, r := range res {
		if r.Status != want[i] {
			t.Errorf("op %d (%s) status = %d %q, want %d", i, r.Key, r.Status, r.Error, want[i])
		}
	}
	for i, name := range map[int]string{14: "head", 15: "head_touch", 16: "append_cas", 17: "prepend_cas", 18: "delete_cas"} {
		e := res[i].Error
		_, named, _ := strings.Cut(e, "; use ")
		if !strings.Contains(e, `unknown op "`+name+`"`) || strings.Contains(named, "head") || strings.Contains(named, "_cas") {
			t.Errorf("batch %s = %q, want an unknown op, no meta verb among those named", name, e)
		}
	}
	if e := res[21].Error; !strings.Contains(e, "incr takes no cas") {
		t.Errorf("batch incr with a cas = %q, want it refused", e)
	}
	if *res[1].Value != "6" { // 1 + 5
		t.Errorf("incr result value = %q, want 6", *res[1].Value)
	}
	if got := string(s.Items["b"].Value); got != "\x00\x01\x02" {
		t.Errorf("base64 set stored %q, want 00 01 02", got)
	}
	for _, tt := range []struct {
		body string
		want int
	}{
		{`not json`, 400},
		{`{"ops":[]}`, 400},
		{`{"ops":[{"op":"get","key":"a","bogus":1}]}`, 400},
		{`[{"op":"get","key":"a"}]`, 200},
		{`{"ops":[{"op":"get","key":"a"}]} trailing`, 400},
		{`{"ops":[` + strings.Repeat(`{"op":"get","key":"a"},`, 1000) + `{"op":"get","key":"a"}]}`, 400},
	} {
		if w := do(h, "POST", "/", tt.body); w.Code != tt.want {
			t.Errorf("batch %.50q… = %d %q, want %d", tt.body, w.Code, w.Body.String(), tt.want)
		}
	}
}

func TestBatchTooLarge(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	h := NewHandler(newFake(), log, prometheus.NewRegistry(), Options{BatchMaxBytes: 100})
	if w := do(h, "POST", "/", `{"ops":[{"op":"set","key":"a","value":"`+strings.Repeat("x", 200)+`"}]}`); w.Code != 413 || !strings.HasSuffix(w.Body.String(), "are accepted (MEMCGATE_BATCH_MAX_BYTES)\n") {
		t.Errorf("batch over BatchMaxBytes = %d %q, want 413 naming the variable", w.Code, w.Body.String())
	}
	// A value of the batch over MaxValueBytes fails its operation alone,
	// and says which limit.
	h = NewHandler(newFake(), log, prometheus.NewRegistry(), Options{MaxValueBytes: 10})
	w := do(h, "POST", "/", `{"ops":[{"op":"set","key":"a","value":"`+strings.Repeat("x", 11)+`"}]}`)
	if res := decodeResults(t, w.Body.String()); len(res) != 1 || res[0].Status != 413 || res[0].Error != "value is 11 bytes; at most 10 are accepted (MEMCGATE_MAX_VALUE_BYTES)" {
		t.Errorf("batch value over MaxValueBytes = %d %q, want its operation 413 naming the variable", w.Code, w.Body.String())
	}
}

func TestAsyncWrites(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	s := newFake()
	reg := prometheus.NewRegistry()
	h := NewHandler(s, log, reg, Options{AsyncQueue: 3, AsyncWorkers: 1}) // one worker: its share is the whole queue
	// Not running yet: writes queue up to the capacity, then 503.
	for i, want := range []int{202, 202, 202, 503} {
		w := asyncDo(h, "PUT", "/k"+string(rune('0'+i)), "v")
		if w.Code != want {
			t.Errorf("async PUT %d = %d, want %d", i, w.Code, want)
		}
		if w.Code == 202 && w.Header().Get("Preference-Applied") != "respond-async" {
			t.Errorf("202 without Preference-Applied")
		}
	}
	// A batch that does not fit is refused whole.
	if w := asyncDo(h, "POST", "/", `[{"op":"set","key":"x","value":"1"}]`); w.Code != 503 {
		t.Errorf("async batch into a full queue = %d, want 503", w.Code)
	}
	// Run applies them; cancelling Run drains the rest before it returns.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { h.Run(ctx); close(done) }()
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	for i := range 3 {
		if _, ok := s.Items["k"+string(rune('0'+i))]; !ok {
			t.Errorf("accepted async write k%d was not applied before Run returned", i)
		}
	}
	if got := testutil.ToFloat64(h.h.async.applied); got != 3 {
		t.Errorf("async applied = %v, want 3", got)
	}
	// After Run, nothing is accepted.
	req := httptest.NewRequest("DELETE", "/k0", nil)
	req.Header.Set("Prefer", "wait=1, respond-async")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	if w.Code != 503 {
		t.Errorf("async DELETE after shutdown = %d, want 503", w.Code)
	}
}

// TestAsyncKeyShare: the writes waiting for one worker, which applies
// them one after another, take at most its share of the queue, in writes
// and in bytes, so that writes to one key cannot fill the queue for all
// the others.
func TestAsyncKeyShare(t *testing.T) {
	tests := []struct {
		name          string
		queue         int
		bytes         int64
		hot           []int // sizes of the writes to one key
		wantHot       []int // their statuses
		others, other int   // writes to other workers' keys, and their size
	}{
		{name: "writes", queue: 64, bytes: 1 << 20, hot: []int{1, 1, 1, 1, 1, 1, 1, 1, 1}, wantHot: []int{202, 202, 202, 202, 202, 202, 202, 202, 503}, others: 8, other: 1},
		{name: "bytes", queue: 64, bytes: 1600, hot: []int{150, 100}, wantHot: []int{202, 503}, others: 8, other: 150},
		{name: "one write past the share fits an empty worker", queue: 64, bytes: 1600, hot: []int{1000, 1}, wantHot: []int{202, 503}, others: 1, other: 500},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			log := slog.New(slog.NewTextHandler(io.Discard, nil))
			reg := prometheus.NewRegistry()
			h := NewHandler(newFake(), log, reg, Options{AsyncQueue: tt.queue, AsyncQueueBytes: tt.bytes, AsyncWorkers: 16}) // not running: writes wait
			put := func(key string, size int) *httptest.ResponseRecorder {
				return asyncDo(h, "PUT", "/"+key, strings.Repeat("v", size))
			}
			for i, size := range tt.hot {
				w := put("hot", size)
				if w.Code != tt.wantHot[i] {
					t.Errorf("async PUT %d of the hot key = %d %s, want %d", i, w.Code, w.Body, tt.wantHot[i])
				}
				if w.Code == 503 && !strings.Contains(w.Body.String(), "this key's worker") {
					t.Errorf("503 says %q; want it to name the key's share", w.Body)
				}
			}
			if got := testutil.ToFloat64(h.h.async.rejectFor["key_share"]); got != 1 {
				t.Errorf(`rejected{reason="key_share"} = %v, want 1`, got)
			}
			// Keys of other workers, one each: accepted.
			q := h.h.async
			_, hot, _ := q.place("hot")
			used := map[int]bool{hot: true}
			for i := 0; len(used) <= tt.others; i++ {
				key := fmt.Sprint("other", i)
				if _, sh, _ := q.place(key); !used[sh] {
					used[sh] = true
					if w := put(key, tt.other); w.Code != 202 {
						t.Errorf("async PUT of %s, another worker's key, = %d %s", key, w.Code, w.Body)
					}
				}
			}
		})
	}
}

func TestAsyncKeepsPerKeyOrder(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	s := newFake()
	h := NewHandler(s, log, prometheus.NewRegistry(), Options{AsyncWorkers: 8})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { h.Run(ctx); close(done) }()
	for i := range 200 {
		asyncDo(h, "PUT", "/same", string(rune('a'+i%26)))
	}
	cancel()
	<-done
	if got, want := string(s.Items["same"].Value), string(rune('a'+199%26)); got != want {
		t.Errorf("after 200 async PUTs of one key the value is %q, want the last one %q", got, want)
	}
}

func FuzzBatch(f *testing.F) {
	f.Add(`{"ops":[{"op":"set","key":"a","value":"1"},{"op":"get","key":"a"}]}`)
	f.Add(`[{"op":"cas","key":"a","value":"AA==","encoding":"base64","cas":"\"12\""}]`)
	f.Add(`[{"op":"incr","key":"a","delta":18446744073709551615}]`)
	f.Add(`[{"op":"set","key":"a","value":"1"},{"op":"delete","key":"a","cas":"1"},{"op":"delete_cas","key":"a","cas":18446744073709551615}]`)
	f.Add(`[{"op":"delete","key":"a","cas":"\"1\" N0"},{"op":"delete","key":"a","cas":null}]`)
	f.Add(`[{"op":"cas","key":"a","value":"1","cas":"12@0a1b2c3d"},{"op":"delete","key":"a","cas":"\"1@0a1b2c3d\""}]`)
	f.Add(`[{"op":"delete","key":"a","cas":"1@00000000"},{"op":"cas","key":"a","value":"1","cas":"1@0a1b2c3d N0"}]`)
	f.Fuzz(func(t *testing.T, body string) {
		h := newTestHandler(t, &lineStore{fakeStore: newFake(), t: t})
		w := do(h, "POST", "/", body)
		if w.Code != 200 && w.Code != 400 && w.Code != 413 {
			t.Fatalf("batch %q = %d, want 200, 400 or 413", body, w.Code)
		}
	})
}

// lineStore is a fake that fails its test when an operation would send
// memcached (its key aside) more than one line, or a CAS value that is
// not digits alone.
type lineStore struct {
	*fakeStore
	t *testing.T
}

func (s *lineStore) Do(ctx context.Context, o op.Op) op.Result {
	if o.Verb.Valid() {
		line := string(op.EncodeHead(nil, &o, "k"))
		if strings.Count(line, "\r\n") != 1 || strings.ContainsAny(line, "@\"") {
			s.t.Errorf("%v sends %q", o.Verb, line)
		}
	}
	return s.fakeStore.Do(ctx, o)
}

// keyErrStore is a fake whose keys listed in errs fail with their error;
// the others behave as the fake does.
type keyErrStore struct {
	*fakeStore
	errs map[string]error
}

func (s *keyErrStore) Do(ctx context.Context, o op.Op) op.Result {
	if err := s.errs[o.Item.Key]; err != nil {
		return op.Result{Err: err}
	}
	return s.fakeStore.Do(ctx, o)
}

func (s *keyErrStore) GetMulti(ctx context.Context, keys []string, limit int, room op.Room) (map[string]op.Item, map[string]error) {
	var rest []string
	failed := map[string]error{}
	for _, k := range keys {
		if err := s.errs[k]; err != nil {
			failed[k] = err
		} else {
			rest = append(rest, k)
		}
	}
	found, more := s.fakeStore.GetMulti(ctx, rest, limit, room)
	maps.Copy(failed, more)
	return found, failed
}

// TestAnswerStatus: a multi-get or batch answers 503 when not one of its
// items reached memcached, so that load balancers, the 5xx metric and its
// alert see the outage; a partial failure stays 200 with each item's own
// status (docs/http-api.md, "The status of a multi-get or batch answer").
func TestAnswerStatus(t *testing.T) {
	noNode := upstream.ErrNoNodes
	refused := &upstream.NodeError{Node: "mc1:11211", Op: "get", Err: syscall.ECONNREFUSED}
	timeout := context.DeadlineExceeded
	tests := []struct {
		name      string
		method    string
		target    string
		body      string
		errs      map[string]error
		want      int
		wantRetry bool
		wantItems []int
	}{
		{"multi-get, every node down", "GET", "/?key=a&key=b", "", map[string]error{"a": noNode, "b": noNode}, 503, true, []int{503, 503}},
		{"multi-get, every read timed out", "GET", "/?key=a&key=b", "", map[string]error{"a": timeout, "b": timeout}, 503, false, []int{504, 504}},
		{"multi-get, refused and timed out", "GET", "/?key=a&key=b", "", map[string]error{"a": refused, "b": timeout}, 503, true, []int{502, 504}},
		{"multi-get, one key answered", "GET", "/?key=a&key=b", "", map[string]error{"a": noNode}, 200, false, []int{503, 200}},
		{"multi-get, one key a miss", "GET", "/?key=a&key=nope", "", map[string]error{"a": noNode}, 200, false, []int{503, 404}},
		{"multi-get, all misses", "GET", "/?key=x&key=y", "", nil, 200, false, []int{404, 404}},
		{"gat multi-get, every node down", "GET", "/?key=a&key=b&touch=10", "", map[string]error{"a": noNode, "b": noNode}, 503, true, []int{503, 503}},
		{"batch, every node down", "POST", "/", `[{"op":"set","key":"a","value":"1"},{"op":"get","key":"b"},{"op":"delete","key":"a"}]`,
			map[string]error{"a": noNode, "b": noNode}, 503, true, []int{503, 503, 503}},
		{"batch, a bad op among failures", "POST", "/", `[{"op":"set","key":"a","value":"1"},{"op":"explode","key":"b"}]`,
			map[string]error{"a": noNode, "b": noNode}, 200, false, []int{503, 400}},
		{"batch, one write applied", "POST", "/", `[{"op":"set","key":"a","value":"1"},{"op":"set","key":"c","value":"1"}]`,
			map[string]error{"a": noNode}, 200, false, []int{503, 201}},
		{"batch, memcached refused every write", "POST", "/", `[{"op":"add","key":"b","value":"1"}]`, nil, 200, false, []int{412}},
		// A replicated write that a replica answered reached memcached,
		// though too few replicas for its policy: its own result is the
		// single-key answer's, the batch's is 200.
		{"batch, every write partly applied", "POST", "/", `[{"op":"set","key":"a","value":"1"}]`,
			map[string]error{"a": &upstream.PartlyAppliedError{Msg: "set reached 1 of 2 replicas", Answered: 1, Sent: 2, Failed: []string{"mc1:11211"}, Err: refused}}, 200, false, []int{502}},
		{"batch, every write reached no replica", "POST", "/", `[{"op":"set","key":"a","value":"1"}]`,
			map[string]error{"a": &upstream.PartlyAppliedError{Msg: "set reached 0 of 2 replicas", Sent: 2, Failed: []string{"mc1:11211", "mc2:11211"}, Err: refused}}, 503, true, []int{502}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &keyErrStore{fakeStore: newFake(), errs: tt.errs}
			s.Put(op.Item{Key: "b", Value: []byte("v")})
			w := do(newTestHandler(t, s), tt.method, tt.target, tt.body)
			if w.Code != tt.want {
				t.Errorf("%s %s = %d, want %d", tt.method, tt.target, w.Code, tt.want)
			}
			if got := w.Header().Get("Retry-After") != ""; got != tt.wantRetry {
				t.Errorf("Retry-After %q, want it set: %v", w.Header().Get("Retry-After"), tt.wantRetry)
			}
			if ct := w.Header().Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q, want the results as JSON whatever the status", ct)
			}
			res := decodeResults(t, w.Body.String())
			var got []int
			for _, r := range res {
				got = append(got, r.Status)
			}
			if !slices.Equal(got, tt.wantItems) {
				t.Errorf("item statuses %v, want %v", got, tt.wantItems)
			}
		})
	}
}

// TestDecodeBatch: the forms a batch body may take, and how each wrong
// one fails, with the whole batch.
func TestDecodeBatch(t *testing.T) {
	get := func(k string) string { return `{"op":"get","key":"` + k + `"}` }
	tests := []struct {
		name    string
		body    string
		maxOps  int
		want    []string // the keys of the operations decoded
		wantErr string   // part of the 400's message; "" for none
	}{
		{"bare array", `[` + get("a") + `,` + get("b") + `]`, 10, []string{"a", "b"}, ""},
		{"wrapper", `{"ops":[` + get("a") + `]}`, 10, []string{"a"}, ""},
		{"whitespace around", " \t\r\n[ " + get("a") + " ]\n ", 10, []string{"a"}, ""},
		{"wrapper and fields in any case", `{"OPS":[{"OP":"get","Key":"a"}]}`, 10, []string{"a"}, ""},
		{"a second ops", `{"ops":[` + get("a") + `],"ops":[` + get("b") + `,` + get("c") + `]}`, 10, nil, "batch has more than one \"ops\" member"},
		{"a second ops in another case", `{"ops":[],"Ops":[]}`, 10, nil, "more than one \"ops\""},
		{"exactly maxOps", `[` + get("a") + `,` + get("b") + `]`, 2, []string{"a", "b"}, ""},
		{"null", `null`, 10, nil, ""},
		{"empty array", `[]`, 10, nil, ""},
		{"empty wrapper", `{}`, 10, nil, ""},
		{"null ops", `{"ops":null}`, 10, nil, ""},
		{"one over maxOps", `[` + get("a") + `,` + get("b") + `,` + get("c") + `]`, 2, nil, "batch has more than 2 operations; at most 2"},
		{"over maxOps in the wrapper", `{"ops":[{},{},{}]}`, 2, nil, "batch has more than 2 operations; at most 2"},
		{"over maxOps before a bad element", `[{},{},"x"]`, 2, nil, "more than 2 operations"},
		{"a number", `[0]`, 10, nil, "batch operation 0 is a number, not an object"},
		{"a string after an op", `[` + get("a") + `,"x"]`, 10, nil, "batch operation 1 is a string, not an object"},
		{"an array", `[[` + get("a") + `]]`, 10, nil, "batch operation 0 is an array, not an object"},
		{"a bool", `[true]`, 10, nil, "batch operation 0 is a bool, not an object"},
		{"null element", `[null]`, 10, nil, "batch operation 0 is null, not an object"},
		{"a bad element before a syntax error", `[0,}`, 10, nil, "batch operation 0 is a number"},
		{"top-level number", `12`, 10, nil, "batch is a number, not {\"ops\":[…]} or an array of operations"},
		{"top-level string", `"ops"`, 10, nil, "batch is a string"},
		{"ops not an array", `{"ops":{}}`, 10, nil, "batch \"ops\" is an object, not an array of operations"},
		{"unknown op field", `[{"op":"get","key":"a","bogus":1}]`, 10, nil, `json: unknown field "bogus"`},
		{"unknown wrapper field", `{"ops":[` + get("a") + `],"x":1}`, 10, nil, `json: unknown field "x"`},
		{"wrong field type", `[{"op":1,"key":"a"}]`, 10, nil, "cannot unmarshal number into Go struct field batchOp.op of type string"},
		// An empty POST / is most often a POST /{key}?op= whose key was
		// left out: "not valid JSON: EOF" said neither.
		{"empty body", ``, 10, nil, `batch body is empty: POST / takes {"ops":[…]}; one key's operation is POST /{key}?op=…`},
		{"blank body", " \r\n", 10, nil, "batch body is empty"},
		{"not JSON", `not json`, 10, nil, "batch is not valid JSON"},
		{"cut short", `[` + get("a"), 10, nil, "unexpected EOF"},
		{"cut short in the wrapper", `{"ops":[` + get("a") + `]`, 10, nil, "unexpected EOF"},
		{"trailing comma", `[` + get("a") + `,]`, 10, nil, "invalid character ']'"},
		{"data after", `[` + get("a") + `] x`, 10, nil, "batch has data after its JSON value"},
		{"a second value after", `{"ops":[` + get("a") + `]} {}`, 10, nil, "batch has data after its JSON value"},
		{"a closing bracket after", `[` + get("a") + `]]`, 10, nil, "batch has data after its JSON value"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ops, err := decodeBatch([]byte(tt.body), tt.maxOps)
			if tt.wantErr != "" {
				_, msg, _ := errorStatus(err)
				if err == nil || !strings.Contains(msg, tt.wantErr) {
					t.Fatalf("decodeBatch(%q) = %d ops, %v; want an error with %q", tt.body, len(ops), err, tt.wantErr)
				}
				if status, _, _ := errorStatus(err); status != 400 {
					t.Errorf("decodeBatch(%q) error status %d, want 400", tt.body, status)
				}
				return
			}
			if err != nil {
				t.Fatalf("decodeBatch(%q): %v", tt.body, err)
			}
			var keys []string
			for _, o := range ops {
				keys = append(keys, o.Key)
			}
			if !slices.Equal(keys, tt.want) {
				t.Errorf("decodeBatch(%q) keys %q, want %q", tt.body, keys, tt.want)
			}
		})
	}
}

// TestBatchManyElements: a body of many tiny elements fails with 400 at
// its first element that is not an object, or as soon as it has more than
// BatchMaxOps operations, having allocated little more than the body,
// not the ~104 bytes per element of decoding the array whole (finding F1).
func TestBatchManyElements(t *testing.T) {
	const size = 1 << 20
	array := func(elem string) string { // [elem,elem,…], under size bytes even with a wrapper around
		n := (size - 64) / (len(elem) + 1)
		return "[" + strings.Repeat(elem+",", n-1) + elem + "]"
	}
	tests := []struct {
		name  string
		body  string
		async bool
		want  string // part of the 400's message
	}{
		{"zeros", array("0"), false, "batch operation 0 is a number, not an object"},
		{"nulls", array("null"), false, "batch operation 0 is null, not an object"},
		{"zeros in the wrapper", `{"ops":` + array("0") + `}`, false, "batch operation 0 is a number, not an object"},
		{"empty objects", array("{}"), false, "batch has more than 1000 operations"},
		{"gets", array(`{"op":"get","key":"a"}`), false, "batch has more than 1000 operations"},
		{"ops after a first one", `[{"op":"get","key":"a"},` + array("0")[1:], false, "batch operation 1 is a number, not an object"},
		{"empty objects, asynchronous", array("{}"), true, "batch has more than 1000 operations"},
	}
	h := newTestHandler(t, newFake())
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var hdr []string
			if tt.async {
				hdr = []string{"Prefer", "respond-async"}
			}
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			w := do(h, "POST", "/", tt.body, hdr...)
			runtime.ReadMemStats(&after)
			if w.Code != 400 || !strings.Contains(w.Body.String(), tt.want) {
				t.Errorf("batch of %d bytes = %d %q, want 400 %q", len(tt.body), w.Code, w.Body.String(), tt.want)
			}
			// The body itself is read once (its buffer may double while
			// it grows); the operations decoded add ~100 KiB.
			if got := after.TotalAlloc - before.TotalAlloc; got > 4*uint64(len(tt.body)) {
				t.Errorf("batch of %d bytes allocated %d bytes, want under 4× the body", len(tt.body), got)
			}
		})
	}
}

// TestBatchMaxOps: a batch of exactly BatchMaxOps operations runs, in
// either form; one more fails whole.
func TestBatchMaxOps(t *testing.T) {
	const maxOps = 1000 // Options default
	sets := func(n int) string {
		ops := make([]string, n)
		for i := range ops {
			ops[i] = `{"op":"set","key":"k` + strconv.Itoa(i) + `","value":"v"}`
		}
		return strings.Join(ops, ",")
	}
	tests := []struct {
		name  string
		body  string
		async bool
		want  int
	}{
		{"array of BatchMaxOps", "[" + sets(maxOps) + "]", false, 200},
		{"wrapper of BatchMaxOps", `{"ops":[` + sets(maxOps) + "]}", false, 200},
		{"asynchronous, BatchMaxOps", "[" + sets(maxOps) + "]", true, 202},
		{"array of BatchMaxOps+1", "[" + sets(maxOps+1) + "]", false, 400},
		{"wrapper of BatchMaxOps+1", `{"ops":[` + sets(maxOps+1) + "]}", false, 400},
		{"asynchronous, BatchMaxOps+1", "[" + sets(maxOps+1) + "]", true, 400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newFake()
			log := slog.New(slog.NewTextHandler(io.Discard, nil))
			h := NewHandler(s, log, prometheus.NewRegistry(), Options{AsyncQueue: 2 * maxOps})
			var hdr []string
			if tt.async {
				hdr = []string{"Prefer", "respond-async"}
			}
			w := do(h, "POST", "/", tt.body, hdr...)
			if w.Code != tt.want {
				t.Fatalf("batch = %d %.100q, want %d", w.Code, w.Body.String(), tt.want)
			}
			switch w.Code {
			case 200:
				if res := decodeResults(t, w.Body.String()); len(res) != maxOps {
					t.Errorf("batch gave %d results, want %d", len(res), maxOps)
				}
				if len(s.Items) != maxOps {
					t.Errorf("batch stored %d items, want %d", len(s.Items), maxOps)
				}
			case 400:
				if want := "batch has more than 1000 operations; at most 1000 (MEMCGATE_BATCH_MAX_OPS)"; !strings.Contains(w.Body.String(), want) {
					t.Errorf("batch = 400 %q, want %q", w.Body.String(), want)
				}
				if len(s.Items) != 0 {
					t.Errorf("a refused batch stored %d items", len(s.Items))
				}
			}
		})
	}
}

// TestMultiGetMaxKeys: a multi-get of BatchMaxOps keys runs; one more is
// refused whole, unsent, with a 400 that names the setting to raise.
func TestMultiGetMaxKeys(t *testing.T) {
	const maxOps = 1000 // Options default
	query := func(n int) string {
		var b strings.Builder
		for i := range n {
			if i > 0 {
				b.WriteByte('&')
			}
			b.WriteString("key=k" + strconv.Itoa(i))
		}
		return b.String()
	}
	for _, tt := range []struct {
		keys int
		want int
	}{{maxOps, 200}, {maxOps + 1, 400}} {
		s := newFake()
		h := NewHandler(s, slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry(), Options{})
		w := do(h, "GET", "/?"+query(tt.keys), "")
		if w.Code != tt.want {
			t.Fatalf("multi-get of %d keys = %d %.100q, want %d", tt.keys, w.Code, w.Body.String(), tt.want)
		}
		if w.Code == 400 {
			if want := "multi-get of 1001 keys; at most 1000 (MEMCGATE_BATCH_MAX_OPS)"; !strings.Contains(w.Body.String(), want) {
				t.Errorf("multi-get = 400 %q, want %q", w.Body.String(), want)
			}
		}
	}
}

// jsonLen is the length setValue counts for value b in an answer.
func jsonLen(b []byte) int {
	var res batchResult
	res.setValue(b)
	return res.valueLen
}

// marshalledLen is how many bytes the answer writer gives value b,
// without the quotes: setValue, then appendJSON as writeResults.
func marshalledLen(t *testing.T, b []byte) int {
	t.Helper()
	var res batchResult
	res.setValue(b)
	out := res.appendJSON(nil)
	res.value = nil
	return len(out) - len(res.appendJSON(nil)) - len(`,"value":""`)
}

// TestJSONLen: jsonLen counts what the answer writer writes, byte for
// byte, U+2028 and U+2029 as the 6 bytes of \u2028 (finding F6).
func TestJSONLen(t *testing.T) {
	tests := []struct {
		name string
		b    string
	}{
		{"empty", ""},
		{"plain", "hello, world"},
		{"quote and backslash", `"\"\\`},
		{"short escapes", "\b\f\n\r\t"},
		{"control bytes", "\x00\x01\x0b\x1f"},
		{"DEL is not escaped", "\x7f"},
		{"HTML", "<a href='x'>&amp;</a>"},
		{"U+2028 and U+2029", "\u2028\u2029"},
		{"next to U+2028", "\u2027\u202a\u2020"},
		{"U+2028 at the end", "x\u2028"},
		{"multi-byte", "é€😀\ufffd"},
		{"invalid UTF-8", "\xff"},
		{"U+2028 cut short", "\xe2\x80"},
		{"invalid among U+2028", "\u2028\xff\u2029"},
		{"surrogate half", "\xed\xa0\x80"},
		{"binary", "\x00\x01\x02\xfe\xff"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got, want := jsonLen([]byte(tt.b)), marshalledLen(t, []byte(tt.b)); got != want {
				t.Errorf("jsonLen(%q) = %d, want %d", tt.b, got, want)
			}
		})
	}
	t.Run("random", func(t *testing.T) {
		pieces := []string{"a", "\"", "\\", "\x00", "\x1f", "\b", "\n", "<", "&", "\u2028", "\u2029", "\u2027", "é", "😀", "\xe2", "\x80", "\xa8", "\xff"}
		rng := rand.New(rand.NewPCG(1, 2))
		for range 2000 {
			var b []byte
			for range rng.IntN(40) {
				if rng.IntN(8) == 0 { // now and then a byte that breaks UTF-8
					b = append(b, byte(rng.IntN(256)))
				} else {
					b = append(b, pieces[rng.IntN(len(pieces)-4)]...)
				}
			}
			if got, want := jsonLen(b), marshalledLen(t, b); got != want {
				t.Fatalf("jsonLen(%q) = %d, want %d", b, got, want)
			}
		}
	})
}

func FuzzJSONLen(f *testing.F) {
	f.Add([]byte("\u2028<&>\"\\\n\x00"))
	f.Add([]byte("\xe2\x80\xa8\xff"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, want := jsonLen(b), marshalledLen(t, b); got != want {
			t.Fatalf("jsonLen(%q) = %d, want %d", b, got, want)
		}
	})
}

// TestMultiGetAnswerRoom: the values of a multi-get's answer take at most
// BatchMaxResponseBytes, as written, whatever they hold: U+2028 too,
// which takes twice its UTF-8 bytes (finding F6).
func TestMultiGetAnswerRoom(t *testing.T) {
	const room = 4096
	tests := []struct {
		name  string
		value string
	}{
		{"ASCII", strings.Repeat("x", 300)},
		{"U+2028", strings.Repeat("\u2028", 100)},
		{"U+2029", strings.Repeat("\u2029", 100)},
		{"HTML", strings.Repeat("<&>", 100)},
		{"control bytes", strings.Repeat("\x01", 300)},
		{"not UTF-8", strings.Repeat("\xff", 300)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newFake()
			var q []string
			for i := range 40 {
				k := "k" + strconv.Itoa(i)
				s.Put(op.Item{Key: k, Value: []byte(tt.value)})
				q = append(q, "key="+k)
			}
			log := slog.New(slog.NewTextHandler(io.Discard, nil))
			h := NewHandler(s, log, prometheus.NewRegistry(), Options{BatchMaxResponseBytes: room})
			w := do(h, "GET", "/?"+strings.Join(q, "&"), "")
			if w.Code != 200 {
				t.Fatalf("multi-get = %d %q, want 200", w.Code, w.Body.String())
			}
			var raw struct {
				Results []struct {
					Status int             `json:"status"`
					Value  json.RawMessage `json:"value"`
				} `json:"results"`
			}
			if err := json.Unmarshal(w.Body.Bytes(), &raw); err != nil {
				t.Fatalf("answer is not results JSON: %v", err)
			}
			written, found := 0, 0
			for _, r := range raw.Results {
				if r.Status == 200 {
					written += len(r.Value) - 2
					found++
				}
			}
			if written > room {
				t.Errorf("answer carries %d bytes of values, want at most %d", written, room)
			}
			if found == 0 || found == len(raw.Results) {
				t.Errorf("%d of %d values answered, want some but not all to fit", found, len(raw.Results))
			}
		})
	}
}

// gatedStore is a Store whose operations wait until gate closes,
// counting how many wait at once.
type gatedStore struct {
	*fakeStore
	gate      chan struct{}
	cur, peak atomic.Int64
}

func (g *gatedStore) Do(ctx context.Context, o op.Op) op.Result {
	n := g.cur.Add(1)
	for p := g.peak.Load(); n > p && !g.peak.CompareAndSwap(p, n); p = g.peak.Load() {
	}
	select {
	case <-g.gate:
	case <-ctx.Done():
	}
	g.cur.Add(-1)
	return g.fakeStore.Do(ctx, o)
}

// TestBatchesShareParallelism sends four batches of 1000 deletes of
// distinct keys at once against a store that holds every operation: all
// batches together work on batchParallel keys at most, each on a
// goroutine, instead of a goroutine per key, and every operation is
// still answered once the store lets them go.
func TestBatchesShareParallelism(t *testing.T) {
	s := &gatedStore{fakeStore: newFake(), gate: make(chan struct{})}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	h := NewHandler(s, log, prometheus.NewRegistry(), Options{RequestTimeout: time.Minute})
	base := runtime.NumGoroutine()
	const batches, perBatch = 4, 1000
	codes := make(chan *httptest.ResponseRecorder, batches)
	for b := range batches {
		ops := make([]string, perBatch)
		for i := range ops {
			ops[i] = `{"op":"delete","key":"b` + strconv.Itoa(b) + `-` + strconv.Itoa(i) + `"}`
		}
		go func() {
			codes <- do(h, "POST", "/", "["+strings.Join(ops, ",")+"]", "Content-Type", "application/json")
		}()
	}
	for deadline := time.Now().Add(10 * time.Second); s.cur.Load() < batchParallel; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d operations of %d batches at once after 10 s, want batchParallel (%d)", s.cur.Load(), batches, batchParallel)
		}
	}
	// One more batch, its request ending after 200 ms: its one operation
	// must find no room, where starting would raise the peak past
	// batchParallel before the request ends.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	late := httptest.NewRequestWithContext(ctx, "POST", "/", strings.NewReader(`[{"op":"delete","key":"late"}]`))
	late.Header.Set("Content-Type", "application/json")
	h.ServeHTTP(httptest.NewRecorder(), late)
	if peak := s.peak.Load(); peak != batchParallel {
		t.Errorf("%d operations of %d batches at once, want batchParallel (%d)", peak, batches, batchParallel)
	}
	if g := runtime.NumGoroutine() - base; g > batchParallel+2*batches+16 {
		t.Errorf("%d goroutines for %d batches of %d keys, want about batchParallel (%d)", g, batches, perBatch, batchParallel)
	}
	close(s.gate)
	for range batches {
		w := <-codes
		if w.Code != 200 {
			t.Fatalf("batch = %d %s", w.Code, w.Body.String())
		}
		res := decodeResults(t, w.Body.String())
		if len(res) != perBatch {
			t.Fatalf("%d results, want %d", len(res), perBatch)
		}
		for _, r := range res {
			if r.Status != 404 {
				t.Fatalf("delete of a missing key = %+v, want 404", r)
			}
		}
	}
}

// TestBatchBookkeepingHeld: a batch's operations and a multi-get's keys
// are held against the byte budget (batchOpBytes each) while the request
// runs, so that many large batches at once meet MAX_BUFFERED_BYTES
// instead of growing the heap past it; and given back when it ends.
func TestBatchBookkeepingHeld(t *testing.T) {
	bg := budget.New(100 << 10) // room for 100 operations' bookkeeping
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	h := NewHandler(newFake(), log, prometheus.NewRegistry(), Options{Budget: bg})
	batch := func(n int) string {
		ops := make([]string, n)
		for i := range ops {
			ops[i] = `{"op":"get","key":"k` + strconv.Itoa(i) + `"}`
		}
		return `{"ops":[` + strings.Join(ops, ",") + `]}`
	}
	multi := func(n int) string {
		q := make([]string, n)
		for i := range q {
			q[i] = "key=k" + strconv.Itoa(i)
		}
		return "/?" + strings.Join(q, "&")
	}
	tests := []struct {
		name, method, target, body string
		want                       int
	}{
		{"batch within", "POST", "/", batch(90), 200},
		{"batch past", "POST", "/", batch(200), 503},
		{"multi-get within", "GET", multi(90), "", 200},
		{"multi-get past", "GET", multi(200), "", 503},
	}
	for _, tt := range tests {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(tt.method, tt.target, strings.NewReader(tt.body)))
		if w.Code != tt.want {
			t.Errorf("%s: %d %s, want %d", tt.name, w.Code, w.Body, tt.want)
		}
		if tt.want == 503 && !strings.Contains(w.Body.String(), "MEMCGATE_MAX_BUFFERED_BYTES") {
			t.Errorf("%s: 503 says %q, want the byte budget named", tt.name, w.Body)
		}
		if held := bg.Used(); held != 0 {
			t.Errorf("%s: %d bytes still held after the request", tt.name, held)
		}
	}
}
