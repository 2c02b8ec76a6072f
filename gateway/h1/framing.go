package h1

import "strings"

// framing follows the HTTP/1.x request framing of a byte stream as
// net/http's server reads it (net/http request.go readRequest and
// transfer.go, net/textproto's header reader, net/http/internal's chunked
// reader), one byte at a time through heads, chunk-size lines and
// trailers and in bulk through bodies and chunk data. It keeps only
// counters and flags, never a line: header names are matched as they
// pass. Its zero value is at the start of a stream.
//
// It checks header fields, in heads and in trailers, as net/http's header
// reader does (no whitespace before the first field, a colon, a non-empty
// name of token bytes or spaces, value bytes that are not controls but
// tab, a CR only before LF) and stops inspecting at the first one that
// fails: net/http fails that head or that body, and closes the
// connection. It must check, not guess on: net/http peeks up to 4 KiB
// ahead for a "\r\n\r\n" before it reads a chunked body's trailer section,
// so when its header reader then fails, net/http has already read into
// what the framing would take for the next request, and a byte withheld
// there would make that body read fail with another error.
type framing struct {
	st  uint8
	off bool // stopped inspecting; see guardConn

	// The request line.
	skip   uint8   // CR or LF bytes that may still be skipped before it (after a POST)
	spaces uint8   // spaces seen in it, up to 2
	post   int8    // bytes of "POST" matched by the method; -1: not POST
	isPOST bool    // this request is a POST
	plen   int     // bytes in the protocol field
	pbuf   [8]byte // its first 8 bytes
	plast  byte    // its last byte

	// A block of header fields: a head's or a trailer section.
	trailer bool  // it is a trailer section
	seen    bool  // a field line began
	folded  bool  // a head's field value continued on a line of its own (obs-fold)
	lastCR  bool  // the line's last byte was CR (also in chunk-size lines)
	name    uint8 // bytes of the field name so far, up to 255
	cand    uint8 // names it may still be: candCL | candTE
	kind    uint8 // the field being read: kindOther, kindCL or kindTE

	// The value of a Content-Length or Transfer-Encoding field, as
	// net/http trims it: leading whitespace dropped, trailing whitespace
	// of each line dropped, continuation lines joined by one space.
	vn   int    // digits (Content-Length) or bytes of "chunked" matched
	vval uint64 // the Content-Length
	vbad bool   // not a valid value
	vws  bool   // whitespace after the value's first byte: bad if anything follows

	// The head's fields so far.
	clN     int    // Content-Length fields
	clEmpty bool   // the first one was empty
	clVal   uint64 // and its value
	clDig   int    // and its digit count
	clBad   bool   // one was invalid or differed from the first
	teN     int    // Transfer-Encoding fields
	teOK    bool   // the last one was "chunked"
	teFinal bool   // the last coding they list is chunked
	el      int8   // bytes of "chunked" matched by the coding being read, -1: another coding
	elSeen  bool   // the coding being read has begun
	elWS    bool   // whitespace came after it
	why     error  // why endHead refused the head

	// Bodies.
	remain uint64 // body or chunk data left
	excess int64  // the chunked reader's overhead count
	lineN  int    // bytes of the chunk-size line so far
	crN    uint8  // CRs in it
	hexN   uint8  // hex digits of the chunk size
	hexV   uint64 // the chunk size
	hexBad bool   // the size is malformed
	hexWS  bool   // whitespace after or before digits
	semi   bool   // a chunk extension began
	endOK  bool   // the first byte after chunk data was CR

	// Where the stream is: bytes scanned, and where the request being
	// read began (headLen).
	pos    uint64
	headAt uint64
}

// framing states.
const (
	fReqStart  = iota // before a request line, maybe skipping CR/LF after a POST
	fReqLine          // in the request line
	fLineStart        // at the start of a header line
	fLineCR           // a header line began with CR
	fName             // in a field name
	fValue            // in a field value
	fBody             // in a Content-Length body
	fChunkLine        // in a chunk-size line
	fChunkData        // in chunk data
	fChunkEnd         // in the CRLF after chunk data
)

