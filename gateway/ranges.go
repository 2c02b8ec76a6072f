package gateway

import (
	"net/http"
	"strconv"
	"strings"
)

// Range requests (RFC 9110 §14) on GET /{key}: one range of bytes is
// answered 206 with that part of the value (for a value stored in chunks,
// only the chunks it covers are fetched); a range that starts past the
// end is answered 416. Everything else the RFC lets a server ignore is
// ignored, and the whole value answered 200: several ranges (which would
// need a multipart answer), a unit other than bytes, a malformed header,
// and an If-Range that does not name the value's current ETag. HEAD
// ignores Range.

// rangeKind is what a Range header asks of a value.
type rangeKind uint8

const (
	rangeNone          rangeKind = iota // no Range to honour: the whole value, 200
	rangePartial                        // one satisfiable range: 206
	rangeUnsatisfiable                  // 416
)

// byteRange reads r's Range header for a value of size bytes whose ETag
// is etag: which answer it gets, and for rangePartial the bytes
// [off, end).
func byteRange(r *http.Request, size int64, etag string) (kind rangeKind, off, end int64) {
	hv := r.Header["Range"]
	if len(hv) != 1 || r.Method != http.MethodGet {
		return rangeNone, 0, size
	}
	if ir := r.Header["If-Range"]; len(ir) > 0 && (len(ir) != 1 || strings.TrimSpace(ir[0]) != etag) {
		return rangeNone, 0, size // an ETag other than ours, or a date: the value may have changed
	}
	return parseRange(hv[0], size)
}

// parseRange reads a Range header's value for a value of size bytes.
func parseRange(h string, size int64) (kind rangeKind, off, end int64) {
	unit, spec, ok := strings.Cut(strings.TrimSpace(h), "=")
	if !ok || !strings.EqualFold(strings.TrimSpace(unit), "bytes") || strings.Contains(spec, ",") {
		return rangeNone, 0, size
	}
	first, last, ok := strings.Cut(strings.TrimSpace(spec), "-")
	if !ok {
		return rangeNone, 0, size
	}
	first, last = strings.TrimSpace(first), strings.TrimSpace(last)
	if first == "" { // -N: the last N bytes
		n, err := parseDigits(last)
		switch {
		case err != nil:
			return rangeNone, 0, size
		case n == 0 || size == 0:
			return rangeUnsatisfiable, 0, 0
		}
		return rangePartial, max(size-n, 0), size
	}
	a, err := parseDigits(first)
	if err != nil {
		return rangeNone, 0, size
	}
	end = size
	if last != "" {
		b, err := parseDigits(last)
		if err != nil || b < a {
			return rangeNone, 0, size
		}
		end = min(b, size-1) + 1 // b+1 would overflow for the capped maximum
	}
	if a >= size {
		return rangeUnsatisfiable, 0, 0
	}
	return rangePartial, a, end
}

// parseDigits reads a non-negative decimal number of only digits; a
// number too large for int64 is capped at its maximum, which is past
// the end of any value.
func parseDigits(s string) (int64, error) {
	if s == "" || strings.TrimLeft(s, "0123456789") != "" {
		return 0, strconv.ErrSyntax
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 1<<63 - 1, nil // digits only: out of range
	}
	return v, nil
}

// contentRange is the Content-Range of bytes [off, end) of size, or of
// an unsatisfiable range (off == end == 0).
func contentRange(off, end, size int64) string {
	if end <= off {
		return "bytes */" + strconv.FormatInt(size, 10)
	}
	return "bytes " + strconv.FormatInt(off, 10) + "-" + strconv.FormatInt(end-1, 10) + "/" + strconv.FormatInt(size, 10)
}

// errRange answers a range that starts past the value's end.
func errRange(size int64) error {
	return &requestError{kind: kindRange, msg: "range not satisfiable: the value is " + strconv.FormatInt(size, 10) + " bytes"}
}
