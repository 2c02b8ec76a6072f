package gateway

import (
	"bytes"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/memcgate/memcgate/gateway/chunk"
)

// TestConditionalDelete: DELETE /{key} with If-Match against real
// memcached, on both pools (gomemcache's sends md on connections of its
// own, as it does a HEAD's mg), for values in one item and in chunks: it
// deletes only the version the ETag names (md C<cas>), answers 412 when
// another write came between or the item is gone, If-Match: * deletes
// only an item that exists, and a value in chunks has its chunks retired
// only when its index was deleted.
func TestConditionalDelete(t *testing.T) {
	tests := []struct {
		name    string
		size    int                 // 0: no item
		between bool                // another PUT of the key after the GET
		ifMatch func(string) string // from the ETag a GET returned
		want    int
	}{
		{name: "unchanged", size: 10, ifMatch: same, want: 204},
		{name: "written between", size: 10, between: true, ifMatch: same, want: 412},
		{name: "gone", ifMatch: func(string) string { return `"12345"` }, want: 412},
		{name: "any", size: 10, ifMatch: star, want: 204},
		{name: "any, gone", ifMatch: star, want: 412},
		{name: "chunked unchanged", size: 4 * rigChunk, ifMatch: same, want: 204},
		{name: "chunked written between", size: 4 * rigChunk, between: true, ifMatch: same, want: 412},
		{name: "chunked any", size: 4 * rigChunk, ifMatch: star, want: 204},
	}
	for _, pool := range []int{2, 0} {
		g := newBigRigPool(t, pool, nil, nil)
		for _, tt := range tests {
			t.Run(tt.name+"/pipeline_conns="+strconv.Itoa(pool), func(t *testing.T) {
				key := strings.NewReplacer(" ", "_", ",", "").Replace(tt.name)
				etag, now := "", []byte(nil)
				var x chunk.Index
				if tt.size > 0 {
					g.mustPut("/"+key, value(tt.size, key))
					a := g.do("GET", "/"+key, nil)
					etag, now = a.hdr.Get("ETag"), a.body
					if a.status != 200 || etag == "" {
						t.Fatalf("GET = %d, ETag %q", a.status, etag)
					}
					if tt.size > rigChunk {
						x = g.index(key)
					}
				}
				if tt.between {
					now = value(tt.size, key+"-2")
					g.mustPut("/"+key, now)
					if tt.size > rigChunk {
						x = g.index(key)
					}
				}
				a := g.do("DELETE", "/"+key, nil, "If-Match", tt.ifMatch(etag))
				if a.status != tt.want {
					t.Fatalf("DELETE, If-Match %s = %d %q, want %d", tt.ifMatch(etag), a.status, a.body, tt.want)
				}
				after := g.do("GET", "/"+key, nil)
				switch {
				case tt.want == 204 || tt.size == 0:
					if after.status != 404 {
						t.Errorf("GET after = %d, want 404", after.status)
					}
				case after.status != 200 || !bytes.Equal(after.body, now):
					t.Errorf("GET after = %d, %d bytes, want 200 and the value written last", after.status, len(after.body))
				}
				if tt.size <= rigChunk {
					return
				}
				// The chunks of the index deleted are retired (they
				// expire within the grace period); those of an index
				// left in place are not (they never expire).
				for c, on := range g.chunkTTLs(key, x) {
					for _, ttl := range on {
						if retired := ttl >= 0 && ttl <= int(rigGrace/time.Second); retired != (tt.want == 204) {
							t.Errorf("chunk %d has TTL %d after the DELETE, want retired %v", c, ttl, tt.want == 204)
						}
					}
				}
			})
		}
	}
}

func same(etag string) string { return etag }
func star(string) string      { return "*" }

// TestConditionalDeleteBatch: a batch's delete with a cas is the same
// compare-and-delete against real memcached: deleted while the cas is
// the item's, 412 once another write came between or the item is gone.
func TestConditionalDeleteBatch(t *testing.T) {
	g := newBigRig(t, nil)
	for _, k := range []string{"a", "b"} {
		g.mustPut("/"+k, []byte("v"))
	}
	cas := func(k string) string {
		it, err := g.item(k)
		if err != nil {
			t.Fatal(err)
		}
		return strconv.FormatUint(it.CAS, 10)
	}
	ca, cb := cas("a"), cas("b")
	g.mustPut("/b", []byte("w")) // b changes after its cas was read
	body := `{"ops":[
		{"op":"delete","key":"a","cas":"` + ca + `"},
		{"op":"delete","key":"b","cas":` + cb + `},
		{"op":"delete","key":"a","cas":"` + ca + `"}
	]}`
	a := g.do("POST", "/", strings.NewReader(body), "Content-Type", "application/json")
	if a.status != 200 {
		t.Fatalf("batch = %d %q, want 200", a.status, a.body)
	}
	res := decodeResults(t, string(a.body))
	want := []int{204, 412, 412}
	if len(res) != len(want) {
		t.Fatalf("batch gave %d results, want %d: %s", len(res), len(want), a.body)
	}
	for i, r := range res {
		if r.Status != want[i] {
			t.Errorf("op %d (delete %s) = %d %q, want %d", i, r.Key, r.Status, r.Error, want[i])
		}
	}
	if _, err := g.item("b"); err != nil {
		t.Errorf("b after a stale delete: %v, want it kept", err)
	}
}

// TestConditionalFieldLines: against real memcached, a DELETE or PUT
// whose If-Match comes empty or on several lines keeps the item whole
// (400): read from its first line alone, an empty line or a * before the
// ETag made it an unconditional delete or overwrite.
func TestConditionalFieldLines(t *testing.T) {
	g := newBigRig(t, nil)
	for _, tt := range []struct {
		method string
		lines  func(etag string) []string
	}{
		{"DELETE", func(string) []string { return []string{""} }},
		{"DELETE", func(etag string) []string { return []string{"", `"1` + etag[1:]} }},
		{"DELETE", func(etag string) []string { return []string{"*", `"1` + etag[1:]} }},
		{"PUT", func(string) []string { return []string{""} }},
		{"PUT", func(etag string) []string { return []string{"", `"1` + etag[1:]} }},
	} {
		g.mustPut("/k", []byte("kept"))
		etag := g.do("GET", "/k", nil).hdr.Get("ETag")
		var hdr []string
		for _, l := range tt.lines(etag) {
			hdr = append(hdr, "If-Match", l)
		}
		var body io.Reader
		if tt.method == "PUT" {
			body = strings.NewReader("lost")
		}
		if a := g.do(tt.method, "/k", body, hdr...); a.status != 400 {
			t.Errorf("%s, If-Match lines %q = %d %q, want 400", tt.method, tt.lines(etag), a.status, a.body)
		}
		if a := g.do("GET", "/k", nil); a.status != 200 || string(a.body) != "kept" {
			t.Errorf("after %s, If-Match lines %q: GET = %d %q, want the item kept", tt.method, tt.lines(etag), a.status, a.body)
		}
	}
}
