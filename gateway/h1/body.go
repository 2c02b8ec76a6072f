package h1

import (
	"io"
	"net/http"
)

// maxDiscard is how much of an unread request body is read and dropped
// to keep the connection (net/http's maxPostHandlerReadBytes).
const maxDiscard = 256 << 10

// body is a fast-path request body: the next n bytes of the connection,
// or of what readAhead read of them. Like net/http's, it returns io.EOF
// with its last bytes, io.ErrUnexpectedEOF if the client stops early, and
// http.ErrBodyReadAfterClose after Close. It is not safe for concurrent
// use.
type body struct {
	c      *conn // reads from c.in, and releases its buffer at the body's end
	n      int64 // bytes not yet read
	ahead  []byte
	err    error // what cut the body short: after the bytes in ahead, or what a read from the connection failed with
	sawEOF bool
	cut    bool // its end came early: the client's EOF, or a read ahead cut short
	gotEOF bool // a Read returned io.EOF, which a body cut short returns after its error
	closed bool
	early  bool // closed before its end: the connection cannot be reused

	closing bool // the request closes the connection (Request.Close)

	// The request said "Expect: 100-continue": its client may wait for
	// a 100 Continue before it sends the body (continue100), which is
	// owed until the body's first read. A body not read to its end
	// closes the connection after the response, as on net/http: what
	// follows may be the body or the next request.
	expect bool
	owe100 bool
}

// Read implements io.Reader.
func (b *body) Read(p []byte) (int, error) {
	switch {
	case b.closed:
		return 0, http.ErrBodyReadAfterClose
	case b.sawEOF:
		b.gotEOF = true
		return 0, io.EOF
	case len(p) == 0:
		return 0, nil
	}
	if int64(len(p)) > b.n {
		p = p[:b.n]
	}
	var n int
	var err error
	switch {
	case len(b.ahead) > 0:
		n = copy(p, b.ahead)
		b.ahead = b.ahead[n:]
	case b.err != nil:
		b.sawEOF, b.cut = true, true
		return 0, b.err
	default:
		if b.owe100 {
			// The first read from the connection; a body read ahead
			// got its 100 Continue there, or none if that failed.
			b.owe100 = false
			if !b.c.w.wroteHeader {
				b.c.continue100() // a failed write is c.werr: the connection closes after the response
			}
		}
		n, err = b.c.in.Read(p)
	}
	b.n -= int64(n)
	if b.n == 0 {
		b.sawEOF, b.gotEOF = true, true
		b.done()
		return n, io.EOF
	}
	switch {
	case err == io.EOF: // net/http then reports io.EOF, and keeps the connection
		b.sawEOF, b.cut = true, true
		err = io.ErrUnexpectedEOF
	case err != nil:
		// The read timeout, or the socket failed: the body's place in
		// the stream is lost, and a client that may still be sending
		// gets its answer before the connection closes (serveRequest
		// lingers).
		b.err = err
	}
	return n, err
}

// TakeAhead hands over r's body if a Server read all of it ahead of the
// handler (Server.BodyLimit) and none of it has been read, else it
// returns nil; see body.takeAhead.
func TakeAhead(r *http.Request) []byte {
	if b, ok := r.Body.(*body); ok {
		return b.takeAhead()
	}
	return nil
}

// takeAhead hands over the body's unread bytes if all of them were read
// ahead (Server.BodyLimit), else it returns nil. The body is then at its
// end, and the bytes are the caller's: the
// connection keeps no reference to them and gives back the bytes of
// Server.Budget it held for them, so that a caller that keeps the body
// holds it against the budget itself, once, instead of copying it.
func (b *body) takeAhead() []byte {
	if b.closed || b.sawEOF || b.err != nil || b.n == 0 || int64(len(b.ahead)) != b.n {
		return nil
	}
	p := b.ahead
	b.n, b.sawEOF = 0, true
	b.c.abuf = nil // the caller's now: not the connection's to recycle
	b.done()
	return p
}

// done lets go of the connection's buffers once the body is read: what
// was read ahead has been copied out, or dropped, so the buffer can be
// lent again.
func (b *body) done() {
	b.c.in.release()
	if b.ahead != nil || b.err != nil {
		b.ahead = nil
		b.c.dropAhead(true)
	}
}

// Close implements io.Closer as net/http's server does: it reads and
// drops up to maxDiscard unread bytes, or gives up the connection; it
// reads nothing if the connection closes after the request anyway.
func (b *body) Close() error {
	if b.closed {
		return nil
	}
	b.closed = true
	switch {
	case b.sawEOF:
	case b.closing: // net/http: "no point in reading to EOF"
	case b.expect:
		// Its client may hold the rest back until a 100 Continue it
		// will not get: reading it would wait for the read timeout.
		// The connection closes after the response (commit), lingering.
		b.early = true
	case b.n > maxDiscard:
		b.early = true
	default:
		b.early = b.n == maxDiscard // net/http's off-by-one, kept
		return b.discard()
	}
	return nil
}

// discard reads and drops the rest of the body.
func (b *body) discard() error {
	if b.err != nil {
		return b.err // the connection's place in the stream is lost
	}
	if b.n > 0 && !b.sawEOF && b.ahead == nil {
		d, err := b.c.in.Discard(int(b.n))
		b.n -= int64(d)
		if err == io.EOF { // as in Read: net/http's body has seen its end
			b.sawEOF = true
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			return err
		}
	}
	b.sawEOF = true
	b.done()
	return nil
}
