package gateway

import (
	"encoding/base64"
	"strconv"
	"unicode/utf8"
)

// The answer of a multi-get or batch is encoded here rather than by
// json.Marshal, byte for byte as json.Marshal writes it (TestAnswerAsMarshal),
// so that its values are copied once, from the buffers they were read
// into straight into one buffer of the answer's size. json.Marshal needed
// a string copy of each value, its own growing buffer and a copy of that:
// about five times the values' bytes at once where the budget counts two
// (decision 0025), which was most of the gateway's memory under many
// multi-gets of large values that nobody reads (abuse attack 11).

// answerSize is the length of appendResults' answer for results, exactly:
// it is allocated and held against the budget before the answer is
// written.
func answerSize(results []batchResult) int {
	n := len(`{"results":[]}` + "\n")
	for i := range results {
		r := &results[i]
		n += len(`{"key":"","status":},`) + escapedLen(r.Key)
		switch {
		case r.value != nil:
			n += len(`,"value":""`) + r.valueLen // counted by setValue
		case r.Value != nil:
			n += len(`,"value":""`) + escapedLen(*r.Value)
		}
		if r.Encoding != "" {
			n += len(`,"encoding":""`) + escapedLen(r.Encoding)
		}
		if r.Flags != nil {
			n += len(`,"flags":`) + decimalLen(int64(*r.Flags))
		}
		if r.CAS != "" {
			n += len(`,"cas":""`) + escapedLen(r.CAS)
		}
		if r.PHPType != "" {
			n += len(`,"php_type":""`) + escapedLen(r.PHPType)
		}
		if r.Error != "" {
			n += len(`,"error":""`) + escapedLen(r.Error)
		}
		n += decimalLen(int64(r.Status))
	}
	if len(results) > 0 {
		n-- // no comma after the last
	}
	return n
}

// decimalLen is the length of i in decimal, as strconv.AppendInt writes
// it (math.MinInt64 included).
func decimalLen(i int64) int {
	n, u := 1, uint64(i)
	if i < 0 {
		n, u = 2, -u
	}
	for ; u >= 10; u /= 10 {
		n++
	}
	return n
}

// escapedLen is the length of what appendJSONString writes for s, without
// its quotes: one byte for each byte written as it is, 2 for a short
// escape, 6 for \u00XX, \u2028, \u2029 and the \ufffd of each byte of
// invalid UTF-8.
func escapedLen[S string | []byte](s S) int {
	n := 0
	for i := 0; i < len(s); {
		if e := jsonEscape[s[i]]; e != 0 {
			n += int(e)
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(string(s[i:min(i+utf8.UTFMax, len(s))]))
		switch {
		case r == utf8.RuneError && size == 1, r == '\u2028', r == '\u2029':
			n += 6
		default:
			n += size
		}
		i += size
	}
	return n
}

// jsonEscape says, for each ASCII byte, how many bytes JSON with HTML
// escaping writes for it (1: itself); 0 for the bytes of multi-byte
// UTF-8, which are decoded.
var jsonEscape = func() (t [256]uint8) {
	for c := range utf8.RuneSelf {
		switch {
		case c == '"' || c == '\\' || c == '\b' || c == '\f' || c == '\n' || c == '\r' || c == '\t':
			t[c] = 2
		case c < 0x20 || c == '<' || c == '>' || c == '&':
			t[c] = 6
		default:
			t[c] = 1
		}
	}
	return t
}()

// appendResults appends the answer {"results":[…]} and a newline.
func appendResults(dst []byte, results []batchResult) []byte {
	dst = append(dst, `{"results":[`...)
	for i := range results {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = results[i].appendJSON(dst)
	}
	return append(dst, "]}\n"...)
}

// appendJSON appends r as json.Marshal writes a batchResult: the fields
// in order, those marked omitempty left out when empty.
func (r *batchResult) appendJSON(dst []byte) []byte {
	dst = append(dst, `{"key":`...)
	dst = appendJSONString(dst, r.Key)
	dst = append(dst, `,"status":`...)
	dst = strconv.AppendInt(dst, int64(r.Status), 10)
	switch {
	case r.value != nil && r.Encoding == "base64":
		dst = append(dst, `,"value":"`...)
		dst = base64.StdEncoding.AppendEncode(dst, r.value)
		dst = append(dst, '"')
	case r.value != nil:
		dst = append(dst, `,"value":`...)
		dst = appendJSONString(dst, r.value)
	case r.Value != nil:
		dst = append(dst, `,"value":`...)
		dst = appendJSONString(dst, *r.Value)
	}
	if r.Encoding != "" {
		dst = append(dst, `,"encoding":`...)
		dst = appendJSONString(dst, r.Encoding)
	}
	if r.Flags != nil {
		dst = append(dst, `,"flags":`...)
		dst = strconv.AppendUint(dst, uint64(*r.Flags), 10)
	}
	if r.CAS != "" {
		dst = append(dst, `,"cas":`...)
		dst = appendJSONString(dst, r.CAS)
	}
	if r.PHPType != "" {
		dst = append(dst, `,"php_type":`...)
		dst = appendJSONString(dst, r.PHPType)
	}
	if r.Error != "" {
		dst = append(dst, `,"error":`...)
		dst = appendJSONString(dst, r.Error)
	}
	return append(dst, '}')
}

// appendJSONString appends s as a quoted JSON string as json.Marshal
// writes it, HTML escaping on: ", \ and the short escapes \b \f \n \r \t
// backslashed; other control bytes and < > & as \u00XX; U+2028 and
// U+2029 as \u2028 and \u2029; each byte of invalid UTF-8 as \ufffd.
// escapedLen counts what it writes.
func appendJSONString[S string | []byte](dst []byte, s S) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if e := jsonEscape[c]; e != 0 {
			if e == 1 {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		// A string of at most 4 bytes that does not escape: no copy to
		// the heap when s is a []byte.
		r, size := utf8.DecodeRuneInString(string(s[i:min(i+utf8.UTFMax, len(s))]))
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hex[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
