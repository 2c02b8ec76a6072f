package gateway

import (
	"encoding/json"
	"net/http"
	"net/http/pprof"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Admin is what the admin endpoints show. Every func field may be nil.
type Admin struct {
	// Unready says why this gateway should not get traffic (upstream not
	// healthy enough, draining), or returns "" when it should. /readyz
	// answers 503 with the reason while it is not "".
	Unready func() string
	// Nodes returns the state of every memcached node, for /debug/nodes.
	Nodes func() any
	// Owners returns where a key lives (owner, failover chain, the node
	// serving it now), for /debug/owners?key=.
	Owners func(key string) any
	// Status returns the cluster's state for the status page: the node
	// table. If nil, the page shows no nodes.
	Status func() StatusInfo
	// Reloads returns the configuration reloads so far, in any order (the
	// page shows the newest first). If nil, as when reloading is not
	// supported, the page says there were none.
	Reloads func() []Reload
	// Started is when the process started, for the uptime; if zero, when
	// NewAdminHandler was called.
	Started time.Time
	// Build says which binary is serving, for the status page.
	Build BuildInfo
	// Config returns the configuration in force, secrets redacted, for
	// /debug/config.
	Config func() any
	// Access, if not nil, has the bearer tokens that guard every endpoint
	// but /healthz and /readyz with the admin scope, read on each
	// request: the data listener's, so that a reload changes both. Its
	// read-only mode does not apply here. Nil: no tokens.
	Access *Access
	// Hosts, if not nil, refuses with 421 every request, /healthz and
	// /readyz included, whose Host it does not allow: always if
	// LoopbackOnly, else while it has names configured
	// (MEMCGATE_ALLOWED_HOSTS). Nil refuses none.
	Hosts *HostCheck
	// LoopbackOnly says the listener is bound to loopback addresses
	// only, so that only this host's clients and the web pages its
	// browsers open reach it, by IP, localhost or a rebound name.
	LoopbackOnly bool
	// Busy, if not nil, is called for each request answered 503 because
	// adminWorkers requests other than /healthz and /readyz were under
	// way, so that the refusals are counted.
	Busy func()
}

// NewAdminHandler returns the admin-plane handler: /metrics from g,
// /healthz (the process is alive), /readyz, /debug/nodes, /debug/owners,
// /debug/config, /debug/pprof/, and the status page at /status and /.
// Every request a browser sends from another site's page (FromOtherSite)
// is refused with 403, tokens or not, after the Host check (a.Hosts) and
// before the token check (a.Access), except a link to the status page
// followed from another site (statusLink).
//
// The status page is one self-contained HTML page for people: each node's
// state and share of the keys with its traffic, and the gateway's own.
// Its rates and latency percentiles are the difference between the
// registry read at this view and at an earlier one (kept in a small ring
// of snapshots the views take; nothing samples in the background), over
// at least a second, or since the start on the first view. ?refresh=N
// reloads it every N seconds (default 5, 0 never).
//
// Every endpoint but /healthz and /readyz serves adminWorkers requests at
// once, and answers 503 with Retry-After past that.
//
// The handler uses its own mux, never http.DefaultServeMux, and starts no
// goroutine.
func NewAdminHandler(g prometheus.Gatherer, a Admin) http.Handler {
	mux := http.NewServeMux()
	status := newStatusPage(g, statusSource{build: a.Build, started: a.Started, unready: a.Unready, status: a.Status, reloads: a.Reloads})
	work := make(chan struct{}, adminWorkers)
	guard := func(h http.Handler) http.Handler { return atOnce(work, a.Busy, h) }
	page := guard(status)
	mux.Handle("GET /status", page)
	mux.Handle("GET /{$}", page)
	mux.Handle("GET /metrics", guard(promhttp.HandlerFor(g, promhttp.HandlerOpts{})))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		text(w, http.StatusOK, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if a.Unready != nil {
			if why := a.Unready(); why != "" {
				text(w, http.StatusServiceUnavailable, "not ready: "+why+"\n")
				return
			}
		}
		text(w, http.StatusOK, "ready\n")
	})
	debug := http.NewServeMux()
	mux.Handle("GET /debug/", guard(debug))
	debug.HandleFunc("GET /debug/nodes", func(w http.ResponseWriter, r *http.Request) {
		if a.Nodes == nil {
			text(w, http.StatusNotFound, "no node information\n")
			return
		}
		writeJSON(w, a.Nodes())
	})
	debug.HandleFunc("GET /debug/owners", func(w http.ResponseWriter, r *http.Request) {
		key := r.URL.Query().Get("key")
		if key == "" {
			text(w, http.StatusBadRequest, "empty key: use /debug/owners?key=K\n")
			return
		}
		if err := checkKey(key, MaxKeyLen); err != nil {
			text(w, http.StatusBadRequest, err.Error()+"\n")
			return
		}
		if a.Owners == nil {
			text(w, http.StatusNotFound, "no ring information\n")
			return
		}
		writeJSON(w, a.Owners(key))
	})
	debug.HandleFunc("GET /debug/config", func(w http.ResponseWriter, r *http.Request) {
		if a.Config == nil {
			text(w, http.StatusNotFound, "no configuration information\n")
			return
		}
		writeJSON(w, a.Config())
	})
	debug.HandleFunc("GET /debug/pprof/", pprof.Index)
	debug.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
	debug.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	debug.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	debug.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	access := a.Access
	if access == nil {
		access = new(Access)
	}
	// Tokens a reload sets where there were none guard the endpoints from
	// then on: the check runs even while there are none.
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength != 0 || len(r.TransferEncoding) > 0 {
			// No endpoint reads a body, and net/http reads up to 256 KiB
			// of one left unread after the handler, until the read
			// timeout: bodies sent a byte at a time kept the listener's
			// every connection serving, and probes out. Not read at all,
			// the body ends the connection.
			_ = http.NewResponseController(w).SetReadDeadline(time.Now())
			w.Header().Set("Connection", "close")
			writeError(w, errAdminBody)
			return
		}
		if a.Hosts.misdirected(r, a.LoopbackOnly) {
			a.Hosts.refuse(w, r, "admin")
			return
		}
		if FromOtherSite(r) && !statusLink(r) {
			writeError(w, errAdminOtherSite)
			return
		}
		if r.URL.Path != "/healthz" && r.URL.Path != "/readyz" && !access.Tokens().require(w, r, ScopeAdmin) {
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// adminWorkers is how many requests the admin endpoints other than
// /healthz and /readyz serve at once. Each of /metrics and the status
// page gathers the whole registry (411 series per node: with 256 nodes
// a scrape allocates tens of MB), /debug/nodes the state of every node,
// and pprof a profile or a collection: without a bound, a client at the
// admin listener's connection cap (64) ran 64 of them at once. Probes,
// a scraper and a person need a few.
const adminWorkers = 4

// errAdminBusy answers an admin request past adminWorkers.
var errAdminBusy = &overloadError{"the admin listener serves " + strconv.Itoa(adminWorkers) + " requests other than /healthz and /readyz at once (metrics, status page, /debug); retry shortly"}

// atOnce serves h while fewer than cap(work) requests it guards are
// under way, and answers 503 with Retry-After at once otherwise, calling
// busy, if not nil, for each such answer.
func atOnce(work chan struct{}, busy func(), h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case work <- struct{}{}:
			defer func() { <-work }()
			h.ServeHTTP(w, r)
		default:
			if busy != nil {
				busy()
			}
			writeError(w, errAdminBusy)
		}
	})
}

