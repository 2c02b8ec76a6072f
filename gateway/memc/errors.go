package memc

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"

	"github.com/memcgate/memcgate/gateway"
	"github.com/memcgate/memcgate/gateway/chunk"
	"github.com/memcgate/memcgate/upstream"
)

// statusClientClosed is recorded (never sent) when the client went away
// before the answer was ready, as nginx does.
const statusClientClosed = 499

// memcErrorLine is an error line memcached answered to a command sent to
// every node; the module forwards such a line as a 502 body.
type memcErrorLine struct{ line string }

func (e *memcErrorLine) Error() string { return "memcached answered " + strings.TrimSpace(e.line) }

// checkKind is what was wrong with a request, found by nginx's or the
// module's checks (or memcgate's own) before anything was sent to
// memcached. The check that finds it says which kind and why (refusal);
// memcFailure alone turns the kind into the module's answer. A checkKind
// is an error, as the REST API's request kinds are, so that errors.Is(err,
// kindReadOnly) finds the kind in err's chain.
type checkKind uint8

// The kinds of refusal, in the order the checks (servePath, check) find
// them.
const (
	kindPath       checkKind = iota + 1 // a path nginx refuses: bad %-escape, %00, .. above the root
	kindNoLocation                      // a path under KeyPath with no key: no location matches
	kindTooLarge                        // a declared body over client_max_body_size (MaxBodyBytes)
	kindNoToken                         // no bearer token, or one the gateway does not know
	kindCommand                         // an unknown $memc_cmd, or a method with no default command
	kindNotAllowed                      // a command memc_cmds_allowed leaves out
	kindNoScope                         // the token lacks the scope the command needs
	kindOtherSite                       // a command that needs more than read, from another site's page
	kindReadOnly                        // a command that writes, in read-only mode
	kindArgument                        // exptime, flags or the delta not the digits the module takes
	kindBody                            // reading the body failed; the read's error decides the answer
	kindNoKey                           // a command that names an item, with an empty key
	kindNoValue                         // a storage command with neither $memc_value nor a body
	kindDeleteTime                      // delete with a time other than 0, which memcached refuses
	kindKeyTooLong                      // a key that escaping makes longer than memcached takes
	kindEnd                             // not a kind: every kind is below it
)

func (k checkKind) Error() string {
	switch k {
	case kindPath:
		return "memc: invalid request path"
	case kindNoLocation:
		return "memc: no key in the path"
	case kindTooLarge:
		return "memc: request body too large"
	case kindNoToken:
		return "memc: missing or unknown bearer token"
	case kindCommand:
		return "memc: no such command"
	case kindNotAllowed:
		return "memc: command not allowed"
	case kindNoScope:
		return "memc: token lacks the scope"
	case kindOtherSite:
		return "memc: command from another site"
	case kindReadOnly:
		return "memc: read-only mode"
	case kindArgument:
		return "memc: invalid argument"
	case kindBody:
		return "memc: reading the request body"
	case kindNoKey:
		return "memc: no key"
	case kindNoValue:
		return "memc: no value"
	case kindDeleteTime:
		return "memc: delete with a time"
	case kindKeyTooLong:
		return "memc: key too long"
	}
	return "memc: refusal of unknown kind " + strconv.Itoa(int(k))
}

// refusal is a request a check refused: its kind, and the reason an
// nginx page of the answer gives in its footer (the kinds answered with
// memcached's raw line do not show it). It wraps its kind, and for
// kindBody the read's error.
type refusal struct {
	kind   checkKind
	reason string
	err    error // kindBody: why reading the body failed
}

// refuse is a refusal of kind k for the reason given.
func refuse(k checkKind, reason string) error { return &refusal{kind: k, reason: reason} }

func (e *refusal) Error() string {
	if e.err != nil {
		return e.kind.Error() + ": " + e.err.Error()
	}
	return e.kind.Error() + ": " + e.reason
}

func (e *refusal) Unwrap() []error {
	if e.err != nil {
		return []error{e.kind, e.err}
	}
	return []error{e.kind}
}

// memcFailure is the one place that maps what went wrong with a request
// (a refusal by the checks) or with its command to the module's answer: a
// raw memcached line as a 502 text body (what the module forwards for
// every command but get), or an nginx page (raw == "") with reason in its
// footer. fail adds the headers: Retry-After with every 503, the bearer
// challenge with kindNoToken. A replicated write that failed says it
// may be partly applied (upstream.ErrPartlyApplied): the replicas are
// not one transaction, and a failure that names only the node that
// failed (no node reached, no answer in time) reads as if nothing was
// written.
func memcFailure(cmd memcCmd, err error) (status int, raw, reason string) {
	status, raw, reason = failureOf(cmd, err)
	if raw == "" && errors.Is(err, upstream.ErrPartlyApplied) {
		reason += "; " + partlyApplied
	}
	return status, raw, reason
}

// partlyApplied is what a failed replicated write adds to its reason.
const partlyApplied = "the write may be partly applied, on some replicas of the key and not others (docs/pools.md, What an error means): read the key, or repeat a set, before relying on it"

