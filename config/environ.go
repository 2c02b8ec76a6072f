package config

import (
	"errors"
	"fmt"
	"math"
	"net"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"
)

// The checks of the environment itself, before values are looked at: a
// variable the binary does not know is an error, and so is a variable set
// to the empty string where the default would be used instead. Both used
// to be ignored: MEMCGATE_SERVRES=… left the default server list in place,
// MEMCGATE_SERVERS= fell back to 127.0.0.1:11211.

// testPrefix starts the test suite's own switches
// (MEMCGATE_TEST_REQUIRE_MEMCACHED), which share the prefix and are not
// settings of the binary.
const testPrefix = Prefix + "TEST_"

// serviceLinkRE matches the end of the names of the variables Kubernetes
// adds to every pod for each Service of its namespace while the pod's
// enableServiceLinks is true (the default): a Service named memcgate (or
// memcgate-…) gives MEMCGATE_PORT, MEMCGATE_SERVICE_HOST,
// MEMCGATE_PORT_80_TCP_ADDR and so on.
var serviceLinkRE = regexp.MustCompile(`^(?:SERVICE_HOST|SERVICE_PORT(?:_[A-Z0-9_]+)?|PORT(?:_[0-9]+_(?:TCP|UDP|SCTP)(?:_(?:PROTO|PORT|ADDR))?)?)$`)

// isServiceLink reports whether name=value is one of Kubernetes' service
// link variables: its name is the prefix, maybe the rest of a Service's
// name, and a service link's ending, and its value has the form Kubernetes
// gives that ending. Those are not settings and are not refused; a name
// of that shape with another value (MEMCGATE_ADMIN_PORT=9091, a setting
// mistyped) is.
func isServiceLink(name, value string) bool {
	rest, ok := strings.CutPrefix(name, Prefix)
	if !ok {
		return false
	}
	for end := rest; ; {
		if serviceLinkRE.MatchString(end) && serviceLinkValue(end, value) {
			return true
		}
		_, after, more := strings.Cut(end, "_")
		if !more {
			return false
		}
		end = after
	}
}

// serviceLinkValue reports whether value is what Kubernetes sets a
// service link variable ending in end to.
func serviceLinkValue(end, value string) bool {
	isPort := func(v string) bool {
		n, err := strconv.Atoi(v)
		return err == nil && n > 0 && n < 65536 && strconv.Itoa(n) == v
	}
	isProto := func(v string) bool { return v == "tcp" || v == "udp" || v == "sctp" }
	switch {
	case end == "SERVICE_HOST", strings.HasPrefix(end, "PORT_") && strings.HasSuffix(end, "_ADDR"):
		return net.ParseIP(value) != nil
	case strings.HasPrefix(end, "SERVICE_PORT"), strings.HasPrefix(end, "PORT_") && strings.HasSuffix(end, "_PORT"):
		return isPort(value)
	case strings.HasSuffix(end, "_PROTO"):
		return isProto(value)
	default: // PORT, PORT_80_TCP: tcp://10.0.0.1:80
		proto, hostPort, ok := strings.Cut(value, "://")
		if !ok || !isProto(proto) {
			return false
		}
		host, port, err := net.SplitHostPort(hostPort)
		return err == nil && net.ParseIP(host) != nil && isPort(port)
	}
}

