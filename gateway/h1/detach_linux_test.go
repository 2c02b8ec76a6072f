package h1

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/memcgate/memcgate/gateway/budget"
	"github.com/memcgate/memcgate/test/slowreader"
)

// detachMux detaches /later/* and answers from a goroutine after the
// handler returned (/later/then), before it returns (/later/now), or with
// a large body (/later/big); /body/* reads the request body first. Every
// other path is answered in place. detached counts successful Detaches.
func detachMux(detached *atomic.Int32, bigBody []byte) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/body/") {
			io.Copy(io.Discard, r.Body)
		}
		if !strings.HasPrefix(r.URL.Path, "/later/") && !strings.HasPrefix(r.URL.Path, "/body/") {
			io.WriteString(w, "inline "+r.URL.Path)
			return
		}
		finish := w.(detacher).Detach()
		if finish == nil {
			io.WriteString(w, "not detached")
			return
		}
		detached.Add(1)
		respond := func() {
			if r.URL.Path == "/later/big" {
				w.Header().Set("Content-Length", strconv.Itoa(len(bigBody)))
				w.Write(bigBody)
			} else {
				w.Header().Set("X-Path", r.URL.Path)
				io.WriteString(w, "detached "+r.URL.Path)
			}
			finish()
		}
		if r.URL.Path == "/later/now" {
			respond()
			return
		}
		go func() {
			time.Sleep(5 * time.Millisecond) // most likely after the handler returned
			respond()
		}()
	})
}

// TestDetach: detached responses are written whole, in order with the
// connection's other responses, pipelined requests included; the
// connection then serves its next request.
func TestDetach(t *testing.T) {
	var detached atomic.Int32
	_, addr := startH1(t, detachMux(&detached, nil), nil)
	raw := "GET /later/then HTTP/1.1\r\nHost: a\r\n\r\n" +
		"GET /later/now HTTP/1.1\r\nHost: a\r\n\r\n" +
		"GET /x HTTP/1.1\r\nHost: a\r\n\r\n" +
		"PUT /body/1 HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello" +
		"PUT /later/unread HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello"
	resps, closed := exchange(t, addr, raw, []string{"GET", "GET", "GET", "PUT", "PUT"}, false)
	want := []string{"detached /later/then", "detached /later/now", "inline /x", "detached /body/1", "not detached"}
	if len(resps) != len(want) || closed {
		t.Fatalf("got %d responses (closed %v): %v; want %d and the connection open", len(resps), closed, resps, len(want))
	}
	for i, r := range resps {
		if r.status != "HTTP/1.1 200 OK" || r.body != want[i] {
			t.Errorf("response %d = %v, want 200 with %q", i, r, want[i])
		}
	}
	if !slices.Contains(resps[0].headers, "X-Path: /later/then") {
		t.Errorf("detached response's headers = %q, want X-Path set after Detach", resps[0].headers)
	}
	if got := detached.Load(); got != 3 {
		t.Errorf("%d Detaches succeeded, want 3 (none with the body unread)", got)
	}
}

// TestDetachSlowClient: finish does not wait for a client that does not
// read; the response reaches it whole once it reads, and the connection
// serves on.
func TestDetachSlowClient(t *testing.T) {
	var detached atomic.Int32
	big := bytes.Repeat([]byte("0123456789abcdef"), 4<<20/16) // far more than socket buffers hold
	finished := make(chan time.Duration, 1)
	inner := detachMux(&detached, big)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/later/big" {
			inner.ServeHTTP(w, r)
			return
		}
		finish := w.(detacher).Detach()
		go func() {
			w.Header().Set("Content-Length", strconv.Itoa(len(big)))
			w.Write(big)
			start := time.Now()
			finish()
			finished <- time.Since(start)
		}()
	})
	_, addr := startH1(t, h, nil)
	c, br := dial(t, addr)
	io.WriteString(c, "GET /later/big HTTP/1.1\r\nHost: a\r\n\r\n")
	// The client reads nothing until finish has returned: a finish that
	// waited for it would never return. (The server has no write timeout
	// to end such a wait.)
	select {
	case d := <-finished:
		t.Logf("finish took %v with a client not reading", d)
	case <-time.After(10 * time.Second):
		t.Fatal("finish blocked on a client that does not read")
	}
	r, err := readWireResponse(br, "GET")
	if err != nil || r.status != "HTTP/1.1 200 OK" || r.body != string(big) {
		t.Fatalf("large detached response: %s, %d bytes, %v; want 200 with %d bytes", r.status, len(r.body), err, len(big))
	}
	if r := roundTrip(t, c, br, "/next"); r.body != "inline /next" {
		t.Errorf("next request after a spilled response = %v", r)
	}
}

