package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/memcgate/memcgate/gateway/chunk"
	"github.com/memcgate/memcgate/upstream"
	"github.com/memcgate/memcgate/upstream/op"
)

// The REST mapping: every outcome of the REST API, batch results
// included, becomes a status and a one-line body here and nowhere else.
// (The HttpMemcModule endpoints answer as the module does, with their own
// mapping in package memc.)

// requestKind is what was wrong with a request, found before anything
// was sent to memcached. The check that finds it says which kind and
// why (requestError); kindStatus alone turns the kind into a status. A
// requestKind is an error, as syscall.Errno is, so that
// errors.Is(err, kindTooLarge) finds the kind in err's chain.
type requestKind uint8

// The kinds of requestError.
const (
	kindInvalid     requestKind = iota + 1 // the request is malformed or makes no sense
	kindTooLarge                           // a body or value over its limit
	kindBodyTooSlow                        // the body did not arrive within the read timeout
	kindMethod                             // the method is not one the path serves
	kindMisdirected                        // the Host is not a name of this gateway
	kindNoToken                            // no bearer token, or one the gateway does not know
	kindNoScope                            // the token lacks the scope the request needs
	kindReadOnly                           // a write in read-only mode
	kindOtherSite                          // a request a browser sent from another site's page: a write to the data listener, any to the admin listener
	kindRange                              // a range that starts past the value's end
	kindHTTPVersion                        // a protocol version the gateway does not speak (HTTP/2)
	kindEnd                                // not a kind: every kind is below it
)

func (k requestKind) Error() string {
	switch k {
	case kindInvalid:
		return "gateway: invalid request"
	case kindTooLarge:
		return "gateway: too large"
	case kindBodyTooSlow:
		return "gateway: request body too slow"
	case kindMethod:
		return "gateway: method not allowed"
	case kindMisdirected:
		return "gateway: misdirected request"
	case kindNoToken:
		return "gateway: missing or unknown bearer token"
	case kindNoScope:
		return "gateway: token lacks the scope"
	case kindReadOnly:
		return "gateway: read-only mode"
	case kindOtherSite:
		return "gateway: request from another site's page"
	case kindRange:
		return "gateway: range not satisfiable"
	case kindHTTPVersion:
		return "gateway: HTTP version not served"
	}
	return "gateway: request error of unknown kind " + strconv.Itoa(int(k))
}

// kindStatus is the status of a request refused for kind k.
func kindStatus(k requestKind) int {
	switch k {
	case kindInvalid:
		return http.StatusBadRequest
	case kindTooLarge:
		return http.StatusRequestEntityTooLarge
	case kindBodyTooSlow:
		return http.StatusRequestTimeout
	case kindMethod:
		return http.StatusMethodNotAllowed
	case kindMisdirected:
		return http.StatusMisdirectedRequest
	case kindNoToken:
		return http.StatusUnauthorized
	case kindNoScope, kindReadOnly, kindOtherSite:
		return http.StatusForbidden
	case kindRange:
		return http.StatusRequestedRangeNotSatisfiable
	case kindHTTPVersion:
		return http.StatusHTTPVersionNotSupported
	}
	return http.StatusInternalServerError
}

// requestError is a problem with the request itself, found before anything
// was sent to memcached: its kind, and a message that is the response
// body. It wraps its kind.
type requestError struct {
	kind  requestKind
	msg   string
	allow string // kindMethod: the methods the path serves, the Allow header
}

func (e *requestError) Error() string { return e.msg }
func (e *requestError) Unwrap() error { return e.kind }

// errHTTP2 answers HTTP/2 with prior knowledge (the preface, PRI *
// HTTP/2.0, which net/http passes on as a request): the gateway speaks
// HTTP/1.x only (docs/decisions/0038).
var errHTTP2 = &requestError{kind: kindHTTPVersion, msg: "HTTP/2 is not served: send HTTP/1.1 (over TLS, ALPN offers http/1.1 alone)"}

func badRequest(msg string) error { return &requestError{kind: kindInvalid, msg: msg} }

// overloadError is a request refused because the gateway is at one of its
// limits: 503 with Retry-After.
type overloadError struct{ msg string }

