package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/gateway/chunk"
	"github.com/memcgate/memcgate/upstream"
	"github.com/memcgate/memcgate/upstream/op"
)

// headHook is the Store of a rig's values in chunks that runs between
// after each op.Head of key that it passes on, before handing the Head's
// answer back: a write of the key from another client that lands
// between an append's check of the item and the append itself.
type headHook struct {
	chunk.Store
	key     string
	between atomic.Pointer[func(head int)] // head counts key's Heads from 1; nil: none
	heads   atomic.Int32
}

func (h *headHook) Do(ctx context.Context, o op.Op) op.Result {
	res := h.Store.Do(ctx, o)
	if f := h.between.Load(); f != nil && o.Verb == op.Head && o.Item.Key == h.key {
		(*f)(int(h.heads.Add(1)))
	}
	return res
}

// newHookedRig is a bigRig whose values in chunks go through a headHook
// on key.
func newHookedRig(t *testing.T, key string) (*bigRig, *headHook) {
	t.Helper()
	hook := &headHook{key: key}
	g := newBigRig(t, func(o *Options, c *upstream.Cluster) {
		hook.Store = c
		o.Chunks = chunk.New(hook, chunk.Options{ChunkSize: int(o.MaxValueBytes), Grace: o.BigValueGrace, Timeout: o.RequestTimeout}, prometheus.NewRegistry())
	})
	return g, hook
}

// TestBigValueAppendRacesPut: an append or prepend whose item changes
// between its check (is it an index?) and the append itself never
// reaches a value in chunks: the append is CAS-checked against the item
// it checked, and checks again when the item changed. Before, an index
// written by a PUT in between took the append's bytes, and the value was
// lost (reads answered 502).
func TestBigValueAppendRacesPut(t *testing.T) {
	big := value(3*rigChunk+5, "big")
	tests := []struct {
		name    string
		verb    string // append or prepend
		between func(put func(v []byte), del func(), head int)
		status  int
		msg     string
		want    []byte // the value read after; nil: a miss
	}{
		{
			name: "a value in chunks written meanwhile", verb: "append",
			between: func(put func([]byte), _ func(), head int) {
				if head == 1 {
					put(big)
				}
			},
			status: 409, msg: "stored in chunks", want: big,
		},
		{
			name: "a value in chunks written meanwhile, prepend", verb: "prepend",
			between: func(put func([]byte), _ func(), head int) {
				if head == 1 {
					put(big)
				}
			},
			status: 409, msg: "stored in chunks", want: big,
		},
		{
			name: "a small value written meanwhile", verb: "append",
			between: func(put func([]byte), _ func(), head int) {
				if head == 1 {
					put([]byte("new"))
				}
			},
			status: 201, want: []byte("new+"),
		},
		{
			name: "deleted meanwhile", verb: "append",
			between: func(_ func([]byte), del func(), head int) {
				if head == 1 {
					del()
				}
			},
			status: 404, msg: "not found",
		},
		{
			name: "written again before the first five tries", verb: "append",
			between: func(put func([]byte), _ func(), head int) {
				if head <= 5 {
					put([]byte("v" + strconv.Itoa(head)))
				}
			},
			status: 201, want: []byte("v5+"),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, hook := newHookedRig(t, "k")
			g.mustPut("/k", []byte("old"))
			// Run on the handler's goroutine: Errorf, never Fatalf.
			put := func(v []byte) {
				if a := g.put("/k", v); a.status != 201 {
					t.Errorf("PUT between = %d %q, want 201", a.status, a.body)
				}
			}
			del := func() {
				if a := g.do("DELETE", "/k", nil); a.status != 204 {
					t.Errorf("DELETE between = %d %q, want 204", a.status, a.body)
				}
			}
			between := func(head int) { tt.between(put, del, head) }
			hook.between.Store(&between)
			a := g.do("POST", "/k?op="+tt.verb, strings.NewReader("+"))
			hook.between.Store(nil)
			if a.status != tt.status || !strings.Contains(string(a.body), tt.msg) {
				t.Errorf("POST ?op=%s = %d %q, want %d %q", tt.verb, a.status, a.body, tt.status, tt.msg)
			}
			got := g.do("GET", "/k", nil)
			switch {
			case tt.want == nil && got.status != 404:
				t.Errorf("GET after = %d %.60q, want 404", got.status, got.body)
			case tt.want != nil && (got.status != 200 || !bytes.Equal(got.body, tt.want)):
				t.Errorf("GET after = %d %.60q (%d bytes), want 200 %.60q (%d bytes)", got.status, got.body, len(got.body), tt.want, len(tt.want))
			}
		})
	}
}

