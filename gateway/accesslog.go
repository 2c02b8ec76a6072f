package gateway

import (
	"log/slog"
	"strconv"
	"time"
)

// appendAccessJSON appends the access log line of one request exactly as
// log/slog's JSONHandler (default options) writes the record the observer
// would log for it, newline included, and reports whether it could: a
// string that JSON must escape makes it return false, and the caller then
// logs the record through slog. With it a request's access log line
// costs less, and no allocation but the request ID's, than through slog
// (the attributes, the caller's PC, encoding/json for the float), and
// every request of the default configuration pays it (docs/benchmarks.md,
// "The access log").
//
// The shape it must keep (TestAccessJSONMatchesSlog compares the two):
//
//	{"time":RFC3339Nano,"level":"INFO","msg":"request","request_id":…,"method":…,"status":…,"bytes":…,"duration_ms":…,"remote":…}
func appendAccessJSON(b []byte, t time.Time, id, method string, status int, n int64, d time.Duration, remote string) ([]byte, bool) {
	if !plainJSON(id) || !plainJSON(method) || !plainJSON(remote) {
		return b, false
	}
	if y := t.Year(); t.IsZero() || y < 0 || y >= 10000 { // slog leaves out a zero time, writes an error for these years
		return b, false
	}
	b = append(b, `{"time":"`...)
	b = t.AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","level":"INFO","msg":"request","request_id":"`...)
	b = append(b, id...)
	b = append(b, `","method":"`...)
	b = append(b, method...)
	b = append(b, `","status":`...)
	b = strconv.AppendInt(b, int64(status), 10)
	b = append(b, `,"bytes":`...)
	b = strconv.AppendInt(b, n, 10)
	b = append(b, `,"duration_ms":`...)
	// slog encodes a float64 with encoding/json, which uses the shortest
	// 'f' form for magnitudes in [1e-6, 1e21): every duration in ms here.
	b = strconv.AppendFloat(b, float64(d.Microseconds())/1000, 'f', -1, 64)
	b = append(b, `,"remote":"`...)
	b = append(b, remote...)
	b = append(b, "\"}\n"...)
	return b, true
}

// plainJSON reports whether s is printable ASCII without '"' or '\', so
// that it appears in a JSON string as it is.
func plainJSON(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}

// accessAttrs appends to dst the attributes of a request's access log line
// through slog (the debug level adds the path); appendAccessJSON writes the
// same. Given a caller's array, they stay on its stack.
func accessAttrs(dst []slog.Attr, id, method string, status int, n int64, d time.Duration, remote string) []slog.Attr {
	return append(dst,
		slog.String("request_id", id), slog.String("method", method),
		slog.Int("status", status), slog.Int64("bytes", n),
		slog.Float64("duration_ms", float64(d.Microseconds())/1000), slog.String("remote", remote),
	)
}