const (
	kindOther = iota
	kindCL
	kindTE
)

const (
	candCL = 1 << iota
	candTE
)

const (
	nameCL = "content-length"
	nameTE = "transfer-encoding"
)

// maxChunkLine is the longest chunk-size line net/http reads, CRLF
// included: the size of its bufio.Reader, which has to hold the line.
const maxChunkLine = 4096

// scan follows b, the next bytes of the stream. It returns the index in b
// of the last byte of a head the guard refuses (endHead), after which
// it must not be called again, or -1.
func (f *framing) scan(b []byte) int {
	base := f.pos
	f.pos += uint64(len(b))
	for i := 0; i < len(b); i++ {
		c := b[i]
		switch f.st {
		case fReqStart:
			if f.skip > 0 && (c == '\r' || c == '\n') {
				f.skip--
				continue
			}
			f.startRequest()
			f.headAt = base + uint64(i)
			f.requestLine(c)
		case fReqLine:
			if f.spaces == 1 {
				// The target: only the space after it matters.
				for i < len(b) && b[i] != ' ' && b[i] != '\n' {
					i++
				}
				if i == len(b) {
					return -1
				}
				c = b[i]
			}
			f.requestLine(c)
		case fLineStart:
			switch c {
			case ' ', '\t':
				f.continuation()
			case '\n':
				if f.endBlock() {
					return i
				}
			case '\r':
				f.endField()
				f.st = fLineCR
			default:
				f.endField()
				f.startField(c)
			}
		case fLineCR:
			if c != '\n' {
				f.off = true // a name that starts with CR
				break
			}
			if f.endBlock() {
				return i
			}
		case fName:
			f.nameByte(c)
		case fValue:
			if f.kind == kindOther && !f.lastCR {
				// Skip the bytes that are valid in any value.
				for i < len(b) && (b[i] >= ' ' && b[i] != 0x7f || b[i] == '\t') {
					i++
				}
				if i == len(b) {
					return -1
				}
				c = b[i]
			}
			f.valueByte(c)
		case fBody:
			n := min(f.remain, uint64(len(b)-i))
			f.remain -= n
			i += int(n) - 1
			if f.remain == 0 {
				f.endRequest()
			}
		case fChunkLine:
			f.chunkLineByte(c)
		case fChunkData:
			n := min(f.remain, uint64(len(b)-i))
			f.remain -= n
			i += int(n) - 1
			if f.remain == 0 {
				f.st = fChunkEnd
				f.lineN = 0
			}
		case fChunkEnd:
			// net/http reads these two bytes whatever they are.
			if f.lineN == 0 {
				f.endOK = c == '\r'
				f.lineN = 1
			} else if f.endOK && c == '\n' {
				f.startChunkLine()
			} else {
				f.endRequest() // malformed chunked encoding
			}
		}
		if f.off {
			return -1
		}
	}
	return -1
}

// startRequest resets the per-request state at the first byte of a
// request line.
func (f *framing) startRequest() {
	*f = framing{st: fReqLine, pos: f.pos}
}

// headLen is how many bytes of a request head scan has followed, its
// last byte not among them, or 0 out of a head (in a body, a trailer
// section, before a request line, or with the framing off).
func (f *framing) headLen() uint64 {
	if f.off || f.trailer {
		return 0
	}
	switch f.st {
	case fReqLine, fLineStart, fLineCR, fName, fValue:
		return f.pos - f.headAt
	}
	return 0
}

// requestLine follows a byte of the request line, which net/http reads
// as any line and cuts at the first two spaces into method, target and
// protocol. The framing needs the method (for the CR/LF net/http skips
// after a POST) and the protocol version (which decides whether
// Transfer-Encoding counts).
func (f *framing) requestLine(c byte) {
	switch {
	case c == '\n':
		f.startBlock(false)
	case c == ' ' && f.spaces < 2:
		if f.spaces == 0 {
			f.isPOST = f.post == 4
		}
		f.spaces++
	case f.spaces == 0:
		if f.post >= 0 && f.post < 4 && c == "POST"[f.post] {
			f.post++
		} else {
			f.post = -1
		}
	case f.spaces == 2:
		if f.plen < len(f.pbuf) {
			f.pbuf[f.plen] = c
		}
		f.plen++
		f.plast = c
	}
}

