package h1

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// hookListener hands out TCP connections whose SetReadDeadline calls
// hook first, so that a test can stop a goroutine at a deadline change.
type hookListener struct {
	net.Listener
	hook    func(t time.Time)
	onClose func()
}

func (l hookListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &hookConn{TCPConn: c.(*net.TCPConn), hook: l.hook, onClose: l.onClose}, nil
}

type hookConn struct {
	*net.TCPConn
	hook    func(t time.Time)
	onClose func()
}

func (c *hookConn) Close() error {
	err := c.TCPConn.Close()
	if c.onClose != nil {
		c.onClose()
	}
	return err
}

func (c *hookConn) SetReadDeadline(t time.Time) error {
	c.hook(t)
	return c.TCPConn.SetReadDeadline(t)
}

// TestDetachKeepAlivesOffWhileFinishing: SetKeepAlivesEnabled(false)
// that comes while finish moves a detached response's connection on
// (after it checked keepAlives, before the connection is idle, when
// closeIdle skips it as active) still gets the connection closed, as it
// is when a worker resumes it; finish must not park it for good.
func TestDetachKeepAlivesOffWhileFinishing(t *testing.T) {
	var armed atomic.Bool
	reached, release := make(chan struct{}), make(chan struct{})
	hook := func(t time.Time) {
		if t.IsZero() && armed.CompareAndSwap(true, false) {
			close(reached)
			<-release
		}
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cc := w.(*response).c
		// A read deadline for detachDone to lift (readDL), as a
		// request read with ReadTimeout leaves.
		http.NewResponseController(w).SetReadDeadline(time.Now().Add(time.Minute))
		finish := w.(detacher).Detach()
		go func() {
			for cc.pending.Load() != 1 { // the handler has returned: finish moves the connection on
				time.Sleep(time.Millisecond)
			}
			io.WriteString(w, "late")
			armed.Store(true)
			finish()
		}()
	})
	ln := hookListener{Listener: listen(t, "tcp"), hook: hook}
	s, addr := startH1On(t, ln, h, nil)
	c, br := dial(t, addr)
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	select {
	case <-reached: // detachDone, past its keepAlives check, lifts the read deadline
	case <-time.After(5 * time.Second):
		t.Fatal("finish did not lift the read deadline")
	}
	s.SetKeepAlivesEnabled(false) // the connection is active: closeIdle leaves it
	close(release)
	r, err := readWireResponse(br, "GET")
	if err != nil || r.body != "late" || slices.Contains(r.headers, "Connection: close") {
		t.Fatalf("response = %v, %v", r, err)
	}
	c.SetReadDeadline(time.Now().Add(time.Second))
	waitClosed(t, br)
}

// TestDetachCloseWhileFinishing: a Close that closes a detached
// response's connection while finish moves it on (after finish looked at
// its state, before it made it idle) leaves nothing behind: finish must
// not park the closed connection where no one will ever finish it.
func TestDetachCloseWhileFinishing(t *testing.T) {
	var armed, closeArmed atomic.Bool
	reached, release := make(chan struct{}), make(chan struct{})
	var cc atomic.Pointer[conn]
	hook := func(t time.Time) {
		if t.IsZero() && armed.CompareAndSwap(true, false) {
			close(reached)
			<-release
		}
	}
	onClose := func() {
		if !closeArmed.CompareAndSwap(true, false) {
			return
		}
		close(release) // finish goes on now, before Close closes the poller
		for deadline := time.Now().Add(200 * time.Millisecond); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			if cc.Load().state.Load() == stateParked {
				return
			}
		}
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/later" {
			io.WriteString(w, "inline")
			return
		}
		c := w.(*response).c
		cc.Store(c)
		http.NewResponseController(w).SetReadDeadline(time.Now().Add(time.Minute))
		finish := w.(detacher).Detach()
		go func() {
			for c.pending.Load() != 1 {
				time.Sleep(time.Millisecond)
			}
			io.WriteString(w, "late")
			armed.Store(true)
			finish()
		}()
	})
	ln := hookListener{Listener: listen(t, "tcp"), hook: hook, onClose: onClose}
	s, addr := startH1On(t, ln, h, nil)
	c, br := dial(t, addr)
	roundTrip(t, c, br, "/first") // registered with the poller from here on
	if !eventually(func() bool { parked, _, _ := pollerCounts(t, s); return parked == 1 }) {
		t.Fatal("the connection was not parked after its first response")
	}
	io.WriteString(c, "GET /later HTTP/1.1\r\nHost: a\r\n\r\n")
	select {
	case <-reached:
	case <-time.After(5 * time.Second):
		t.Fatal("finish did not lift the read deadline")
	}
	closeArmed.Store(true)
	s.Close()
	var parked, registered, conns int
	if !eventually(func() bool {
		parked, registered, conns = pollerCounts(t, s)
		return conns == 0
	}) {
		t.Errorf("after Close: %d parked, %d registered, %d tracked; want none tracked", parked, registered, conns)
	}
}