func (e *overloadError) Error() string { return e.msg }

// valueError is a stored value the codec cannot read: memcached answered,
// but with something broken, which makes it a bad gateway answer.
type valueError struct{ err error }

func (e *valueError) Error() string { return "stored value cannot be decoded: " + e.err.Error() }
func (e *valueError) Unwrap() error { return e.err }

// ErrWaitedForAsync is in the chain of a synchronous write's error when
// the write gave up waiting for the asynchronous writes of its key
// accepted before it (WriteOrder): its request's context ended first (the
// context's error is in the chain too), and nothing was sent.
var ErrWaitedForAsync = errors.New("asynchronous writes of this key accepted before this write were not applied within the request deadline (MEMCGATE_REQUEST_TIMEOUT); this write must follow them and was not sent")

// statusRecorder is a ResponseWriter that records a status it never
// writes (the observer's statusWriter).
type statusRecorder interface{ recordStatus(status int) }

// statusClientClosed is logged and counted (never sent) when the client went
// away before the answer was ready, as nginx does.
const statusClientClosed = 499

// errClientGone is a request whose client closed or reset its connection
// before its work was sent to memcached: nothing was sent, nothing is
// written, and it is logged and counted as 499, as a cancelled request is.
var errClientGone = fmt.Errorf("client closed its connection before the request was sent to memcached: %w", context.Canceled)

// outcome is the status and body of verb v's result err, and whether to
// send Retry-After: the verb's success status, 412 for the conditional
// writes whose condition failed, or the error's mapping (errorStatus).
func outcome(v op.Verb, err error) (status int, msg string, retry bool) {
	if err == nil {
		switch v.Reply() {
		case op.Items, op.Number, op.Meta:
			return http.StatusOK, "", false
		case op.Touched, op.Deleted, op.MetaDeleted:
			return http.StatusNoContent, "", false
		}
		return http.StatusCreated, "", false
	}
	switch {
	case v == op.Add && errors.Is(err, upstream.ErrExists):
		return http.StatusPreconditionFailed, "key exists (add, If-None-Match: *)", false
	case v == op.Replace && errors.Is(err, upstream.ErrNotFound):
		return http.StatusPreconditionFailed, "key does not exist (replace, If-Match: *)", false
	case errors.Is(err, upstream.ErrCASNode):
		// Not a change of the item, which a read would show: the node
		// the CAS value names is not where the check can be made.
		return http.StatusPreconditionFailed, "the ETag (or cas) names a node that does not hold the key for this gateway: one removed or ejected, no longer among the key's replicas or not the node serving it, a warm-up pool's node, or none (a plain ETag on a replicated pool); read the key again for an ETag to send", false
	case v == op.CAS && (errors.Is(err, upstream.ErrCASConflict) || errors.Is(err, upstream.ErrNotFound)):
		return http.StatusPreconditionFailed, "item changed or is gone since its ETag was read (cas, If-Match)", false
	case v == op.DeleteCAS && (errors.Is(err, upstream.ErrCASConflict) || errors.Is(err, upstream.ErrNotFound)):
		// RFC 9110 §13.1.1: a failed If-Match is 412, a gone item too.
		return http.StatusPreconditionFailed, "item changed since its ETag (or cas) was read, or is gone (delete with If-Match or a cas)", false
	case v == op.DeleteCAS && errors.Is(err, upstream.ErrNoMeta):
		return http.StatusNotImplemented, "memcached answered the meta delete (md) with an error: a conditional delete (If-Match, or a batch delete with cas) needs memcached 1.6 or later, and a proxy in front of it that passes meta commands on", false
	case (v == op.Append || v == op.Prepend) && errors.Is(err, upstream.ErrNotFound):
		// memcached answers NOT_STORED both for a missing item and for
		// one the addition would make larger than an item: say both.
		return http.StatusNotFound, "not found, or the value would pass memcached's item size (memcached answers both alike)", false
	case v == op.Set && errors.Is(err, upstream.ErrTooLarge):
		// memcached unlinks the item a set too large for it would have
		// replaced, so that no stale value outlives the failed set; the
		// other writes leave it.
		return http.StatusRequestEntityTooLarge, "memcached refused the value as too large for an item, and deleted the value the key held (as it does when a set fails so): the key is now missing", false
	case (v == op.Append || v == op.Prepend) && errors.Is(err, chunk.ErrChunked):
		return http.StatusConflict, "the value is stored in chunks, which append and prepend cannot change; PUT the whole value", false
	}
	status, msg, retry = errorStatus(err)
	var ne *upstream.NodeError
	if v.Writes() && status == http.StatusGatewayTimeout && errors.As(err, &ne) && !errors.Is(err, upstream.ErrPartlyApplied) {
		// The key's node timed out and stays its node: the write was not
		// moved elsewhere (decisions/0086). Say what it left there.
		if ne.Dial() {
			msg += "; the write was not sent (no connection in time): the key's node keeps what it held"
		} else {
			msg += "; the write may or may not have been applied there: read the key, or repeat the write, before relying on it"
		}
	}
	return status, msg, retry
}