// errAdminBody refuses every admin request with a body (NewAdminHandler).
var errAdminBody = &requestError{kind: kindTooLarge, msg: "the admin listener takes no request body: its endpoints are read with GET and no body"}

// errAdminOtherSite refuses every request to the admin listener that
// FromOtherSite says a browser sent from another site's page. Such a page
// cannot read the answer, but it can make the gateway profile or trace
// itself for as long as it asks (/debug/pprof/profile?seconds=60), as
// often as it likes, with no token where there are none. Nothing here is
// for other sites' pages: probes, scrapers and curl send neither header,
// and a person opens the status page from the address bar or a bookmark
// (Sec-Fetch-Site: none) or by its own links (same-origin).
var errAdminOtherSite = &requestError{kind: kindOtherSite, msg: "a browser sent this request from a page of another site (Sec-Fetch-Site, Origin): the admin listener serves no other site's page, so that none can start profiles or traces; open its address directly (typed or bookmarked), or use curl"}

// statusLink reports whether r is a browser opening the status page in a
// tab or window of its own (Sec-Fetch-Mode navigate, Sec-Fetch-Dest
// document), as a link on a dashboard does: a page cannot read what it
// opens that way, nor make the request anything but a GET of the page,
// which costs the gateway one render. Images, scripts, frames and
// fetches of it from another site stay refused.
func statusLink(r *http.Request) bool {
	return r.Method == http.MethodGet && (r.URL.Path == "/status" || r.URL.Path == "/") &&
		r.Header.Get("Sec-Fetch-Mode") == "navigate" && r.Header.Get("Sec-Fetch-Dest") == "document"
}

// writeJSON answers 200 with v as indented JSON.
func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
