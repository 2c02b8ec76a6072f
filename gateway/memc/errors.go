package memc

import (
	"context"
	"errors"
	"net/http"
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

// memcFailure is the one place that maps what went wrong with a command to
// the module's answer: a raw memcached line as a 502 text body (what the
// module forwards for every command but get), or an nginx page (raw == "").
func memcFailure(cmd memcCmd, err error) (status int, raw, reason string) {
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
	case errors.Is(err, upstream.ErrBadKey):
		return http.StatusBadGateway, "CLIENT_ERROR bad command line format\r\n", ""
	case errors.Is(err, upstream.ErrServer):
		// memcgate's client does not hand back the line itself.
		return http.StatusBadGateway, "SERVER_ERROR memcached answered with an error\r\n", ""
	}
	return http.StatusInternalServerError, "", "internal error"
}

// fail answers a failed command.
func (m *memc) fail(w http.ResponseWriter, r *http.Request, cmd memcCmd, err error) {
	status, raw, reason := memcFailure(cmd, err)
	if status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
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
