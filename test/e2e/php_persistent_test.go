package e2e

import (
	"bufio"
	"encoding/base64"
	be "encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/gatewaytest"
	"github.com/memcgate/memcgate/test/memcachedtest"
)

// phpSession is one php process running test/php/persistent_get.php: its
// calls of memcgate_get_persistent share the kept connection, as the pages
// a php-fpm worker serves do.
type phpSession struct {
	t      *testing.T
	cmd    *exec.Cmd
	in     io.WriteCloser
	lines  chan string // stdout, a line at a time; closed at its end
	stderr *gatewaytest.SyncBuffer
}

// startPHPSession runs persistent_get.php in php until the test ends.
func startPHPSession(t *testing.T, php string) *phpSession {
	t.Helper()
	cmd := exec.Command(php, "../php/persistent_get.php")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &phpSession{t: t, cmd: cmd, in: in, lines: make(chan string, 1), stderr: &gatewaytest.SyncBuffer{}}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(nil, 4<<20)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
	}()
	t.Cleanup(func() {
		in.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	return p
}

// call makes one call (an op of persistent_get.php) of key at addr and
// returns its answer.
func (p *phpSession) call(op, key, addr string, timeout float64) streamResult {
	p.t.Helper()
	return p.callToken(op, key, addr, timeout, nil)
}

// callToken is call passing the function a token, or none if token is nil.
func (p *phpSession) callToken(op, key, addr string, timeout float64, token *string) streamResult {
	p.t.Helper()
	in, _ := json.Marshal(map[string]any{"op": op, "key": base64.StdEncoding.EncodeToString([]byte(key)), "addr": addr, "timeout": timeout, "token": token})
	if _, err := p.in.Write(append(in, '\n')); err != nil {
		p.t.Fatalf("php persistent_get.php: %v\n%s", err, p.stderr.String())
	}
	select {
	case line, ok := <-p.lines:
		if !ok {
			p.t.Fatalf("php persistent_get.php ended:\n%s", p.stderr.String())
		}
		var r streamResult
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			p.t.Fatalf("php persistent_get.php: %v: %s\n%s", err, line, p.stderr.String())
		}
		return r
	case <-time.After(60 * time.Second):
		p.t.Fatalf("php persistent_get.php: no answer in 60s for %s %q\n%s", op, key, p.stderr.String())
	}
	return streamResult{}
}

// get is call("get", …) expecting the value want ("" with miss for a
// miss).
func (p *phpSession) get(key, addr string, want string) {
	p.t.Helper()
	r := p.call("get", key, addr, 5)
	got, ok := r.value(p.t)
	if !ok || got != want {
		p.t.Errorf("get %q: %d bytes (ok %v, miss %v, error %q), want the %d bytes stored", key, len(got), ok, r.Miss, r.Error, len(want))
	}
}

// accepted is the gateway's count of accepted client connections.
func accepted(t *testing.T, g *gateway) float64 {
	t.Helper()
	return metricValue(t, g, "memcgate_http_connections_accepted_total")
}