// errorStatus maps an error to its status and body, whatever the verb.
// A replicated write that failed says it may be partly applied
// (upstream.ErrPartlyApplied): the replicas are not one transaction, and
// a failure that names only the node that failed reads as if nothing
// was written.
func errorStatus(err error) (status int, msg string, retry bool) {
	status, msg, retry = errorStatusOf(err)
	if errors.Is(err, upstream.ErrPartlyApplied) {
		msg += "; the write may be partly applied, on some replicas of the key and not others (docs/pools.md, What an error means): read the key, or repeat a set, before relying on it"
	}
	return status, msg, retry
}

// errorStatusOf is errorStatus but for a write partly applied.
func errorStatusOf(err error) (status int, msg string, retry bool) {
	var re *requestError
	var oe *overloadError
	var ne *upstream.NodeError
	var ve *valueError
	var be *upstream.BusyError
	switch {
	case errors.Is(err, ErrWaitedForAsync) && errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout, ErrWaitedForAsync.Error(), false
	case errors.As(err, &oe):
		return http.StatusServiceUnavailable, oe.msg, true
	case errors.As(err, &be):
		return http.StatusServiceUnavailable, "memcached node " + be.Node + " has its share of MEMCGATE_MAX_REQUESTS in flight or waiting (it answers slower than requests for it come); retry shortly", true
	case errors.As(err, &ve):
		return http.StatusBadGateway, ve.Error(), false
	case errors.As(err, &re):
		return kindStatus(re.kind), re.msg, false
	case errors.Is(err, upstream.ErrNotFound):
		return http.StatusNotFound, "not found", false
	case errors.Is(err, chunk.ErrMissing):
		return http.StatusNotFound, "not found (a chunk of the value was gone)", false
	case errors.Is(err, chunk.ErrChunked):
		return http.StatusInsufficientStorage, "the value is stored in chunks; read it on its own with GET /{key}", false
	case errors.Is(err, chunk.ErrMoved):
		return http.StatusServiceUnavailable, "the key's memcached nodes changed (a reload, or a node ejected or back) while the value was written in chunks: it is not stored, or not readable; PUT it again", true
	case errors.Is(err, chunk.ErrChanging):
		return http.StatusConflict, "the value kept changing between the check that it is not stored in chunks and the append (other writes of the key); nothing was appended", false
	case errors.Is(err, upstream.ErrExists):
		return http.StatusConflict, "key exists", false
	case errors.Is(err, upstream.ErrCASConflict):
		return http.StatusPreconditionFailed, "item changed since its ETag was read", false
	case errors.Is(err, upstream.ErrNotNumeric):
		return http.StatusConflict, "value is not a decimal number", false
	case errors.Is(err, upstream.ErrBadKey):
		return http.StatusBadRequest, "key is not valid for memcached", false
	case errors.Is(err, upstream.ErrTooLarge):
		return http.StatusRequestEntityTooLarge, "memcached refused the value as too large for an item", false
	case errors.Is(err, upstream.ErrNoMemory):
		return http.StatusServiceUnavailable, "memcached had no memory to store the item (SERVER_ERROR out of memory storing object), though it fits: try again", true
	case errors.Is(err, upstream.ErrNoFit):
		return http.StatusServiceUnavailable, errBudget.msg, true
	case errors.Is(err, upstream.ErrOverLimit):
		return http.StatusInsufficientStorage, "value does not fit in this answer (MEMCGATE_BATCH_MAX_RESPONSE_BYTES); read this key on its own", false
	case errors.Is(err, upstream.ErrNoNodes):
		return http.StatusServiceUnavailable, "no memcached node available", true
	case errors.As(err, &ne) && ne.Timeout():
		return http.StatusGatewayTimeout, "memcached did not answer in time (" + ne.Node + ")", false
	case errors.As(err, &ne):
		return http.StatusBadGateway, "memcached connection failed (" + ne.Node + ")", true
	case errors.Is(err, upstream.ErrServer):
		return http.StatusBadGateway, "memcached answered with an error", false
	case errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout, "request deadline exceeded", false
	case errors.Is(err, context.Canceled):
		return statusClientClosed, "client closed the request", false
	}
	return http.StatusInternalServerError, "internal error", false
}