// version returns the request's HTTP version as net/http parses it
// (ParseHTTPVersion, after the line's CRLF or LF is cut), and whether it
// is valid.
func (f *framing) version() (major, minor int, ok bool) {
	n := f.plen
	if n > 0 && f.plast == '\r' {
		n--
	}
	p := &f.pbuf
	if f.spaces < 2 || n != 8 || string(p[:5]) != "HTTP/" || p[6] != '.' ||
		p[5] < '0' || p[5] > '9' || p[7] < '0' || p[7] > '9' {
		return 0, 0, false
	}
	return int(p[5] - '0'), int(p[7] - '0'), true
}

// startBlock begins the header fields of a head or a trailer section.
func (f *framing) startBlock(trailer bool) {
	f.st = fLineStart
	f.trailer = trailer
	f.seen = false
	f.kind = kindOther
	f.lastCR = false
}

// endBlock is called at the last byte of a block of header fields. It
// reports whether that ends a head the guard refuses.
func (f *framing) endBlock() bool {
	if f.trailer {
		f.endRequest()
		return false
	}
	f.endField()
	return f.endHead()
}

// startField begins a field line with its first byte c.
func (f *framing) startField(c byte) {
	f.seen = true
	f.name = 0
	f.cand = candCL | candTE
	f.st = fName
	f.nameByte(c)
}

// nameByte follows a byte of a field name, up to the colon. net/http
// knows a field as Content-Length or Transfer-Encoding when its name is
// one of them in any case (canonicalMIMEHeaderKey): a name with any other
// byte, a space before the colon included, is another field.
func (f *framing) nameByte(c byte) {
	if c == ':' {
		if f.name == 0 {
			f.off = true // an empty name
			return
		}
		f.kind = kindOther
		if f.trailer {
			// Trailer fields are checked, not read.
		} else if f.cand&candCL != 0 && int(f.name) == len(nameCL) {
			f.kind = kindCL
		} else if f.cand&candTE != 0 && int(f.name) == len(nameTE) {
			f.kind = kindTE
		}
		f.vn, f.vval, f.vbad, f.vws = 0, 0, false, false
		f.st = fValue
		return
	}
	if c != ' ' && !validFieldByte(c) {
		f.off = true // no colon, or a byte net/http does not take in a name
		return
	}
	if 'A' <= c && c <= 'Z' {
		c += 'a' - 'A'
	}
	n := int(f.name)
	if f.cand&candCL != 0 && (n >= len(nameCL) || nameCL[n] != c) {
		f.cand &^= candCL
	}
	if f.cand&candTE != 0 && (n >= len(nameTE) || nameTE[n] != c) {
		f.cand &^= candTE
	}
	if f.name < 255 {
		f.name++
	}
}

// valueByte follows a byte of a field value, continuation lines
// included.
func (f *framing) valueByte(c byte) {
	if f.kind == kindTE && c != '\n' && c != '\r' && !f.lastCR {
		f.codingByte(c)
	}
	switch {
	case c == '\n':
		f.vws = false // trailing whitespace of a line is dropped
		f.lastCR = false
		f.st = fLineStart
		return
	case f.lastCR:
		f.off = true // a CR not before LF
		return
	case c == '\r':
		f.lastCR = true
		return
	case c != '\t' && (c < ' ' || c == 0x7f):
		f.off = true // a control byte
		return
	case f.kind == kindOther:
		return
	case c == ' ' || c == '\t':
		if f.vn > 0 || f.vbad {
			f.vws = true
		}
		return
	case f.vws:
		f.vbad = true
		return
	}
	if f.kind == kindCL {
		// strconv.ParseUint(v, 10, 63): digits only, at most 1<<63-1.
		if c < '0' || c > '9' {
			f.vbad = true
			return
		}
		d := uint64(c - '0')
		if f.vval > (1<<63-1-d)/10 {
			f.vbad = true
			return
		}
		f.vval = f.vval*10 + d
		f.vn++
		return
	}
	if 'A' <= c && c <= 'Z' {
		c += 'a' - 'A'
	}
	if f.vn < len("chunked") && c == "chunked"[f.vn] {
		f.vn++
	} else {
		f.vbad = true
	}
}

