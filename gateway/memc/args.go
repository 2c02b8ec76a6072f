package memc

// The parsers of the HttpMemcModule-compatible endpoints. Each reproduces
// one step of what nginx 1.22 + memc-nginx-module 0.19 do to a request, as
// measured in docs/migrating-from-nginx-memc.md; none of them decodes
// anything the module leaves encoded.

import (
	"errors"
	"strings"
)

// nginxArg returns the value of the first query argument called name, as
// nginx's $arg_name does: the name is matched ASCII case-insensitively, it
// must start the query or follow '&' and be followed by '='; the value runs
// to the next '&' and is not percent-decoded ("a%20b" stays "a%20b", '+'
// stays '+'). An argument without '=' does not count.
func nginxArg(rawQuery, name string) (string, bool) {
	n := len(name)
	for i := 0; i+n < len(rawQuery); i++ {
		if i > 0 && rawQuery[i-1] != '&' {
			continue
		}
		if rawQuery[i+n] != '=' || !asciiEqualFold(rawQuery[i:i+n], name) {
			continue
		}
		v := rawQuery[i+n+1:]
		if end := strings.IndexByte(v, '&'); end >= 0 {
			v = v[:end]
		}
		return v, true
	}
	return "", false
}

// asciiEqualFold compares a and b ignoring ASCII case only, like nginx's
// ngx_strncasecmp (strings.EqualFold would also fold non-ASCII runes such
// as the Kelvin sign into 'k').
func asciiEqualFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// splitTarget splits a raw request target (r.RequestURI) into its path and
// query as nginx does: the query starts at the first '?', and a '#' ends
// the target (nginx ignores a fragment sent on the request line). An
// absolute-form target ("http://host/p?q") loses its scheme and host.
func splitTarget(target string) (path, query string) {
	if i := strings.IndexByte(target, '#'); i >= 0 {
		target = target[:i]
	}
	if !strings.HasPrefix(target, "/") {
		if i := strings.Index(target, "://"); i >= 0 {
			rest := target[i+3:]
			if j := strings.IndexAny(rest, "/?"); j >= 0 {
				target = rest[j:]
				if target[0] == '?' {
					target = "/" + target
				}
			} else {
				target = "/"
			}
		}
	}
	path, query, _ = strings.Cut(target, "?")
	return path, query
}

// errNginxPath is a request path nginx refuses with 400 before any
// location matches: a bad %-escape, an escaped NUL, a raw control byte,
// or ".." above the root.
var errNginxPath = errors.New("gateway: path nginx would refuse")

// nginxPath decodes and normalises a raw request path as nginx does before
// it matches locations: %XX escapes are decoded, runs of '/' merged, "."
// segments dropped and ".." segments resolved; a decoded '/' or '.' counts
// like a literal one. quoted reports whether the raw path held a '%'
// escape or a '+', which makes nginx re-escape what a regex location
// captures (see argsEscape).
func nginxPath(raw string) (path string, quoted bool, err error) {
	dec := make([]byte, 0, len(raw))
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		switch c {
		case '%':
			if i+2 >= len(raw) || unhex(raw[i+1]) < 0 || unhex(raw[i+2]) < 0 {
				return "", false, errNginxPath
			}
			c = byte(unhex(raw[i+1])<<4 | unhex(raw[i+2]))
			if c == 0 {
				return "", false, errNginxPath
			}
			i += 2
			quoted = true
		case '+':
			quoted = true
		default:
			if c < ' ' || c == 0x7f {
				// nginx refuses raw control bytes on the request line
				// (Go's server already does, before any handler).
				return "", false, errNginxPath
			}
		}
		dec = append(dec, c)
	}
	if len(dec) == 0 || dec[0] != '/' {
		return "", quoted, errNginxPath
	}
	segs := strings.Split(string(dec[1:]), "/")
	out := make([]string, 0, len(segs))
	trailing := false
	for i, s := range segs {
		last := i == len(segs)-1
		switch s {
		case "", ".":
			trailing = last
		case "..":
			if len(out) == 0 {
				return "", quoted, errNginxPath
			}
			out = out[:len(out)-1]
			trailing = last
		default:
			out = append(out, s)
			trailing = false
		}
	}
	path = "/" + strings.Join(out, "/")
	if trailing && len(out) > 0 {
		path += "/"
	}
	return path, quoted, nil
}

