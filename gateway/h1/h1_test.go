package h1

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/gatewaytest"
)

const testMaxHeader = 8 << 10

// testHandler serves the conformance cases; every path shows one
// behaviour of a ResponseWriter or a Request.
func testHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/cl", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "5")
		io.WriteString(w, "hello")
	})
	mux.HandleFunc("/small", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello world")
	})
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		chunk := bytes.Repeat([]byte("0123456789"), 100)
		for n > 0 {
			k := min(n, len(chunk))
			w.Write(chunk[:k])
			n -= k
		}
	})
	mux.HandleFunc("/bigcl", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "100000")
		w.Write(bytes.Repeat([]byte("0123456789"), 10000))
	})
	mux.HandleFunc("/flushread", func(w http.ResponseWriter, r *http.Request) {
		w.(http.Flusher).Flush() // net/http drops the unread body here
		b, err := io.ReadAll(r.Body)
		fmt.Fprintf(w, "read %q, err %v", b, err)
	})
	mux.HandleFunc("/keepalive", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "keep-alive")
		io.WriteString(w, "kept")
	})
	mux.HandleFunc("/html", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "<html><body>hi</body></html>")
	})
	mux.HandleFunc("/nilct", func(w http.ResponseWriter, r *http.Request) {
		w.Header()["Content-Type"] = nil
		io.WriteString(w, "<html><body>hi</body></html>")
	})
	mux.HandleFunc("/gzip", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Encoding", "gzip")
		io.WriteString(w, "not really gzip")
	})
	mux.HandleFunc("/204", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "3")
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("/304", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("Content-Length", "3")
		w.Header().Set("ETag", `"1"`)
		w.WriteHeader(http.StatusNotModified)
		_, err := io.WriteString(w, "abc")
		w.Header().Set("X-Write-Error", fmt.Sprint(err)) // too late: not sent
	})
	mux.HandleFunc("/404", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no such thing", http.StatusNotFound)
	})
	mux.HandleFunc("/read", func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		fmt.Fprintf(w, "read %d bytes, err %v, cl %d, te %q", len(b), err, r.ContentLength, r.TransferEncoding)
	})
	mux.HandleFunc("/ignore", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ignored")
	})
	mux.HandleFunc("/closebody", func(w http.ResponseWriter, r *http.Request) {
		r.Body.Close()
		io.WriteString(w, "closed")
	})
	mux.HandleFunc("/double", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		w.WriteHeader(http.StatusInternalServerError)
		io.WriteString(w, "created")
	})
	mux.HandleFunc("/close", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		io.WriteString(w, "bye")
	})
	mux.HandleFunc("/short", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "10")
		io.WriteString(w, "12345")
	})
	mux.HandleFunc("/over", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "3")
		_, err := io.WriteString(w, "1234")
		io.WriteString(w, "123")
		_ = err
	})
	mux.HandleFunc("/badcl", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "abc")
		io.WriteString(w, "body")
	})
	mux.HandleFunc("/headers", func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h["X-Multi"] = []string{"a", "b"}
		h.Set("X-Split", "one\r\ntwo")
		h.Set("X-Trim", "  padded \t")
		h["Bad Key"] = []string{"dropped"}
		h["lower-case"] = []string{"kept as is"}
		h.Set("Date", "Mon, 02 Jan 2006 15:04:05 GMT")
		w.WriteHeader(http.StatusAccepted)
		h.Set("X-After", "not sent")
		io.WriteString(w, "headers")
	})
	mux.HandleFunc("/flush", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "a")
		w.(http.Flusher).Flush()
		io.WriteString(w, "b")
	})
	mux.HandleFunc("/trailer", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "X-Sum, Content-Length")
		io.WriteString(w, "with trailer")
		w.Header().Set("X-Sum", "42")
		w.Header().Set(http.TrailerPrefix+"X-Late", "7")
	})
	mux.HandleFunc("/identity", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Transfer-Encoding", "identity")
		io.WriteString(w, "streamed until close")
	})
	mux.HandleFunc("/hints", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</style.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		io.WriteString(w, "after hints")
	})
	mux.HandleFunc("/status", func(w http.ResponseWriter, r *http.Request) {
		code, _ := strconv.Atoi(r.URL.Query().Get("code"))
		w.WriteHeader(code)
	})
	mux.HandleFunc("/panic", func(w http.ResponseWriter, r *http.Request) {
		panic("boom")
	})
	mux.HandleFunc("/abort", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "100")
		io.WriteString(w, "partial")
		panic(http.ErrAbortHandler)
	})
	mux.HandleFunc("/", echo)
	return mux
}

