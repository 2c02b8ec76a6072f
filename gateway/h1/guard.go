package h1

import (
	"errors"
	"io"
	"net"
	"strconv"
	"sync/atomic"
)

// A request whose head has both Content-Length and Transfer-Encoding is
// the classic request-smuggling vector: a proxy in front may frame its
// body by one header and the server by the other. RFC 9112 §6.3 lets a
// server read it as chunked only if it closes the connection afterwards;
// nginx answers 400. The fast path refuses such requests itself, but
// net/http reads them as chunked, deletes the Content-Length header (so a
// handler cannot tell) and keeps the connection open. A Transfer-Encoding
// on HTTP/1.0 is the same risk: net/http ignores it and reads no body, so
// the chunks that a proxy in front forwards as the body (HAProxy does)
// are read as the next requests, where RFC 9112 §6.1 requires the
// connection closed; nginx answers 400 here too. So is a field value
// continued on a line that begins with whitespace (obs-fold): net/http
// joins it to the field before, where a proxy may take it for a field of
// its own and so see a Content-Length or Transfer-Encoding that net/http
// does not, or the other way round; RFC 9112 §5.2 lets a server refuse
// it, and nginx does (errObsFold). And a Transfer-Encoding whose last
// coding is not chunked leaves the length unknown: RFC 9112 §6.3 requires
// 400 and the connection closed, where net/http answers 501
// (errTENotChunked). GuardConn makes net/http refuse all four, from
// below: it follows the framing of the request stream and never lets
// net/http see such a head complete.

// GuardConn returns c wrapped so that a net/http Server serving it
// answers a request whose head has both a Content-Length and a
// Transfer-Encoding header field, or, on HTTP/1.x, a field continued on a
// line of its own (obs-fold), a Transfer-Encoding on HTTP/1.0, or one
// whose last coding is not chunked, with
//
//	HTTP/1.1 400 Bad Request
//	Content-Type: text/plain; charset=utf-8
//	Connection: close
//	Content-Length: 54
//
//	request has both Content-Length and Transfer-Encoding
//
// (the body says which it is) and closes the connection, as the fast
// path and nginx do, whatever the Transfer-Encoding value. Field names
// are matched as net/http reads them: in any case, and only names that
// are exactly one of the two ("Content-Length :" is another field, which
// net/http then rejects itself). Requests before it on the connection are
// answered as usual, and every other stream passes unchanged, so net/http
// answers it exactly as it would without the wrapper. The one exception,
// documented at guardConn: a chunked request whose trailer section does
// not end in CRLF CRLF, followed within 4 KiB by a refused head, fails
// instead. (A refused head exactly at net/http's size limit gets net/http's
// 431 rather than the 400.)
//
// c must be a plain connection (TCP, or one h1 hands over) whose next byte
// starts a request, and its reads must all go through the wrapper. Do not
// wrap a *tls.Conn that net/http is to serve: net/http type-asserts
// *tls.Conn to fill Request.TLS, to run the handshake and its timeouts,
// and to negotiate HTTP/2, and would then serve HTTP/1 to a client that
// may have negotiated h2. Nor is the wrapper meant for connections whose
// bytes stop being HTTP/1 requests: those a handler hijacks or upgrades,
// or served as unencrypted HTTP/2 (http.Protocols.SetUnencryptedHTTP2).
// It assumes handlers do not use http.ResponseController.EnableFullDuplex
// (see guardConn for why).
//
// The returned conn keeps c's deadlines, addresses and Close, gives c back
// from NetConn (as tls.Conn does), and keeps its
// CloseWrite, CloseRead and ReadFrom when c has them. Read must not be
// called concurrently with itself, which net/http never does. Reads
// allocate nothing and cost one pass over the bytes read, mostly a skip
// over request bodies. GuardConn of a conn it returned returns that conn.
func GuardConn(c net.Conn) net.Conn { return Guard{}.Conn(c) }

// GuardListener returns ln with every connection it accepts wrapped by
// GuardConn, for an http.Server that serves plain TCP; see GuardConn for
// where it must not be used (in particular not under tls.NewListener's
// connections). Accept errors are returned unchanged.
func GuardListener(ln net.Listener) net.Listener { return Guard{}.Listener(ln) }

