package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestServerLog: the servers' lines are warnings, but for failed TLS
// handshakes, which are counted and logged a line a second at most, each
// saying how many went unlogged before it. Accept errors are counted too.
func TestServerLog(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var out bytes.Buffer
		handshakes := newHandshakeErrors(prometheus.NewRegistry())
		var accepts atomic.Uint64
		l := newServerLog(slog.New(slog.NewJSONHandler(&out, nil)), "data", handshakes, &accepts)
		const hs = handshakeError + "127.0.0.1:4000: EOF"
		steps := []struct {
			after    time.Duration // since the previous step
			line     string
			logged   bool
			unlogged int // the line's unlogged_before, for a handshake
		}{
			{0, hs, true, 0},
			{100 * time.Millisecond, hs, false, 0},
			{100 * time.Millisecond, "h1: superfluous response.WriteHeader call with 200 after 200", true, 0},
			{500 * time.Millisecond, hs, false, 0},
			{400 * time.Millisecond, hs, true, 2},
			{999 * time.Millisecond, hs, false, 0},
			{time.Millisecond, hs, true, 1},
			{0, acceptError + "accept tcp 127.0.0.1:8080: accept4: too many open files; retrying in 5ms", true, 0},
		}
		for i, st := range steps {
			time.Sleep(st.after)
			out.Reset()
			l.Print(st.line)
			if !st.logged {
				if out.Len() != 0 {
					t.Errorf("step %d: %q logged %s, want nothing", i, st.line, out.Bytes())
				}
				continue
			}
			var rec struct {
				Level, Msg, Listener string
				Unlogged             *int `json:"unlogged_before"`
			}
			if err := json.Unmarshal(out.Bytes(), &rec); err != nil {
				t.Fatalf("step %d: %q logged %q: %v", i, st.line, out.Bytes(), err)
			}
			if rec.Level != "WARN" || rec.Msg != st.line {
				t.Errorf("step %d: logged %s %q, want WARN %q", i, rec.Level, rec.Msg, st.line)
			}
			switch handshake := strings.HasPrefix(st.line, handshakeError); {
			case handshake && (rec.Unlogged == nil || *rec.Unlogged != st.unlogged || rec.Listener != "data"):
				t.Errorf("step %d: logged %s, want listener data and unlogged_before %d", i, out.Bytes(), st.unlogged)
			case !handshake && rec.Unlogged != nil:
				t.Errorf("step %d: logged %s, want the line alone", i, out.Bytes())
			}
		}
		if got := testutil.ToFloat64(handshakes.WithLabelValues("data")); got != 6 {
			t.Errorf("memcgate_http_tls_handshake_errors_total{listener=data} = %v, want 6", got)
		}
		if n := accepts.Load(); n != 1 {
			t.Errorf("accept errors counted: %d, want 1", n)
		}
	})
}
