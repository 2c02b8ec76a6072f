package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream"
)

// boundValue is the size of the values the tests of what a multi-get or
// batch makes memcached send: a quarter of the attack review's 1 MB,
// with a quarter of the default answer room (boundRoom), so that the
// same counts of values fit and the tests write a quarter of the bytes
// (under the race detector, storing 1 MB values took most of a minute).
// Large values all the same: read into lent buffers, hinted, held.
const boundValue = 250_000

// boundRoom is the answer room of newBoundRig's handler
// (BatchMaxResponseBytes): room for 16 such values, as the default 16 MiB
// is for 1 MB values.
const boundRoom = 4 << 20

// newBoundRig is a bigRig without values in chunks, whose items take
// values of boundValue bytes, with an answer room of boundRoom; its
// memcached servers are started with args.
func newBoundRig(t *testing.T, args ...string) *bigRig {
	t.Helper()
	return newBoundRigPool(t, 2, args...)
}

// newBoundRigPool is newBoundRig with pipelineConns pipelined
// connections per node (0: gomemcache's pool). What the tests measure is
// bytes, not time: memcached's answers and the requests get a deadline
// (boundTimeout) that a loaded machine cannot reach while the tests
// store hundreds of large values and read them back under the race
// detector.
func newBoundRigPool(t *testing.T, pipelineConns int, args ...string) *bigRig {
	t.Helper()
	return newBigRigUpstream(t, upstream.Options{PipelineConns: pipelineConns, Timeout: boundTimeout}, args, func(o *Options, _ *upstream.Cluster) {
		o.MaxValueBytes, o.BigValueMaxBytes, o.BatchMaxResponseBytes = boundValue+1000, 0, boundRoom
		o.RequestTimeout = boundTimeout
	})
}

// boundTimeout is the deadline of newBoundRig's memcached operations and
// requests.
const boundTimeout = time.Minute

// written is the bytes the rig's memcached servers have written so far
// (stats bytes_written, summed).
func (g *bigRig) written() int {
	g.t.Helper()
	return memcachedtest.SumStat(g.t, "bytes_written", g.mcs...)
}

// statuses decodes a multi-get's or batch's answer: each result's key and
// status, in order.
func statuses(t *testing.T, a answer) []batchResult {
	t.Helper()
	if a.status != http.StatusOK {
		t.Fatalf("answer %d %.200q, want 200", a.status, a.body)
	}
	return decodeResults(t, string(a.body))
}

// countStatuses counts the results of each status.
func countStatuses(res []batchResult) map[int]int {
	n := map[int]int{}
	for _, r := range res {
		n[r.Status]++
	}
	return n
}

// TestMultiGetTouchReadsEachKeyOnce: a multi-get with touch of one large
// key named 1000 times sends one gat, not 1000: memcached writes about
// one value, every position still gets its result (the value while the
// answer has room, 507 after), and the item's expiration is set.
func TestMultiGetTouchReadsEachKeyOnce(t *testing.T) {
	g := newBoundRig(t)
	g.mustPut("/big", value(boundValue, "big"))
	g.mustPut("/small", []byte("s"))
	target := "/?" + strings.Repeat("key=big&", 998) + "key=small&key=big&touch=300"
	before := g.written()
	res := statuses(t, g.do("GET", target, nil))
	if n := g.written() - before; n > boundValue+64<<10 {
		t.Errorf("memcached wrote %d bytes for a multi-get with touch of one %d-byte key named 1000 times, want about one value", n, boundValue)
	}
	if len(res) != 1000 {
		t.Fatalf("%d results, want 1000", len(res))
	}
	fit := boundRoom / boundValue
	for i, r := range res {
		want := http.StatusOK
		switch {
		case i == 998:
			if r.Key != "small" || r.Status != http.StatusOK || *r.Value != "s" {
				t.Errorf("result %d = %+v, want small's value", i, r)
			}
			continue
		case i >= fit:
			want = http.StatusInsufficientStorage
		}
		if r.Key != "big" || r.Status != want || (want == http.StatusOK) != (r.Value != nil) {
			t.Fatalf("result %d = key %q, status %d, value %v; want big, %d", i, r.Key, r.Status, r.Value != nil, want)
		}
	}
	for _, k := range []string{"big", "small"} {
		for node, ttl := range g.ttls(k) {
			if ttl < 290 || ttl > 300 {
				t.Errorf("%s on %s: %d s to live after touch=300", k, node, ttl)
			}
		}
	}
}

// opsOf is one operation verb with exptime exp (nil: none) for each key
// of keys.
func opsOf(verb string, exp *int64, keys ...string) []batchOp {
	ops := make([]batchOp, len(keys))
	for i, k := range keys {
		ops[i] = batchOp{Op: verb, Key: k, Exptime: exp}
	}
	return ops
}

// batchBody is the body of a batch of ops.
func batchBody(ops []batchOp) []byte {
	b, err := json.Marshal(ops)
	if err != nil {
		panic(err)
	}
	return b
}

// repeat is key n times.
func repeat(key string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = key
	}
	return keys
}