// Guard is GuardConn and GuardListener with what they say in place of
// net/http's answers. The zero Guard is GuardConn's.
type Guard struct {
	// HeadTooLarge, if not empty, is the body of the 431 that answers a
	// request head over net/http's limit (MaxHeaderBytes plus 4096
	// bytes), a request line that long included, in place of net/http's
	// "431 Request Header Fields Too Large", which names no limit: a
	// line that says which limit and what sets it, say. A newline is
	// added. The status line and headers stay net/http's, with a
	// Content-Length, and the connection is closed as net/http closes it.
	// Only net/http's answer to a head is replaced: bytes equal to it
	// that a handler writes pass as written (see headTooLarge).
	HeadTooLarge string
}

// Conn is GuardConn with g's answers.
func (g Guard) Conn(c net.Conn) net.Conn {
	return g.conn(c, headTooLargeAnswer(g.HeadTooLarge), nil)
}

// Listener is GuardListener with g's answers.
func (g Guard) Listener(ln net.Listener) net.Listener {
	return guardListener{ln, headTooLargeAnswer(g.HeadTooLarge)}
}

// conn wraps c, unless it is wrapped already, answering tooLarge (see
// headTooLargeAnswer) to a head over net/http's limit and calling
// refused, if not nil, with the reason for a head it refuses
// (errBothLengths, errObsFold, errTEOnHTTP10, errTENotChunked).
func (Guard) conn(c net.Conn, tooLarge string, refused func(error)) net.Conn {
	if g, ok := c.(*guardConn); ok {
		return g
	}
	return &guardConn{Conn: c, tooLarge: tooLarge, counted: refused}
}

type guardListener struct {
	net.Listener
	tooLarge string // headTooLargeAnswer's
}

func (l guardListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return Guard{}.conn(c, l.tooLarge, nil), nil
}

// headTooLarge is net/http's answer to a request head over its limit,
// written whole in one Write, as it writes it.
//
// A response can end in the same bytes: net/http's buffered writer
// sends a response's last bytes, up to 4 KiB, in a Write of their own,
// and a value a client stored makes them what it likes. So the guard
// replaces them only while net/http reads a head of more than readAhead
// bytes that has not ended: such a head's request is not served yet, and
// every request before it has been answered, since net/http reads no
// further ahead while it serves one. A head over net/http's limit
// (MaxHeaderBytes plus 4096 bytes) is longer, for a MaxHeaderBytes of 2 or more.
const headTooLarge = "HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n431 Request Header Fields Too Large"

// readAhead is the most net/http reads past the request it serves: the
// 4096 bytes of its bufio.Reader (a body read fills it, and a chunked
// body's trailer peeks into it) and the byte of its background read.
const readAhead = 4096 + 1

// headTooLargeAnswer is the answer in place of headTooLarge with body
// msg (Guard.HeadTooLarge), or "" for net/http's own when msg is empty.
func headTooLargeAnswer(msg string) string {
	if msg == "" {
		return ""
	}
	msg += "\n"
	return "HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\nContent-Length: " +
		strconv.Itoa(len(msg)) + "\r\n\r\n" + msg
}

// errSmuggle fails the reads after a refused head. net/http answers a
// read error that is not io.EOF, a timeout or a *net.OpError "read" with
// its plain 400 and closes the connection (conn.serve); this one is none
// of those.
var errSmuggle = errors.New("h1: request head with ambiguous framing")

// filler stands in for the withheld last byte of a refused head; see
// guardConn.
const filler = 0