// codingByte follows a byte of a Transfer-Encoding value as a list of
// codings (RFC 9110 §5.6.1: commas, optional whitespace around them,
// empty elements), for the last coding of the head's list: RFC 9112 §6.3
// makes a request whose last coding is not chunked one whose length
// cannot be known.
func (f *framing) codingByte(c byte) {
	switch {
	case c == ',':
		f.endCoding()
	case c == ' ' || c == '\t':
		f.elWS = f.elSeen
	default:
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if f.elWS || f.el < 0 || int(f.el) == len("chunked") || c != "chunked"[f.el] {
			f.el = -1
		} else {
			f.el++
		}
		f.elSeen = true
	}
}

// endCoding ends a coding of a Transfer-Encoding list: the last one
// begun is the list's last so far.
func (f *framing) endCoding() {
	if f.elSeen {
		f.teFinal = int(f.el) == len("chunked")
	}
	f.el, f.elSeen, f.elWS = 0, false, false
}

// continuation starts a line that begins with whitespace: it continues
// the current field's value, unless there is none yet, which net/http
// fails ("malformed MIME header initial line"). net/http joins it to the
// value with a space: for Content-Length, which it trims at both ends,
// that space only matters before more digits; for Transfer-Encoding,
// which it trims only at the start, any space after "chunked" spoils it.
// In a head it also marks the head folded, which endHead refuses
// (errObsFold); a trailer's continuation lines are only followed.
func (f *framing) continuation() {
	if !f.seen {
		f.off = true
		return
	}
	if !f.trailer {
		f.folded = true
	}
	if f.vn > 0 || f.vbad {
		switch f.kind {
		case kindCL:
			f.vws = true
		case kindTE:
			f.vbad = true
		}
	}
	f.st = fValue
}

// endField adds the head field just read, if any, to the head's.
func (f *framing) endField() {
	switch f.kind {
	case kindCL:
		// net/http requires duplicates to be the same string after
		// trimming, then parses the first: a digit string is one value
		// and length.
		empty := f.vn == 0 && !f.vbad
		f.clN++
		switch {
		case f.vbad:
			f.clBad = true
		case f.clN == 1:
			f.clEmpty, f.clVal, f.clDig = empty, f.vval, f.vn
		case empty != f.clEmpty || f.vval != f.clVal || f.vn != f.clDig:
			f.clBad = true
		}
	case kindTE:
		f.teN++
		f.teOK = !f.vbad && f.vn == len("chunked")
		f.endCoding()
	}
	f.kind = kindOther
}

