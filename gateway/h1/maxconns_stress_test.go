package h1

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// openConns is the count of connections MaxConns holds: accepted and not
// closed yet, handed-over ones included.
func (s *Server) openConns() int64 { return s.open.Load() }

// stressHandler answers / at once, /detach from a goroutine after the
// handler returned (detached where it can be), /panic by panicking, and
// /slow after a while; every request's body is read first.
func stressHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		switch r.URL.Path {
		case "/panic":
			panic("stress")
		case "/slow":
			time.Sleep(20 * time.Millisecond)
		case "/detach":
			d, ok := w.(detacher)
			if !ok {
				break
			}
			if finish := d.Detach(); finish != nil {
				go func() {
					time.Sleep(10 * time.Millisecond) // the client may be gone by then
					io.WriteString(w, "ok")
					finish()
				}()
				return
			}
		}
		io.WriteString(w, "ok")
	})
}

// stressConn runs one of many ways a client may use and leave a
// connection, chosen by kind, against addr. Errors are expected (evicted,
// refused, timed out): only the server's accounting is checked.
func stressConn(network, addr string, kind int, rnd *rand.Rand) {
	c, err := net.Dial(network, addr)
	if err != nil {
		return
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	br := bufio.NewReader(c)
	get := exchanger(c, br)
	reset := func() {
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetLinger(0) // Close sends RST
		}
	}
	switch kind {
	case 0: // keep-alive, then close
		for range 1 + rnd.IntN(3) {
			if !get("GET / HTTP/1.1\r\nHost: a\r\n\r\n") {
				return
			}
		}
	case 1: // keep-alive, then idle until evicted or the idle timeout
		get("GET / HTTP/1.1\r\nHost: a\r\n\r\n")
		c.SetReadDeadline(time.Now().Add(time.Duration(rnd.IntN(300)) * time.Millisecond))
		br.ReadByte()
	case 2: // a request, then a reset
		io.WriteString(c, "GET /slow HTTP/1.1\r\nHost: a\r\n\r\n")
		time.Sleep(time.Duration(rnd.IntN(30)) * time.Millisecond)
		reset()
	case 3: // part of a head, then a wait past the header timeout or a close
		io.WriteString(c, "GET / HTTP/1.1\r\nHo")
		time.Sleep(time.Duration(rnd.IntN(150)) * time.Millisecond)
		if rnd.IntN(2) == 0 {
			reset()
		}
	case 4: // silent
		time.Sleep(time.Duration(rnd.IntN(150)) * time.Millisecond)
	case 5: // a head over 4 KiB: handed over, kept alive by Fallback
		if get("GET / HTTP/1.1\r\nHost: a\r\nX-Pad: " + strings.Repeat("p", 5000) + "\r\n\r\n") {
			get("GET / HTTP/1.1\r\nHost: a\r\n\r\n")
		}
		if rnd.IntN(2) == 0 {
			reset()
		}
	case 6: // Expect: 100-continue: on the fast path, its body sent or never
		io.WriteString(c, "PUT / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
		if rnd.IntN(2) == 0 {
			io.WriteString(c, "hello")
			http.ReadResponse(br, nil)
		}
	case 7: // Connection: close
		get("GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
		br.ReadByte()
	case 8: // a detached response whose client may leave first
		io.WriteString(c, "GET /detach HTTP/1.1\r\nHost: a\r\n\r\n")
		if rnd.IntN(2) == 0 {
			reset()
			return
		}
		http.ReadResponse(br, nil)
		get("GET /detach HTTP/1.1\r\nHost: a\r\n\r\n")
	case 9: // a handler panics
		get("GET /panic HTTP/1.1\r\nHost: a\r\n\r\n")
	case 10: // part of a body, read ahead, then a close or a reset
		io.WriteString(c, "PUT / HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\nabc")
		time.Sleep(time.Duration(rnd.IntN(100)) * time.Millisecond)
		if rnd.IntN(2) == 0 {
			reset()
		}
	case 11: // refused with 400, lingering
		io.WriteString(c, "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n")
		for range rnd.IntN(5) {
			io.WriteString(c, "more")
			time.Sleep(10 * time.Millisecond)
		}
		br.ReadByte()
	case 12: // a malformed head, answered by Fallback
		io.WriteString(c, "GET / HTTP/1.1\nHost: a\n\n")
		br.ReadByte()
	case 13: // pipelined, then closed
		io.WriteString(c, strings.Repeat("GET /detach HTTP/1.1\r\nHost: a\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n", 3))
		time.Sleep(time.Duration(rnd.IntN(20)) * time.Millisecond)
	}
}

const stressKinds = 14

// stressConfig sets the stress tests' small cap and short timeouts, so
// that connections time out, linger and are evicted within the test.
func stressConfig(s *Server) {
	s.MaxConns = 8
	s.ReadHeaderTimeout = 50 * time.Millisecond
	s.ReadTimeout = 100 * time.Millisecond
	s.IdleTimeout = 100 * time.Millisecond
	s.BodyLimit = func(*http.Request) int64 { return 1 << 10 }
	s.Fallback.ReadTimeout = 100 * time.Millisecond
	s.Fallback.IdleTimeout = 100 * time.Millisecond
}

// TestMaxConnsAccounting drives many connections, of every kind
// stressConn knows, at a Server with a small MaxConns and short timeouts,
// so that many make room or are refused; once every client is gone, the
// count of open connections must be back to exactly 0, or the Server
// would in time refuse everything (or cap nothing). Keep-alives are
// turned off and on meanwhile, which closes the idle connections.
func TestMaxConnsAccounting(t *testing.T) {
	for _, network := range []string{"tcp", "unix"} {
		t.Run(network, func(t *testing.T) {
			h := stressHandler()
			s, addr := startH1On(t, listen(t, network), h, stressConfig)
			var wg sync.WaitGroup
			stop := make(chan struct{})
			toggled := make(chan struct{})
			go func() { // closeIdle while serving
				defer close(toggled)
				for {
					select {
					case <-stop:
						s.SetKeepAlivesEnabled(true)
						return
					case <-time.After(37 * time.Millisecond):
						s.SetKeepAlivesEnabled(false)
						time.Sleep(5 * time.Millisecond)
						s.SetKeepAlivesEnabled(true)
					}
				}
			}()
			for g := range 24 {
				wg.Go(func() {
					rnd := rand.New(rand.NewPCG(uint64(g), 1))
					for range 40 {
						stressConn(network, addr, rnd.IntN(stressKinds), rnd)
					}
				})
			}
			wg.Wait()
			close(stop)
			<-toggled
			waitOpen(t, s, 0)
			// The count still caps: MaxConns connections are served.
			for range s.MaxConns {
				c, resp := getOnce(t, network, addr)
				defer c.Close()
				if resp.StatusCode != 200 {
					t.Fatalf("after the load: %v", resp)
				}
			}
		})
	}
}

// waitOpen waits until s counts want open connections.
func waitOpen(t *testing.T, s *Server, want int64) {
	t.Helper()
	var n int64
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if n = s.openConns(); n == want {
			return
		}
	}
	t.Fatalf("open = %d, want %d (%s)", n, want, fmt.Sprintf("%+v", s.ConnStats()))
}

// TestMaxConnsAccountingClose is TestMaxConnsAccounting with the Server
// closed while the connections come and go: each one still ends
// uncounted, whoever ends it.
func TestMaxConnsAccountingClose(t *testing.T) {
	for _, shutdown := range []bool{false, true} {
		t.Run(fmt.Sprintf("shutdown=%v", shutdown), func(t *testing.T) {
			s, addr := startH1(t, stressHandler(), stressConfig)
			var wg sync.WaitGroup
			for g := range 24 {
				wg.Go(func() {
					rnd := rand.New(rand.NewPCG(uint64(g), 2))
					for range 20 {
						stressConn("tcp", addr, rnd.IntN(stressKinds), rnd)
					}
				})
			}
			time.Sleep(100 * time.Millisecond)
			if shutdown {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				s.Shutdown(ctx)
			} else {
				s.Close()
			}
			wg.Wait()
			waitOpen(t, s, 0)
		})
	}
}

// exchanger returns a function that sends a request on c and reads its
// answer from br (c's reader) to its end, reporting whether the
// connection stays open for another: false once a write or read failed
// or the answer said Connection: close.
func exchanger(c net.Conn, br *bufio.Reader) func(req string) bool {
	return func(req string) bool {
		if _, err := io.WriteString(c, req); err != nil {
			return false
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return false
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return !resp.Close
	}
}
