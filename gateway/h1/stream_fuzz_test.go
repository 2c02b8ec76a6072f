package h1

import (
	"bytes"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// FuzzStream sends one byte stream of pipelined HTTP/1.x requests, then
// EOF, to an h1.Server (with its net/http Fallback) and to a plain
// net/http Server, both serving streamHandler on loopback TCP, and
// requires every byte each sends back, up to its EOF, to be the same but
// for the Date header. Unlike FuzzServe, which compares only the first
// response head, it checks each response of the stream, the point where
// h1 hands a connection over to Fallback mid-stream, and where each side
// stops answering (a reset counts as a close, see sendStream).
//
// cuts splits the stream into up to three writes (see sendStream), so
// that heads and bodies arrive in pieces at odd points.
func FuzzStream(f *testing.F) {
	for _, s := range streamSeeds() {
		f.Add([]byte(s.raw), s.cuts)
	}
	h := streamHandler()
	// The servers live across executions, as a gateway's do: state a
	// connection leaves behind (pooled buffers, the poller) is under test
	// too. No timeouts: the client's EOF ends every connection, and a
	// read deadline could only add timing to what is compared.
	_, fast := startH1(f, h, func(s *Server) {
		s.MaxHeaderBytes, s.Fallback.MaxHeaderBytes = streamMaxHeader, streamMaxHeader
	})
	// The reference refuses what h1 refuses (a head with both
	// Content-Length and Transfer-Encoding), as the gateway's own
	// net/http path does.
	ln := GuardListener(listen(f, "tcp"))
	plain := &http.Server{Handler: h, MaxHeaderBytes: streamMaxHeader, ErrorLog: quietLog()}
	go plain.Serve(ln)
	f.Cleanup(func() { plain.Close() })
	std := ln.Addr().String()
	var client streamClient
	f.Fuzz(func(t *testing.T, in []byte, cuts uint32) {
		if len(in) > maxStream {
			t.Skip("longer than the socket buffers")
		}
		var got, want []byte
		var gotErr, wantErr error
		var wg sync.WaitGroup
		wg.Go(func() { got, gotErr = client.sendStream(fast, in, cuts) })
		wg.Go(func() { want, wantErr = client.sendStream(std, in, cuts) })
		wg.Wait()
		if wantErr != nil {
			t.Fatalf("net/http on %q (cuts %#x): %v; read %q", in, cuts, wantErr, want)
		}
		if gotErr != nil {
			t.Fatalf("h1 on %q (cuts %#x): %v; read %q", in, cuts, gotErr, got)
		}
		got, want = normaliseDate(got), normaliseDate(want)
		got, want = normaliseRefusal(got, want)
		if !bytes.Equal(got, want) {
			i := diffAt(got, want)
			t.Errorf("stream %q (cuts %#x): h1 and net/http differ at byte %d of %d and %d\nh1       %q\nnet/http %q",
				in, cuts, i, len(got), len(want), around(got, i), around(want, i))
		}
	})
}

const (
	// streamMaxHeader is every server's MaxHeaderBytes in FuzzStream: more
	// than a stream can hold, so that no request reaches net/http's limit.
	// Where a request would, net/http's own answer depends on how the
	// stream arrived: it counts against a request's limit (MaxHeaderBytes
	// plus 4 KiB) the bytes it reads from the connection for it, but not
	// those it read before: buffered with the request before, or by the
	// read of up to 4 KiB it makes between requests before it sets the
	// limit; and once a request has used up its limit, any error reading
	// it is answered 431, not 400. So a later request whose head is up to
	// 4 KiB over the limit is served by net/http alone and answered 431
	// by h1, whose Fallback sees every request it is handed as a first.
	// TestConformance covers the limit on a first request.
	streamMaxHeader = 1 << 20
	// maxStream is the longest stream FuzzStream sends: it fits in the
	// loopback socket buffers, so the client's writes never wait on a
	// server that has stopped reading, and it is far more than the 4 KiB
	// head the fast path takes.
	maxStream = 64 << 10
	// streamPause separates the writes of a cut stream, long enough for
	// the server to read each write on its own most of the time. Nothing
	// waits on it: the output must be the same however the stream
	// arrives, so it only makes odd arrivals likely.
	streamPause = time.Millisecond
	// streamDeadline bounds one side of an execution: a server that
	// neither answers nor closes fails the input instead of hanging it.
	// An execution normally takes a few milliseconds.
	streamDeadline = 10 * time.Second
)

// A streamClient opens FuzzStream's connections. Each execution opens
// two, and the client, which half-closes first, keeps every one in
// TIME_WAIT for a minute afterwards: from one source address, a fuzzer
// running at full speed would use up the ephemeral ports of 127.0.0.1
// (for everyone on the machine) within a minute, and then wait in
// connect. On Linux, where all of 127.0.0.0/8 is loopback, it therefore
// dials from 127.0.1.1 to 127.0.1.254 in turn, each with ports of its
// own (where that fails, as in a sandbox without them, from the default
// address). It is safe for concurrent use.
type streamClient struct {
	n atomic.Uint32 // connections dialled
}

func (sc *streamClient) dial(addr string) (net.Conn, error) {
	if runtime.GOOS == "linux" {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 1, byte(1+sc.n.Add(1)%254))}}
		if c, err := d.Dial("tcp", addr); err == nil {
			return c, nil
		}
	}
	return net.Dial("tcp", addr)
}