// TestDetachThenPeerClose: a client that sends its requests, detached
// ones, and closes its side at once gets every response, and then the
// connection is closed with nothing left behind: on a new connection
// (finish registers it with the poller, which then sees the close) and
// on one parked before (the close comes while the request is served).
func TestDetachThenPeerClose(t *testing.T) {
	for _, fresh := range []bool{true, false} {
		for _, n := range []int{1, 2} {
			t.Run(fmt.Sprintf("fresh=%v/requests=%d", fresh, n), func(t *testing.T) {
				var detached atomic.Int32
				s, addr := startH1(t, detachMux(&detached, nil), nil)
				c, br := dial(t, addr)
				if !fresh {
					roundTrip(t, c, br, "/x")
					if !eventually(func() bool { parked, _, _ := pollerCounts(t, s); return parked == 1 }) {
						t.Fatal("the connection was not parked after its response")
					}
				}
				io.WriteString(c, strings.Repeat("GET /later/then HTTP/1.1\r\nHost: a\r\n\r\n", n))
				c.(*net.TCPConn).CloseWrite()
				for i := range n {
					if r, err := readWireResponse(br, "GET"); err != nil || r.body != "detached /later/then" {
						t.Fatalf("response %d: %v, %v", i, r, err)
					}
				}
				waitClosed(t, br)
				waitNoConns(t, s, "after the client closed")
			})
		}
	}
}

// TestParkedPeerCloseMany: idle connections that close at once, more
// than one batch of epoll events, are all ended by the poller without a
// worker, while the ones still open are served on.
func TestParkedPeerCloseMany(t *testing.T) {
	const n, open = 300, 3
	s, addr := startH1(t, testHandler(), nil)
	var conns []net.Conn
	var brs []*bufio.Reader
	for range n + open {
		c, br := dial(t, addr)
		roundTrip(t, c, br, "/small")
		conns, brs = append(conns, c), append(brs, br)
	}
	if !eventually(func() bool { parked, _, _ := pollerCounts(t, s); return parked == n+open }) {
		t.Fatal("the connections were not all parked")
	}
	before := takenCount(s)
	for i, c := range conns[:n] {
		if i%2 == 0 {
			c.(*net.TCPConn).SetLinger(0) // a reset
		}
		c.Close()
	}
	var parked, registered, tracked int
	if !eventually(func() bool {
		parked, registered, tracked = pollerCounts(t, s)
		return parked == open && registered == open && tracked == open
	}) {
		t.Fatalf("after %d clients closed: %d parked, %d registered, %d tracked; want %d each", n, parked, registered, tracked, open)
	}
	if got := takenCount(s) - before; got != 0 {
		t.Errorf("workers took closed connections %d times, want none", got)
	}
	for i, c := range conns[n:] {
		if r := roundTrip(t, c, brs[n+i], "/small"); r.status != "HTTP/1.1 200 OK" {
			t.Errorf("open connection %d: %v", i, r)
		}
	}
}

// TestUnixSocketPeerClose: the poller ends an idle Unix socket
// connection whose client closed, as a TCP one.
func TestUnixSocketPeerClose(t *testing.T) {
	var detached atomic.Int32
	s, addr := startH1On(t, listen(t, "unix"), detachMux(&detached, nil), nil)
	c, br := dialOn(t, "unix", addr)
	roundTrip(t, c, br, "/later/one")
	if !eventually(func() bool { parked, _, _ := pollerCounts(t, s); return parked == 1 }) {
		t.Fatal("the connection was not parked")
	}
	before := takenCount(s)
	c.Close()
	waitNoConns(t, s, "after the client closed")
	if got := takenCount(s) - before; got != 0 {
		t.Errorf("a worker took the closed connection %d times, want none", got)
	}
}

// TestDetachNextRequestAtOnce: clients that send their next request as
// soon as they have read a detached response, before finish can have
// parked the connection, are all served, on new and reused connections.
func TestDetachNextRequestAtOnce(t *testing.T) {
	var detached atomic.Int32
	s, addr := startH1(t, detachMux(&detached, nil), nil)
	const clients, requests = 8, 50
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < requests; {
				c, err := net.Dial("tcp", addr)
				if err != nil {
					errs <- err
					return
				}
				c.SetDeadline(time.Now().Add(5 * time.Second))
				br := bufio.NewReader(c)
				for k := 0; k < 1+i%4 && j < requests; k, j = k+1, j+1 {
					path := "/later/now"
					if j%2 == 0 {
						path = "/later/then"
					}
					io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: a\r\n\r\n")
					if r, err := readWireResponse(br, "GET"); err != nil || r.body != "detached "+path {
						errs <- fmt.Errorf("client %d request %d: %v, %v", i, j, r, err)
						c.Close()
						return
					}
				}
				c.Close()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	waitNoConns(t, s, "after every client closed")
}
