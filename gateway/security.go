package gateway

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
)

// Scope is what a bearer token allows.
type Scope uint8

const (
	// ScopeRead allows GET and HEAD of items (and multi-get).
	ScopeRead Scope = 1 << iota
	// ScopeWrite allows PUT, DELETE and POST operations on items.
	ScopeWrite
	// ScopeAdmin allows the admin listener's endpoints other than /healthz
	// and /readyz, and cluster-wide commands (flush_all, stats).
	ScopeAdmin
)

// Tokens maps bearer tokens to their scopes. Lookups compare SHA-256
// digests of every configured token in constant time, so neither a token's
// content nor its length leaks through timing. The zero value (no tokens)
// lets every request through.
type Tokens struct {
	entries  []tokenEntry
	required bool // a token is needed even with no entries (RequireToken)
}

type tokenEntry struct {
	digest [sha256.Size]byte
	scopes Scope
}

// NewTokens hashes the given secrets with their scopes.
func NewTokens(secrets map[string]Scope) Tokens {
	var t Tokens
	for secret, sc := range secrets {
		t.entries = append(t.entries, tokenEntry{digest: sha256.Sum256([]byte(secret)), scopes: sc})
	}
	return t
}

// RequireToken returns t enforced even without a token: every request
// that needs a scope is refused (401) until tokens replace it. It is the
// Tokens of a token file named that holds none yet (a secret not yet
// written): running open instead would let every client do everything.
func (t Tokens) RequireToken() Tokens {
	t.required = true
	return t
}

// Enabled reports whether requests need a token: any is configured, or
// one is required (RequireToken).
func (t Tokens) Enabled() bool { return len(t.entries) > 0 || t.required }

// Scopes returns the scopes of the request's bearer token and whether a
// known token was presented.
func (t Tokens) Scopes(r *http.Request) (Scope, bool) {
	h := r.Header.Get("Authorization")
	const prefix = "Bearer "
	if len(h) <= len(prefix) || !strings.EqualFold(h[:len(prefix)], prefix) {
		return 0, false
	}
	d := sha256.Sum256([]byte(strings.TrimSpace(h[len(prefix):])))
	var found Scope
	ok := 0
	for _, e := range t.entries { // no early exit: every entry costs the same
		eq := subtle.ConstantTimeCompare(d[:], e.digest[:])
		ok |= eq
		found |= e.scopes & Scope(-eq) // all ones or zero: a mask
	}
	return found, ok == 1
}

// require answers a request without a valid token or without the scope
// need (writeError), and reports whether it may go on.
func (t Tokens) require(w http.ResponseWriter, r *http.Request, need Scope) bool {
	return refuse(w, t.check(r, need))
}

// check returns why the request may not go on: no valid token
// (kindNoToken) or not every scope of need (kindNoScope); nil if it may.
func (t Tokens) check(r *http.Request, need Scope) *requestError {
	if !t.Enabled() {
		return nil
	}
	have, ok := t.Scopes(r)
	if !ok {
		return &requestError{kind: kindNoToken, msg: "missing or unknown bearer token"}
	}
	if missing := need &^ have; missing != 0 {
		return &requestError{kind: kindNoScope, msg: "token lacks the " + missing.String() + " scope"}
	}
	return nil
}

// refuse answers a request that check refused, and reports whether it
// may go on (e == nil).
func refuse(w http.ResponseWriter, e *requestError) bool {
	if e == nil {
		return true
	}
	writeError(w, e)
	return false
}

// String names the scopes of s as MEMCGATE_AUTH_TOKENS writes them:
// "read", "read+write".
func (s Scope) String() string {
	var names []string
	for _, n := range []struct {
		s    Scope
		name string
	}{{ScopeRead, "read"}, {ScopeWrite, "write"}, {ScopeAdmin, "admin"}} {
		if s&n.s != 0 {
			names = append(names, n.name)
		}
	}
	if len(names) == 0 || s&^(ScopeRead|ScopeWrite|ScopeAdmin) != 0 {
		return "unknown"
	}
	return strings.Join(names, "+")
}