// sendStream writes in to a new TCP connection to addr, in up to three
// writes cut where cuts says (its low and high 16 bits, each modulo
// len(in)+1), half-closes it and returns all it reads until the server
// closes. A reset after the server's last bytes counts as its close:
// whether a server's close finds request bytes unread, and so resets,
// depends on when they arrived; the bytes read before it do not.
func (sc *streamClient) sendStream(addr string, in []byte, cuts uint32) ([]byte, error) {
	c, err := sc.dial(addr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(streamDeadline))
	a, b := int(cuts&0xffff)%(len(in)+1), int(cuts>>16)%(len(in)+1)
	if a > b {
		a, b = b, a
	}
	go func() { // the server may answer, or close, before it has read it all
		wrote := false
		for _, part := range [][]byte{in[:a], in[a:b], in[b:]} {
			if len(part) == 0 {
				continue
			}
			if wrote {
				time.Sleep(streamPause)
			}
			if _, err := c.Write(part); err != nil {
				break
			}
			wrote = true
		}
		c.(*net.TCPConn).CloseWrite()
	}()
	out, err := io.ReadAll(c)
	switch {
	case errors.Is(err, syscall.ECONNRESET):
		err = nil
	case errors.Is(err, os.ErrDeadlineExceeded):
		err = fmt.Errorf("no EOF after %v", streamDeadline)
	}
	return out, err
}

// dateLine matches a Date header line as both servers write it.
var dateLine = regexp.MustCompile(`\r\nDate: [A-Z][a-z]{2}, \d{2} [A-Z][a-z]{2} \d{4} \d{2}:\d{2}:\d{2} GMT\r\n`)

// normaliseDate blanks the value of every Date header line in out: the
// two servers answer at slightly different times, which may straddle a
// second. Nothing else is normalised. In particular, the documented
// difference in how the two close a connection with request bytes left
// unread (h1 half-closes and reads until the client closes, net/http
// half-closes and sleeps) does not show here: both send their FIN after
// their last response, and the client, which has half-closed already,
// reads until that FIN and does not wait for the full close that follows.
func normaliseDate(out []byte) []byte {
	return dateLine.ReplaceAll(out, []byte("\r\nDate: (normalised)\r\n"))
}

// normaliseRefusal makes the last answers of got and want the same when
// one is net/http's plain 400 (badRequest) and the other a framing
// refusal's 400 that says why, at the same offset, each the last bytes
// of its stream. A head that the guard refuses next to a request line
// net/http cannot parse gets one or the other depending on how far
// net/http read when it failed (GuardConn, "The answer"): 400 and the
// connection closed either way.
func normaliseRefusal(got, want []byte) ([]byte, []byte) {
	plain, why := []byte(badRequest), []byte("HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\nContent-Length: ")
	for _, p := range [][2]*[]byte{{&got, &want}, {&want, &got}} {
		a, b := *p[0], *p[1]
		if i := len(a) - len(plain); i >= 0 && bytes.HasSuffix(a, plain) && len(b) > i && bytes.HasPrefix(b[i:], why) && bytes.Equal(a[:i], b[:i]) {
			*p[1] = a
		}
	}
	return got, want
}

// diffAt returns the offset of the first byte where a and b differ.
func diffAt(a, b []byte) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

// around returns the bytes of b from a few hundred before i to a few
// hundred after, marking where it cut b.
func around(b []byte, i int) string {
	const span = 400
	lo, hi := max(0, i-span), min(len(b), i+span)
	s := string(b[lo:hi])
	if lo > 0 {
		s = "…" + s
	}
	if hi < len(b) {
		s += "…"
	}
	return s
}

