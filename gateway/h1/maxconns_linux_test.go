package h1

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestMaxConns fills a Server with MaxConns = 2 connections in different
// states, then connects once more: the connection due to be closed first
// makes room (the one idle the longest, a silent one before an idle one
// due later); a connection whose
// body is being read or that was handed to Fallback does not, and the
// new connection is then answered 503 with Retry-After and closed; once
// one of them closes, a new one is served.
func TestMaxConns(t *testing.T) {
	s, addr := startH1(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, "ok")
	}), func(s *Server) {
		s.MaxConns = 2
		s.ReadHeaderTimeout, s.IdleTimeout = 10*time.Second, time.Minute
	})
	dial := func(t *testing.T) net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	get := func(t *testing.T, c net.Conn, head string) *http.Response {
		t.Helper()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: a\r\n"+head+"\r\n"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("no response: %v", err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		resp.Body = io.NopCloser(strings.NewReader(string(body)))
		return resp
	}
	wantOK := func(t *testing.T, resp *http.Response) {
		t.Helper()
		if body, _ := io.ReadAll(resp.Body); resp.StatusCode != 200 || string(body) != "ok" {
			t.Fatalf("got %s %q, want 200 ok", resp.Status, body)
		}
	}
	wantRefused := func(t *testing.T) {
		t.Helper()
		c := dial(t)
		resp := get(t, c, "")
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" ||
			!resp.Close || string(body) != "too many client connections; retry shortly\n" {
			t.Fatalf("over the cap: %s %v %q, want 503 with Retry-After, closed", resp.Status, resp.Header, body)
		}
		if n, err := c.Read(make([]byte, 1)); err != io.EOF {
			t.Fatalf("after the 503: read %d, %v; want EOF", n, err)
		}
	}
	waitStats := func(t *testing.T, ok func(ConnStats) bool) ConnStats {
		t.Helper()
		var st ConnStats
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if st = s.ConnStats(); ok(st) {
				return st
			}
		}
		t.Fatalf("ConnStats() = %+v", st)
		return st
	}

	t.Run("idle ones make room, oldest first", func(t *testing.T) {
		a, b := dial(t), dial(t)
		wantOK(t, get(t, a, ""))
		// a parks after its client has read the answer: it is the older
		// only once it has.
		parked := func(n int) func(ConnStats) bool {
			return func(ConnStats) bool {
				return inPoller(s, func(p *poller) (k int) {
					for c := p.oldest; c != nil; c = c.pf.newer {
						k++
					}
					return k
				}) == n
			}
		}
		waitStats(t, parked(1))
		wantOK(t, get(t, b, ""))
		waitStats(t, parked(2))
		wantOK(t, get(t, dial(t), ""))
		if n, err := a.Read(make([]byte, 1)); err != io.EOF {
			t.Fatalf("the oldest idle connection: read %d, %v; want EOF", n, err)
		}
		wantOK(t, get(t, b, "")) // b was idle for less time: kept
		if st := s.ConnStats(); st.Reclaimed != 1 || st.Refused != 0 {
			t.Fatalf("ConnStats() = %+v, want 1 reclaimed, 0 refused", st)
		}
		b.Close()
	})

	gone := func(t *testing.T) {
		t.Helper() // the last test's connections
		waitStats(t, func(st ConnStats) bool { return st.Idle+st.Reading+st.Active == 0 })
	}
	t.Run("then silent ones", func(t *testing.T) {
		gone(t)
		silent := dial(t)
		time.Sleep(20 * time.Millisecond) // the older
		slow := dial(t)
		io.WriteString(slow, "GET / HTTP/1.1\r\n") // part of a head
		waitStats(t, func(st ConnStats) bool { return st.Reading == 2 })
		wantOK(t, get(t, dial(t), ""))
		if n, err := silent.Read(make([]byte, 1)); err != io.EOF {
			t.Fatalf("the silent connection: read %d, %v; want EOF", n, err)
		}
		// The slow one is served once the rest of its head comes.
		io.WriteString(slow, "Host: a\r\n\r\n")
		slow.SetDeadline(time.Now().Add(5 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(slow), nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("the slow connection: %v %v", resp, err)
		}
		slow.Close()
	})

	t.Run("silent ones before idle ones due later", func(t *testing.T) {
		gone(t)
		a := dial(t)
		wantOK(t, get(t, a, "")) // idle from now: due at the idle timeout
		silent := dial(t)        // due at the header timeout, sooner
		silent.SetDeadline(time.Now().Add(10 * time.Second))
		waitStats(t, func(st ConnStats) bool { return st.Reading == 1 && st.Idle == 1 })
		wantOK(t, get(t, dial(t), ""))
		if n, err := silent.Read(make([]byte, 1)); err != io.EOF {
			t.Fatalf("the silent connection: read %d, %v; want EOF", n, err)
		}
		wantOK(t, get(t, a, "")) // the keep-alive client lost nothing
		a.Close()
	})

	t.Run("busy ones do not", func(t *testing.T) {
		gone(t)
		a := dial(t)
		io.WriteString(a, "PUT / HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nab") // part of a body
		// A head over 4 KiB goes to Fallback, which keeps the connection
		// alive after its response.
		handed := dial(t)
		wantOK(t, get(t, handed, "X-Pad: "+strings.Repeat("p", 5000)+"\r\n"))
		waitStats(t, func(st ConnStats) bool { return st.Active == 1 })
		wantRefused(t)
		if st := s.ConnStats(); st.Refused != 1 {
			t.Fatalf("ConnStats() = %+v, want 1 refused", st)
		}
		// Fallback's connection closing makes room.
		handed.Close()
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			c := dial(t)
			resp := get(t, c, "")
			if resp.StatusCode == 200 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("still %s after Fallback's connection closed", resp.Status)
			}
		}
	})
}