// TestDetachBlock: after Block, a detached response written on a
// goroutine of its own waits for a client that does not read, instead
// of copying what the socket does not take (which the budget would
// hold); the response still arrives whole, and the connection serves
// on.
func TestDetachBlock(t *testing.T) {
	big := bytes.Repeat([]byte("0123456789abcdef"), 16<<20/16) // far more than socket buffers hold
	wrote := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/big" {
			io.WriteString(w, "inline "+r.URL.Path)
			return
		}
		finish := w.(detacher).Detach()
		go func() {
			w.(interface{ Block() }).Block()
			w.Header().Set("Content-Length", strconv.Itoa(len(big)))
			for b := big; len(b) > 0; b = b[64<<10:] {
				w.Write(b[:64<<10])
			}
			close(wrote)
			finish()
		}()
	})
	bg := budget.New(0)
	_, addr := startH1(t, h, func(s *Server) { s.Budget = bg })
	c := slowreader.Dial(t, addr, 32<<10)
	c.SetDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(c)
	io.WriteString(c, "GET /big HTTP/1.1\r\nHost: a\r\n\r\n")
	select {
	case <-wrote:
		t.Fatal("the response was all written while the client read nothing: it was not blocking")
	case <-time.After(200 * time.Millisecond):
	}
	if used := bg.Used(); used != 0 {
		t.Errorf("budget holds %d bytes of the response, want none", used)
	}
	r, err := readWireResponse(br, "GET")
	if err != nil || r.status != "HTTP/1.1 200 OK" || r.body != string(big) {
		t.Fatalf("blocking detached response: %s, %d bytes, %v; want 200 with %d bytes", r.status, len(r.body), err, len(big))
	}
	if r := roundTrip(t, c, br, "/next"); r.body != "inline /next" {
		t.Errorf("next request after a blocking detached response = %v", r)
	}
}

// TestDetachWaitIfRefused: a detached response written on a goroutine
// of its own copies what a client that does not read leaves unsent while
// the budget holds it; past that, with WaitIfRefused, it waits for the
// client and arrives whole, the budget given back and the connection
// serving on; without, it is cut short after its head and the
// connection closed.
func TestDetachWaitIfRefused(t *testing.T) {
	big := bytes.Repeat([]byte("0123456789abcdef"), 8<<20/16) // far more than socket buffers and the budget hold
	for _, wait := range []bool{true, false} {
		t.Run("wait="+strconv.FormatBool(wait), func(t *testing.T) {
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != "/big" {
					io.WriteString(w, "inline "+r.URL.Path)
					return
				}
				finish := w.(detacher).Detach()
				go func() {
					if wait {
						w.(interface{ WaitIfRefused() }).WaitIfRefused()
					}
					w.Header().Set("Content-Length", strconv.Itoa(len(big)))
					for b := big; len(b) > 0; b = b[64<<10:] {
						w.Write(b[:64<<10])
					}
					finish()
				}()
			})
			bg := &refusingBudget{Budget: budget.New(1 << 20), refused: make(chan struct{})}
			_, addr := startH1(t, h, func(s *Server) { s.Budget = bg })
			c := slowreader.Dial(t, addr, 32<<10)
			c.SetDeadline(time.Now().Add(5 * time.Second))
			br := bufio.NewReader(c)
			io.WriteString(c, "GET /big HTTP/1.1\r\nHost: a\r\n\r\n")
			select { // the client reads nothing until the budget refuses the spill
			case <-bg.refused:
			case <-time.After(5 * time.Second):
				t.Fatal("the budget refused no spill within 5s: the test proves nothing")
			}
			r, err := readWireResponse(br, "GET")
			if !wait {
				if err == nil && r.body == string(big) {
					t.Fatalf("response written whole past the budget without WaitIfRefused")
				}
				return
			}
			if err != nil || r.status != "HTTP/1.1 200 OK" || r.body != string(big) {
				t.Fatalf("detached response past the budget: %s, %d bytes, %v; want 200 with %d bytes", r.status, len(r.body), err, len(big))
			}
			if r := roundTrip(t, c, br, "/next"); r.body != "inline /next" {
				t.Errorf("next request after the response = %v", r)
			}
			if used := bg.Used(); used != 0 {
				t.Errorf("budget holds %d bytes after the response, want none", used)
			}
		})
	}
}