// TestPHPPersistentClient runs memcgate_get_persistent, the kept-connection
// client docs/php.md gives PHP users, in the real php against a real
// gateway, over TCP and its Unix socket: calls of one process share one
// connection through hits of awkward values, a miss and a refused key,
// and a refusal with Connection: close makes the next call connect again;
// a gateway stopped with SIGSTOP is a timeout whose connection is not used
// again; a gateway restarted, and one whose idle timeout closed the kept
// connection, are connected to again.
func TestPHPPersistentClient(t *testing.T) {
	t.Parallel()
	php := gatewaytest.PHP(t)
	sock := filepath.Join(t.TempDir(), "memcgate.sock")
	g := startOneNodeGateway(t, map[string]string{
		"MEMCGATE_LISTEN_SOCKET":   sock,
		"MEMCGATE_MAX_VALUE_BYTES": strconv.Itoa(1<<20 + 1000),
	}, "-I", "2m")
	big := make([]byte, 1<<20)
	for i := range big {
		big[i] = byte(i * 7)
	}
	values := map[string]string{
		"seed":  strings.Repeat("v", 400),
		"bin":   "a\x00b\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n\x00\xff",
		"empty": "",
		"big":   string(big),
	}
	for k, v := range values {
		if r := g.do("PUT", "/"+k, []byte(v)); r.status != 201 {
			t.Fatalf("PUT %s: %d %s", k, r.status, r.body)
		}
	}

	for _, addr := range []string{"tcp://" + g.DataAddr, "unix://" + sock} {
		t.Run(strings.SplitN(addr, ":", 2)[0], func(t *testing.T) {
			p := startPHPSession(t, php)
			before := accepted(t, g)
			p.get("seed", addr, values["seed"])
			p.get("bin", addr, values["bin"])
			p.get("empty", addr, values["empty"])
			p.get("big", addr, values["big"])
			if r := p.call("get", "missing", addr, 5); !r.Miss {
				t.Errorf("missing key: %+v, want a miss", r)
			}
			// A key with a space is answered 400, the connection kept.
			if r := p.call("get", "bad key", addr, 5); !strings.Contains(r.Error, "status 400: key has byte 0x20") {
				t.Errorf("key with a space: %+v, want an exception with the gateway's 400", r)
			}
			p.get("bin", addr, values["bin"])
			if n := accepted(t, g) - before; n != 1 {
				t.Errorf("%v connections accepted for 7 calls of one process, want 1", n)
			}
			// A head over MEMCGATE_MAX_HEADER_BYTES is refused before any
			// handler, 431 with Connection: close, its body naming the
			// variable: the next call is on a new connection.
			if r := p.call("get", strings.Repeat("k", 100000), addr, 5); !strings.Contains(r.Error, "status 431: request head too large") || !strings.Contains(r.Error, "MEMCGATE_MAX_HEADER_BYTES") {
				t.Errorf("key of 100 KB: %+v, want an exception with the gateway's 431", r)
			}
			p.get("seed", addr, values["seed"])
			p.get("seed", addr, values["seed"])
			if n := accepted(t, g) - before; n != 2 {
				t.Errorf("%v connections accepted for 10 calls, one answered with Connection: close, want 2", n)
			}

			// Stopped, the gateway answers nothing: a timeout. Once it goes
			// on it writes the answer for "big" into a socket the client
			// closed; the next call, for another key, is on a new one.
			g.Signal(syscall.SIGSTOP)
			memcachedtest.WaitStopped(t, "memcgate", g.Pid())
			r := p.call("get", "big", addr, 0.3)
			g.Signal(syscall.SIGCONT)
			if !strings.Contains(r.Error, "connection timed out before the answer's head") {
				t.Errorf("gateway stopped: %+v, want a timeout", r)
			}
			before = accepted(t, g)
			p.get("seed", addr, values["seed"])
			if n := accepted(t, g) - before; n != 1 {
				t.Errorf("after a timeout: %v connections accepted for the next call, want 1 (a new one)", n)
			}
		})
	}

	t.Run("restart", func(t *testing.T) {
		p := startPHPSession(t, php)
		addr := "tcp://" + g.DataAddr
		p.get("seed", addr, values["seed"])
		g.Signal(syscall.SIGTERM)
		if err, ok := g.Wait(30 * time.Second); !ok {
			t.Fatal("memcgate did not stop within 30s of SIGTERM")
		} else if err != nil {
			t.Logf("memcgate stopped: %v", err)
		}
		g.Start(t)
		p.get("bin", addr, values["bin"])
		p.get("seed", addr, values["seed"])
		if n := accepted(t, g); n != 1 {
			t.Errorf("restarted gateway: %v connections accepted for 2 calls, want 1", n)
		}
	})
}

// TestPHPPersistentClientDrain: a gateway draining after SIGTERM answers
// each request with "Connection: close" (and closes the connections idle
// then); a worker's calls meanwhile get their values, not an exception,
// each on a new connection.
func TestPHPPersistentClientDrain(t *testing.T) {
	t.Parallel()
	php := gatewaytest.PHP(t)
	g := startOneNodeGateway(t, map[string]string{
		"MEMCGATE_DRAIN_DELAY": "10m", // the test ends first and kills it
	})
	if r := g.do("PUT", "/k", []byte("v"), "Connection", "close"); r.status != 201 {
		t.Fatalf("PUT: %d %s", r.status, r.body)
	}
	addr := "tcp://" + g.DataAddr
	p := startPHPSession(t, php)
	p.get("k", addr, "v")
	g.Signal(syscall.SIGTERM)
	// Keep-alives are off once an answer says "Connection: close".
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if resp, err := http.Get(g.URL + "/k"); err == nil {
			resp.Body.Close()
			if resp.Close {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no answer with Connection: close within 30s of SIGTERM")
		}
	}
	// The kept connection was closed, or its answer closes it now.
	p.get("k", addr, "v")
	first := accepted(t, g)
	for range 2 {
		p.get("k", addr, "v")
	}
	if n := accepted(t, g) - first; n != 2 {
		t.Errorf("%v connections accepted for 2 calls while draining, want 2 (each answer closes its own)", n)
	}
}

