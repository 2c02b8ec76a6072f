package gateway

import (
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/memcgate/memcgate/upstream/op"
)

// TestWriteFoundHeaders checks the numbers writeFound puts in a read's
// answer headers, whose digits live in the request's context: numbers
// short and long enough to outgrow that room, a request without such a
// context, and a second answer on the same context, which must leave the
// first one's headers as they were (a response's head may be written
// after its handler returns).
func TestWriteFoundHeaders(t *testing.T) {
	tests := []struct {
		name  string
		cas   uint64
		flags uint32
		size  int
	}{
		{"small", 7, 0, 400},
		{"zero", 0, 0, 0},
		{"largest", math.MaxUint64, math.MaxUint32, math.MaxInt},
	}
	check := func(t *testing.T, hd http.Header, cas uint64, flags uint32, size int) {
		t.Helper()
		want := map[string]string{
			"Etag":              `"` + strconv.FormatUint(cas, 10) + `"`,
			"X-Memcached-Flags": strconv.FormatUint(uint64(flags), 10),
			"Content-Length":    strconv.Itoa(size),
		}
		for k, v := range want {
			if got := hd.Get(k); got != v {
				t.Errorf("%s: %q, want %q", k, got, v)
			}
		}
	}
	h := &handler{}
	for _, tt := range tests {
		for _, withCtx := range []bool{true, false} {
			t.Run(tt.name+"/ctx="+strconv.FormatBool(withCtx), func(t *testing.T) {
				r := httptest.NewRequest(http.MethodHead, "/k", nil)
				if withCtx {
					r = r.WithContext(newRequestCtx(r.Context(), time.Now(), time.Second))
				}
				first := httptest.NewRecorder()
				h.writeFound(first, r, "", op.Item{CAS: tt.cas, Flags: tt.flags}, decoded{}, tt.size)
				check(t, first.Header(), tt.cas, tt.flags, tt.size)
				second := httptest.NewRecorder()
				h.writeFound(second, r, "", op.Item{CAS: tt.cas/2 + 1, Flags: tt.flags / 3}, decoded{}, tt.size/5+9)
				check(t, second.Header(), tt.cas/2+1, tt.flags/3, tt.size/5+9)
				check(t, first.Header(), tt.cas, tt.flags, tt.size)
			})
		}
	}
}
