// Package h1 is a minimal HTTP/1.x server for one http.Handler. It serves
// the simple, well-formed requests of the gateway's hot path itself and
// hands every connection it does not take on to a net/http Server, which
// then owns it and answers exactly as net/http does, errors included.
//
// The fast path avoids net/http's per-request background read, context
// and double buffering: it parses each request head where it lies in the
// read buffer and sends each response with one write. A connection holds
// no buffer between requests, and on Linux no goroutine either: it waits
// in an epoll set of the Server's own and a worker serves it when its
// next request comes, connections in the order their requests arrived
// (see poller). h1 does no TLS, HTTP/2 or Hijack itself; it answers
// "Expect: 100-continue" on HTTP/1.1 itself (conn.continue100), any other
// expectation is Fallback's.
//
// What a handler sees on the fast path differs from net/http in these
// ways, all else (request fields, status lines, headers and their order,
// Content-Length and Content-Type rules, chunking, keep-alive and body
// draining rules) being the same:
//   - The request context is cancelled only by Server.Close: not when the
//     client goes away (net/http notices that with a background read) nor
//     when the handler returns. Handlers bound their work with their own
//     deadlines, and may ask whether the client is still there, without
//     waiting, through the client NewContext is given (Gone).
//   - The context carries http.LocalAddrContextKey but not
//     http.ServerContextKey.
//   - The ResponseWriter is an http.Flusher and supports
//     http.ResponseController's Flush, SetReadDeadline, SetWriteDeadline
//     and EnableFullDuplex, but not Hijack; it has no CloseNotify or
//     ReadFrom. http.MaxBytesReader cannot make it close the connection
//     after the response, as net/http does when the limit is hit.
//   - When it must close a connection with request bytes left unread, h1
//     half-closes it and drops what the client still sends until the
//     client closes, sends nothing for 5s, or 30s have passed, as nginx
//     lingers (a refusal over MaxConns, 500ms of silence); net/http
//     half-closes and sleeps 500ms.
//   - A body read ahead (Server.BodyLimit) of an "Expect: 100-continue"
//     request gets its 100 Continue once the budget has room for its
//     first bytes, before the handler runs; net/http sends it at the
//     handler's first read. Such a body the handler leaves unread is not
//     read to drop it (its client may be holding it back for the 100
//     Continue): the connection closes after the response, lingering,
//     where net/http reads and drops up to 256 KiB of it first.
//   - A handler may give its request back (ReleaseRequest): its
//     *http.Request, URL and Header are then reused for a later request
//     once it has ended. net/http never reuses a request; a handler that
//     does not call ReleaseRequest keeps its request as there.
//   - A request that arrives while Shutdown runs is answered, with
//     "Connection: close", if it got in before its connection was closed
//     as idle; net/http may drop such a request unanswered.
package h1