// TestMaxConnsBodyFirst: a body being read ahead whose read timeout
// comes before the header timeout of a silent connection does not keep
// the silent one from making room: evict looks past it.
func TestMaxConnsBodyFirst(t *testing.T) {
	s, addr := startH1(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, "ok")
	}), func(s *Server) {
		s.MaxConns = 3
		s.ReadTimeout = 5 * time.Second // a body's deadline, from its head
		s.ReadHeaderTimeout = 10 * time.Second
		s.BodyLimit = func(*http.Request) int64 { return 1 << 10 }
	})
	dial := func() net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	for range 2 { // bodies first, nearest their deadlines
		io.WriteString(dial(), "PUT / HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nab")
	}
	if !eventually(func() bool { return readingCount(s) == 2 }) {
		t.Fatal("the bodies are not parked")
	}
	silent := dial()
	if !eventually(func() bool { return readingCount(s) == 3 }) {
		t.Fatal("the silent connection is not parked")
	}
	c := dial()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("over the cap with a silent connection to close: %v %v, want 200 (%+v)", resp, err, s.ConnStats())
	}
	silent.SetDeadline(time.Now().Add(5 * time.Second))
	if n, err := silent.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("the silent connection: read %d, %v; want EOF", n, err)
	}
}

// TestEvictable checks which connection of the reading heap evict takes:
// the one nearest its deadline whose body is not being read, wherever it
// is in the heap; none when every one reads a body.
func TestEvictable(t *testing.T) {
	now := time.Now()
	type parked struct {
		name  string
		due   time.Duration // from now; 0: no deadline
		phase uint8
	}
	tests := []struct {
		name   string
		parked []parked
		want   string // "": none
	}{
		{"empty", nil, ""},
		{"a head first", []parked{{"head", 1, phaseHead}, {"body", 2, phaseBody}}, "head"},
		{"bodies first", []parked{{"b1", 1, phaseBody}, {"b2", 2, phaseBody}, {"new", 3, phaseIdle}, {"head", 4, phaseHead}}, "new"},
		{"the nearest of several", []parked{{"b1", 1, phaseBody}, {"h9", 9, phaseHead}, {"b2", 2, phaseBody}, {"l5", 5, phaseLinger}, {"h7", 7, phaseHead}}, "l5"},
		{"no deadline last", []parked{{"b1", 1, phaseBody}, {"none", 0, phaseHead}, {"h3", 3, phaseHead}}, "h3"},
		{"only bodies", []parked{{"b1", 1, phaseBody}, {"b2", 2, phaseBody}}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := &poller{}
			names := map[*conn]string{}
			for _, pc := range tt.parked {
				c := &conn{phase: pc.phase}
				c.state.Store(stateReading)
				if pc.due > 0 {
					c.pf.deadline = now.Add(pc.due * time.Second)
				}
				names[c] = pc.name
				p.heapPushLocked(c)
			}
			if got := names[p.evictableLocked()]; got != tt.want {
				t.Errorf("evictableLocked() = %q, want %q", got, tt.want)
			}
		})
	}
}

// TestMaxConnsAnswer: the 503 over MaxConns says what TooManyConns says,
// so that a client refused can tell its operator which setting to raise.
func TestMaxConnsAnswer(t *testing.T) {
	const body = "too many client connections (MEMCGATE_MAX_CLIENT_CONNS); retry shortly"
	_, addr := startH1(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
	}), func(s *Server) {
		s.MaxConns, s.TooManyConns = 1, body
		s.ReadHeaderTimeout, s.IdleTimeout = 10*time.Second, time.Minute
	})
	held, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	// A body on its way: never closed for room.
	if _, err := io.WriteString(held, "PUT / HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nabc"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("over the cap: %v", err)
	}
	got, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusServiceUnavailable || string(got) != body+"\n" {
		t.Errorf("over the cap: %s %q, want 503 %q", resp.Status, got, body+"\n")
	}
}