// TestPHPPersistentClientToken: the token goes with each request on the
// kept connection, and one that would add a byte to the request past its
// head (a token read from a file, with its newline) is refused before
// anything is sent, so it cannot fail the next page's call.
func TestPHPPersistentClientToken(t *testing.T) {
	t.Parallel()
	php := gatewaytest.PHP(t)
	g := startOneNodeGateway(t, map[string]string{
		"MEMCGATE_AUTH_TOKENS": "read:php-pages-token-0001",
	})
	addr := "tcp://" + g.DataAddr
	p := startPHPSession(t, php)
	good, nl := "php-pages-token-0001", "php-pages-token-0001\n"
	for i, c := range []struct {
		token *string
		want  string // "" for a miss
	}{
		{nil, "status 401"},
		{&good, ""},
		{&nl, "printable ASCII with no space"},
		{&good, ""},
		{&good, ""},
	} {
		r := p.callToken("get", "missing", addr, 5, c.token)
		if c.want == "" && (!r.Miss || r.Error != "") {
			t.Errorf("call %d: %+v, want a miss", i, r)
		}
		if c.want != "" && !strings.Contains(r.Error, c.want) {
			t.Errorf("call %d: %+v, want an exception with %q", i, r, c.want)
		}
	}
}

// TestPHPPersistentClientIdle: a kept connection the gateway closed at
// MEMCGATE_IDLE_TIMEOUT between two calls is replaced.
func TestPHPPersistentClientIdle(t *testing.T) {
	t.Parallel()
	php := gatewaytest.PHP(t)
	g := startOneNodeGateway(t, map[string]string{
		"MEMCGATE_IDLE_TIMEOUT": "200ms",
	})
	// Connection: close: the one connection the gateway keeps idle is php's.
	if r := g.do("PUT", "/k", []byte("v1"), "Connection", "close"); r.status != 201 {
		t.Fatalf("PUT: %d %s", r.status, r.body)
	}
	addr := "tcp://" + g.DataAddr
	p := startPHPSession(t, php)
	const idle = `memcgate_http_connections_closed_total{listener="data",reason="idle_timeout"}`
	first := accepted(t, g)
	for i := range 3 {
		before := metricValue(t, g, idle)
		p.get("k", addr, "v1")
		for deadline := time.Now().Add(30 * time.Second); metricValue(t, g, idle) == before; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("call %d: the gateway closed no idle connection within 30s", i)
			}
		}
	}
	p.get("k", addr, "v1")
	if n := accepted(t, g) - first; n != 4 {
		t.Errorf("%v connections accepted for 4 calls, each after the last one's closed, want 4", n)
	}
}

// step is what a scripted server (TestPHPPersistentClientAnswers) does
// with one request it reads.
type step struct {
	answer string // written as it is
	close  bool   // then the connection is closed
	signal bool   // then the php process is sent SIGUSR1 (see persistent_get.php's "abandon")
	// With none of these the request is not answered and the connection held.
}

// ok is a step answering value with 200.
func ok(value string) step {
	return step{answer: fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(value), value)}
}

// scriptedServer answers the n-th request of its i-th connection with
// conns[i][n]; requests past the script get the value "WRONG", so a client
// reading an answer not its own shows.
type scriptedServer struct {
	ln     net.Listener
	conns  [][]step
	signal func()

	mu    sync.Mutex
	reqs  [][]string // the requests each connection read, in accept order
	accum []net.Conn // the connections, in accept order, closed at the end
}

