package gateway

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/memcgate/memcgate/gateway/chunk"
)

// MaxKeyLen is memcached's limit on key length in bytes.
const MaxKeyLen = 250

// keyFromPath returns the key named by the request path: everything after
// the first '/', percent-decoded (net/http has decoded URL.Path already), so
// it may contain '/'. The key is checked against maxLen and against bytes
// the memcached text protocol cannot carry in a key.
func keyFromPath(r *http.Request, maxLen int) (string, error) {
	key := strings.TrimPrefix(r.URL.Path, "/")
	if key == "" {
		return key, badRequest("empty key: use /{key}")
	}
	return key, checkKey(key, maxLen)
}

// checkKey enforces memcached's key rules so that nothing memcached could
// misread is ever sent: not empty (a caller whose route takes the key in
// a place of its own says where, first), at most maxLen bytes, and no
// space, control byte or DEL. Bytes >= 0x80 (UTF-8) are fine. Keys that start
// with chunk.KeyPrefix are the gateway's own (the chunks of large
// values): a client can neither read nor overwrite them.
func checkKey(key string, maxLen int) error {
	if key == "" {
		return badRequest("empty key")
	}
	if len(key) > maxLen {
		if maxLen < MaxKeyLen {
			return badRequest("key is " + strconv.Itoa(len(key)) + " bytes; with the configured key prefix at most " + strconv.Itoa(maxLen) + " are allowed")
		}
		return badRequest("key is " + strconv.Itoa(len(key)) + " bytes; memcached allows at most 250")
	}
	if chunk.Reserved(key) {
		return badRequest("keys that start with " + chunk.KeyPrefix + " are reserved for the chunks of large values")
	}
	for i := 0; i < len(key); i++ {
		if b := key[i]; b <= ' ' || b == 0x7f {
			return badRequest("key has byte 0x" + hex2(b) + " at offset " + strconv.Itoa(i) + "; memcached keys cannot contain spaces or control bytes")
		}
	}
	return nil
}

func hex2(b byte) string {
	const digits = "0123456789abcdef"
	return string([]byte{digits[b>>4], digits[b&15]})
}

// query returns the first value of name in a raw query string, decoded as
// a form value, and whether it was present. It allocates only when the
// value needs unescaping, unlike url.ParseQuery, which builds a map.
func query(raw, name string) (string, bool) {
	for raw != "" {
		var pair string
		pair, raw, _ = strings.Cut(raw, "&")
		k, v, _ := strings.Cut(pair, "=")
		if k != name {
			continue
		}
		if strings.ContainsAny(v, "%+") {
			if u, err := url.QueryUnescape(v); err == nil {
				return u, true
			}
		}
		return v, true
	}
	return "", false
}

// hasQuery reports whether the raw query names a parameter name.
func hasQuery(raw, name string) bool {
	_, ok := query(raw, name)
	return ok
}

// parseExptime reads the query parameter name (exptime, touch) as
// memcached seconds: 0 never expires, up to 30 days relative, larger
// values are a Unix time, negative values expire at once. def is the value
// when it is absent.
func parseExptime(raw, name string, def int32) (int32, error) {
	s, ok := query(raw, name)
	if !ok {
		return def, nil
	}
	v, err := strconv.ParseInt(s, 10, 32)
	if err != nil {
		return 0, badRequest(name + " " + quoted(s) + " is not a whole number of seconds from -2147483648 to 2147483647")
	}
	return int32(v), nil
}

// parseFlags reads ?flags= as memcached's 32-bit client flags.
func parseFlags(raw string) (uint32, error) {
	s, ok := query(raw, "flags")
	if !ok {
		return 0, nil
	}
	v, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return 0, badRequest("flags " + quoted(s) + " is not a number from 0 to 4294967295")
	}
	return uint32(v), nil
}

// parseDelta reads ?delta= for incr/decr; 1 when absent.
func parseDelta(raw string) (uint64, error) {
	s, ok := query(raw, "delta")
	if !ok {
		return 1, nil
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, badRequest("delta " + quoted(s) + " is not a number from 0 to 18446744073709551615")
	}
	return v, nil
}
