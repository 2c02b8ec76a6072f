package h1

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/memcgate/memcgate/gateway/budget"
)

// TestTakeAhead: a body read whole ahead of its handler is handed over
// without a copy, with the budget the connection held for it given back
// (the taker holds it instead, once), or what is left of it if the
// handler read some; a body not read ahead is not handed over and reads
// as usual. The connection stays
// good either way.
func TestTakeAhead(t *testing.T) {
	tests := []struct {
		name     string
		size     int
		readOne  bool // the handler reads a byte before TakeAhead
		wantTook int
	}{
		{"read ahead", 100 << 10, false, 100 << 10},
		{"partly read: the rest", 100 << 10, true, 100<<10 - 1},
		{"with its head, not read ahead", 10, false, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bg := budget.New(1 << 20)
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				read := 0
				if tt.readOne {
					n, _ := r.Body.Read(make([]byte, 1))
					read += n
				}
				took := TakeAhead(r)
				used := bg.Used()
				rest, err := io.ReadAll(r.Body)
				fmt.Fprintf(w, "took %d used %d read %d %v", len(took), used, read+len(rest), err)
			})
			_, addr := startH1(t, h, func(s *Server) {
				s.Budget = bg
				s.BodyLimit = func(*http.Request) int64 { return 1 << 20 }
			})
			c, br := dial(t, addr)
			fmt.Fprintf(c, "PUT /x HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n%s", tt.size, strings.Repeat("b", tt.size))
			r, err := readWireResponse(br, "PUT")
			read := tt.size - tt.wantTook
			want := fmt.Sprintf("took %d used 0 read %d <nil>", tt.wantTook, read)
			if err != nil || r.body != want {
				t.Errorf("PUT answered %q, %v; want %q", r.body, err, want)
			}
			if !eventually(func() bool { return bg.Used() == 0 }) {
				t.Errorf("budget holds %d bytes after the request", bg.Used())
			}
			if r := roundTrip(t, c, br, "/"); !strings.HasPrefix(r.body, "took 0 used 0 read 0") {
				t.Errorf("next request: %v", r)
			}
		})
	}
}
