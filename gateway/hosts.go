package gateway

import (
	"context"
	"log/slog"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/upstream/loggate"
)

// AllowedHosts are the host names a listener answers to besides the ones
// a web page cannot take over (DNS rebinding): IP literals, localhost and
// the names under .localhost, and an absent Host. The zero value names
// none.
type AllowedHosts struct {
	any     bool
	names   []string // compared without case
	domains []string // ".example.com": example.com and every name under it
}

// NewAllowedHosts returns the rule for names, as MEMCGATE_ALLOWED_HOSTS
// lists them: a host name without port (compared without case, a final
// dot ignored), "*" for any, or a name with a leading dot for that domain
// and every name under it. Empty names are skipped.
func NewAllowedHosts(names []string) AllowedHosts {
	var a AllowedHosts
	for _, n := range names {
		n = strings.TrimSuffix(strings.TrimSpace(n), ".")
		switch {
		case n == "":
		case n == "*":
			a.any = true
		case n[0] == '.':
			a.domains = append(a.domains, n)
		default:
			a.names = append(a.names, n)
		}
	}
	return a
}

// Configured reports whether any name is listed.
func (a AllowedHosts) Configured() bool { return a.any || len(a.names) > 0 || len(a.domains) > 0 }

// Allows reports whether a request with Host header host may be served:
// host (its port and an IPv6 literal's brackets aside) is empty (HTTP/1.0
// without Host), an IP literal, localhost or a name under .localhost, or
// a name a lists. None of the first can be a name a web page made resolve
// to this gateway: a browser sends the name of the page's origin, and an
// origin that is an IP literal, or a loopback name browsers resolve
// themselves (RFC 6761), is the gateway's own.
func (a AllowedHosts) Allows(host string) bool {
	h := hostName(host)
	if h == "" || a.any {
		return true
	}
	if _, err := netip.ParseAddr(h); err == nil {
		return true
	}
	h = strings.TrimSuffix(h, ".")
	if strings.EqualFold(h, "localhost") || hasSuffixFold(h, ".localhost") {
		return true
	}
	for _, n := range a.names {
		if strings.EqualFold(h, n) {
			return true
		}
	}
	for _, d := range a.domains {
		if strings.EqualFold(h, d[1:]) || hasSuffixFold(h, d) {
			return true
		}
	}
	return false
}

// hostName is the host of a Host header: without its port, and an IPv6
// literal without its brackets. A header with more than one colon and no
// brackets is returned whole (an IPv6 literal as some clients send it).
func hostName(host string) string {
	if strings.HasPrefix(host, "[") {
		if end := strings.IndexByte(host, ']'); end > 0 {
			return host[1:end]
		}
		return host
	}
	if i := strings.IndexByte(host, ':'); i >= 0 && strings.IndexByte(host[i+1:], ':') < 0 {
		return host[:i]
	}
	return host
}

func hasSuffixFold(s, suffix string) bool {
	return len(s) >= len(suffix) && strings.EqualFold(s[len(s)-len(suffix):], suffix)
}

// HostCheck refuses, with 421 Misdirected Request, requests whose Host
// header names a host the listener is not known by: what a web page that
// makes its own name resolve to the gateway's address (DNS rebinding)
// sends. A listener checks when its rule is configured, and a listener
// bound to loopback only always (the names a loopback listener is reached
// by are AllowedHosts' own). Refusals are counted by listener and logged
// a line a second at most. Safe for concurrent use; a nil HostCheck
// refuses nothing.
type HostCheck struct {
	allowed atomic.Pointer[AllowedHosts]
	refused *prometheus.CounterVec
	log     *slog.Logger
	logGate loggate.Gate // refusals logged, a line a second at most
}

// NewHostCheck returns a HostCheck with allowed, logging to log and
// counting in memcgate_http_misdirected_requests_total on reg.
func NewHostCheck(allowed AllowedHosts, log *slog.Logger, reg prometheus.Registerer) *HostCheck {
	c := &HostCheck{
		log: log,
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "memcgate_http_misdirected_requests_total",
			Help: "Requests refused with 421 because their Host named neither an IP address, localhost nor a name of MEMCGATE_ALLOWED_HOSTS (DNS rebinding; logged a line a second at most), by listener.",
		}, []string{"listener"}),
	}
	c.refused.WithLabelValues("data")
	c.refused.WithLabelValues("admin")
	reg.MustRegister(c.refused)
	c.Set(allowed)
	return c
}

// Set replaces the allowed names for the requests that follow.
func (c *HostCheck) Set(allowed AllowedHosts) { c.allowed.Store(&allowed) }

// misdirected reports whether r must be refused on a listener that checks
// every request (always) or only while names are configured.
func (c *HostCheck) misdirected(r *http.Request, always bool) bool {
	if c == nil {
		return false
	}
	a := c.allowed.Load()
	if a == nil {
		a = &AllowedHosts{}
	}
	return (always || a.Configured()) && !a.Allows(r.Host)
}

// refuse answers r 421, counts it for listener and logs it, a line a
// second at most.
func (c *HostCheck) refuse(w http.ResponseWriter, r *http.Request, listener string) {
	host := Shorten(r.Host)
	c.refused.WithLabelValues(listener).Inc()
	writeError(w, &requestError{kind: kindMisdirected, msg: "Host " + strconv.Quote(host) +
		" is not a name of this gateway: use its IP address or localhost, or list the name in MEMCGATE_ALLOWED_HOSTS (refused so that a web page that makes its own name resolve here, DNS rebinding, cannot use the gateway)"})
	unlogged, ok := c.logGate.Pass()
	if !ok {
		return
	}
	c.log.LogAttrs(context.Background(), slog.LevelWarn, "request refused: Host not allowed: neither an IP address, localhost nor a name of MEMCGATE_ALLOWED_HOSTS",
		slog.String("listener", listener), slog.String("host", host), slog.String("remote", r.RemoteAddr), slog.Uint64("unlogged_before", unlogged))
}