// echo describes the request it got, body included.
func echo(w http.ResponseWriter, r *http.Request) {
	b, err := io.ReadAll(r.Body)
	keys := make([]string, 0, len(r.Header))
	for k := range r.Header {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	fmt.Fprintf(w, "%s %q path=%q raw=%q query=%q host=%q proto=%s %d.%d close=%v cl=%d te=%q\n",
		r.Method, r.RequestURI, r.URL.Path, r.URL.RawPath, r.URL.RawQuery, r.Host, r.Proto,
		r.ProtoMajor, r.ProtoMinor, r.Close, r.ContentLength, r.TransferEncoding)
	for _, k := range keys {
		fmt.Fprintf(w, "%s=%q\n", k, r.Header[k])
	}
	fmt.Fprintf(w, "body=%q err=%v remote=%v local=%v\n", b, err,
		strings.HasPrefix(r.RemoteAddr, "127.0.0.1:"), r.Context().Value(http.LocalAddrContextKey) != nil)
}

func quietLog() *log.Logger { return log.New(io.Discard, "", 0) }

// detacher is what a handler asks of the fast path's ResponseWriter.
type detacher interface{ Detach() func() }

// eventually retries cond for up to 5s and reports whether it held.
func eventually(cond func() bool) bool {
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

// listen listens on a free loopback port, or on a Unix socket in a
// temporary directory.
func listen(t testing.TB, network string) net.Listener {
	t.Helper()
	addr := "127.0.0.1:0"
	if network == "unix" {
		addr = t.TempDir() + "/s"
	}
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// startH1 serves h with an h1.Server on a free loopback port.
func startH1(t testing.TB, h http.Handler, configure func(*Server)) (*Server, string) {
	t.Helper()
	return startH1On(t, listen(t, "tcp"), h, configure)
}

func startH1On(t testing.TB, ln net.Listener, h http.Handler, configure func(*Server)) (*Server, string) {
	t.Helper()
	s := &Server{
		Handler:        h,
		MaxHeaderBytes: testMaxHeader,
		Fallback:       &http.Server{Handler: h, MaxHeaderBytes: testMaxHeader, ErrorLog: quietLog()},
		ErrorLog:       quietLog(),
	}
	if configure != nil {
		configure(s)
	}
	errc := make(chan error, 1)
	go func() { errc <- s.Serve(ln) }()
	t.Cleanup(func() {
		s.Close()
		if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Serve() = %v, want %v", err, http.ErrServerClosed)
		}
	})
	return s, ln.Addr().String()
}

// startNetHTTP serves h with a net/http Server on ln, behind GuardListener
// as memcgate serves net/http's connections, so that it is the reference
// for everything h1 serves (both refuse Content-Length with
// Transfer-Encoding).
func startNetHTTP(t testing.TB, ln net.Listener, h http.Handler) string {
	t.Helper()
	s := &http.Server{Handler: h, MaxHeaderBytes: testMaxHeader, ErrorLog: quietLog()}
	go s.Serve(GuardListener(ln))
	t.Cleanup(func() { s.Close() })
	return ln.Addr().String()
}

// wireResponse is a response as read off the wire: its status line, its
// header lines in order without Date, and its decoded body.
type wireResponse struct {
	status  string
	headers []string
	body    string
}

func (r wireResponse) String() string {
	return fmt.Sprintf("%s\n%s\n\n%q", r.status, strings.Join(r.headers, "\n"), r.body)
}

// dialFor connects to addr with a deadline of d for everything the test
// then does on the connection; the caller closes it.
func dialFor(t testing.TB, addr string, d time.Duration) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(d))
	return c
}

// exchange sends raw on a new connection and reads one response per
// entry of methods, then reports whether the server closed the
// connection, found by sending one more request.
// With halfClose it closes its side after raw instead, and closed is
// whether the server closed after the responses.
func exchange(t *testing.T, addr, raw string, methods []string, halfClose bool) (resps []wireResponse, closed bool) {
	t.Helper()
	c := dialFor(t, addr, 10*time.Second)
	defer c.Close()
	go func() { // the server may answer before it reads it all
		io.WriteString(c, raw)
		if halfClose {
			c.(*net.TCPConn).CloseWrite()
		}
	}()
	br := bufio.NewReader(c)
	for _, m := range methods {
		r, err := readWireResponse(br, m)
		if r.status != "" {
			resps = append(resps, r)
		}
		if err != nil || r.status == "" {
			return resps, true
		}
	}
	if halfClose {
		_, err := br.ReadByte()
		return resps, err == io.EOF
	}
	io.WriteString(c, "GET /small HTTP/1.1\r\nHost: probe\r\n\r\n")
	r, err := readWireResponse(br, "GET")
	return resps, err != nil || r.status == ""
}

// readWireResponse reads one response; r.status is empty if the
// connection was closed before a status line. Interim responses are read
// as their own response.
func readWireResponse(br *bufio.Reader, method string) (r wireResponse, err error) {
	line, err := br.ReadString('\n')
	if err != nil {
		return r, nil
	}
	r.status = strings.TrimRight(line, "\r\n")
	te, cl := "", -1
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return r, err
		}
		line = strings.TrimRight(line, "\r\n")
		if line == "" {
			break
		}
		k, v, _ := strings.Cut(line, ": ")
		switch k {
		case "Date":
			continue
		case "Transfer-Encoding":
			te = v
		case "Content-Length":
			cl, _ = strconv.Atoi(v)
		}
		r.headers = append(r.headers, line)
	}
	code, _ := strconv.Atoi(strings.Fields(r.status)[1])
	var b []byte
	switch {
	case code < 200 || code == 204 || code == 304 || method == "HEAD":
	case te == "chunked":
		b, err = io.ReadAll(httputil.NewChunkedReader(br))
		for err == nil { // trailers
			line, err = br.ReadString('\n')
			if line = strings.TrimRight(line, "\r\n"); line == "" {
				break
			}
			r.headers = append(r.headers, "trailer "+line)
		}
	case cl >= 0:
		b = make([]byte, cl)
		_, err = io.ReadFull(br, b)
	default:
		b, err = io.ReadAll(br)
	}
	r.body = string(b)
	return r, err
}

// conformanceCase is a raw request whose responses from h1 and net/http
// must be the same.
type conformanceCase struct {
	name      string
	raw       string
	methods   []string // one per response expected; default one GET
	halfClose bool     // close the client side after raw
	status    string   // if set, the first status line
}

