package h1

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// smuggleNext follows every case of TestSmuggling on its connection: it is
// answered only if the server read the case as the client framed it and
// kept the connection.
const smuggleNext = "GET /next HTTP/1.1\r\nHost: a\r\n\r\n"

// smuggleCases are request heads and bodies whose framing a proxy in
// front and the gateway could read differently (RFC 9112 §6.3 and §5),
// with what both of h1's paths answer: each response as "status body",
// " | " between them. A request whose length is ambiguous gets 400 with a
// body that says why and the connection is closed, or net/http's own
// answer to a head it cannot read (501 for a list of codings that ends in
// chunked but is not chunked alone), which closes it too.
func smuggleCases() []struct{ name, raw, want string } {
	const (
		put       = "PUT /p HTTP/1.1\r\nHost: a\r\n"
		chunked   = put + "Transfer-Encoding: chunked\r\n\r\n"
		next      = "200 GET /next cl=0 te=[] body=\"\" err=<nil>"
		okPut     = "200 PUT /p cl=5 te=[] body=\"abcde\" err=<nil> | " + next
		okChunked = "200 PUT /p cl=-1 te=[\"chunked\"] body=\"abcde\" err=<nil> | " + next
		bad       = "400 400 Bad Request"
		both      = "400 request has both Content-Length and Transfer-Encoding\n"
		fold      = "400 request header field continued on a line of its own (obsolete line folding)\n"
		te10      = "400 HTTP/1.0 request has Transfer-Encoding\n"
		te501     = "501 Unsupported transfer encoding"
		teFinal   = "400 request Transfer-Encoding does not end in chunked\n"
		badHeader = "400 400 Bad Request: invalid header name"
	)
	bodyErr := func(err string) string { // the body read failed: the connection closes after the answer
		return "200 PUT /p cl=-1 te=[\"chunked\"] body=\"\" err=" + err
	}
	return []struct{ name, raw, want string }{
		// Content-Length.
		{"CL", put + "Content-Length: 5\r\n\r\nabcde", okPut},
		{"CL leading zero", put + "Content-Length: 05\r\n\r\nabcde", okPut},
		{"CL with spaces around", put + "Content-Length:  5 \t\r\n\r\nabcde", okPut},
		{"CL twice, same", put + "Content-Length: 5\r\nContent-Length: 5\r\n\r\nabcde", okPut},
		{"CL twice, differing", put + "Content-Length: 5\r\nContent-Length: 6\r\n\r\nabcdef", bad},
		{"CL twice, same value spelt differently", put + "Content-Length: 5\r\nContent-Length: 05\r\n\r\nabcde", bad},
		{"CL +5", put + "Content-Length: +5\r\n\r\nabcde", bad},
		{"CL -5", put + "Content-Length: -5\r\n\r\nabcde", bad},
		{"CL 5,5", put + "Content-Length: 5,5\r\n\r\nabcde", bad},
		{"CL 5, 5", put + "Content-Length: 5, 5\r\n\r\nabcde", bad},
		{"CL 5 5", put + "Content-Length: 5 5\r\n\r\nabcde", bad},
		{"CL hex", put + "Content-Length: 0x5\r\n\r\nabcde", bad},
		{"CL with underscore", put + "Content-Length: 5_0\r\n\r\nabcde", bad},
		{"CL non-ASCII digit", put + "Content-Length: \xd9\xa5\r\n\r\nabcde", bad},
		{"CL trailing garbage", put + "Content-Length: 5abc\r\n\r\nabcde", bad},
		{"CL empty", put + "Content-Length:\r\n\r\n", bad},
		{"CL 2^63", put + "Content-Length: 9223372036854775808\r\n\r\nabcde", bad},
		{"CL 2^64+5", put + "Content-Length: 18446744073709551621\r\n\r\nabcde", bad},
		{"CL with space before the colon", put + "Content-Length : 5\r\n\r\nabcde", badHeader},
		{"CL with tab before the colon", put + "Content-Length\t: 5\r\n\r\nabcde", bad},

		// Content-Length and Transfer-Encoding.
		{"CL then TE", put + "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nabcde\r\n0\r\n\r\n", both},
		{"TE then CL", put + "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n5\r\nabcde\r\n0\r\n\r\n", both},
		{"CL 0 and TE", put + "Content-Length: 0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", both},
		{"CL and empty TE", put + "Transfer-Encoding:\r\nContent-Length: 5\r\n\r\nabcde", both},
		{"CL and TE identity", put + "Transfer-Encoding: identity\r\nContent-Length: 5\r\n\r\nabcde", both},
		{"CL and TE, bare LF", "PUT /p HTTP/1.1\nHost: a\nContent-Length: 5\nTransfer-Encoding: chunked\n\n5\r\nabcde\r\n0\r\n\r\n", both},
		{"CL and TE on HTTP/1.0", "PUT /p HTTP/1.0\r\nConnection: keep-alive\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nabcde\r\n0\r\n\r\n", both},

		// Transfer-Encoding.
		{"TE chunked", chunked + "5\r\nabcde\r\n0\r\n\r\n", okChunked},
		{"TE CHUNKED", put + "Transfer-Encoding: CHUNKED\r\n\r\n5\r\nabcde\r\n0\r\n\r\n", okChunked},
		{"TE with spaces around", put + "Transfer-Encoding:  chunked \r\n\r\n5\r\nabcde\r\n0\r\n\r\n", okChunked},
		{"TE chunked, identity", put + "Transfer-Encoding: chunked, identity\r\n\r\n5\r\nabcde\r\n0\r\n\r\n", teFinal},
		{"TE identity, chunked", put + "Transfer-Encoding: identity, chunked\r\n\r\n5\r\nabcde\r\n0\r\n\r\n", te501},
		{"TE gzip, chunked", put + "Transfer-Encoding: gzip, chunked\r\n\r\n5\r\nabcde\r\n0\r\n\r\n", te501},
		{"TE identity", put + "Transfer-Encoding: identity\r\n\r\nabcde", teFinal},
		{"TE xchunked", put + "Transfer-Encoding: xchunked\r\n\r\n5\r\nabcde\r\n0\r\n\r\n", teFinal},
		{"TE chunkedx", put + "Transfer-Encoding: chunkedx\r\n\r\n5\r\nabcde\r\n0\r\n\r\n", teFinal},
		{"TE chunke", put + "Transfer-Encoding: chunke\r\n\r\n5\r\nabcde\r\n0\r\n\r\n", teFinal},
		{"TE chunked with a parameter", put + "Transfer-Encoding: chunked;q=1\r\n\r\n5\r\nabcde\r\n0\r\n\r\n", teFinal},
		{"TE chunked x", put + "Transfer-Encoding: chunked x\r\n\r\n5\r\nabcde\r\n0\r\n\r\n", teFinal},
		{"TE empty", put + "Transfer-Encoding:\r\n\r\n", teFinal},
		{"TE commas only", put + "Transfer-Encoding: , ,\r\n\r\n", teFinal},
		{"TE chunked, then empty elements", put + "Transfer-Encoding: chunked , ,\r\n\r\n5\r\nabcde\r\n0\r\n\r\n", te501},
		{"TE empty element, chunked", put + "Transfer-Encoding: ,chunked\r\n\r\n5\r\nabcde\r\n0\r\n\r\n", te501},
		{"TE chunked, chunked", put + "Transfer-Encoding: chunked, chunked\r\n\r\n5\r\nabcde\r\n0\r\n\r\n", te501},
		{"TE twice", put + "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nabcde\r\n0\r\n\r\n", te501},
		{"TE chunked and identity", put + "Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\n5\r\nabcde\r\n0\r\n\r\n", teFinal},
		{"TE identity and chunked", put + "Transfer-Encoding: identity\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nabcde\r\n0\r\n\r\n", te501},
		{"TE chunked and empty", put + "Transfer-Encoding: chunked\r\nTransfer-Encoding:\r\n\r\n5\r\nabcde\r\n0\r\n\r\n", te501},
		{"TE with a vertical tab", put + "Transfer-Encoding: chunked\x0b\r\n\r\n5\r\nabcde\r\n0\r\n\r\n", bad},
		{"TE with space before the colon", put + "Transfer-Encoding : chunked\r\n\r\n5\r\nabcde\r\n0\r\n\r\n", badHeader},
		{"TE on HTTP/1.0", "PUT /p HTTP/1.0\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nabcde\r\n0\r\n\r\n", te10},
		{"TE on HTTP/1.0, no keep-alive", "PUT /p HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nabcde\r\n0\r\n\r\n", te10},
		{"TE and Connection naming it", put + "Connection: close, Transfer-Encoding\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nabcde\r\n0\r\n\r\n",
			"200 PUT /p cl=-1 te=[\"chunked\"] body=\"abcde\" err=<nil>"},

		// Obsolete line folding: net/http joins the line to the field
		// before it; a proxy may not.
		{"TE folded", put + "Transfer-Encoding:\r\n chunked\r\n\r\n5\r\nabcde\r\n0\r\n\r\n", fold},
		{"CL folded", put + "Content-Length:\r\n 5\r\n\r\nabcde", fold},
		{"TE hidden in a fold, with CL", put + "X-A: 1\r\n Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\nabcde", fold},
		{"CL hidden in a fold, with TE", put + "X-A: 1\r\n\tContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nabcde\r\n0\r\n\r\n", fold},
		{"other field folded", put + "X-A: 1\r\n 2\r\nContent-Length: 5\r\n\r\nabcde", fold},
		{"fold of whitespace only", put + "Content-Length: 5\r\n \r\n\r\nabcde", fold},
		{"fold as the first field", "PUT /p HTTP/1.1\r\n Host: a\r\nContent-Length: 5\r\n\r\nabcde", bad},

		// Other header syntax.
		{"bare LF", "PUT /p HTTP/1.1\nHost: a\nContent-Length: 5\n\nabcde", okPut},
		{"bare CR", "PUT /p HTTP/1.1\rHost: a\r\nContent-Length: 5\r\n\r\nabcde", bad},
		{"CR in a value", put + "X-A: a\rb\r\nContent-Length: 5\r\n\r\nabcde", bad},
		{"NUL in a value", put + "X-A: a\x00b\r\nContent-Length: 5\r\n\r\nabcde", bad},
		{"space in a name", put + "X A: 1\r\nContent-Length: 5\r\n\r\nabcde", badHeader},
		{"no colon", put + "X-A 1\r\nContent-Length: 5\r\n\r\nabcde", bad},
		{"empty name", put + ": 1\r\nContent-Length: 5\r\n\r\nabcde", bad},
		{"non-ASCII name", put + "X-\xc3\xa9: 1\r\nContent-Length: 5\r\n\r\nabcde", bad},

		// Request lines.
		{"two spaces after the method", "GET  /p HTTP/1.1\r\nHost: a\r\n\r\n", bad},
		{"two spaces before the version", "GET /p  HTTP/1.1\r\nHost: a\r\n\r\n", bad},
		{"space after the version", "GET /p HTTP/1.1 \r\nHost: a\r\n\r\n", bad},
		{"tab for space", "GET\t/p HTTP/1.1\r\nHost: a\r\n\r\n", bad},
		{"lower-case version", "GET /p http/1.1\r\nHost: a\r\n\r\n", bad},
		{"HTTP/0.9", "GET /p\r\n\r\n", bad},
		{"HTTP/2.0", "GET /p HTTP/2.0\r\nHost: a\r\n\r\n", "505 505 HTTP Version Not Supported: unsupported protocol version"},
		{"absolute form", "GET http://b/p HTTP/1.1\r\nHost: a\r\n\r\n", "200 GET http://b/p cl=0 te=[] body=\"\" err=<nil> | " + next},
		{"empty lines first", "\r\n\r\nGET /p HTTP/1.1\r\nHost: a\r\n\r\n", bad},
		{"CRLF after a POST body", "POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nabcde\r\n",
			"200 POST /p cl=5 te=[] body=\"abcde\" err=<nil> | " + next},

		// Chunked bodies: a malformed one fails the body read, and the
		// connection closes after the answer.
		{"chunk extension", chunked + "5;a=b\r\nabcde\r\n0;c\r\n\r\n", okChunked},
		{"chunk size with leading zeros", chunked + "0005\r\nabcde\r\n0\r\n\r\n", okChunked},
		{"chunk size with trailing space", chunked + "5 \r\nabcde\r\n0\r\n\r\n", okChunked},
		{"chunk size of 17 digits", chunked + "00000000000000005\r\nabcde\r\n0\r\n\r\n", bodyErr("http chunk length too large")},
		{"chunk size overflowing", chunked + "1ffffffffffffffff\r\nabcde\r\n0\r\n\r\n", bodyErr("http chunk length too large")},
		{"chunk size 0x5", chunked + "0x5\r\nabcde\r\n0\r\n\r\n", bodyErr("invalid byte in chunk length")},
		{"chunk size -5", chunked + "-5\r\nabcde\r\n0\r\n\r\n", bodyErr("invalid byte in chunk length")},
		{"chunk line bare LF", chunked + "5\nabcde\n0\n\n", bodyErr("chunked line ends with bare LF")},
		{"chunk extension with LF", chunked + "5;a\nb\r\nabcde\r\n0\r\n\r\n", bodyErr("chunked line ends with bare LF")},
		{"chunk extension with CR", chunked + "5;a\rb\r\nabcde\r\n0\r\n\r\n", bodyErr("invalid CR in chunked line")},
		{"chunk data without CRLF", chunked + "5\r\nabcde0\r\n\r\n", "200 PUT /p cl=-1 te=[\"chunked\"] body=\"abcde\" err=malformed chunked encoding"},
		{"chunk data then LF", chunked + "5\r\nabcde\n0\r\n\r\n", "200 PUT /p cl=-1 te=[\"chunked\"] body=\"abcde\" err=malformed chunked encoding"},
		{"last chunk without CRLF", chunked + "0\r\n", bodyErr("malformed MIME header: missing colon: \"GET /next HTTP/1.1\"")},
		{"trailer", chunked + "5\r\nabcde\r\n0\r\nX-T: 1\r\n\r\n", okChunked},
		{"trailer with CL", chunked + "5\r\nabcde\r\n0\r\nContent-Length: 50\r\n\r\n", okChunked},
		{"trailer with bare LF", chunked + "5\r\nabcde\r\n0\r\nX-T: 1\n\n", okChunked},
		{"trailer folded", chunked + "5\r\nabcde\r\n0\r\nX-T: 1\r\n 2\r\n\r\n", okChunked},
		{"trailer over 4 KiB", chunked + "0\r\nX-T: " + strings.Repeat("t", 5000) + "\r\n\r\n", bodyErr("http: suspiciously long trailer after chunked body")},

		// Expect, and bodies on any method.
		{"Expect without a body", put + "Expect: 100-continue\r\n\r\n", "200 PUT /p cl=0 te=[] body=\"\" err=<nil> | " + next},
		{"Expect with CL 0", put + "Expect: 100-continue\r\nContent-Length: 0\r\n\r\n", "200 PUT /p cl=0 te=[] body=\"\" err=<nil> | " + next},
		{"Expect with a body", put + "Expect: 100-continue\r\nContent-Length: 5\r\n\r\nabcde", "100 | " + okPut},
		{"Expect on GET", "GET /p HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\n\r\n", "200 GET /p cl=0 te=[] body=\"\" err=<nil> | " + next},
		{"Expect other", put + "Expect: 200-ok\r\nContent-Length: 5\r\n\r\nabcde", "417 "},
		{"GET with a body", "GET /p HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nabcde", "200 GET /p cl=5 te=[] body=\"abcde\" err=<nil> | " + next},
		{"HEAD with a body", "HEAD /p HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nabcde", "200  | " + next},
		{"DELETE with a body", "DELETE /p HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nabcde", "200 DELETE /p cl=5 te=[] body=\"abcde\" err=<nil> | " + next},
		{"HTTP/1.0 keep-alive with a body", "PUT /p HTTP/1.0\r\nConnection: keep-alive\r\nContent-Length: 5\r\n\r\nabcde", okPut},
	}
}

