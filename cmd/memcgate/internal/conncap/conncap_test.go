package conncap

import (
	"bufio"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/gatewaytest"
)

// TestConnCap checks the cap on the listeners net/http serves alone: a
// connection over it closes, to make room, the quiet or idle one due to
// be closed first (counted), never one whose request is being served;
// with no other, the new one is closed at once, counted and logged; a
// connection closing frees its place, and a reload can lift the cap.
func TestConnCap(t *testing.T) {
	var logged gatewaytest.SyncBuffer
	release := make(chan struct{})
	var states connStates
	// A quiet connection is due a minute after its accept, an idle one
	// an hour after its last answer: quiet ones go first here.
	c := New(0, time.Minute, time.Hour, "MEMCGATE_MAX_CLIENT_CONNS", slog.New(slog.NewTextHandler(&logged, nil)))
	c.SetMax(2)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/block" {
			<-release
		}
	}))
	srv.Listener = c.Listener(srv.Listener)
	srv.Config.ConnState = func(nc net.Conn, s http.ConnState) {
		c.State(nc, s)
		states.hook(nc, s)
	}
	srv.Start()
	defer srv.Close()
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	defer unblock()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	get := func(c net.Conn) error {
		c.SetDeadline(time.Now().Add(5 * time.Second))
		c.Write([]byte("GET / HTTP/1.1\r\nHost: a\r\n\r\n"))
		_, err := http.ReadResponse(bufio.NewReader(c), nil)
		return err
	}
	// closedByServer waits for the server to close c (EOF or a reset),
	// failing if c stays open.
	closedByServer := func(what string, c net.Conn) {
		t.Helper()
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		var ne net.Error
		if _, err := c.Read(make([]byte, 1)); errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("the %s connection was not closed to make room", what)
		}
	}
	// waitState waits until n connections are in state.
	waitState := func(state http.ConnState, n int64) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); states.count(state) != n; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d connections %v, want %d", states.count(state), state, n)
			}
		}
	}

	idle, quiet := dial(), dial()
	if err := get(idle); err != nil {
		t.Fatal(err)
	}
	// net/http marks a connection idle after its answer is written: wait
	// for it, and for the quiet one's accept.
	waitState(http.StateIdle, 1)
	waitState(http.StateNew, 1)
	third := dial()
	if err := get(third); err != nil {
		t.Fatalf("a third connection was not served: the quiet one should have made room: %v", err)
	}
	closedByServer("quiet", quiet)
	waitState(http.StateIdle, 2) // third idle before idle is again
	if err := get(idle); err != nil {
		t.Fatalf("the idle connection was closed rather than the quiet one: %v", err)
	}
	// Now two idle ones, third idle the longest: it makes room.
	waitState(http.StateIdle, 2)
	fourth := dial()
	if err := get(fourth); err != nil {
		t.Fatal(err)
	}
	closedByServer("longest idle", third)
	if err := get(idle); err != nil {
		t.Fatalf("the connection idle the shortest was closed: %v", err)
	}
	idle.Close()
	fourth.Close()
	waitState(http.StateIdle, 0)
	if n := c.Reclaimed(); n != 2 {
		t.Fatalf("reclaimed = %d, want 2", n)
	}

	// Two requests being served hold their connections: a third is closed.
	c.SetMax(0)
	for range 2 {
		dial().Write([]byte("GET /block HTTP/1.1\r\nHost: a\r\n\r\n"))
	}
	waitState(http.StateActive, 2)
	waitState(http.StateIdle, 0)
	c.SetMax(2)
	if err := get(dial()); err == nil {
		t.Fatal("a connection was served with the cap taken by requests being served")
	}
	if n := c.Refused(); n < 1 {
		t.Fatalf("refused = %d, want at least 1", n)
	}
	if l := logged.String(); !strings.Contains(l, "level=WARN") || !strings.Contains(l, "refused_so_far=1") || !strings.Contains(l, "at MEMCGATE_MAX_CLIENT_CONNS,") {
		t.Errorf("the refusal was not logged as a warning with its count: %q", l)
	}
	unblock()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if get(dial()) == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no connection served once the requests ended")
		}
	}
	c.SetMax(0)
	for range 3 {
		if err := get(dial()); err != nil {
			t.Fatalf("with the cap lifted: %v", err)
		}
	}
}

// connStates counts the connections of a server in each http.ConnState,
// from its ConnState hook.
type connStates struct {
	mu sync.Mutex // guards of
	of map[net.Conn]http.ConnState
}

func (s *connStates) hook(c net.Conn, st http.ConnState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.of == nil {
		s.of = map[net.Conn]http.ConnState{}
	}
	if st == http.StateClosed || st == http.StateHijacked {
		delete(s.of, c)
		return
	}
	s.of[c] = st
}

// count returns the number of connections in st.
func (s *connStates) count(st http.ConnState) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := int64(0)
	for _, v := range s.of {
		if v == st {
			n++
		}
	}
	return n
}