func conformanceCases() []conformanceCase {
	big := strings.Repeat("x", 300<<10)
	return []conformanceCase{
		{name: "handler Content-Length", raw: "GET /cl HTTP/1.1\r\nHost: a\r\n\r\n"},
		{name: "computed Content-Length", raw: "GET /small HTTP/1.1\r\nHost: a\r\n\r\n"},
		{name: "2048 bytes fit", raw: "GET /big?n=2048 HTTP/1.1\r\nHost: a\r\n\r\n"},
		{name: "2049 bytes chunked", raw: "GET /big?n=2049 HTTP/1.1\r\nHost: a\r\n\r\n"},
		{name: "over 64 KiB chunked", raw: "GET /big?n=100000 HTTP/1.1\r\nHost: a\r\n\r\n"},
		{name: "over 64 KiB with Content-Length", raw: "GET /bigcl HTTP/1.1\r\nHost: a\r\n\r\n"},
		{name: "flush before reading the body", raw: "PUT /flushread HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc"},
		{name: "handler Connection keep-alive", raw: "GET /keepalive HTTP/1.1\r\nHost: a\r\n\r\n"},
		{name: "HTTP/1.0 handler keep-alive", raw: "GET /keepalive HTTP/1.0\r\n\r\n"},
		{name: "HTTP/1.0 POST", raw: "POST /read HTTP/1.0\r\nContent-Length: 3\r\n\r\nabc"},
		{name: "HTTP/1.0 pipelined", raw: "GET /small HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /cl HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
			methods: []string{"GET", "GET"}},
		{name: "empty body", raw: "PUT / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n"},
		{name: "101 without hijack", raw: "GET /status?code=101 HTTP/1.1\r\nHost: a\r\n\r\n"},
		{name: "sniffed", raw: "GET /html HTTP/1.1\r\nHost: a\r\n\r\n"},
		{name: "nil Content-Type", raw: "GET /nilct HTTP/1.1\r\nHost: a\r\n\r\n"},
		{name: "Content-Encoding not sniffed", raw: "GET /gzip HTTP/1.1\r\nHost: a\r\n\r\n"},
		{name: "HEAD with handler CL", raw: "HEAD /cl HTTP/1.1\r\nHost: a\r\n\r\n", methods: []string{"HEAD"}},
		{name: "HEAD without handler CL", raw: "HEAD /small HTTP/1.1\r\nHost: a\r\n\r\n", methods: []string{"HEAD"}},
		{name: "HEAD big", raw: "HEAD /big?n=5000 HTTP/1.1\r\nHost: a\r\n\r\n", methods: []string{"HEAD"}},
		{name: "HEAD empty", raw: "HEAD /status?code=200 HTTP/1.1\r\nHost: a\r\n\r\n", methods: []string{"HEAD"}},
		{name: "204", raw: "GET /204 HTTP/1.1\r\nHost: a\r\n\r\n"},
		{name: "304", raw: "GET /304 HTTP/1.1\r\nHost: a\r\n\r\n"},
		{name: "404 via http.Error", raw: "GET /404 HTTP/1.1\r\nHost: a\r\n\r\n"},
		{name: "unknown status", raw: "GET /status?code=599 HTTP/1.1\r\nHost: a\r\n\r\n"},
		{name: "PUT read fully", raw: "PUT /read HTTP/1.1\r\nHost: a\r\nContent-Length: 400\r\n\r\n" + strings.Repeat("v", 400)},
		{name: "PUT body ignored", raw: "PUT /ignore HTTP/1.1\r\nHost: a\r\nContent-Length: 400\r\n\r\n" + strings.Repeat("v", 400)},
		{name: "PUT 100 KiB body ignored", raw: "PUT /ignore HTTP/1.1\r\nHost: a\r\nContent-Length: 102400\r\n\r\n" + big[:100<<10]},
		{name: "PUT big body ignored", raw: "PUT /ignore HTTP/1.1\r\nHost: a\r\nContent-Length: " + strconv.Itoa(len(big)) + "\r\n\r\n" + big},
		{name: "PUT body closed", raw: "PUT /closebody HTTP/1.1\r\nHost: a\r\nContent-Length: 400\r\n\r\n" + strings.Repeat("v", 400)},
		{name: "PUT big body closed", raw: "PUT /closebody HTTP/1.1\r\nHost: a\r\nContent-Length: " + strconv.Itoa(len(big)) + "\r\n\r\n" + big},
		{name: "PUT short body", raw: "PUT /read HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nabc", halfClose: true},
		{name: "head cut short", raw: "GET /echo HTTP/1.1\r\nHost: a\r\nX-A: 1", halfClose: true},
		{name: "line cut short", raw: "GET /echo HTTP/1.1\r\nHost", halfClose: true},
		{name: "double WriteHeader", raw: "GET /double HTTP/1.1\r\nHost: a\r\n\r\n"},
		{name: "handler Connection close", raw: "GET /close HTTP/1.1\r\nHost: a\r\n\r\n"},
		{name: "client Connection close", raw: "GET /small HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"},
		{name: "short body", raw: "GET /short HTTP/1.1\r\nHost: a\r\n\r\n"},
		{name: "write past Content-Length", raw: "GET /over HTTP/1.1\r\nHost: a\r\n\r\n"},
		{name: "invalid handler Content-Length", raw: "GET /badcl HTTP/1.1\r\nHost: a\r\n\r\n"},
		{name: "header formatting", raw: "GET /headers HTTP/1.1\r\nHost: a\r\n\r\n"},
		{name: "flush", raw: "GET /flush HTTP/1.1\r\nHost: a\r\n\r\n"},
		{name: "trailers", raw: "GET /trailer HTTP/1.1\r\nHost: a\r\n\r\n"},
		{name: "Transfer-Encoding identity", raw: "GET /identity HTTP/1.1\r\nHost: a\r\n\r\n"},
		{name: "early hints", raw: "GET /hints HTTP/1.1\r\nHost: a\r\n\r\n", methods: []string{"GET", "GET"}},
		{name: "panic", raw: "GET /panic HTTP/1.1\r\nHost: a\r\n\r\n"},
		{name: "abort", raw: "GET /abort HTTP/1.1\r\nHost: a\r\n\r\n"},
		{name: "HTTP/1.0", raw: "GET /small HTTP/1.0\r\n\r\n"},
		{name: "HTTP/1.0 keep-alive", raw: "GET /small HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"},
		{name: "HTTP/1.0 keep-alive streamed", raw: "GET /big?n=3000 HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n"},
		{name: "HTTP/1.0 keep-alive HEAD", raw: "HEAD /big?n=3000 HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", methods: []string{"HEAD"}},
		{name: "HTTP/1.0 keep-alive 204", raw: "GET /204 HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"},
		{name: "HTTP/1.0 handler close", raw: "GET /close HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"},
		{name: "pipelined", raw: "GET /small HTTP/1.1\r\nHost: a\r\n\r\n" +
			"PUT /read HTTP/1.1\r\nHost: b\r\nContent-Length: 3\r\n\r\nabc" +
			"HEAD /cl HTTP/1.1\r\nHost: c\r\n\r\n", methods: []string{"GET", "PUT", "HEAD"}},
		{name: "pipelined then fallback", raw: "GET /small HTTP/1.1\r\nHost: a\r\n\r\n" +
			"PUT /read HTTP/1.1\r\nHost: b\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n" +
			"GET /echo HTTP/1.1\r\nHost: c\r\n\r\n", methods: []string{"GET", "PUT", "GET"}},
		{name: "CRLF after POST", raw: "POST /read HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n\r\nx\r\n" +
			"GET /small HTTP/1.1\r\nHost: a\r\n\r\n", methods: []string{"POST", "GET"}},
		{name: "percent-encoded path", raw: "GET /a%2Fb/c%20d?x=1&y=%20 HTTP/1.1\r\nHost: a\r\n\r\n"},
		{name: "request headers", raw: "GET /echo HTTP/1.1\r\nHost: example.com:8080\r\nuser-agent: t\r\nX-A: 1\r\nX-A:  2 \r\n" +
			"Pragma: no-cache\r\nAccept:\r\nX-Obs: caf\xc3\xa9\r\n\r\n"},
		{name: "two Host headers", raw: "GET /echo HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", status: "HTTP/1.1 400 Bad Request"},
		{name: "no Host", raw: "GET /echo HTTP/1.1\r\n\r\n", status: "HTTP/1.1 400 Bad Request: missing required Host header"},
		{name: "bad Host", raw: "GET /echo HTTP/1.1\r\nHost: a b\r\n\r\n"},
		{name: "chunked request body on HTTP/1.0", raw: "PUT /read HTTP/1.0\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n" +
			"3\r\nabc\r\n0\r\n\r\nGET /small HTTP/1.0\r\n\r\n", status: "HTTP/1.1 400 Bad Request"},
		{name: "chunked request body", raw: "PUT /read HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", status: "HTTP/1.1 200 OK"},
		{name: "Expect 100-continue", raw: "PUT /read HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\nabc",
			methods: []string{"PUT", "PUT"}, status: "HTTP/1.1 100 Continue"},
		{name: "Expect 100-continue pipelined", raw: "PUT /read HTTP/1.1\r\nHost: a\r\nExpect: 100-Continue\r\nContent-Length: 3\r\n\r\nabc" +
			"GET /small HTTP/1.1\r\nHost: a\r\n\r\n", methods: []string{"PUT", "PUT", "GET"}, status: "HTTP/1.1 100 Continue"},
		{name: "Expect 100-continue body ignored", raw: "PUT /ignore HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\nabc" +
			"GET /small HTTP/1.1\r\nHost: a\r\n\r\n", methods: []string{"PUT", "GET"}},
		{name: "Expect 100-continue body closed", raw: "PUT /closebody HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\nabc" +
			"GET /small HTTP/1.1\r\nHost: a\r\n\r\n", methods: []string{"PUT", "GET"}},
		{name: "Expect 100-continue with CL 0", raw: "PUT /read HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 0\r\n\r\n" +
			"GET /small HTTP/1.1\r\nHost: a\r\n\r\n", methods: []string{"PUT", "GET"}},
		{name: "bad Expect", raw: "PUT /read HTTP/1.1\r\nHost: a\r\nExpect: nonsense\r\nContent-Length: 3\r\n\r\nabc"},
		{name: "two Content-Lengths", raw: "PUT /read HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc"},
		{name: "bad Content-Length", raw: "PUT /read HTTP/1.1\r\nHost: a\r\nContent-Length: +3\r\n\r\nabc"},
		{name: "Connection token list", raw: "GET /echo HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, close\r\n\r\n"},
		{name: "Upgrade", raw: "GET /echo HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"},
		{name: "absolute form", raw: "GET http://other/echo HTTP/1.1\r\nHost: a\r\n\r\n"},
		{name: "OPTIONS *", raw: "OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n"},
		{name: "bad request line", raw: "GARBAGE\r\n\r\n", status: "HTTP/1.1 400 Bad Request"},
		{name: "HTTP/1.2", raw: "GET / HTTP/1.2\r\nHost: a\r\n\r\n"},
		{name: "bare LF", raw: "GET /echo HTTP/1.1\nHost: a\n\n"},
		{name: "obs-fold", raw: "GET /echo HTTP/1.1\r\nHost: a\r\nX-A: 1\r\n 2\r\n\r\n"},
		{name: "space before colon", raw: "GET /echo HTTP/1.1\r\nHost: a\r\nX-A : 1\r\n\r\n"},
		{name: "control byte in value", raw: "GET /echo HTTP/1.1\r\nHost: a\r\nX-A: 1\x002\r\n\r\n"},
		{name: "head over 4 KiB", raw: "GET /echo HTTP/1.1\r\nHost: a\r\nX-Big: " + strings.Repeat("b", 6000) + "\r\n\r\n", status: "HTTP/1.1 200 OK"},
		{name: "head over MaxHeaderBytes", raw: "GET /echo HTTP/1.1\r\nHost: a\r\nX-Big: " + strings.Repeat("b", 20000) + "\r\n\r\n", status: "HTTP/1.1 431 Request Header Fields Too Large"},
	}
}