// TestBatchReadsStopWithTheAnswerRoom: once a batch's answer has no room
// for a key's value, its reads of that key are not sent: a get answers
// 507, a gat sends a touch and answers 507 (404 for a missing key), so
// memcached writes about the answer room and one value more for 1000
// reads of one large key, not 1000 values, and the expiration is set.
func TestBatchReadsStopWithTheAnswerRoom(t *testing.T) {
	g := newBoundRig(t)
	g.mustPut("/big", value(boundValue, "big"))
	exp := int64(300)
	tests := []struct {
		name string
		ops  []batchOp
		last int // status of the last result
	}{
		{"gat", opsOf("gat", &exp, repeat("big", 1000)...), http.StatusInsufficientStorage},
		// a touch first: the gets are read one at a time, not as a multi-get
		{"get after a touch", append(opsOf("touch", &exp, "big"), opsOf("get", nil, repeat("big", 999)...)...), http.StatusInsufficientStorage},
		{"gat of a missing key last", opsOf("gat", &exp, append(repeat("big", 999), "nope")...), http.StatusNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g.do("POST", "/big?op=touch&exptime=5", nil)
			before := g.written()
			res := statuses(t, g.do("POST", "/", bytes.NewReader(batchBody(tt.ops))))
			if n := g.written() - before; n > boundRoom+2*boundValue {
				t.Errorf("memcached wrote %d bytes for a batch of 1000 reads of one %d-byte key, want at most the answer room and a value (%d)", n, boundValue, boundRoom+2*boundValue)
			}
			if len(res) != 1000 {
				t.Fatalf("%d results, want 1000", len(res))
			}
			n := countStatuses(res)
			if ok := n[http.StatusOK]; ok < boundRoom/boundValue-1 || ok > boundRoom/boundValue {
				t.Errorf("%d values in the answer, want the %d that fit: statuses %v", ok, boundRoom/boundValue, n)
			}
			if got := res[len(res)-1].Status; got != tt.last {
				t.Errorf("last result %d, want %d: statuses %v", got, tt.last, n)
			}
			if n[http.StatusServiceUnavailable] > 0 {
				t.Errorf("statuses %v: 503, the budget refusing values, where the answer room is full", n)
			}
			for node, ttl := range g.ttls("big") {
				if ttl < 290 || ttl > 300 {
					t.Errorf("big on %s: %d s to live after the batch, want about 300", node, ttl)
				}
			}
		})
	}
}

// TestBatchReadsOfManyKeysAreBounded: gats of many different large keys,
// more than the answer room takes, make memcached send at most twice the
// answer room and readParallel values, however many keys there are; each
// key is touched. With gomemcache's pool too, whose reads ask no Room.
func TestBatchReadsOfManyKeysAreBounded(t *testing.T) {
	for _, conns := range []int{2, 0} {
		t.Run(fmt.Sprint("pipeline_conns=", conns), func(t *testing.T) { batchReadsOfManyKeysAreBounded(t, conns) })
	}
}

func batchReadsOfManyKeysAreBounded(t *testing.T, pipelineConns int) {
	g := newBoundRigPool(t, pipelineConns)
	const keys = 100
	var names []string
	for i := range keys {
		k := "big" + strconv.Itoa(i)
		g.mustPut("/"+k, value(boundValue, k))
		names = append(names, k)
	}
	exp := int64(300)
	before := g.written()
	res := statuses(t, g.do("POST", "/", bytes.NewReader(batchBody(opsOf("gat", &exp, names...)))))
	limit := 2*boundRoom + readParallel*boundValue
	if n := g.written() - before; n > limit {
		t.Errorf("memcached wrote %d bytes for gats of %d different %d-byte keys, want at most %d", n, keys, boundValue, limit)
	}
	if n := countStatuses(res); n[http.StatusOK] == 0 || n[http.StatusOK]+n[http.StatusInsufficientStorage]+n[http.StatusServiceUnavailable] != keys {
		t.Errorf("statuses %v, want values, then 507 (or 503 where the budget was full)", n)
	}
	for _, k := range names {
		for node, ttl := range g.ttls(k) {
			if ttl < 290 || ttl > 300 {
				t.Errorf("%s on %s: %d s to live after the batch, want about 300", k, node, ttl)
			}
		}
	}
}

// TestMultiGetOfManyKeysIsBounded: a plain multi-get (no touch) of 200
// different large keys asks memcached their sizes first and reads only
// the values that fit the answer room: memcached writes about the room,
// not 200 values. The keys read answer 200 with their values, the others
// present 507, the missing one 404.
func TestMultiGetOfManyKeysIsBounded(t *testing.T) {
	g := newBoundRig(t, "-m", "256")
	const keys = 200
	var b strings.Builder
	b.WriteString("/?")
	for i := range keys {
		k := "big" + strconv.Itoa(i)
		g.mustPut("/"+k, value(boundValue, k))
		fmt.Fprintf(&b, "key=%s&", k)
	}
	b.WriteString("key=absent")
	before := g.written()
	res := statuses(t, g.do("GET", b.String(), nil))
	if n := g.written() - before; n > 2*boundRoom+64<<10 {
		t.Errorf("memcached wrote %d bytes for a multi-get of %d different %d-byte keys, want less than twice the answer room (%d)", n, keys, boundValue, 2*boundRoom)
	}
	if len(res) != keys+1 {
		t.Fatalf("%d results, want %d", len(res), keys+1)
	}
	if r := res[keys]; r.Key != "absent" || r.Status != http.StatusNotFound {
		t.Errorf("the missing key's result = %+v, want 404", r)
	}
	n := countStatuses(res[:keys])
	if n[http.StatusOK] < boundRoom/boundValue/2 || n[http.StatusOK]+n[http.StatusInsufficientStorage] != keys {
		t.Errorf("statuses %v, want at least %d values, the rest 507", n, boundRoom/boundValue/2)
	}
	for _, r := range res[:keys] {
		if r.Status == http.StatusOK && (r.Value == nil || len(*r.Value) != boundValue) {
			t.Errorf("%s: 200 without its %d-byte value", r.Key, boundValue)
		}
	}
}
