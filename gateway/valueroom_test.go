package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/memcgate/memcgate/gateway/budget"
	"github.com/memcgate/memcgate/upstream"
	"github.com/memcgate/memcgate/upstream/op"
)

// TestMultiKeyReadsHeldByTheBudget: the values a multi-get or batch
// reads are held against the byte budget from before each is read, so
// that the budget decides which of them the answer carries rather than
// whether all of them are thrown away once read: with room for three of
// six values, three come back and three answer 503 inside a 200, and
// with no room at all the answer is 503 with Retry-After. Nothing stays
// held once the requests end.
func TestMultiKeyReadsHeldByTheBudget(t *testing.T) {
	const n, size = 6, 300_000
	bg := budget.New(2 << 20) // room for three of the values, each held twice: itself and its place in the JSON answer
	g := newBigRig(t, func(o *Options, _ *upstream.Cluster) { o.Budget = bg })
	var keys []string
	for i := range n {
		k := fmt.Sprintf("vr%d", i)
		keys = append(keys, "key="+k)
		if res := g.cluster.Do(t.Context(), op.Op{Verb: op.Set, Item: op.Item{Key: k, Value: bytes.Repeat([]byte("v"), size)}}); res.Err != nil {
			t.Fatal(res.Err)
		}
	}
	multi := "/?" + strings.Join(keys, "&")
	tests := []struct {
		name       string
		path       string
		taken      int64 // of the budget, by someone else, during the request
		wantStatus int
		want200    int // results of 200 inside the answer
		want503    int
	}{
		{"multi-get", multi, 0, http.StatusOK, 3, 3},
		{"multi-get with touch (a batch of gats)", multi + "&touch=600", 0, http.StatusOK, 3, 3},
		{"multi-get, no room for a value", multi, 2<<20 - 16<<10, http.StatusServiceUnavailable, 0, n},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bg.Force(tt.taken)
			a := g.do("GET", tt.path, nil)
			bg.Release(tt.taken)
			if a.status != tt.wantStatus {
				t.Fatalf("status %d, want %d (%.200q)", a.status, tt.wantStatus, a.body)
			}
			if a.status == http.StatusServiceUnavailable && a.hdr.Get("Retry-After") == "" {
				t.Errorf("503 without Retry-After")
			}
			{
				var ans struct {
					Results []struct {
						Status int     `json:"status"`
						Value  *string `json:"value"`
					} `json:"results"`
				}
				if err := json.Unmarshal(a.body, &ans); err != nil {
					t.Fatalf("answer: %v", err)
				}
				got := map[int]int{}
				for _, r := range ans.Results {
					got[r.Status]++
					if r.Status == http.StatusOK && (r.Value == nil || len(*r.Value) != size) {
						t.Errorf("a 200 result without its %d-byte value", size)
					}
				}
				if got[http.StatusOK] != tt.want200 || got[http.StatusServiceUnavailable] != tt.want503 {
					t.Errorf("results by status %v, want %d × 200 and %d × 503", got, tt.want200, tt.want503)
				}
			}
			if used := bg.Used(); used != 0 {
				t.Errorf("the budget holds %d bytes after the request", used)
			}
		})
	}
}