// startScripted serves conns on a loopback port until the test ends;
// signal is what a step with signal calls.
func startScripted(t *testing.T, conns [][]step, signal func()) *scriptedServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &scriptedServer{ln: ln, conns: conns, signal: signal}
	var open sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		s.mu.Lock()
		for _, c := range s.accum {
			c.Close()
		}
		s.mu.Unlock()
		open.Wait()
	})
	open.Add(1)
	go func() {
		defer open.Done()
		for i := 0; ; i++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.reqs = append(s.reqs, nil)
			s.accum = append(s.accum, c)
			s.mu.Unlock()
			var script []step
			if i < len(conns) {
				script = conns[i]
			}
			open.Add(1)
			go func() {
				defer open.Done()
				s.serve(i, c, script)
			}()
		}
	}()
	return s
}

func (s *scriptedServer) serve(i int, c net.Conn, script []step) {
	defer c.Close()
	r := bufio.NewReader(c)
	for n := 0; ; n++ {
		var req strings.Builder
		for !strings.HasSuffix(req.String(), "\r\n\r\n") {
			line, err := r.ReadString('\n')
			req.WriteString(line)
			if err != nil {
				return
			}
		}
		s.mu.Lock()
		s.reqs[i] = append(s.reqs[i], req.String())
		s.mu.Unlock()
		st := ok("WRONG")
		if n < len(script) {
			st = script[n]
		}
		if st.answer != "" {
			if _, err := c.Write([]byte(st.answer)); err != nil {
				return
			}
		}
		if st.signal {
			s.signal()
		}
		if st.close {
			return
		}
	}
}

// push writes b, unasked, on the connection accepted last.
func (s *scriptedServer) push(t *testing.T, b string) {
	t.Helper()
	s.mu.Lock()
	c := s.accum[len(s.accum)-1]
	s.mu.Unlock()
	if _, err := c.Write([]byte(b)); err != nil {
		t.Fatal(err)
	}
}

// requests is how many requests each connection read, in accept order.
func (s *scriptedServer) requests() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := make([]int, len(s.reqs))
	for i, r := range s.reqs {
		n[i] = len(r)
	}
	return n
}