// guardConn is GuardConn's conn.
//
// # Refusing a head
//
// When the framing reaches the last byte of a head it refuses (the LF of
// its empty line), Read returns the bytes before it and withholds
// it; the next Read returns one filler byte in its place and every Read
// after that fails with errSmuggle. net/http, in the middle of that head,
// then reads a last line that has no colon ("\r\x00" or "\x00", as bufio
// hands it a line cut short by an error as if it were whole), or the
// error itself, and answers 400 either way. Net/http's limit on what it
// reads for a head (MaxHeaderBytes+4096 bytes) counts the filler as it
// would have counted the LF: a refused head that runs past it still gets
// the 431 it gets without the wrapper, and one that ends exactly at it
// gets that 431 too, not the 400, as the filler takes the last byte
// allowed.
//
// The filler byte is for net/http's background read: while a handler
// runs, net/http reads one byte ahead to notice a client that goes away,
// and cancels the request's context on any read error. When a refused
// head is pipelined right behind a request, that read is the first after
// the head was withheld; with an error there the earlier request's
// context would be cancelled and a handler that honours it would fail the
// request. It gets the filler instead, as it would get the next byte of a
// pipelined request, and net/http keeps it for the next head: the earlier
// request completes with its context intact and its response is written
// before the 400.
//
// The one case where an earlier response changes: net/http reads a
// chunked body's trailer section only after peeking ahead, up to 4 KiB,
// for a "\r\n\r\n". A trailer section that does not itself end in one
// (it has bare LFs, which net/http's header reader accepts) has the peek
// run on into the requests after it. If the first "\r\n\r\n" there
// ends a refused head, or lies past one, the peek hits the withheld byte,
// so that chunked request's body read fails with "http: suspiciously long
// trailer after chunked body": its handler sees the error, net/http
// closes the connection after its response, and the requests after it
// get no answer. Without the wrapper the chunked request would have been served,
// and then the refused one as chunked (or, if a request in between is one
// net/http rejects, such as one with an invalid method or target, which
// the framing does not check, that request with an error).
//
// # Failing open
//
// The framing stops inspecting a connection (t.off) only where net/http
// fails it too, so that nothing is lost by passing the rest through:
//   - at a header field, in a head or in a trailer section, that
//     net/http's header reader rejects (see framing for why it must check
//     them): net/http fails that head with a 400, or that body read and
//     then closes the connection after the response.
//   - after a head whose request line or body framing net/http rejects
//     once it has read the head: an HTTP version it cannot parse, or one
//     that is not 1.x (400 or 505, or PRI * HTTP/2.0, after which it
//     closes); an invalid or empty Content-Length, or duplicates that
//     differ (400); a Transfer-Encoding that ends in chunked but is not
//     one "chunked" field, on HTTP/1.1 and later (501). Net/http reads no
//     further request. (Under
//     GODEBUG=httplaxcontentlength=1 net/http takes an empty
//     Content-Length as no length and goes on; the guard then stays off for
//     that connection.)
//
// Everything else is followed as net/http follows it. Where net/http
// fails a request line the framing goes on regardless, since net/http
// reads nothing after it. A malformed chunked body (a chunk-size line that
// is not hex digits and an optional extension ending in CRLF, with no
// other CR, at most 4096 bytes and not too much overhead per byte of data;
// or chunk data not followed by CRLF) makes net/http close the connection
// after the response, unless the handler enabled full duplex and wrote its
// response first: then net/http goes on to read the next request from
// where its chunked reader stopped. The framing resumes at that same
// place, so it holds in both cases. (With full duplex, net/http also goes
// on after a trailer section it rejected, from a place that depends on how
// far its header reader got; the guard is off by then. Hence GuardConn's
// assumption that handlers do not enable full duplex.)
//
// # The answer
//
// net/http answers the failed head with its plain 400 ("400 Bad Request",
// see badRequest), which says nothing of why. Once a read after the
// filler has failed, Write replaces that answer, written whole in one
// Write as net/http does, with framingAnswer's, which says why: only
// net/http reading the refused head reads past the filler (its
// background read, which may take the filler while a handler runs,
// reads one byte), and then it writes nothing but its answer to that
// head. Not before: a handler's response may end in the very bytes of
// net/http's 400 (a value a client stored), sent in a Write of their own
// by net/http's buffered writer; and net/http, which fails a bad request
// line without reading further, may be answering an earlier head that
// the framing went past. A refused head whose request line net/http
// fails before that read, or a bad request line in a head before it,
// gets net/http's 400: 400 and the connection closed either way, with
// another body. (In the trailer case above the failed read is the
// chunked request's body read; its response, were it exactly net/http's
// 400, would be replaced.)
type guardConn struct {
	net.Conn
	t        framing
	refused  uint8                  // 0, or 1: a head's last byte was withheld, 2: reads fail
	counted  func(error)            // if not nil, called once for the head refused
	tooLarge string                 // headTooLargeAnswer's answer in place of net/http's 431; "": net/http's
	long     atomic.Bool            // net/http is reading a head longer than it reads ahead (readAhead): what it writes answers that head
	why      string                 // framingAnswer's answer to the head refused
	answer   atomic.Pointer[string] // &why once a read after the filler failed: Write runs on other goroutines than Read
}

