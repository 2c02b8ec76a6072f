package gateway

import (
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/memcgate/memcgate/upstream"
)

// boundValue is the size of the values the tests of what a multi-get or
// batch makes memcached send: 1 MB, as the attack review's key held.
const boundValue = 1_000_000

// boundRoom is the answer room of newBoundRig's handler
// (BatchMaxResponseBytes): room for 16 such values.
const boundRoom = 16 << 20

// newBoundRig is a bigRig without values in chunks, whose items take
// values of boundValue bytes, with the default answer room (16 MiB).
func newBoundRig(t *testing.T) *bigRig {
	t.Helper()
	return newBigRig(t, func(o *Options, _ *upstream.Cluster) {
		o.MaxValueBytes, o.BigValueMaxBytes, o.BatchMaxResponseBytes = boundValue+1000, 0, boundRoom
	})
}

// written is the bytes the rig's memcached servers have written so far
// (stats bytes_written, summed).
func (g *bigRig) written() int {
	g.t.Helper()
	n := 0
	for _, m := range g.mcs {
		st, err := m.Stats()
		if err != nil {
			g.t.Fatal(err)
		}
		c, err := strconv.Atoi(st["bytes_written"])
		if err != nil {
			g.t.Fatalf("bytes_written %q: %v", st["bytes_written"], err)
		}
		n += c
	}
	return n
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

// TestMultiGetTouchReadsEachKeyOnce: a multi-get with touch of one 1 MB
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