func TestConformance(t *testing.T) {
	h := testHandler()
	_, raw := startH1(t, h, nil)
	// Connections without a RawConn are read with Read (see inbuf).
	_, plain := startH1On(t, plainListener{listen(t, "tcp")}, h, nil)
	std := startNetHTTP(t, listen(t, "tcp"), h)
	for _, tt := range conformanceCases() {
		for _, fast := range []struct{ name, addr string }{{"raw", raw}, {"Read", plain}} {
			t.Run(fast.name+"/"+tt.name, func(t *testing.T) {
				t.Parallel()
				testConformance(t, tt, std, fast.addr)
			})
		}
	}
}

// testConformance checks that h1 at fast answers tt as net/http at std.
func testConformance(t *testing.T, tt conformanceCase, std, fast string) {
	methods := tt.methods
	if methods == nil {
		methods = []string{"GET"}
	}
	want, wantClosed := exchange(t, std, tt.raw, methods, tt.halfClose)
	got, gotClosed := exchange(t, fast, tt.raw, methods, tt.halfClose)
	if tt.status != "" && (len(want) == 0 || want[0].status != tt.status) {
		t.Fatalf("net/http answered %v, want status %q", want, tt.status)
	}
	if len(got) != len(want) {
		t.Fatalf("got %d responses, want %d:\ngot  %v\nwant %v", len(got), len(want), got, want)
	}
	for i := range got {
		if got[i].String() != want[i].String() {
			t.Errorf("response %d:\ngot  %v\nwant %v", i, got[i], want[i])
		}
	}
	if gotClosed != wantClosed {
		t.Errorf("connection closed = %v, want %v", gotClosed, wantClosed)
	}
}

