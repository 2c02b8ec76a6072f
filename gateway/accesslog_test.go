package gateway

import (
	"bytes"
	"context"
	"log/slog"
	"net/http/httptest"
	"regexp"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TestAccessJSONMatchesSlog: appendAccessJSON writes the bytes slog's
// JSONHandler writes for the same record, or declines.
func TestAccessJSONMatchesSlog(t *testing.T) {
	utc := time.Date(2026, 12, 3, 17, 20, 1, 123456789, time.UTC)
	tests := []struct {
		name   string
		t      time.Time
		id     string
		method string
		status int
		n      int64
		d      time.Duration
		remote string
		wantOK bool
	}{
		{"now, local, monotonic", time.Now(), "1a2b3c4d-17", "GET", 200, 400, 812 * time.Microsecond, "127.0.0.1:53124", true},
		{"generated id", utc, "1a2b3c4d-17", "GET", 200, 400, 812 * time.Microsecond, "127.0.0.1:53124", true},
		{"whole second, zero duration", utc.Truncate(time.Second), "x", "PUT", 201, 0, 0, "127.0.0.1:1", true},
		{"sub-microsecond duration", utc, "x", "HEAD", 304, 0, 999 * time.Nanosecond, "127.0.0.1:1", true},
		{"negative duration", utc, "x", "GET", 200, 0, -3 * time.Millisecond, "127.0.0.1:1", true},
		{"long duration", utc, "x", "DELETE", 504, 31, 2*time.Second + 345678*time.Microsecond, "[::1]:8080", true},
		{"hours", utc, "x", "GET", 200, 1 << 40, 100 * time.Hour, "[fe80::1%eth0]:80", true},
		{"offset zone", utc.In(time.FixedZone("", -(5*3600 + 30*60))), "x", "GET", 404, 9, time.Millisecond, "10.0.0.1:2", true},
		{"client id with <>&'", utc, "<a&b>'c", "POST", 200, 2, time.Microsecond, "127.0.0.1:1", true},
		{"status out of range", utc, "x", "GET", 999, 0, 0, "127.0.0.1:1", true},
		{"empty strings", utc, "", "", 0, 0, 0, "", true},
		{"quote in id", utc, `a"b`, "GET", 200, 0, 0, "127.0.0.1:1", false},
		{"backslash in id", utc, `a\b`, "GET", 200, 0, 0, "127.0.0.1:1", false},
		{"tab in id", utc, "a\tb", "GET", 200, 0, 0, "127.0.0.1:1", false},
		{"non-ASCII id", utc, "é", "GET", 200, 0, 0, "127.0.0.1:1", false},
		{"odd method", utc, "x", "M\x7fX", 405, 0, 0, "127.0.0.1:1", false},
		{"zero time", time.Time{}.In(time.FixedZone("", 3600)), "x", "GET", 200, 0, 0, "127.0.0.1:1", false},
		{"year 10000", time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), "x", "GET", 200, 0, 0, "127.0.0.1:1", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := appendAccessJSON([]byte("kept:"), tc.t, tc.id, tc.method, tc.status, tc.n, tc.d, tc.remote)
			if ok != tc.wantOK {
				t.Fatalf("ok = %v; want %v (line %q)", ok, tc.wantOK, got)
			}
			if !ok {
				if string(got) != "kept:" {
					t.Errorf("declined but appended: %q", got)
				}
				return
			}
			var want bytes.Buffer
			want.WriteString("kept:")
			rec := slog.NewRecord(tc.t, slog.LevelInfo, "request", 0)
			rec.AddAttrs(accessAttrs(nil, tc.id, tc.method, tc.status, tc.n, tc.d, tc.remote)...)
			if err := slog.NewJSONHandler(&want, nil).Handle(context.Background(), rec); err != nil {
				t.Fatal(err)
			}
			if string(got) != want.String() {
				t.Errorf("got  %s\nwant %s", got, want.Bytes())
			}
		})
	}
}