// checkEnviron returns an error for every MEMCGATE_ variable of environ
// that is not a setting, naming the closest setting, and for every setting
// with a default that is set to the empty string (unless its empty tag
// gives the empty value a meaning), in the order of their names.
func checkEnviron(environ map[string]string) []error {
	vs := vars(reflect.TypeFor[Config](), Prefix)
	known := map[string]fieldVar{}
	for _, v := range vs {
		known[v.Name] = v
	}
	var names []string
	for name := range environ {
		if strings.HasPrefix(name, Prefix) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	var errs []error
	for _, name := range names {
		v, ok := known[name]
		switch {
		case !ok && (strings.HasPrefix(name, testPrefix) || isServiceLink(name, environ[name])):
		case !ok:
			msg := name + " is not a memcgate variable"
			if near := closest(name, vs); near != "" {
				msg += "; did you mean " + near + "?"
			} else if guessed := wordGuesses(name, vs); len(guessed) > 0 {
				msg += "; did you mean " + strings.Join(guessed, " or ") + "?"
			} else {
				msg += " (memcgate -help lists them)"
			}
			errs = append(errs, errors.New(msg))
		case environ[name] == "" && v.Default != "" && v.empty == "":
			errs = append(errs, fmt.Errorf("%s: is set but empty; unset it to get the default (%s), or give a value", name, v.Default))
		}
	}
	return errs
}

// closest returns the variable whose name, or whose Go field's name
// written like a variable (MEMCGATE_MAX_IDLE_CONNS for KEEPALIVE), is
// nearest to name, if it is near enough to be a misspelling; else "".
func closest(name string, vs []fieldVar) string {
	typed := strings.TrimPrefix(name, Prefix)
	best, bestDist := "", -1
	for _, v := range vs {
		for _, cand := range []string{strings.TrimPrefix(v.Name, Prefix), fieldSnake(v)} {
			d := editDistance(typed, cand)
			if bestDist < 0 || d < bestDist {
				best, bestDist = v.Name, d
			}
		}
	}
	// A third of the name, and at least two edits (a transposition is
	// one): MEMCGATE_SERVRES, MEMCGATE_LOGLEVEL, MEMCGATE_TIMOUT match;
	// a name sharing a word or two does not.
	if bestDist >= 0 && bestDist <= max(2, len(typed)/3) {
		return best
	}
	return ""
}

// wordGuesses returns, in order, the variables (at most two) that name
// is one word short of, its words in the same order with one more:
// MEMCGATE_TOKENS for MEMCGATE_AUTH_TOKENS, MEMCGATE_LISTEN for
// MEMCGATE_LISTEN_ADDR and MEMCGATE_LISTEN_SOCKET. A final PORT is read
// as ADDR, since every listener is set by its address: MEMCGATE_PORT
// gives MEMCGATE_ADMIN_ADDR and MEMCGATE_LISTEN_ADDR, and
// MEMCGATE_LISTEN_PORT, with as many words, MEMCGATE_LISTEN_ADDR. These
// are names guessed from other servers' settings, too far from any
// variable by spelling for closest. A word that more variables share
// (MAX, READ) guesses nothing.
func wordGuesses(name string, vs []fieldVar) []string {
	typed := strings.Split(strings.TrimPrefix(name, Prefix), "_")
	if typed[len(typed)-1] == "PORT" {
		typed[len(typed)-1] = "ADDR"
	}
	var out []string
	for _, v := range vs {
		words := strings.Split(strings.TrimPrefix(v.Name, Prefix), "_")
		if slices.Equal(words, typed) || len(words) == len(typed)+1 && oneWordMore(typed, words) {
			out = append(out, v.Name)
		}
	}
	if len(out) > 2 {
		return nil
	}
	slices.Sort(out)
	return out
}

// oneWordMore reports whether long is short with one word inserted.
func oneWordMore(short, long []string) bool {
	for i := range long {
		if slices.Equal(short, slices.Concat(long[:i], long[i+1:])) {
			return true
		}
	}
	return false
}

// fieldSnake is the variable name (without Prefix) that v's Go field
// would have if it were named like the field: MaxIdleConns → MAX_IDLE_CONNS,
// prefixed like v (MEMC_…).
func fieldSnake(v fieldVar) string {
	var b strings.Builder
	f := v.field
	for i, r := range f {
		if i > 0 && 'A' <= r && r <= 'Z' && (f[i-1] < 'A' || f[i-1] > 'Z' || i+1 < len(f) && 'a' <= f[i+1] && f[i+1] <= 'z') {
			b.WriteByte('_')
		}
		b.WriteRune(r)
	}
	return v.prefix + strings.ToUpper(b.String())
}

// editDistance is the optimal string alignment distance of a and b: the
// insertions, deletions, substitutions and transpositions of adjacent
// bytes that turn a into b.
func editDistance(a, b string) int {
	// d[i][j] is the distance of a[:i] and b[:j].
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

// describe turns env's aggregate error into one error per variable, each
// naming the variable instead of the Go field and saying in plain words
// what is wrong with its value (environ holds the values).
func describe(err error, environ map[string]string) []error {
	var agg env.AggregateError
	if !errors.As(err, &agg) {
		return []error{err}
	}
	var out []error
	for _, e := range agg.Errors {
		var pe env.ParseError
		if errors.As(e, &pe) {
			name := varName(pe.Name)
			out = append(out, fmt.Errorf("%s: %w", name, plainParseError(name, environ[name], pe)))
			continue
		}
		out = append(out, e)
	}
	return out
}

// binaryBytes reads a size written with a binary unit, 64MiB or 64Mi
// (KiB to TiB), as bytes.
func binaryBytes(s string) (int64, bool) {
	digits := strings.TrimRight(s, "KMGTiB")
	unit := strings.TrimSuffix(s[len(digits):], "B")
	shift, ok := map[string]uint{"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40}[unit]
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(digits, 10, 64)
	if err != nil || n < 0 || n > math.MaxInt64>>shift {
		return 0, false
	}
	return n << shift, true
}

// plainParseError says why value does not parse as pe's type, without the
// strconv and time package's wording. Errors of the package's own parsers
// (servers) are already plain and kept.
func plainParseError(name, value string, pe env.ParseError) error {
	t := pe.Type
	if t.Kind() == reflect.Slice {
		t = t.Elem()
	}
	switch {
	case t == reflect.TypeFor[time.Duration]():
		if strings.Trim(value, "0123456789") == "" {
			return fmt.Errorf("%q has no unit; write e.g. %ss or %sms", value, value, value)
		}
		return fmt.Errorf("%q is not a duration such as 500ms, 2s, 1m30s or 1h", value)
	case t.Kind() == reflect.Bool:
		return fmt.Errorf("%q is not true or false", value)
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Uint64:
		if errors.Is(pe.Err, strconv.ErrRange) {
			return fmt.Errorf("%q is out of range", value)
		}
		if strings.HasSuffix(name, "_BYTES") {
			// Sizes are written elsewhere with units (64MiB, Kubernetes'
			// 64Mi, GOMEMLIMIT): say what to write instead.
			if n, ok := binaryBytes(value); ok {
				return fmt.Errorf("%q is not a whole number of bytes: a unit is not read; write %d", value, n)
			}
			return fmt.Errorf("%q is not a whole number of bytes (a unit such as MiB is not read)", value)
		}
		return fmt.Errorf("%q is not a whole number", value)
	case t.Kind() == reflect.Float32 || t.Kind() == reflect.Float64:
		return fmt.Errorf("%q is not a number", value)
	}
	return pe.Err
}