// smuggleHandler describes the request it got, and reads its body.
func smuggleHandler(w http.ResponseWriter, r *http.Request) {
	b, err := io.ReadAll(r.Body)
	fmt.Fprintf(w, "%s %s cl=%d te=%q body=%q err=%v", r.Method, r.RequestURI, r.ContentLength, r.TransferEncoding, b, err)
}

// TestSmuggling sends each of smuggleCases, then smuggleNext, and
// half-closes; h1 and net/http behind GuardListener must answer both the
// same and as the case says.
func TestSmuggling(t *testing.T) {
	h := http.HandlerFunc(smuggleHandler)
	_, fast := startH1(t, h, nil)
	std := startNetHTTP(t, listen(t, "tcp"), h)
	for _, tt := range smuggleCases() {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			for _, srv := range []struct{ name, addr string }{{"h1", fast}, {"net/http", std}} {
				out := smuggleSend(t, srv.addr, tt.raw+smuggleNext)
				if got := smuggleSummary(out, strings.HasPrefix(tt.raw, "HEAD ")); got != tt.want {
					t.Errorf("%s answered %q\n(%q)\nwant %q", srv.name, got, out, tt.want)
				}
			}
		})
	}
}

// smuggleSend writes raw on a new connection to addr, half-closes it, and
// returns all that comes back until the server closes.
func smuggleSend(t *testing.T, addr, raw string) []byte {
	t.Helper()
	c := dialFor(t, addr, 10*time.Second)
	defer c.Close()
	go func() { // the server may answer before it reads it all
		io.WriteString(c, raw)
		c.(*net.TCPConn).CloseWrite()
	}()
	out, err := io.ReadAll(c)
	if err != nil && len(out) == 0 {
		t.Logf("read: %v", err)
	}
	return out
}

// smuggleSummary describes the responses in out as "status body", " | "
// between them; a 1xx as its status alone. The first response is to a
// HEAD if head.
func smuggleSummary(out []byte, head bool) string {
	br := bufio.NewReader(bytes.NewReader(out))
	var parts []string
	for i := 0; ; i++ {
		var req *http.Request
		if i == 0 && head {
			req = &http.Request{Method: http.MethodHead}
		}
		resp, err := http.ReadResponse(br, req)
		if err != nil {
			break
		}
		if resp.StatusCode < 200 {
			parts = append(parts, fmt.Sprint(resp.StatusCode))
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		parts = append(parts, fmt.Sprintf("%d %s", resp.StatusCode, b))
	}
	return strings.Join(parts, " | ")
}