// TestFastPath checks which requests the fast path takes.
func TestFastPath(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, fast := w.(*response)
		fmt.Fprint(w, fast)
	})
	_, addr := startH1(t, h, nil)
	tests := []struct {
		name string
		raw  string
		want string
	}{
		{"GET", "GET /k?x=1 HTTP/1.1\r\nHost: a\r\n\r\n", "true"},
		{"PUT", "PUT /k HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc", "true"},
		{"HTTP/1.0", "GET / HTTP/1.0\r\n\r\n", "true"},
		{"keep-alive", "GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive\r\n\r\n", "true"},
		{"lower-case keys", "GET / HTTP/1.1\r\nhost: a\r\ncontent-length: 0\r\n\r\n", "true"},
		{"percent-encoding", "GET /a%2Fb HTTP/1.1\r\nHost: a\r\n\r\n", "true"},
		{"chunked", "PUT / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", "false"},
		{"Expect", "PUT / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 0\r\n\r\n", "true"},
		{"two Expects", "PUT / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nExpect: 100-continue\r\nContent-Length: 0\r\n\r\n", "false"},
		{"Expect on HTTP/1.0", "PUT / HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 0\r\n\r\n", "false"},
		{"absolute form", "GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n", "false"},
		{"Connection list", "GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, x\r\n\r\n", "false"},
		{"big head", "GET / HTTP/1.1\r\nHost: a\r\nX: " + strings.Repeat("x", 5000) + "\r\n\r\n", "false"},
		{"huge Content-Length", "PUT / HTTP/1.1\r\nHost: a\r\nContent-Length: 1099511627777\r\n\r\n", "false"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resps, _ := exchange(t, addr, tt.raw, []string{"GET"}, true)
			if len(resps) != 1 || resps[0].body != tt.want {
				t.Errorf("fast path took %q: %v, want %s", tt.raw, resps, tt.want)
			}
		})
	}
}

// dial opens a connection to addr that the test closes.
func dial(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	return dialOn(t, "tcp", addr)
}

// dialOn is dial on network ("tcp" or "unix").
func dialOn(t *testing.T, network, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(5 * time.Second))
	return c, bufio.NewReader(c)
}

// roundTrip sends a GET for path on c and reads its response.
func roundTrip(t *testing.T, c net.Conn, br *bufio.Reader, path string) wireResponse {
	t.Helper()
	if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: a\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	r, err := readWireResponse(br, "GET")
	if err != nil || r.status == "" {
		t.Fatalf("GET %s: %v, %v", path, r, err)
	}
	return r
}

// waitClosed waits for the server to close c and returns how long it took.
func waitClosed(t *testing.T, br *bufio.Reader) time.Duration {
	t.Helper()
	start := time.Now()
	if b, err := br.ReadByte(); err == nil {
		t.Fatalf("read %q, want the connection closed", b)
	} else if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("connection still open after %v", time.Since(start))
	}
	return time.Since(start)
}

