package gateway

import (
	"context"
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
