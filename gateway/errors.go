package gateway

import (
	"context"
	"errors"
	"net/http"

	"github.com/memcgate/memcgate/upstream"
)

// requestError is a problem with the request itself, found before anything
// was sent to memcached. Its message is the response body.
type requestError struct {
	status int
	msg    string
}

func (e *requestError) Error() string { return e.msg }

func badRequest(msg string) error { return &requestError{http.StatusBadRequest, msg} }

// preconditionError marks an upstream refusal that answers a conditional
// request (If-Match / If-None-Match): 412 instead of the plain mapping.
type preconditionError struct {
	err error
	msg string
}

func (e *preconditionError) Error() string { return e.msg }
func (e *preconditionError) Unwrap() error { return e.err }

// statusClientClosed is logged and counted (never sent) when the client went
// away before the answer was ready, as nginx does.
const statusClientClosed = 499

// errorStatus is the one place that maps an error to an HTTP status and the
// one-line body the client sees. retry says whether to send Retry-After.
func errorStatus(err error) (status int, msg string, retry bool) {
	var re *requestError
	var pe *preconditionError
	var ne *upstream.NodeError
	var ve *valueError
	var oe *overloadError
	switch {
	case errors.As(err, &oe):
		return http.StatusServiceUnavailable, oe.msg, true
	case errors.As(err, &ve):
		return http.StatusBadGateway, ve.Error(), false
	case errors.As(err, &re):
		return re.status, re.msg, false
	case errors.As(err, &pe):
		return http.StatusPreconditionFailed, pe.msg, false
	case errors.Is(err, upstream.ErrNotFound):
		return http.StatusNotFound, "not found", false
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

// writeError answers a failed request with a short text/plain body.
func writeError(w http.ResponseWriter, err error) {
	status, msg, retry := errorStatus(err)
	if status == statusClientClosed {
		if sw, ok := w.(*statusWriter); ok {
			sw.status = statusClientClosed
		}
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
