package h1

import (
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
)

// Header keys whose handler values commit may leave out.
const (
	exCL uint8 = 1 << iota
	exTE
	exConn
	exCT
)

// hasTrailerPrefix reports whether h has a TrailerPrefix key.
func hasTrailerPrefix(h http.Header) bool {
	for k := range h {
		if strings.HasPrefix(k, http.TrailerPrefix) {
			return true
		}
	}
	return false
}

// validTrailer reports whether RFC 7230 section 4.1.2 allows k in a
// trailer, as net/http checks.
func validTrailer(k string) bool {
	switch k {
	case "Authorization", "Cache-Control", "Connection", "Content-Encoding", "Content-Length",
		"Content-Range", "Content-Type", "Expect", "Host", "Keep-Alive", "Max-Forwards", "Pragma",
		"Proxy-Authenticate", "Proxy-Authorization", "Proxy-Connection", "Range", "Realm", "Te",
		"Trailer", "Transfer-Encoding", "Www-Authenticate":
		return false
	}
	return true
}

func appendStatus(b []byte, is11 bool, code int) []byte {
	if is11 {
		b = append(b, "HTTP/1.1 "...)
	} else {
		b = append(b, "HTTP/1.0 "...)
	}
	b = strconv.AppendInt(b, int64(code), 10)
	if text := http.StatusText(code); text != "" {
		b = append(append(b, ' '), text...)
	} else {
		b = strconv.AppendInt(append(b, " status code "...), int64(code), 10)
	}
	return append(b, "\r\n"...)
}

// appendHeaders appends the lines of kvs but the keys ex leaves out. Like
// net/http, it trims values and turns CR and LF inside them into spaces.
func appendHeaders(b []byte, kvs []kv, ex uint8) []byte {
	for _, kv := range kvs {
		if ex != 0 && exBit(kv.k)&ex != 0 {
			continue
		}
		for _, v := range kv.v {
			b = append(append(b, kv.k...), ": "...)
			v = textproto.TrimString(v)
			if strings.ContainsAny(v, "\r\n") {
				for i := 0; i < len(v); i++ {
					if ch := v[i]; ch == '\r' || ch == '\n' {
						b = append(b, ' ')
					} else {
						b = append(b, ch)
					}
				}
			} else {
				b = append(b, v...)
			}
			b = append(b, "\r\n"...)
		}
	}
	return b
}

func exBit(k string) uint8 {
	switch k {
	case "Content-Length":
		return exCL
	case "Transfer-Encoding":
		return exTE
	case "Connection":
		return exConn
	case "Content-Type":
		return exCT
	}
	return 0
}

func appendLine(b []byte, k, v string) []byte {
	return append(append(append(append(b, k...), ": "...), v...), "\r\n"...)
}

func first(v []string) string {
	if len(v) == 0 {
		return ""
	}
	return v[0]
}

func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}

// hasToken reports whether v holds token, ignoring ASCII case, between
// the ends, spaces, tabs and commas, as net/http's check does.
func hasToken(v, token string) bool {
	for i := 0; i+len(token) <= len(v); i++ {
		j := i + len(token)
		if (i == 0 || isBoundary(v[i-1])) && (j == len(v) || isBoundary(v[j])) && asciiEqualFold(v[i:j], token) {
			return true
		}
	}
	return false
}

func isBoundary(b byte) bool { return b == ' ' || b == ',' || b == '\t' }