func TestTimeouts(t *testing.T) {
	const timeout = 200 * time.Millisecond
	tests := []struct {
		name      string
		configure func(*Server)
		send      func(c net.Conn, br *bufio.Reader)
	}{
		{
			name:      "idle",
			configure: func(s *Server) { s.IdleTimeout = timeout },
			send: func(c net.Conn, br *bufio.Reader) {
				roundTrip(t, c, br, "/small")
			},
		},
		{
			name:      "slow head",
			configure: func(s *Server) { s.ReadHeaderTimeout = timeout },
			send: func(c net.Conn, br *bufio.Reader) {
				go func() {
					tick := time.NewTicker(timeout / 2)
					defer tick.Stop()
					for _, b := range []byte("GET /small HTTP/1.1\r\nHost: a\r\n\r\n") {
						if _, err := c.Write([]byte{b}); err != nil {
							return
						}
						<-tick.C
					}
				}()
			},
		},
		{
			// The start of a head sent at once, usually read with the
			// accept (no read deadline armed then), and nothing more: the
			// header timeout still closes the connection.
			name:      "head begun with the connection",
			configure: func(s *Server) { s.ReadHeaderTimeout, s.IdleTimeout = timeout, time.Minute },
			send: func(c net.Conn, br *bufio.Reader) {
				io.WriteString(c, "GET /small HTTP/1.1\r\nHo")
			},
		},
		{
			// A whole request and the start of a second in one write: the
			// second's head is cut by ReadHeaderTimeout, not left to the
			// idle timeout (which is long here).
			name: "slow pipelined head",
			configure: func(s *Server) {
				s.ReadHeaderTimeout, s.IdleTimeout = timeout, time.Minute
			},
			send: func(c net.Conn, br *bufio.Reader) {
				roundTrip(t, c, br, "/small") // the first request, idle deadline then armed
				c.Write([]byte("GET /small HTTP/1.1\r\nHost: a\r\n\r\nGET /sm"))
				if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != 200 {
					t.Errorf("the whole pipelined request: %v %v", resp, err)
				} else {
					io.Copy(io.Discard, resp.Body)
				}
			},
		},
		{
			// A head longer than the read buffer that stops short: the
			// header timeout counts from its start, as in net/http
			// alone, with the head waiting in the fast path.
			name:      "slow long head",
			configure: func(s *Server) { s.ReadHeaderTimeout, s.IdleTimeout = timeout, time.Minute },
			send: func(c net.Conn, br *bufio.Reader) {
				io.WriteString(c, "GET /small HTTP/1.1\r\nHost: a\r\nX-Big: "+strings.Repeat("b", 6000))
			},
		},
		{
			// A body that stops halfway is cut by ReadTimeout.
			name: "slow body",
			configure: func(s *Server) {
				s.ReadTimeout, s.IdleTimeout = timeout, time.Minute
			},
			send: func(c net.Conn, br *bufio.Reader) {
				c.Write([]byte("PUT /small HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nhalf"))
				// The handler's body read fails at the deadline; whatever
				// it answers, the connection then closes.
				if resp, err := http.ReadResponse(br, nil); err == nil {
					io.Copy(io.Discard, resp.Body)
				}
			},
		},
		{
			name:      "idle falls back to ReadTimeout",
			configure: func(s *Server) { s.ReadTimeout = timeout },
			send: func(c net.Conn, br *bufio.Reader) {
				roundTrip(t, c, br, "/small")
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, addr := startH1(t, testHandler(), tt.configure)
			start := time.Now() // before the dial: the server's clock may start at the accept
			c, br := dial(t, addr)
			tt.send(c, br)
			waitClosed(t, br)
			// Generous above (a loaded machine is late): the timers it
			// must not follow are a minute, or none.
			if d := time.Since(start); d < timeout*3/4 || d > 20*timeout { // below dial's 5 s deadline
				t.Errorf("connection closed after %v, want about %v", d, timeout)
			}
		})
	}
}

func TestShutdown(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	releaseOnce := sync.OnceFunc(func() { close(release) })
	t.Cleanup(releaseOnce)
	h := http.NewServeMux()
	h.HandleFunc("/sleep", func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-release // the work in flight
		io.WriteString(w, "slept")
	})
	h.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Handler: h, Fallback: &http.Server{Handler: h}, ErrorLog: quietLog()}
	serveErr := make(chan error, 1)
	go func() { serveErr <- s.Serve(ln) }()
	t.Cleanup(func() { s.Close() })
	addr := ln.Addr().String()

	idle, idleBR := dial(t, addr)
	roundTrip(t, idle, idleBR, "/")
	busy, busyBR := dial(t, addr)
	io.WriteString(busy, "GET /sleep HTTP/1.1\r\nHost: a\r\n\r\n")
	<-entered

	shutdownErr := make(chan error, 1)
	go func() { shutdownErr <- s.Shutdown(t.Context()) }()

	// At once: while the request in flight still waits for release.
	waitClosed(t, idleBR)
	releaseOnce()
	r, err := readWireResponse(busyBR, "GET")
	if err != nil || r.body != "slept" || !slices.Contains(r.headers, "Connection: close") {
		t.Errorf("in-flight response = %v, %v; want it whole, with Connection: close", r, err)
	}
	waitClosed(t, busyBR)
	if err := <-shutdownErr; err != nil {
		t.Errorf("Shutdown() = %v, want nil", err)
	}
	if err := <-serveErr; !errors.Is(err, http.ErrServerClosed) {
		t.Errorf("Serve() = %v, want %v", err, http.ErrServerClosed)
	}
	if err := s.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		t.Errorf("Serve() after Shutdown = %v, want %v", err, http.ErrServerClosed)
	}
}

// heldListener returns each connection it accepts only once the test
// lets it (release), and says when it was closed: what Serve does with a
// connection it accepted as Shutdown closed the listener.
type heldListener struct {
	net.Listener
	accepted, release, closed chan struct{}
	closeOnce                 sync.Once
}

func (l *heldListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.accepted <- struct{}{}
	<-l.release
	return c, nil
}