// endHead is called at the last byte of a head whose fields all passed.
// It reports whether the guard refuses the head, and sets f.why: one with
// both Content-Length and Transfer-Encoding (errBothLengths); one with a
// field value continued on a line of its own (errObsFold), which net/http
// joins to the line before, where a proxy in front may take the line for
// a field of its own, so that a fold can hide a framing field from one of
// them; or one with Transfer-Encoding on HTTP/1.0 (errTEOnHTTP10), which
// net/http ignores and reads as having no body (RFC 9112 §6.1 requires
// the framing to be taken as faulty and the connection closed: a proxy in
// front that reads the body as chunked would have the chunks read as the
// next requests); or, on HTTP/1.1, one whose Transfer-Encoding does not
// end in chunked (errTENotChunked), which RFC 9112 §6.3 requires be
// answered 400 and closed (net/http answers 501 and closes; a list that
// ends in chunked but is not chunked alone still gets that 501).
// Otherwise it sets up the body as net/http's
// readTransfer does, or turns the framing off where net/http fails the
// connection.
func (f *framing) endHead() bool {
	if f.clN > 0 && f.teN > 0 {
		f.why = errBothLengths
		return true
	}
	major, minor, ok := f.version()
	switch {
	case !ok || major != 1:
		f.off = true // 400 malformed version, 505, or PRI * HTTP/2.0 (closed after it)
	case f.folded:
		f.why = errObsFold
		return true
	case f.teN > 0 && minor == 0:
		f.why = errTEOnHTTP10
		return true
	case f.teN > 0 && !f.teFinal:
		f.why = errTENotChunked
		return true
	case f.teN > 0:
		if f.teN != 1 || !f.teOK {
			f.off = true // 501
			break
		}
		f.excess = 0
		f.startChunkLine()
	case f.clN > 0:
		if f.clBad || f.clEmpty {
			f.off = true // 400
			break
		}
		if f.clVal == 0 {
			f.endRequest()
			break
		}
		f.remain = f.clVal
		f.st = fBody
	default:
		f.endRequest()
	}
	return false
}

// endRequest moves on to the next request, where net/http's server goes
// on after a body it read to its end or, for a chunked body, failed to
// read. After a POST it skips up to 4 CR or LF bytes first.
func (f *framing) endRequest() {
	f.st = fReqStart
	f.skip = 0
	if f.isPOST {
		f.skip = 4
	}
}

func (f *framing) startChunkLine() {
	f.st = fChunkLine
	f.lineN, f.crN, f.lastCR = 0, 0, false
	f.hexN, f.hexV, f.hexBad, f.hexWS, f.semi = 0, 0, false, false, false
}

// chunkLineByte follows a byte of a chunk-size line. net/http reads the
// line up to LF with bufio.Reader.ReadSlice, and then requires that it end
// in CRLF with no other CR, that what precedes the first ';' (after
// whitespace at the end of the line is cut) be 1 to 16 hex digits, and
// that the chunked overhead stay small; a failed line ends the body
// there. A line with no LF in its first 4096 bytes fails after them.
func (f *framing) chunkLineByte(c byte) {
	f.lineN++
	if c == '\n' {
		if !f.lastCR || f.crN != 1 || f.hexN == 0 || f.hexBad {
			f.endRequest()
			return
		}
		// internal/chunked.go beginChunk, to the letter.
		f.excess += int64(f.lineN)
		f.excess -= 16 + (2 * int64(f.hexV))
		f.excess = max(f.excess, 0)
		switch {
		case f.hexV == 0:
			f.startBlock(true)
		case f.excess > 16*1024:
			f.endRequest() // too much non-data
		default:
			f.remain = f.hexV
			f.st = fChunkData
		}
		return
	}
	if f.lineN == maxChunkLine {
		f.endRequest() // line too long
		return
	}
	if c == '\r' {
		f.crN++
		f.lastCR = true
		return
	}
	f.lastCR = false
	if f.semi {
		return
	}
	switch {
	case c == ';':
		f.semi = true
		if f.hexWS {
			f.hexBad = true
		}
	case c == ' ' || c == '\t':
		f.hexWS = true
	case f.hexWS:
		f.hexBad = true
	case '0' <= c && c <= '9', 'a' <= c && c <= 'f', 'A' <= c && c <= 'F':
		if f.hexN == 16 {
			f.hexBad = true
			return
		}
		f.hexV = f.hexV<<4 | uint64(unhex(c))
		f.hexN++
	default:
		f.hexBad = true
	}
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c >= 'a':
		return c - 'a' + 10
	}
	return c - 'A' + 10
}

// validFieldByte reports whether c is a token byte (RFC 9110 tchar), as
// net/textproto's validHeaderFieldByte.
func validFieldByte(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return c < 0x80 && strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}
