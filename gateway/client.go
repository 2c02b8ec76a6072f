package gateway

import (
	"context"
	"fmt"
	"net/http"
)

// Client is what the gateway asks of a request's connection, from a
// server that offers it (h1.Server, through NewContext): Gone reports,
// without waiting, whether the client has closed or reset the
// connection, so that a request whose memcached work is large is not
// sent for an answer nobody would read. It must be cheap (one
// non-blocking system call at most) and safe to call from any goroutine
// while the request runs. h1's connections are Clients.
//
// Only requests that make memcached send much ask it, before any of
// their work is sent: multi-key reads (GET /?key=a&key=b) and batches
// (POST /). The small GET and PUT of one key never do: a check would cost
// them a system call each and spare little. A server that offers no
// Client (net/http) cancels a request's context when its client goes:
// that is asked instead.
type Client = interface{ Gone() bool }

// errClientGone is a request whose client closed or reset its connection
// before its work was sent to memcached: nothing was sent, nothing is
// written, and it is logged and counted as 499, as a cancelled request is.
var errClientGone = fmt.Errorf("client closed its connection before the request was sent to memcached: %w", context.Canceled)

// clientGone reports whether r's client has gone (Client), for a request
// about to send large work to memcached.
func clientGone(r *http.Request) bool {
	rc := reqCtx(r)
	if rc == nil {
		return r.Context().Err() == context.Canceled
	}
	if rc.client != nil {
		return rc.client.Gone()
	}
	return rc.Context.Err() != nil // net/http cancels it when the client goes
}