// streamHandler serves FuzzStream. Its path is a program: each byte after
// the slash is a step, done in order, and bytes that are no step are
// ignored, so that a mutated path still means something. After the steps
// it writes streamEcho unless told not to.
//
// Request body:
//
//	r  read it to its end       p  read 2 bytes of it
//	c  close it                 x  EnableFullDuplex (the body is then
//	                               closed at the end, see below)
//
// Response head:
//
//	w  WriteHeader(200)         C  201          N  204
//	M  304                      S  500          E  http.Error 404
//	1  103 Early Hints, an interim response with a Link header
//	k  Connection: close        K  Connection: keep-alive
//	y  Content-Type: text/plain (no sniffing)
//	l  Content-Length of the echo; L 3 more (a body cut short);
//	   j 1 less (the echo's last write fails)
//	t  declare trailer X-T      T  a TrailerPrefix trailer; both set at the end
//
// Response body:
//
//	f  flush                    b  write 3000 bytes (past net/http's 2048-byte
//	                               buffer before chunking)
//	h  write "<!DOCTYPE html>" (sniffed as HTML)
//	s  write with io.WriteString from now on
//	e  no echo at the end       P  panic(http.ErrAbortHandler)
//
// And on the fast path:
//
//	D  Detach, if the response can be (see response.Detach), and do the
//	   rest on another goroutine, which then calls finish: as the
//	   gateway's handlers answer from memcached's reply reader. It is
//	   not done before a P, which a detached handler cannot raise.
func streamHandler() http.Handler {
	big := bytes.Repeat([]byte("0123456789abcdef"), 3000/16+1)[:3000]
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var steps strings.Builder // what the body steps saw, for the echo
		var read []byte           // every body byte read
		echo, trailer, prefixed := true, false, false
		setCL, clDelta := false, 0
		asString, duplex := false, false
		write := func(b []byte) {
			if asString {
				//lint:ignore SA6006 the conversion is the point: op s exercises the ResponseWriter's WriteString path
				io.WriteString(w, string(b))
			} else {
				w.Write(b)
			}
		}
		// run does the steps of ops; at a D that detaches, if it may
		// detach (once a request), it returns the rest of ops and finish.
		run := func(ops string, mayDetach bool) (rest string, finish func()) {
			for i := 0; i < len(ops); i++ {
				switch op := ops[i]; op {
				case 'r', 'p':
					var b []byte
					var err error
					if op == 'r' {
						b, err = io.ReadAll(r.Body)
					} else {
						// ReadFull, as a single Read returns what has arrived.
						b = make([]byte, 2)
						var n int
						n, err = io.ReadFull(r.Body, b)
						b = b[:n]
					}
					read = append(read, b...)
					fmt.Fprintf(&steps, "%c n=%d err=%s\n", op, len(b), echoErr(err))
				case 'c':
					err := r.Body.Close()
					if strings.Contains(strings.ToLower(r.Header.Get("Expect")), "100-continue") {
						// h1 reads nothing more of a body whose client
						// may hold it back for a 100 Continue (body.Close:
						// the connection closes instead); net/http reads
						// the rest and reports how it ended, an early EOF
						// included. Only the error differs.
						fmt.Fprintf(&steps, "c (Expect: error not compared)\n")
						break
					}
					fmt.Fprintf(&steps, "c err=%s\n", echoErr(err))
				case 'x':
					duplex = true
					fmt.Fprintf(&steps, "x err=%s\n", echoErr(http.NewResponseController(w).EnableFullDuplex()))
				case 'w':
					w.WriteHeader(http.StatusOK)
				case 'C':
					w.WriteHeader(http.StatusCreated)
				case 'N':
					w.WriteHeader(http.StatusNoContent)
				case 'M':
					w.WriteHeader(http.StatusNotModified)
				case 'S':
					w.WriteHeader(http.StatusInternalServerError)
				case 'E':
					http.Error(w, "no such thing", http.StatusNotFound)
				case '1':
					w.Header().Set("Link", "</s.css>; rel=preload")
					w.WriteHeader(http.StatusEarlyHints)
				case 'k':
					w.Header().Set("Connection", "close")
				case 'K':
					w.Header().Set("Connection", "keep-alive")
				case 'y':
					w.Header().Set("Content-Type", "text/plain")
				case 'l':
					setCL, clDelta = true, 0
				case 'L':
					setCL, clDelta = true, 3
				case 'j':
					setCL, clDelta = true, -1
				case 't':
					w.Header().Set("Trailer", "X-T")
					trailer = true
				case 'T':
					prefixed = true
				case 'f':
					w.(http.Flusher).Flush()
				case 'b':
					write(big)
				case 'h':
					write([]byte("<!DOCTYPE html>"))
				case 's':
					asString = true
				case 'e':
					echo = false
				case 'P':
					panic(http.ErrAbortHandler)
				case 'D':
					d, ok := w.(interface{ Detach() func() })
					if !ok || !mayDetach || strings.IndexByte(ops[i:], 'P') >= 0 {
						break
					}
					if finish := d.Detach(); finish != nil {
						return ops[i+1:], finish
					}
				}
			}
			return "", nil
		}
		end := func() {
			out := streamEcho(r, steps.String(), read)
			if setCL {
				w.Header().Set("Content-Length", strconv.Itoa(len(out)+clDelta))
			}
			if echo {
				write(out)
			}
			if trailer {
				w.Header().Set("X-T", "t")
			}
			if prefixed {
				w.Header().Set(http.TrailerPrefix+"X-U", "u")
			}
			if duplex {
				// net/http (golang/go#68560): in full-duplex mode a body the
				// handler leaves unread reaches its EOF only when the server
				// closes it after the handler, which starts a background
				// read after the server stopped the last one; the next
				// request's read then panics ("invalid concurrent Body.Read
				// call") and the connection closes unanswered, or not,
				// depending on timing. h1 answers it. So the handler closes
				// the body itself, the known workaround, and the comparison
				// stays on defined behaviour.
				r.Body.Close()
			}
		}
		rest, finish := run(r.URL.Path, true)
		if finish == nil {
			end()
			return
		}
		go func() {
			run(rest, false)
			end()
			finish()
		}()
	})
}