// TestAccessLogPaths: the observer's line for a request is the same
// whether it goes through slog or straight to Options.AccessLogJSON (its
// time aside, read at different moments), and a line that needs escaping
// or the debug level's path goes through slog: Options.AccessLogger's,
// never the handler's logger, which keeps the log's room for errors.
func TestAccessLogPaths(t *testing.T) {
	timeField := regexp.MustCompile(`^\{"time":"[^"]+",`)
	tests := []struct {
		name     string
		level    slog.Level
		id       string
		wantFast bool
	}{
		{"plain", slog.LevelInfo, "req-1", true},
		{"escaped id", slog.LevelInfo, `say "hi"`, false},
		{"debug adds the path", slog.LevelDebug, "req-2", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			line := func(fast bool) (viaSlog, direct string) {
				var slogged, written, errors bytes.Buffer
				opts := &slog.HandlerOptions{Level: tc.level}
				log := slog.New(slog.NewJSONHandler(&errors, opts))
				access := slog.New(slog.NewJSONHandler(&slogged, opts))
				o := newObserver(log, access, prometheus.NewRegistry(), true, nil)
				if fast {
					o = newObserver(log, access, prometheus.NewRegistry(), true, &written)
				}
				defer func() {
					if errors.Len() > 0 {
						t.Errorf("the handler's logger got %q; want access lines on the access logger only", errors.String())
					}
				}()
				r := httptest.NewRequest("PUT", "/k", nil)
				r.Header.Set("X-Request-Id", tc.id)
				o.inFlight.Inc()
				o.record(r, &statusWriter{status: 201, bytes: 7}, time.Now().Add(-1500*time.Microsecond))
				return slogged.String(), written.String()
			}
			ref, none := line(false)
			viaSlog, direct := line(true)
			if none != "" || ref == "" {
				t.Fatalf("without AccessLogJSON: slog %q, direct %q; want a slog line only", ref, none)
			}
			got := direct
			if !tc.wantFast {
				got = viaSlog
				if direct != "" {
					t.Errorf("wrote %q directly; want it through slog", direct)
				}
			} else if viaSlog != "" {
				t.Errorf("logged %q through slog; want it written directly", viaSlog)
			}
			strip := func(s string) string { return timeField.ReplaceAllString(s, "{") }
			// The durations differ by the moment each was measured.
			dur := regexp.MustCompile(`"duration_ms":[0-9.]+`)
			if g, w := dur.ReplaceAllString(strip(got), ""), dur.ReplaceAllString(strip(ref), ""); g != w {
				t.Errorf("line\n got  %s want %s", g, w)
			}
		})
	}
}

// FuzzAccessJSON: for any request ID, method, remote address, status,
// size, duration and time, appendAccessJSON writes slog's bytes or
// declines (and then slog writes the line).
func FuzzAccessJSON(f *testing.F) {
	f.Add("1a2b3c4d-17", "GET", "127.0.0.1:53124", 200, int64(400), int64(812000), int64(1796664001), int64(123456789), 0)
	f.Add(`a"b`, "PUT", "[::1]:1", 201, int64(0), int64(0), int64(0), int64(0), -19800)
	f.Add("<é>", "M\x7f", "", 999, int64(-1), int64(-5), int64(-62135596800), int64(0), 3600)
	f.Add("x", "GET", "127.0.0.1:1", 200, int64(0), int64(0), int64(253402300800), int64(0), 0) // year 10000
	f.Fuzz(func(t *testing.T, id, method, remote string, status int, n, d, sec, nsec int64, zone int) {
		tm := time.Unix(sec, nsec).In(time.FixedZone("", zone%(18*3600)))
		got, ok := appendAccessJSON(nil, tm, id, method, status, n, time.Duration(d), remote)
		if !ok {
			if len(got) != 0 {
				t.Fatalf("declined but appended %q", got)
			}
			return
		}
		var want bytes.Buffer
		rec := slog.NewRecord(tm, slog.LevelInfo, "request", 0)
		rec.AddAttrs(accessAttrs(nil, id, method, status, n, time.Duration(d), remote)...)
		if err := slog.NewJSONHandler(&want, nil).Handle(context.Background(), rec); err != nil {
			t.Fatal(err)
		}
		if string(got) != want.String() {
			t.Fatalf("got  %s\nwant %s", got, want.Bytes())
		}
	})
}