// refusingBudget is a budget that closes refused when it first refuses
// to hold bytes.
type refusingBudget struct {
	*budget.Budget
	once    sync.Once
	refused chan struct{}
}

func (b *refusingBudget) Acquire(n int64) error {
	err := b.Budget.Acquire(n)
	if err != nil {
		b.once.Do(func() { close(b.refused) })
	}
	return err
}

// TestDetachShutdown: Shutdown waits for a detached response, which is
// sent with Connection: close.
func TestDetachShutdown(t *testing.T) {
	release, detached := make(chan struct{}), make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		finish := w.(detacher).Detach()
		close(detached)
		go func() {
			<-release
			io.WriteString(w, "late")
			finish()
		}()
	})
	s, addr := startH1(t, h, nil)
	c, br := dial(t, addr)
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	<-detached
	done := make(chan error, 1)
	go func() { done <- s.Shutdown(t.Context()) }()
	// Shutdown returning is what must not happen: the wait gives it the
	// chance to.
	select {
	case err := <-done:
		t.Fatalf("Shutdown returned %v with a detached response pending", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	r, err := readWireResponse(br, "GET")
	if err != nil || r.body != "late" || !slices.Contains(r.headers, "Connection: close") {
		t.Errorf("detached response during Shutdown = %v, %v; want it whole with Connection: close", r, err)
	}
	waitClosed(t, br)
	if err := <-done; err != nil {
		t.Errorf("Shutdown() = %v", err)
	}
}

// TestDetachThenPipelined: a request pipelined behind a detached response
// is served with its connection active, as behind an ordinary one, so
// that closeIdle (SetKeepAlivesEnabled(false), Shutdown) does not take it
// for idle and close it mid-request. (Found in review: the requeued
// connection kept stateIdle while it served the buffered request.)
func TestDetachThenPipelined(t *testing.T) {
	for _, detach := range []bool{false, true} {
		name := "inline"
		if detach {
			name = "detached"
		}
		t.Run(name, func(t *testing.T) {
			started := make(chan *conn, 1)
			release := make(chan struct{})
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				switch r.URL.Path {
				case "/first":
					if detach {
						finish := w.(detacher).Detach()
						go func() {
							time.Sleep(10 * time.Millisecond)
							io.WriteString(w, "first")
							finish()
						}()
						return
					}
					io.WriteString(w, "first")
				case "/slow":
					started <- w.(*response).c
					<-release
					io.WriteString(w, "slow")
				}
			})
			s, addr := startH1(t, h, nil)
			c, br := dial(t, addr)
			io.WriteString(c, "GET /first HTTP/1.1\r\nHost: a\r\n\r\nGET /slow HTTP/1.1\r\nHost: a\r\n\r\n")
			cc := <-started
			if st := cc.state.Load(); st != stateActive {
				t.Errorf("state while serving the pipelined request = %d, want stateActive (%d)", st, stateActive)
			}
			s.SetKeepAlivesEnabled(false) // what main does when draining starts
			close(release)
			r1, err := readWireResponse(br, "GET")
			if err != nil || r1.body != "first" {
				t.Fatalf("first response = %v, %v", r1, err)
			}
			r2, err := readWireResponse(br, "GET")
			if err != nil || r2.body != "slow" || !slices.Contains(r2.headers, "Connection: close") {
				t.Errorf("pipelined response after SetKeepAlivesEnabled(false) = %+v, %v; want it whole with Connection: close", r2, err)
			}
		})
	}
}