func unhex(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'a' <= c && c <= 'f':
		return int(c-'a') + 10
	case 'A' <= c && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

// regexCapture is what the reference location `~ ^/key/(.+)$` captures
// from a normalised path under prefix, and whether it matches at all. PCRE
// without DOTALL: '.' never matches '\n', and '$' also matches just before
// a final '\n', which is then not part of the capture.
func regexCapture(path, prefix string) (string, bool) {
	rest, ok := strings.CutPrefix(path, prefix)
	if !ok {
		return "", false
	}
	rest = strings.TrimSuffix(rest, "\n")
	if rest == "" || strings.IndexByte(rest, '\n') >= 0 {
		return "", false
	}
	return rest, true
}

const upperHex = "0123456789ABCDEF"

// argsEscape escapes a regex capture the way nginx does when the request
// path was quoted (ngx_escape_uri with NGX_ESCAPE_ARGS in nginx 1.22):
// control bytes, space, " # % & + ; < > ? \ ^ ` { | } and bytes 0x7F-0xFF.
func argsEscape(s string) string {
	return escapeBytes(s, func(c byte) bool {
		if c <= ' ' || c >= 0x7f {
			return true
		}
		return strings.IndexByte("\"#%&+;<>?\\^`{|}", c) >= 0
	})
}

// memcEscape is the module's key escaping (ngx_escape_uri with
// NGX_ESCAPE_MEMCACHED): space, '%' and bytes 0x00-0x1F become %XX with
// uppercase hex. memcgate also escapes DEL (0x7F), which memcached would
// take but our memcached client refuses; since '%' is always escaped this
// cannot make two keys collide, and no HTTP request can carry a raw DEL to
// here anyway (nginx and Go both refuse it on the request line).
func memcEscape(key string) string {
	return escapeBytes(key, func(c byte) bool { return c <= ' ' || c == '%' || c == 0x7f })
}

func escapeBytes(s string, esc func(byte) bool) string {
	n := 0
	for i := 0; i < len(s); i++ {
		if esc(s[i]) {
			n++
		}
	}
	if n == 0 {
		return s
	}
	b := make([]byte, 0, len(s)+2*n)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if esc(c) {
			b = append(b, '%', upperHex[c>>4], upperHex[c&15])
			continue
		}
		b = append(b, c)
	}
	return string(b)
}

// digits reports whether s is 1 to max ASCII digits, the module's only
// check of exptime and flags (max 10) and of the incr/decr delta (max 19).
// The range is not checked.
func digits(s string, max int) bool {
	if s == "" || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// parseDigits reads a string that passed digits(s, 19 or fewer); the
// result is exact because 19 digits always fit in a uint64.
func parseDigits(s string) uint64 {
	var v uint64
	for i := 0; i < len(s); i++ {
		v = v*10 + uint64(s[i]-'0')
	}
	return v
}

// memcFlags is how memcached 1.6 reads a flags token that the module sent
// verbatim: modulo 2^32 (4294967297 is stored as 1).
func memcFlags(s string) uint32 {
	if s == "" {
		return 0
	}
	return uint32(parseDigits(s))
}

// memcExptime is how memcached 1.6 reads an exptime token: as a 64-bit
// number truncated to 32 bits, so 4294967295 is -1 (expired at once) and
// 4294967296 is 0 (never expires).
func memcExptime(s string) int32 {
	if s == "" {
		return 0
	}
	return int32(uint32(parseDigits(s)))
}