// failureOf is memcFailure but for a write partly applied.
func failureOf(cmd memcCmd, err error) (status int, raw, reason string) {
	var rf *refusal
	if errors.As(err, &rf) {
		switch rf.kind {
		case kindPath, kindCommand, kindArgument:
			return http.StatusBadRequest, "", rf.reason
		case kindNoLocation:
			return http.StatusNotFound, "", rf.reason
		case kindTooLarge:
			return http.StatusRequestEntityTooLarge, "", rf.reason
		case kindNoToken:
			return http.StatusUnauthorized, "", rf.reason
		case kindNotAllowed, kindNoScope, kindOtherSite, kindReadOnly:
			return http.StatusForbidden, "", rf.reason
		case kindBody:
			// The REST API's answer to the same failure, as a page: the
			// body is read as the REST API reads its own (its 503s are
			// the ones that call for Retry-After).
			status, msg, _ := gateway.Status(rf.err)
			return status, "", msg
		case kindNoKey, kindNoValue:
			return http.StatusInternalServerError, "", rf.reason
		case kindDeleteTime:
			// What memcached 1.6 answers to "delete <key> <n>" for any n
			// but "0".
			return http.StatusBadGateway, "CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]\r\n", ""
		case kindKeyTooLong:
			// memcached's answer to the key the module would send; get
			// reads it as an invalid reply, the others forward it.
			if cmd == memcGet {
				return http.StatusBadGateway, "", rf.reason
			}
			return http.StatusBadGateway, "CLIENT_ERROR bad command line format\r\n", ""
		}
		return http.StatusInternalServerError, "", "internal error"
	}
	var ne *upstream.NodeError
	var be *upstream.BusyError
	var el *memcErrorLine
	switch {
	case errors.Is(err, upstream.ErrNotFound):
		return http.StatusNotFound, "", "not found"
	case errors.Is(err, context.Canceled):
		return statusClientClosed, "", "client closed the request"
	case errors.Is(err, gateway.ErrWaitedForAsync) && errors.Is(err, context.DeadlineExceeded):
		// Not something the module could meet: the write waited for
		// asynchronous writes of its key (Prefer: respond-async on the
		// REST API) that memcached did not apply in time.
		return http.StatusGatewayTimeout, "", "asynchronous writes of this key accepted before this write were not applied in time; this write was not sent"
	case errors.As(err, &ne) && ne.Timeout(), errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout, "", "memcached did not answer in time"
	case errors.As(err, &ne), errors.Is(err, upstream.ErrNoNodes):
		return http.StatusBadGateway, "", "no memcached node could be reached"
	case errors.As(err, &be):
		// nginx answers 502 when its upstream's max_conns are all taken.
		return http.StatusBadGateway, "", "memcached node has its share of MEMCGATE_MAX_REQUESTS in flight or waiting"
	case errors.Is(err, upstream.ErrNoFit):
		// The REST API's answer to the same refusal (Retry-After: fail).
		return http.StatusServiceUnavailable, "", "the gateway holds as many bytes for clients as it may (MEMCGATE_MAX_BUFFERED_BYTES); retry shortly"
	case errors.Is(err, chunk.ErrChunked):
		// Not something the module could meet: memcgate stored the
		// value in chunks (MEMCGATE_BIG_VALUE_MAX_BYTES).
		return http.StatusConflict, "", "the value is stored in chunks, larger than one memcached item; read it with GET /{key} on the REST API"
	case errors.Is(err, chunk.ErrChanging):
		// Not something the module could meet either: other writes of
		// the key kept landing between the check that it is not stored
		// in chunks and the append.
		return http.StatusConflict, "", "the value kept changing between the check that it is not stored in chunks and the append; nothing was appended"
	}
	if cmd == memcGet {
		// The module reads any error line as an invalid reply to get.
		return http.StatusBadGateway, "", "memcached answered with an error"
	}
	switch {
	case errors.As(err, &el):
		return http.StatusBadGateway, el.line, ""
	case errors.Is(err, upstream.ErrNotNumeric):
		return http.StatusBadGateway, "CLIENT_ERROR cannot increment or decrement non-numeric value\r\n", ""
	case errors.Is(err, upstream.ErrTooLarge):
		return http.StatusBadGateway, "SERVER_ERROR object too large for cache\r\n", ""
	case errors.Is(err, upstream.ErrNoMemory):
		return http.StatusBadGateway, "SERVER_ERROR out of memory storing object\r\n", ""
	case errors.Is(err, upstream.ErrBadKey):
		return http.StatusBadGateway, "CLIENT_ERROR bad command line format\r\n", ""
	case errors.Is(err, upstream.ErrServer):
		// memcgate's client does not hand back the line itself.
		return http.StatusBadGateway, "SERVER_ERROR memcached answered with an error\r\n", ""
	}
	return http.StatusInternalServerError, "", "internal error"
}

// fail answers a refused request or a failed command (cmd is memcNone
// while the command is not known yet).
func (m *memc) fail(w http.ResponseWriter, r *http.Request, cmd memcCmd, err error) {
	status, raw, reason := memcFailure(cmd, err)
	switch {
	case status == http.StatusServiceUnavailable:
		w.Header().Set("Retry-After", "1")
	case errors.Is(err, kindNoToken):
		w.Header().Set("WWW-Authenticate", `Bearer realm="memcgate"`)
	}
	switch {
	case status == statusClientClosed:
		gateway.ClientClosed(w)
	case raw != "":
		m.raw(w, r, status, raw)
	default:
		m.page(w, r, status, reason)
	}
}