// TestDetachKeepsNoStaleDeadline: a busy keep-alive client, whose next
// request is there when its connection is queued again after a detached
// response, is served past ReadHeaderTimeout. (It was not: the deadline
// armed for the connection's first request was cleared only on parking,
// which such a connection skips, so it fired mid-stream and closed the
// connection. wrk saw it as read errors at 2048 clients.)
func TestDetachKeepsNoStaleDeadline(t *testing.T) {
	var detached atomic.Int32
	_, addr := startH1(t, detachMux(&detached, nil), func(s *Server) { s.ReadHeaderTimeout = 100 * time.Millisecond })
	c, br := dial(t, addr)
	const req = "GET /later/then HTTP/1.1\r\nHost: a\r\n\r\n"
	io.WriteString(c, req) // one request always waits behind the one served
	start := time.Now()
	for i := 0; time.Since(start) < 400*time.Millisecond; i++ {
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatal(err)
		}
		if r, err := readWireResponse(br, "GET"); err != nil || r.body != "detached /later/then" {
			t.Fatalf("request %d, %v after the first: %v, %v; want it answered", i, time.Since(start).Round(time.Millisecond), r, err)
		}
	}
}

// TestWriteTimeout: a response the client does not read is cut at
// WriteTimeout, counted from when its request was read, whether the
// handler writes it in place or detaches it, on the first request of a
// connection and on a later one; the deadline is set on the connection
// only once a write has to wait.
func TestWriteTimeout(t *testing.T) {
	const timeout = 200 * time.Millisecond
	big := bytes.Repeat([]byte("0123456789abcdef"), 8<<20/16) // far more than socket buffers hold
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/small" {
			io.WriteString(w, "small")
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(big)))
		if r.URL.Path == "/detached" {
			finish := w.(detacher).Detach()
			go func() {
				w.Write(big)
				finish()
			}()
			return
		}
		w.Write(big)
	})
	tests := []struct {
		name  string
		path  string
		small bool // a small request on the connection first
	}{
		{"in place", "/inline", false},
		{"detached", "/detached", false},
		{"in place after a request", "/inline", true},
		{"detached after a request", "/detached", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, addr := startH1(t, h, func(s *Server) { s.WriteTimeout = timeout })
			c, br := dial(t, addr)
			if tt.small {
				if r := roundTrip(t, c, br, "/small"); r.body != "small" {
					t.Fatalf("first request: %v", r)
				}
			}
			io.WriteString(c, "GET "+tt.path+" HTTP/1.1\r\nHost: a\r\n\r\n")
			time.Sleep(3 * timeout) // the client does not read meanwhile
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			n, err := io.Copy(io.Discard, br)
			if nerr, ok := err.(net.Error); ok && nerr.Timeout() {
				t.Fatalf("read %d bytes, then the connection stayed open: %v", n, err)
			}
			if n >= int64(len(big)) {
				t.Errorf("read %d bytes, the whole response; want it cut at the write timeout", n)
			}
		})
	}
}

// TestDetachParks: after a detached response on a keep-alive connection
// whose client sent nothing more, finish parks the connection itself: a
// worker is woken only for a request, not to find that none came.
func TestDetachParks(t *testing.T) {
	var detached atomic.Int32
	s, addr := startH1(t, detachMux(&detached, nil), nil)
	c, br := dial(t, addr)
	const n = 20
	roundTrip(t, c, br, "/later/then") // the poller exists once a connection was served
	before := takenCount(s)
	for i := range n {
		if r := roundTrip(t, c, br, "/later/then"); r.body != "detached /later/then" {
			t.Fatalf("request %d: %v", i, r)
		}
		if !eventually(func() bool { parked, _, _ := pollerCounts(t, s); return parked == 1 }) {
			t.Fatalf("request %d: the connection was not parked after its response", i)
		}
	}
	// One take per request; a requeue after each response would double it.
	if got := takenCount(s) - before; got > n+1 {
		t.Errorf("workers took the connection %d times for %d requests, want at most %d", got, n, n+1)
	}
}