// unreachable reports whether err says memcached could not be asked for
// an item: no node could take it, the connection failed, no answer came
// in time, or the gateway was at one of its limits. An answer memcached
// gave (a miss, an error reply, a value that cannot be decoded) and a
// problem of the request itself are not; nor is a replicated write that
// some replicas answered though too few for its policy
// (upstream.PartlyAppliedError): it reached memcached there, whatever
// failed on the others.
func unreachable(err error) bool {
	var ne *upstream.NodeError
	var oe *overloadError
	var be *upstream.BusyError
	var pe *upstream.PartlyAppliedError
	if errors.As(err, &pe) && pe.Answered > 0 {
		return false
	}
	return errors.Is(err, upstream.ErrNoNodes) || errors.As(err, &ne) || errors.As(err, &oe) || errors.As(err, &be) ||
		errors.Is(err, upstream.ErrNoFit) || errors.Is(err, context.DeadlineExceeded)
}

// Status is the REST mapping of an error the gateway's own request
// handling returned (ReadBody's, say), for endpoints that answer in their
// own format: its status, message, and whether to send Retry-After.
func Status(err error) (status int, msg string, retryAfter bool) { return errorStatus(err) }

// writeError answers a failed request with a short text/plain body, and
// the header its kind calls for: Allow on a 405, the bearer challenge on
// a 401.
func writeError(w http.ResponseWriter, err error) {
	status, msg, retry := errorStatus(err)
	var re *requestError
	if errors.As(err, &re) {
		switch re.kind {
		case kindMethod:
			w.Header().Set("Allow", re.allow)
		case kindNoToken:
			w.Header().Set("WWW-Authenticate", `Bearer realm="memcgate"`)
		}
	}
	writeStatus(w, status, msg, retry)
}

// writeStatus answers with status and a short text/plain body.
func writeStatus(w http.ResponseWriter, status int, msg string, retry bool) {
	if status == statusClientClosed {
		recordClientClosed(w)
		return
	}
	h := w.Header()
	h.Del("ETag")
	h.Del("X-Memcached-Flags")
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	if retry {
		h.Set("Retry-After", "1")
	}
	if status == http.StatusRequestEntityTooLarge {
		// The body is unread; do not let net/http drain a huge one to
		// keep the connection.
		h.Set("Connection", "close")
	}
	w.WriteHeader(status)
	_, _ = w.Write([]byte(msg + "\n"))
}

// maxShown bounds a client's string that an answer or a log line quotes
// (a method, a Host, a query value, a batch's op name): the request head
// bounds such a string only by MAX_HEADER_BYTES, and a batch's body by
// BATCH_MAX_BYTES, and echoed whole it would make every answer and log
// line as large.
const maxShown = 100

// Shorten returns s cut to 100 bytes, "…" marking the cut, for quoting a
// string a client chose (a method, a command) in an answer or a log line.
func Shorten(s string) string {
	if len(s) <= maxShown {
		return s
	}
	return s[:maxShown] + "…"
}

// quoted is s shortened and quoted as a Go string, escapes and all.
func quoted(s string) string { return strconv.Quote(Shorten(s)) }

// text answers status with a plain-text body.
func text(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(body))
}