// TestBigValueAppend: with values in chunks on, append and prepend answer
// as they did: 404 for a missing key, the bytes added to a plain value,
// 409 for a value in chunks, which stays whole; through POST, a batch
// and a batch's asynchronous writes, on pipelined connections (which
// check the append against the item's CAS) and on gomemcache's pool
// (which has no meta set, and appends unchecked).
func TestBigValueAppend(t *testing.T) {
	big := value(2*rigChunk+1, "big")
	tests := []struct {
		name    string
		key     string // "plain" holds "abc", "big" big, "none" nothing
		verb    string
		via     string // "post", "batch" or "async" (a batch with Prefer: respond-async)
		status  int
		msg     string
		refused bool   // an asynchronous write that fails (counted refused); else applied
		want    []byte // read after; nil: a miss
		wantBig bool
	}{
		{name: "append to a missing key", key: "none", verb: "append", via: "post", status: 404, msg: "not found, or the value would pass memcached's item size"},
		{name: "append to a plain value", key: "plain", verb: "append", via: "post", status: 201, want: []byte("abc+")},
		{name: "prepend to a plain value", key: "plain", verb: "prepend", via: "post", status: 201, want: []byte("+abc")},
		{name: "append to a value in chunks", key: "big", verb: "append", via: "post", status: 409, msg: "stored in chunks", wantBig: true},
		{name: "prepend to a value in chunks", key: "big", verb: "prepend", via: "post", status: 409, msg: "stored in chunks", wantBig: true},
		{name: "batch append to a missing key", key: "none", verb: "append", via: "batch", status: 404},
		{name: "batch append to a plain value", key: "plain", verb: "append", via: "batch", status: 201, want: []byte("abc+")},
		{name: "batch prepend to a value in chunks", key: "big", verb: "prepend", via: "batch", status: 409, wantBig: true},
		{name: "async append to a plain value", key: "plain", verb: "append", via: "async", status: 202, want: []byte("abc+")},
		{name: "async append to a value in chunks", key: "big", verb: "append", via: "async", status: 202, refused: true, wantBig: true},
	}
	for _, pool := range []struct {
		name  string
		conns int
	}{{"pipelined", 2}, {"gomemcache", 0}} {
		t.Run(pool.name, func(t *testing.T) {
			g := newBigRigPool(t, pool.conns, nil, nil)
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					g.mustPut("/plain", []byte("abc"))
					g.mustPut("/big", big)
					applied := func() float64 {
						if tt.refused {
							return g.counter("memcgate_async_writes_failed_total", "reason", "refused")
						}
						return g.counterPlain("memcgate_async_writes_applied_total")
					}
					before := applied()
					var a answer
					switch tt.via {
					case "post":
						a = g.do("POST", "/"+tt.key+"?op="+tt.verb, strings.NewReader("+"))
					case "batch", "async":
						var hdr []string
						if tt.via == "async" {
							hdr = []string{"Prefer", "respond-async"}
						}
						a = g.do("POST", "/", strings.NewReader(`[{"op":"`+tt.verb+`","key":"`+tt.key+`","value":"+"}]`), hdr...)
						if tt.via == "async" {
							break // {"accepted":1}
						}
						var out struct {
							Results []struct {
								Status int    `json:"status"`
								Error  string `json:"error"`
							}
						}
						if err := json.Unmarshal(a.body, &out); err != nil || len(out.Results) != 1 {
							t.Fatalf("batch = %d %q: %v", a.status, a.body, err)
						}
						a.status, a.body = out.Results[0].Status, []byte(out.Results[0].Error)
					}
					if a.status != tt.status || !strings.Contains(string(a.body), tt.msg) {
						t.Errorf("%s %s = %d %q, want %d %q", tt.via, tt.verb, a.status, a.body, tt.status, tt.msg)
					}
					want := tt.want
					if tt.wantBig {
						want = big
					}
					if tt.via == "async" { // applied after the answer
						waitFor(t, "the asynchronous append", func() bool { return applied() > before })
					}
					got := g.do("GET", "/"+tt.key, nil)
					switch {
					case want == nil && got.status != 404:
						t.Errorf("GET after = %d %.60q, want 404", got.status, got.body)
					case want != nil && (got.status != 200 || !bytes.Equal(got.body, want)):
						t.Errorf("GET after = %d %.60q (%d bytes), want 200 %.60q (%d bytes)", got.status, got.body, len(got.body), want, len(want))
					}
				})
			}
		})
	}
}

// TestBigValueAppendContended: with values in chunks on, concurrent
// appends to one plain value all land, as memcached's append does. Each
// append is checked against the CAS it read, so they refuse each other;
// with three tries in all, 37 to 43 of 50 answered 409 and their bytes
// were lost.
func TestBigValueAppendContended(t *testing.T) {
	const n = 50
	g := newBigRig(t, nil)
	g.mustPut("/log", []byte{})
	var wg sync.WaitGroup
	statuses := make(chan int, n)
	for range n {
		wg.Go(func() { statuses <- g.do("POST", "/log?op=append", strings.NewReader("x")).status })
	}
	wg.Wait()
	close(statuses)
	got := map[int]int{}
	for s := range statuses {
		got[s]++
	}
	if got[201] != n {
		t.Errorf("%d concurrent POST ?op=append answered %v, want %d 201s", n, got, n)
	}
	if a := g.do("GET", "/log", nil); a.status != 200 || len(a.body) != n {
		t.Errorf("GET after = %d, %d bytes, want 200, %d bytes", a.status, len(a.body), n)
	}
}