// streamEcho describes r as its handler saw it: the request line and
// fields, its headers in key order, what the body steps saw, a hash of
// the body bytes read, and its trailers (set once a chunked body is read
// to its end). It leaves out RemoteAddr, whose port differs between the
// two servers' connections.
func streamEcho(r *http.Request, steps string, read []byte) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s %q path=%q raw=%q query=%q host=%q %s %d.%d close=%v cl=%d te=%q\n",
		r.Method, r.RequestURI, r.URL.Path, r.URL.RawPath, r.URL.RawQuery, r.Host, r.Proto,
		r.ProtoMajor, r.ProtoMinor, r.Close, r.ContentLength, r.TransferEncoding)
	for _, k := range slices.Sorted(maps.Keys(r.Header)) {
		fmt.Fprintf(&b, "%s=%q\n", k, r.Header[k])
	}
	b.WriteString(steps)
	sum := fnv.New64a()
	sum.Write(read)
	fmt.Fprintf(&b, "read=%d fnv=%x\n", len(read), sum.Sum64())
	for _, k := range slices.Sorted(maps.Keys(r.Trailer)) {
		fmt.Fprintf(&b, "trailer %s=%q\n", k, r.Trailer[k])
	}
	return b.Bytes()
}

// echoErr formats err for an echo. A network error is shown without
// its addresses, which differ between the two servers' connections.
func echoErr(err error) string {
	var oe *net.OpError
	if errors.As(err, &oe) {
		return "net: " + oe.Err.Error()
	}
	return fmt.Sprint(err)
}

// streamSeed is one seed of FuzzStream.
type streamSeed struct {
	name string // what it covers
	raw  string
	cuts uint32
}