func (l *heldListener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// serveHeld starts a Server answering "ok" on a heldListener of its own,
// and returns it, the listener and what its Serve returns.
func serveHeld(t *testing.T) (*Server, *heldListener, chan error) {
	t.Helper()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := &heldListener{Listener: inner, accepted: make(chan struct{}), release: make(chan struct{}), closed: make(chan struct{})}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	s := &Server{Handler: h, Fallback: &http.Server{Handler: h}, ErrorLog: quietLog()}
	serveErr := make(chan error, 1)
	go func() { serveErr <- s.Serve(ln) }()
	return s, ln, serveErr
}

// TestShutdownServesAccepted checks that a connection Serve accepted
// just as Shutdown closed its listener is served, not closed unread: a
// listening socket that systemd also holds would have queued it for the
// next gateway, and its client got a reset for a request nothing
// refused (test/deploy TestSystemdSocketRestart found it).
func TestShutdownServesAccepted(t *testing.T) {
	s, ln, serveErr := serveHeld(t)
	inner := ln.Listener
	t.Cleanup(func() { s.Close() })

	c, br := dial(t, inner.Addr().String())
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	<-ln.accepted // Serve holds the connection, not yet its own
	shutdownErr := make(chan error, 1)
	go func() { shutdownErr <- s.Shutdown(t.Context()) }()
	<-ln.closed
	close(ln.release)
	r, err := readWireResponse(br, "GET")
	if err != nil || r.body != "ok" {
		t.Errorf("response to the connection accepted during Shutdown = %v, %v; want ok", r, err)
	}
	if err := <-shutdownErr; err != nil {
		t.Errorf("Shutdown() = %v, want nil", err)
	}
	if err := <-serveErr; !errors.Is(err, http.ErrServerClosed) {
		t.Errorf("Serve() = %v, want %v", err, http.ErrServerClosed)
	}
}

func TestShutdownTimeout(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-release
	})
	s, addr := startH1(t, h, nil)
	defer close(release)
	c, _ := dial(t, addr)
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	<-entered
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if err := s.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Shutdown() = %v, want %v", err, context.DeadlineExceeded)
	}
}

func TestSetKeepAlivesEnabled(t *testing.T) {
	s, addr := startH1(t, testHandler(), nil)
	idle, idleBR := dial(t, addr)
	if r := roundTrip(t, idle, idleBR, "/small"); slices.Contains(r.headers, "Connection: close") {
		t.Fatalf("response before SetKeepAlivesEnabled(false) = %v, want no Connection: close", r)
	}

	s.SetKeepAlivesEnabled(false)
	waitClosed(t, idleBR)
	c, br := dial(t, addr)
	if r := roundTrip(t, c, br, "/small"); !slices.Contains(r.headers, "Connection: close") {
		t.Errorf("response = %v, want Connection: close", r)
	}
	waitClosed(t, br)

	s.SetKeepAlivesEnabled(true)
	c, br = dial(t, addr)
	for range 2 {
		if r := roundTrip(t, c, br, "/small"); slices.Contains(r.headers, "Connection: close") {
			t.Errorf("response after SetKeepAlivesEnabled(true) = %v, want no Connection: close", r)
		}
	}
}

func TestServeConfig(t *testing.T) {
	h := http.NotFoundHandler()
	tests := []struct {
		name string
		s    *Server
	}{
		{"no Handler", &Server{Fallback: &http.Server{}}},
		{"no Fallback", &Server{Handler: h}},
		{"MaxHeaderBytes differ", &Server{Handler: h, MaxHeaderBytes: 1 << 10, Fallback: &http.Server{}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			if err := tt.s.Serve(ln); err == nil || errors.Is(err, http.ErrServerClosed) {
				t.Errorf("Serve() = %v, want a configuration error", err)
			}
		})
	}
}

// FuzzServe feeds arbitrary bytes, then EOF, to h1 and to net/http. h1
// must not panic or hang, and when both answer, their first response
// heads (status line and header lines but Date) must be the same.
func FuzzServe(f *testing.F) {
	for _, tt := range conformanceCases() {
		if len(tt.raw) <= 16<<10 {
			f.Add([]byte(tt.raw))
		}
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, "%s %s %q %q\n", r.Method, r.RequestURI, r.Header, b)
	})
	_, fast := startH1On(f, listen(f, "unix"), h, func(s *Server) { s.ReadTimeout = 2 * time.Second })
	std := startNetHTTP(f, listen(f, "unix"), h)
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) > 16<<10 {
			t.Skip("longer than the socket buffers")
		}
		got, err := firstHead(fast, in)
		if err != nil {
			t.Fatalf("h1 on %q: %v", in, err)
		}
		want, err := firstHead(std, in)
		if err != nil {
			t.Skipf("net/http: %v", err)
		}
		if got != want && got != "" && want != "" {
			t.Errorf("first response to %q:\nh1       %q\nnet/http %q", in, got, want)
		}
	})
}

// firstHead sends in and EOF on a new Unix socket connection to addr and
// returns the head of the first response without its Date line, or "".
func firstHead(addr string, in []byte) (string, error) {
	c, err := net.Dial("unix", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	c.Write(in) // the server may close first
	c.(*net.UnixConn).CloseWrite()
	out, err := io.ReadAll(c)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return "", fmt.Errorf("no EOF after 5s, read %q", out)
	}
	head, _, ok := bytes.Cut(out, []byte("\r\n\r\n"))
	if !ok || !bytes.HasPrefix(head, []byte("HTTP/1.")) {
		return "", nil
	}
	var b strings.Builder
	for l := range strings.SplitSeq(string(head), "\r\n") {
		if !strings.HasPrefix(l, "Date: ") {
			b.WriteString(l + "\n")
		}
	}
	return b.String(), nil
}