// TestPHPPersistentClientAnswers gives memcgate_get_persistent answers from
// a scripted server and checks, for each, the values or exceptions of the
// calls and how many requests each connection carried: what is kept, what
// is closed, what is sent again on a new connection (only a request whose
// kept connection closed before any byte of its answer), and that a call
// abandoned in the middle of its answer (as by a fatal error or exit) leaves
// a connection the next call does not use.
func TestPHPPersistentClientAnswers(t *testing.T) {
	t.Parallel()
	php := gatewaytest.PHP(t, "pcntl")
	type call struct {
		op      string  // "get" (the default), "foreign", "fatal" or "abandon"
		push    string  // written first, unasked, on the last connection the server accepted
		timeout float64 // seconds; 0: 5
		want    string  // the value, or with err a part of the exception's message
		err     bool
		miss    bool
	}
	head := func(status string, body string, hdr ...string) step {
		return step{answer: fmt.Sprintf("HTTP/1.1 %s\r\n%sContent-Length: %d\r\n\r\n%s", status, strings.Join(hdr, ""), len(body), body)}
	}
	cases := []struct {
		name  string
		conns [][]step
		calls []call
		reqs  []int
	}{
		{"kept for the next call", [][]step{{ok("a"), ok("b"), ok("")}},
			[]call{{want: "a"}, {want: "b"}, {want: ""}}, []int{3}},
		{"a 404 read to its end, then a hit", [][]step{{head("404 Not Found", "not found\n"), ok("b")}},
			[]call{{miss: true}, {want: "b"}}, []int{2}},
		{"an error status read to its end, the connection kept", [][]step{{head("503 Service Unavailable", "busy\n"), ok("b")}},
			[]call{{want: "status 503: busy", err: true}, {want: "b"}}, []int{2}},
		{"Connection: close", [][]step{{head("400 Bad Request", "bad\n", "Connection: close\r\n")}, {ok("b")}},
			[]call{{want: "status 400: bad", err: true}, {want: "b"}}, []int{1, 1}},
		{"Connection: close on a hit", [][]step{{head("200 OK", "a", "Connection: keep-alive, close\r\n")}, {ok("b")}},
			[]call{{want: "a"}, {want: "b"}}, []int{1, 1}},
		{"HTTP/1.0", [][]step{{step{answer: "HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\na"}}, {ok("b")}},
			[]call{{want: "a"}, {want: "b"}}, []int{1, 1}},
		{"kept closed with no answer: sent again on a new one", [][]step{{ok("a"), {close: true}}, {ok("b"), ok("c")}},
			[]call{{want: "a"}, {want: "b"}, {want: "c"}}, []int{2, 2}},
		{"sent again once only", [][]step{{ok("a"), {close: true}}, {{close: true}}, {ok("c")}},
			[]call{{want: "a"}, {want: "connection closed before the answer's head", err: true}, {want: "c"}}, []int{2, 1, 1}},
		{"a new connection closed with no answer: not sent again", [][]step{{{close: true}}, {ok("b")}},
			[]call{{want: "connection closed before the answer's head", err: true}, {want: "b"}}, []int{1, 1}},
		{"part of a head: not sent again", [][]step{{ok("a"), {answer: "HTTP/1.1 200 OK\r\nContent-Le", close: true}}, {ok("c")}},
			[]call{{want: "a"}, {want: "connection closed before the answer's head", err: true}, {want: "c"}}, []int{2, 1}},
		{"part of a body: not sent again", [][]step{{ok("a"), {answer: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab", close: true}}, {ok("c")}},
			[]call{{want: "a"}, {want: "connection closed after 2 of 5 body bytes", err: true}, {want: "c"}}, []int{2, 1}},
		{"a timeout on a kept connection: not sent again, not used again", [][]step{{ok("a"), {}}, {ok("c")}},
			[]call{{want: "a"}, {timeout: 0.3, want: "connection timed out before the answer's head", err: true}, {want: "c"}}, []int{2, 1}},
		{"bytes past the Content-Length", [][]step{{step{answer: "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\na" + ok("X").answer}}, {ok("b")}},
			[]call{{want: "more bytes than the Content-Length of 1", err: true}, {want: "b"}}, []int{1, 1}},
		// Bytes between two answers, which no correct server sends: the
		// connection is not used again.
		{"an answer no one asked for", [][]step{{ok("a")}, {ok("b")}},
			[]call{{want: "a"}, {push: ok("X").answer, want: "b"}}, []int{1, 1}},
		// Other code that opened the same persistent socket left its
		// answer unread: not taken for this call's.
		{"an answer to other code on the same socket", [][]step{{ok("WRONG")}, {ok("b")}},
			[]call{{op: "foreign", want: "b"}}, []int{1, 1}},
		// An interim answer is followed by the final one, late here: the
		// next call must not read it as its own.
		{"an interim answer with a Content-Length", [][]step{{{answer: "HTTP/1.1 100 Continue\r\nContent-Length: 0\r\n\r\n"}, ok("WRONG")}, {ok("b")}},
			[]call{{want: "status 100", err: true}, {want: "b"}}, []int{1, 1}},
		// Two lengths: which one frames the body is anyone's guess
		// (RFC 9112 §6.3), so the connection is not used again.
		{"two Content-Lengths", [][]step{{{answer: "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 3\r\n\r\na"}, {answer: "bc" + ok("WRONG").answer}}, {ok("b")}},
			[]call{{want: "two Content-Lengths", err: true}, {want: "b"}}, []int{1, 1}},
		// Framings no memcgate answer has, each read safely or refused.
		{"a header ending in Content-Length", [][]step{{head("200 OK", "a", "X-Content-Length: 99\r\n"), ok("b")}},
			[]call{{want: "a"}, {want: "b"}}, []int{2}},
		{"a signed Content-Length", [][]step{{{answer: "HTTP/1.1 200 OK\r\nContent-Length: +1\r\n\r\na"}}, {ok("b")}},
			[]call{{want: "bad Content-Length '+1'", err: true}, {want: "b"}}, []int{1, 1}},
		{"a 204 with no body", [][]step{{{answer: "HTTP/1.1 204 No Content\r\n\r\n"}}, {ok("b")}},
			[]call{{want: "status 204", err: true}, {want: "b"}}, []int{1, 1}},
		{"a refusal running to the close", [][]step{{{answer: "HTTP/1.1 431 Request Header Fields Too Large\r\nConnection: close\r\n\r\ntoo large", close: true}}, {ok("b")}},
			[]call{{want: "status 431: too large", err: true}, {want: "b"}}, []int{1, 1}},
		{"chunked", [][]step{{step{answer: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\n\r\n"}}, {ok("b")}},
			[]call{{want: "no Content-Length", err: true}, {want: "b"}}, []int{1, 1}},
		// The first call ends while its answer's body is owed and none of
		// it waits in the socket: only the mark tells the next call.
		{"abandoned after the head", [][]step{{{answer: "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", signal: true}}, {ok("b")}},
			[]call{{op: "abandon", timeout: 0.5}, {want: "b"}}, []int{1, 1}},
		// A real fatal error (the memory limit) while the body is read.
		{"a fatal error in the body", [][]step{{{answer: "HTTP/1.1 200 OK\r\nContent-Length: 67108864\r\n\r\n" + strings.Repeat("x", 8<<20)}}, {ok("b")}},
			[]call{{op: "fatal"}, {want: "b"}}, []int{1, 1}},
		{"abandoned in the body", [][]step{{{answer: "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", signal: true}}, {ok("b")}},
			[]call{{op: "abandon", timeout: 0.5}, {want: "b"}}, []int{1, 1}},
	}
	const wantReq = "GET /a%20b%2F%C3%BC HTTP/1.1\r\nHost: localhost\r\n\r\n"
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			p := startPHPSession(t, php)
			s := startScripted(t, c.conns, func() { p.cmd.Process.Signal(syscall.SIGUSR1) })
			addr := "tcp://" + s.ln.Addr().String()
			for i, cl := range c.calls {
				op, timeout := cl.op, cl.timeout
				if op == "" {
					op = "get"
				}
				if timeout == 0 {
					timeout = 5
				}
				if cl.push != "" {
					s.push(t, cl.push)
				}
				r := p.call(op, "a b/ü", addr, timeout)
				v, hit := r.value(t)
				switch {
				case op == "abandon" || op == "fatal":
					if !r.Abandoned {
						t.Errorf("call %d: %+v, want it abandoned", i, r)
					}
				case cl.miss:
					if !r.Miss {
						t.Errorf("call %d: %+v, want a miss", i, r)
					}
				case cl.err:
					if hit || !strings.Contains(r.Error, cl.want) {
						t.Errorf("call %d: %+v, want an exception with %q", i, r, cl.want)
					}
				case !hit || v != cl.want:
					t.Errorf("call %d: %+v, want the value %q", i, r, cl.want)
				}
			}
			if got := s.requests(); fmt.Sprint(got) != fmt.Sprint(c.reqs) {
				t.Errorf("requests per connection %v, want %v", got, c.reqs)
			}
			s.mu.Lock()
			if req := s.reqs[len(s.reqs)-1][0]; req != wantReq {
				t.Errorf("request %q, want %q", req, wantReq)
			}
			s.mu.Unlock()
		})
	}
}

// phpFPM returns the path of php-fpm (Debian names it php-fpm8.2 and so
// on), or ends t through gatewaytest.Missing.
func phpFPM(t *testing.T) string {
	t.Helper()
	m, _ := filepath.Glob("/usr/sbin/php-fpm*")
	if len(m) == 0 {
		gatewaytest.Missing(t, "php-fpm", "php-fpm", errors.New("no /usr/sbin/php-fpm*"))
	}
	return m[len(m)-1]
}

// fcgiGet asks the FastCGI server at sock for one page, with params, and
// returns the page's body (after its CGI headers) and what it wrote to
// stderr. A FastCGI client in the fewest lines: one request, no keep-conn.
func fcgiGet(t *testing.T, sock string, params map[string]string) (string, string) {
	t.Helper()
	c, err := net.DialTimeout("unix", sock, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(60 * time.Second))
	record := func(typ byte, content []byte) []byte {
		h := []byte{1, typ, 0, 1, byte(len(content) >> 8), byte(len(content)), 0, 0}
		return append(h, content...)
	}
	var p []byte
	for k, v := range params {
		for _, n := range []int{len(k), len(v)} {
			if n < 128 {
				p = append(p, byte(n))
			} else {
				p = be.BigEndian.AppendUint32(p, uint32(n)|1<<31)
			}
		}
		p = append(p, k+v...)
	}
	var req []byte
	req = append(req, record(1, []byte{0, 1, 0, 0, 0, 0, 0, 0})...) // BEGIN_REQUEST, responder
	req = append(req, record(4, p)...)                              // PARAMS
	req = append(req, record(4, nil)...)
	req = append(req, record(5, nil)...) // STDIN, empty
	if _, err := c.Write(req); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr []byte
	for {
		var h [8]byte
		if _, err := io.ReadFull(c, h[:]); err != nil {
			t.Fatalf("FastCGI answer: %v", err)
		}
		body := make([]byte, int(h[4])<<8|int(h[5])+int(h[6]))
		if _, err := io.ReadFull(c, body); err != nil {
			t.Fatalf("FastCGI answer: %v", err)
		}
		body = body[:int(h[4])<<8|int(h[5])]
		switch h[1] {
		case 6:
			stdout = append(stdout, body...)
		case 7:
			stderr = append(stderr, body...)
		case 3: // END_REQUEST
			_, page, _ := strings.Cut(string(stdout), "\r\n\r\n")
			return page, string(stderr)
		}
	}
}

// TestPHPPersistentFPM: pages that php-fpm serves from one worker share the
// connection memcgate_get_persistent keeps, over TCP and the Unix socket,
// and each page finds the mark the one before left on it.
func TestPHPPersistentFPM(t *testing.T) {
	t.Parallel()
	fpm := phpFPM(t)
	dir := t.TempDir()
	sock := filepath.Join(dir, "memcgate.sock")
	g := startOneNodeGateway(t, map[string]string{
		"MEMCGATE_LISTEN_SOCKET": sock,
	})
	for _, k := range []string{"a", "b"} {
		if r := g.do("PUT", "/"+k, []byte("value of "+k), "Connection", "close"); r.status != 201 {
			t.Fatalf("PUT: %d %s", r.status, r.body)
		}
	}
	lib, err := filepath.Abs("../php/memcgate_get.php")
	if err != nil {
		t.Fatal(err)
	}
	page := filepath.Join(dir, "page.php")
	if err := os.WriteFile(page, []byte(`<?php
require '`+lib+`';
// The kept socket's mark, as this page finds it: PHP's 8192 on a new
// connection, 8191 on one a page before this one read its answer from.
$s = stream_socket_client($_SERVER['ADDR'], $errno, $errstr, 5.0, STREAM_CLIENT_CONNECT | STREAM_CLIENT_PERSISTENT);
$mark = stream_set_chunk_size($s, 8192);
stream_set_chunk_size($s, $mark);
echo getmypid(), ' ', $mark, ' ', memcgate_get_persistent($_SERVER['KEY'], $_SERVER['ADDR'], 5.0);
`), 0o644); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "php-fpm.conf")
	fsock := filepath.Join(dir, "fpm.sock")
	if err := os.WriteFile(conf, []byte(`[global]
error_log = `+filepath.Join(dir, "fpm.log")+`
daemonize = no
[pages]
listen = `+fsock+`
pm = static
pm.max_children = 1
pm.max_requests = 0
`), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(fpm, "-R", "-y", conf, "-F") // -R: as root, if we are; one worker
	out := &gatewaytest.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(fsock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(filepath.Join(dir, "fpm.log"))
			t.Fatalf("php-fpm did not listen within 15s:\n%s\n%s", out.String(), b)
		}
	}
	for _, addr := range []string{"tcp://" + g.DataAddr, "unix://" + sock} {
		before := accepted(t, g)
		pids := map[string]bool{}
		var marks []string
		for i, k := range []string{"a", "b", "a"} {
			got, stderr := fcgiGet(t, fsock, map[string]string{
				"SCRIPT_FILENAME": page, "REQUEST_METHOD": "GET", "KEY": k, "ADDR": addr,
			})
			pid, rest, _ := strings.Cut(got, " ")
			mark, v, _ := strings.Cut(rest, " ")
			pids[pid] = true
			marks = append(marks, mark)
			if v != "value of "+k {
				t.Errorf("%s page %d: %q (stderr %q), want %q", addr, i, got, stderr, "value of "+k)
			}
		}
		if fmt.Sprint(marks) != "[8192 8191 8191]" {
			t.Errorf("%s: the pages found the kept socket's mark %v, want [8192 8191 8191]", addr, marks)
		}
		if len(pids) != 1 {
			t.Errorf("%s: pages served by workers %v, want one", addr, pids)
		}
		if n := accepted(t, g) - before; n != 1 {
			t.Errorf("%s: %v connections accepted for 3 pages of one php-fpm worker, want 1", addr, n)
		}
	}
}