// scopeFor is the scopes a data-plane request needs, all of them: read to
// read, write for everything else, and both for a read that also sets the
// item's expiration (?touch=), which answers the value as a GET does.
// Query names are compared raw, undecoded, as every handler of the data
// listener reads them: a name that decodes to "touch" (%74ouch) is no gat
// here, and must be none in the handler.
func scopeFor(r *http.Request) Scope {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return ScopeWrite
	}
	if hasQuery(r.URL.RawQuery, "touch") {
		return ScopeRead | ScopeWrite
	}
	return ScopeRead
}

// Access is who may do what: the bearer tokens and read-only mode, which
// a reload may change while requests run. The REST API and the
// HttpMemcModule endpoints share one (Options.Access). Safe for concurrent
// use; the zero value lets every request through.
type Access struct {
	p atomic.Pointer[accessRules]
}

type accessRules struct {
	tokens   Tokens
	readOnly bool
}

// NewAccess returns an Access with tokens and read-only mode.
func NewAccess(tokens Tokens, readOnly bool) *Access {
	a := new(Access)
	a.Set(tokens, readOnly)
	return a
}

// Set replaces the tokens and read-only mode for the requests that follow.
func (a *Access) Set(tokens Tokens, readOnly bool) {
	a.p.Store(&accessRules{tokens: tokens, readOnly: readOnly})
}

// Tokens returns the tokens in force.
func (a *Access) Tokens() Tokens { return a.rules().tokens }

// ReadOnly reports whether read-only mode is on.
func (a *Access) ReadOnly() bool { return a.rules().readOnly }

func (a *Access) rules() *accessRules {
	if r := a.p.Load(); r != nil {
		return r
	}
	return &accessRules{}
}

// guard enforces an Access on the REST API.
type guard struct{ a *Access }

// authorize is the middleware of guard.
func (g guard) authorize(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if refuse(w, g.access(r)) {
			next.ServeHTTP(w, r)
		}
	})
}

// access returns why a data-plane request may not go on (read-only mode,
// a write from another site's page, tokens), or nil.
func (g guard) access(r *http.Request) *requestError {
	rules := g.a.rules()
	need := scopeFor(r)
	if rules.readOnly && need&ScopeWrite != 0 && r.Method != http.MethodOptions {
		return &requestError{kind: kindReadOnly, msg: "read-only mode: writes are disabled (MEMCGATE_READ_ONLY)"}
	}
	if need != ScopeRead && !rules.tokens.Enabled() && FromOtherSite(r) {
		return errOtherSite
	}
	return rules.tokens.check(r, need)
}

// errOtherSite refuses a write that FromOtherSite says a browser sent from
// another site's page.
var errOtherSite = &requestError{kind: kindOtherSite, msg: "a browser sent this write from a page of another site (Sec-Fetch-Site, Origin): refused, so that web pages cannot change the cache; writes from pages need a bearer token (MEMCGATE_AUTH_TOKENS)"}

// FromOtherSite reports whether a browser says r comes from a page of
// another origin: Sec-Fetch-Site is cross-site or same-site or, from a
// browser too old to send it, Origin names a host other than r.Host. It
// is the test of net/http's CrossOriginProtection, for every method: a
// GET changes data too (GET ?touch=, the HttpMemcModule endpoints' GET
// ?cmd=set and ?cmd=flush_all), and an <img> sends one from any page.
// Programs send neither header, so their requests never are.
//
// Without tokens, anything that reaches the data listener may write;
// this keeps a web page that a user inside the network opens from
// writing with that user's reach. A request with a valid token needs no
// such test: a page cannot send a token it does not have.
func FromOtherSite(r *http.Request) bool {
	switch r.Header.Get("Sec-Fetch-Site") {
	case "same-origin", "none": // the gateway's own origin, or typed in the address bar
		return false
	case "":
		o := r.Header.Get("Origin")
		if o == "" {
			return false
		}
		u, err := url.Parse(o)
		return err != nil || u.Host != r.Host
	}
	return true
}