func TestErrorLog(t *testing.T) {
	tests := []struct {
		path string
		want string // in the log; "" for nothing
	}{
		{"/panic", "h1: panic serving 127.0.0.1:"},
		{"/abort", ""},
		{"/double", "superfluous response.WriteHeader call"},
		{"/badcl", `invalid Content-Length of "abc"`},
		{"/small", ""},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			var logs gatewaytest.SyncBuffer
			_, addr := startH1(t, testHandler(), func(s *Server) { s.ErrorLog = log.New(&logs, "", 0) })
			c, br := dial(t, addr)
			io.WriteString(c, "GET "+tt.path+" HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
			io.Copy(io.Discard, br) // until the server closes, after logging
			got := logs.String()
			if tt.want == "" && got != "" || !strings.Contains(got, tt.want) {
				t.Errorf("GET %s logged %q, want %q", tt.path, got, tt.want)
			}
		})
	}
}

func TestCloseCancelsRequests(t *testing.T) {
	entered := make(chan struct{})
	done := make(chan error, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-r.Context().Done()
		done <- r.Context().Err()
	})
	s, addr := startH1(t, h, nil)
	c, _ := dial(t, addr)
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	<-entered
	s.Close()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("request context error after Close = %v, want %v", err, context.Canceled)
	}
}

// ctxMark is the value NewContext adds in TestNewContext.
type ctxMark struct{}

func TestNewContext(t *testing.T) {
	made := 0
	entered := make(chan struct{}, 1)
	done := make(chan error, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		fmt.Fprintf(w, "mark=%v local=%v", ctx.Value(ctxMark{}), ctx.Value(http.LocalAddrContextKey) != nil)
		if r.URL.Path == "/wait" {
			entered <- struct{}{}
			<-ctx.Done()
			done <- ctx.Err()
		}
	})
	s, addr := startH1(t, h, func(s *Server) {
		s.NewContext = func(parent context.Context, _ time.Time, _ interface{ Gone() bool }) context.Context {
			made++ // requests on one connection run one at a time
			return context.WithValue(parent, ctxMark{}, made)
		}
	})
	c, br := dial(t, addr)
	for i := 1; i <= 2; i++ {
		got := roundTrip(t, c, br, "/")
		if want := fmt.Sprintf("mark=%d local=true", i); got.body != want {
			t.Errorf("request %d: handler saw %q, want %q (a new context per request, from the connection's)", i, got.body, want)
		}
	}
	io.WriteString(c, "GET /wait HTTP/1.1\r\nHost: a\r\n\r\n")
	<-entered
	s.Close()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("NewContext's context after Close: error %v, want %v", err, context.Canceled)
	}
}

func TestReadTimeoutCutsBody(t *testing.T) {
	_, addr := startH1(t, testHandler(), func(s *Server) { s.ReadTimeout = 200 * time.Millisecond })
	c, br := dial(t, addr)
	io.WriteString(c, "PUT /read HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nabc")
	r, err := readWireResponse(br, "PUT")
	if err != nil || !strings.Contains(r.body, "i/o timeout") {
		t.Errorf("response = %v, %v; want the handler to see a timeout", r, err)
	}
}

// TestHeaderReuse: a connection reuses its response header map, and
// nothing a handler set shows in the next response.
func TestHeaderReuse(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n, _ := strconv.Atoi(r.URL.Query().Get("n")); n > 0 {
			for i := range n {
				w.Header().Set("X-H"+strconv.Itoa(i), "v")
			}
		}
		io.WriteString(w, "ok")
	})
	_, addr := startH1(t, h, nil)
	c, br := dial(t, addr)
	for _, n := range []int{3, 0, maxReusedHeader + 5, 0, 1, 0} {
		r := roundTrip(t, c, br, "/?n="+strconv.Itoa(n))
		got := 0
		for _, line := range r.headers {
			if strings.HasPrefix(line, "X-H") {
				got++
			}
		}
		if got != n {
			t.Errorf("response to n=%d has %d X-H headers, want %d: %v", n, got, n, r)
		}
	}
}

// TestDateHeader: the Date header, formatted once a second for the whole
// server, names the second the response was made in, on every
// connection.
func TestDateHeader(t *testing.T) {
	_, addr := startH1(t, testHandler(), nil)
	for i := range 3 {
		before := time.Now().Truncate(time.Second)
		resp, err := http.Get("http://" + addr + "/small")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		after := time.Now()
		d, err := http.ParseTime(resp.Header.Get("Date"))
		if err != nil || d.Before(before) || d.After(after) {
			t.Errorf("request %d: Date %q (%v), want a time between %v and %v", i, resp.Header.Get("Date"), err, before, after)
		}
	}
}

// TestShutdownTimeoutServeHeld checks that Shutdown's wait for its Serve
// loops is bounded by its ctx: a Serve that holds a connection it
// accepted (here until the test lets it go) keeps Shutdown waiting only
// until ctx ends. Close then stops the Serve: the connection it hands
// over after that is closed unserved, and Serve returns.
func TestShutdownTimeoutServeHeld(t *testing.T) {
	s, ln, serveErr := serveHeld(t)
	inner := ln.Listener

	c, br := dial(t, inner.Addr().String())
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	<-ln.accepted // Serve holds the connection until release
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if err := s.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Shutdown() with a Serve held = %v, want %v", err, context.DeadlineExceeded)
	}
	s.Close() // its error is the listener Shutdown closed already
	close(ln.release)
	if err := <-serveErr; !errors.Is(err, http.ErrServerClosed) {
		t.Errorf("Serve() = %v, want %v", err, http.ErrServerClosed)
	}
	if r, err := readWireResponse(br, "GET"); err != nil || r.status != "" {
		t.Errorf("the connection handed over after Close was answered %v, %v; want it closed unserved", r, err)
	}
}