// streamSeeds are FuzzStream's seed corpus: pipelined streams over the
// fast path, the handover to Fallback, and the ways a stream stops.
func streamSeeds() []streamSeed {
	const host = "Host: a\r\n"
	get := func(path string) string { return "GET " + path + " HTTP/1.1\r\n" + host + "\r\n" }
	withBody := func(method, path, body string) string {
		return method + " " + path + " HTTP/1.1\r\n" + host + "Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
	}
	chunked := "PUT /r HTTP/1.1\r\n" + host + "Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-Tr: 1\r\n\r\n"
	bigHead := "GET /r HTTP/1.1\r\n" + host + "X-Big: " + strings.Repeat("b", 6000) + "\r\n\r\n"
	bigBody := strings.Repeat("0123456789", 1000)
	hugeHead := "GET /r HTTP/1.1\r\n" + host + "X-Big: " + strings.Repeat("b", 13000) + "\r\n\r\n"
	cut := func(a, b int) uint32 { return uint32(a) | uint32(b)<<16 }
	return []streamSeed{
		{name: "one GET", raw: get("/")},
		{name: "pipelined methods", raw: get("/r") + "HEAD /r HTTP/1.1\r\n" + host + "\r\n" +
			withBody("PUT", "/r", "abc") + "DELETE /r HTTP/1.1\r\n" + host + "\r\n" + withBody("POST", "/r", "hello")},
		{name: "pipelined methods, cut", raw: get("/r") + "HEAD /r HTTP/1.1\r\n" + host + "\r\n" +
			withBody("PUT", "/r", "abc") + "DELETE /r HTTP/1.1\r\n" + host + "\r\n" + withBody("POST", "/r", "hello"),
			cuts: cut(7, 80)},
		{name: "Connection close mid-stream", raw: get("/r") + "GET /r HTTP/1.1\r\n" + host + "Connection: close\r\n\r\n" + get("/r")},
		{name: "handler close mid-stream", raw: get("/k") + get("/r")},
		{name: "HTTP/1.0", raw: "GET /r HTTP/1.0\r\n\r\n" + get("/r")},
		{name: "HTTP/1.0 keep-alive", raw: "GET /r HTTP/1.0\r\nConnection: keep-alive\r\n\r\n" +
			"GET /b HTTP/1.0\r\nConnection: keep-alive\r\n\r\n" + "GET /lK HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"},
		{name: "HTTP/1.0 keep-alive 204", raw: "GET /N HTTP/1.0\r\nConnection: keep-alive\r\n\r\n" + "HEAD /b HTTP/1.0\r\nConnection: keep-alive\r\n\r\n" + get("/")},
		{name: "chunked hands over", raw: get("/r") + chunked + get("/r") + withBody("PUT", "/r", "xyz")},
		{name: "chunked hands over, cut", raw: get("/r") + chunked + get("/r"), cuts: cut(40, 90)},
		{name: "chunked unread", raw: strings.Replace(chunked, "/r", "/n", 1) + get("/r")},
		{name: "Expect 100-continue", raw: "PUT /r HTTP/1.1\r\n" + host + "Expect: 100-continue\r\nContent-Length: 3\r\n\r\nabc" + get("/r")},
		{name: "Expect 100-continue unread", raw: get("/") + "PUT /n HTTP/1.1\r\n" + host + "Expect: 100-continue\r\nContent-Length: 3\r\n\r\nabc" + get("/r")},
		{name: "malformed head mid-stream", raw: get("/r") + "GARBAGE\r\n\r\n" + get("/r")},
		{name: "no Host mid-stream", raw: get("/r") + "GET /r HTTP/1.1\r\n\r\n" + get("/r")},
		{name: "bare LF mid-stream", raw: get("/r") + "GET /r HTTP/1.1\nHost: a\n\n" + get("/r")},
		{name: "duplicate Content-Length", raw: get("/r") + "PUT /r HTTP/1.1\r\n" + host + "Content-Length: 3\r\nContent-Length: 3\r\n\r\nabc" + get("/r")},
		{name: "conflicting Content-Length", raw: get("/r") + "PUT /r HTTP/1.1\r\n" + host + "Content-Length: 3\r\nContent-Length: 4\r\n\r\nabcd" + get("/r")},
		{name: "Content-Length with Transfer-Encoding (skipped)", raw: get("/r") + "PUT /r HTTP/1.1\r\n" + host +
			"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n" + get("/r")},
		{name: "head over 4 KiB", raw: get("/r") + bigHead + get("/r")},
		{name: "head over 12 KiB", raw: get("/r") + hugeHead + get("/r")},
		{name: "CRLF after POST", raw: withBody("POST", "/r", "x") + "\r\n" + get("/r") + withBody("POST", "/n", "y") + "\r\n\r\n" + get("/r")},
		{name: "body cut short", raw: get("/r") + "PUT /r HTTP/1.1\r\n" + host + "Content-Length: 10\r\n\r\nabc"},
		{name: "head cut short", raw: get("/r") + "GET /r HTTP/1.1\r\nHost: a\r\nX-A: 1"},
		{name: "stray bytes after the last request", raw: get("/r") + "GE"},
		{name: "body partly read", raw: withBody("PUT", "/p", "abcdef") + get("/r")},
		{name: "body not read", raw: withBody("PUT", "/n", "abcdef") + get("/r")},
		{name: "body closed", raw: withBody("PUT", "/c", "abcdef") + get("/r")},
		{name: "body read after flush", raw: withBody("PUT", "/fr", "abcdef") + get("/r")},
		{name: "body read after flush, full duplex", raw: withBody("PUT", "/xfr", "abcdef") + get("/r")},
		{name: "big body not read", raw: "PUT /n HTTP/1.1\r\n" + host + "Content-Length: 300000\r\n\r\nabc" + get("/r")},
		{name: "statuses", raw: get("/N") + get("/M") + get("/C") + get("/S") + get("/E") + get("/1") + get("/wr")},
		{name: "HEAD statuses", raw: "HEAD /b HTTP/1.1\r\n" + host + "\r\n" + "HEAD /l HTTP/1.1\r\n" + host + "\r\n" +
			"HEAD /e HTTP/1.1\r\n" + host + "\r\n" + "HEAD /N HTTP/1.1\r\n" + host + "\r\n" + get("/")},
		{name: "Content-Length and chunking", raw: get("/l") + get("/b") + get("/lb") + get("/fb") + get("/y") + get("/e") + get("/j") + get("/r")},
		{name: "many steps", raw: get("/hEfsbhbT") + withBody("PUT", "/prcxwfhb", "abcdef") + get("/DhbsbTt") + get("/tshbfhEl") +
			"HEAD /hfbsbh HTTP/1.1\r\n" + host + "\r\n" + "GET /bhsbLfh HTTP/1.0\r\n\r\n"},
		{name: "sniffing and WriteString", raw: get("/h") + get("/sh") + get("/yh") + get("/sl") + get("/sj") + get("/sbl")},
		{name: "Content-Length too large", raw: get("/L") + get("/r")},
		{name: "trailers", raw: get("/t") + get("/T") + get("/tb") + get("/tl")},
		{name: "abort", raw: get("/r") + get("/fP") + get("/r")},
		{name: "abort unflushed", raw: get("/bP") + get("/r")},
		{name: "abort streamed, HTTP/1.0", raw: "GET /hbP HTTP/1.0\r\n\r\n"},
		{name: "abort streamed, HTTP/1.0, WriteString", raw: "GET /hsbbP HTTP/1.0\r\n\r\n"},
		{name: "abort streamed after flush, HTTP/1.0", raw: "GET /bfhbbP HTTP/1.0\r\n\r\n"},
		{name: "keep-alive header", raw: get("/K") + get("/kb")},
		{name: "odd requests", raw: "OPTIONS * HTTP/1.1\r\n" + host + "\r\n" + "GET http://b/r HTTP/1.1\r\n" + host + "\r\n" +
			"GET /r?q=%20 HTTP/1.1\r\n" + host + "X-A: 1\r\nx-a:  2 \r\nPragma: no-cache\r\n\r\n" + get("/a%2Fr")},
		{name: "Connection token list", raw: "GET /r HTTP/1.1\r\n" + host + "Connection: keep-alive, x\r\n\r\n" + get("/r")},
		{name: "Upgrade", raw: "GET /r HTTP/1.1\r\n" + host + "Connection: Upgrade\r\nUpgrade: websocket\r\n\r\n" + get("/r")},
		{name: "HTTP/1.2", raw: get("/r") + "GET /r HTTP/1.2\r\n" + host + "\r\n" + get("/r")},
		{name: "every byte cut", raw: withBody("PUT", "/r", "abc") + get("/r"), cuts: cut(1, 42)},
		{name: "bodies over the read buffer", raw: withBody("PUT", "/r", bigBody) + withBody("POST", "/n", bigBody) +
			withBody("PUT", "/p", bigBody) + get("/r"), cuts: cut(3000, 17000)},
		{name: "body over the read buffer, HTTP/1.0", raw: "PUT /n HTTP/1.0\r\nContent-Length: 10000\r\n\r\n" + bigBody},
		{name: "detached", raw: get("/D") + get("/Db") + get("/DfbT") + withBody("PUT", "/rDr", "abc") + get("/Dk") + get("/r")},
		{name: "detached statuses", raw: "HEAD /Db HTTP/1.1\r\n" + host + "\r\n" + get("/DN") + get("/DlL") + get("/D1C") + get("/r")},
		{name: "detached HTTP/1.0", raw: "GET /Db HTTP/1.0\r\nConnection: keep-alive\r\n\r\n" + "GET /DlK HTTP/1.0\r\nConnection: keep-alive\r\n\r\n" + get("/r")},
		{name: "detach declined", raw: withBody("PUT", "/D", "abc") + get("/wD") + get("/DP") + get("/r")},
	}
}