func (g *guardConn) Read(p []byte) (int, error) {
	switch g.refused {
	case 1:
		if len(p) == 0 {
			return 0, nil
		}
		p[0] = filler
		g.refused = 2
		return 1, nil
	case 2:
		g.answer.Store(&g.why)
		return 0, errSmuggle
	}
	n, err := g.Conn.Read(p)
	if n > 0 && !g.t.off {
		i := g.t.scan(p[:n])
		read := g.t.headLen() // of a head not over
		if i >= 0 {
			// A refused head is never over: net/http reads it up to its
			// withheld last byte.
			read -= min(read, uint64(n-i))
		}
		g.long.Store(read > readAhead)
		if i >= 0 {
			g.why = framingAnswer(g.t.why)
			if g.counted != nil {
				g.counted(g.t.why)
			}
			if i == 0 {
				p[0] = filler
				g.refused = 2
				return 1, nil
			}
			g.refused = 1
			return i, nil
		}
	}
	return n, err
}

// Write writes p to the wrapped connection, or, once a head is refused,
// framingAnswer's answer in place of net/http's plain 400 (see
// guardConn), or Guard.HeadTooLarge's in place of net/http's 431. Both
// are answers net/http writes whole in one Write, and only to a request
// it failed to read: a handler's response has a Date header.
func (g *guardConn) Write(p []byte) (int, error) {
	a := g.answer.Load()
	switch {
	case a != nil && string(p) == badRequest:
	case g.tooLarge != "" && g.long.Load() && string(p) == headTooLarge:
		a = &g.tooLarge
	default:
		return g.Conn.Write(p)
	}
	if _, err := io.WriteString(g.Conn, *a); err != nil {
		return 0, err
	}
	return len(p), nil
}

// ReadError is the wrapped connection's ReadError, if it has one (see
// replayConn.ReadError), else nil.
func (g *guardConn) ReadError() error {
	if r, ok := g.Conn.(interface{ ReadError() error }); ok {
		return r.ReadError()
	}
	return nil
}

// NetConn returns the wrapped connection, as tls.Conn.NetConn does.
func (g *guardConn) NetConn() net.Conn { return g.Conn }

// RefusalCounted reports whether the guard refused a head and counted it
// (Guard.conn with refused): net/http's 400 that follows is then counted already.
func (g *guardConn) RefusalCounted() bool { return g.refused != 0 && g.counted != nil }

// CloseWrite half-closes the connection if the wrapped one can, as
// net/http does on TCP before it closes a connection with a request left
// unread; otherwise it does nothing.
func (g *guardConn) CloseWrite() error {
	if cw, ok := g.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// CloseRead shuts the reading side if the wrapped connection can.
func (g *guardConn) CloseRead() error {
	if cr, ok := g.Conn.(interface{ CloseRead() error }); ok {
		return cr.CloseRead()
	}
	return nil
}

// ReadFrom writes what it reads from r to the wrapped connection, with
// its own ReadFrom if it has one (sendfile or splice on TCP), which
// net/http uses for io.Copy to a ResponseWriter. The reading side has no
// counterpart (no WriteTo): every byte read must pass the framing.
func (g *guardConn) ReadFrom(r io.Reader) (int64, error) {
	if rf, ok := g.Conn.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(writerOnly{g.Conn}, r)
}

// writerOnly hides every method of a writer but Write, so that io.Copy
// does not call back into ReadFrom.
type writerOnly struct{ io.Writer }
