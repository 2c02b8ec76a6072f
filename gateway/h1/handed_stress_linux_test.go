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

	"github.com/memcgate/memcgate/gateway/budget"
	"github.com/memcgate/memcgate/gateway/connlist"
)

// handedStressHandler reads the body, then answers / at once, /panic by
// panicking, /big with 1 MB, /hijack by hijacking the connection and
// answering on it (closing it at once, or once its client closes), and
// /wait after a while.
func handedStressHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		switch r.URL.Path {
		case "/panic":
			panic("stress")
		case "/big":
			w.Write(make([]byte, 1<<20))
			return
		case "/wait":
			time.Sleep(50 * time.Millisecond)
		case "/hijack":
			hj, ok := w.(http.Hijacker)
			if !ok {
				break
			}
			c, brw, err := hj.Hijack()
			if err != nil {
				return
			}
			defer c.Close()
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
			if r.URL.RawQuery == "hold" {
				c.SetReadDeadline(time.Now().Add(2 * time.Second))
				io.Copy(io.Discard, brw) // until the client or a reclaim closes it
			}
			return
		}
		io.WriteString(w, "ok")
	})
}

const (
	chunkedPut = "PUT / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
	chunkedEnd = "5\r\nhello\r\n0\r\n\r\n"
)

// handedLongHead is a GET with a head over the fast path's buffer: Fallback's.
var handedLongHead = "GET / HTTP/1.1\r\nHost: a\r\nX-Pad: " + strings.Repeat("p", 5000) + "\r\n\r\n"

// handedConn runs one of many ways a client may use and leave a
// connection handed to Fallback, chosen by kind, against addr: every
// close path of a handed connection (the client's close or reset, in a
// body, in a head, idle, or with an answer unread; Fallback's idle, read
// and write timeouts; a refusal by GuardConn; a handler's panic or
// hijack; a reclaim for room, idle or slow) and the ConnState orders
// they take (New then Closed without Active, Hijacked, Active and Idle
// many times). Errors are expected: only the accounting is checked.
func handedConn(addr string, kind int, rnd *rand.Rand) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(4 * time.Second))
	br := bufio.NewReader(c)
	send := exchanger(c, br)
	reset := func() { c.(*net.TCPConn).SetLinger(0) }
	pause := func(max int) { time.Sleep(time.Duration(rnd.IntN(max)) * time.Millisecond) }
	switch kind {
	case 0: // Active and Idle many times, then a close
		for range 1 + rnd.IntN(6) {
			req := chunkedPut + chunkedEnd
			if rnd.IntN(2) == 0 {
				req = handedLongHead
			}
			if !send(req) {
				return
			}
		}
	case 1: // one upload, then idle: reclaimed, timed out or closed
		send(chunkedPut + chunkedEnd)
		c.SetReadDeadline(time.Now().Add(time.Duration(rnd.IntN(400)) * time.Millisecond))
		br.ReadByte()
	case 2: // part of a chunked body, then a close or a reset
		io.WriteString(c, chunkedPut+"10\r\nabc")
		pause(100)
		if rnd.IntN(2) == 0 {
			reset()
		}
	case 3: // a body dribbled below minHandedRate: slow, reclaimed or timed out
		io.WriteString(c, chunkedPut)
		for range 5 + rnd.IntN(12) {
			if _, err := io.WriteString(c, "1\r\na\r\n"); err != nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		if rnd.IntN(2) == 0 {
			io.WriteString(c, "0\r\n\r\n")
			http.ReadResponse(br, nil)
		}
	case 4: // a handler's panic
		send("PUT /panic HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n" + chunkedEnd)
	case 5: // hijacked and closed by the handler
		send("PUT /hijack HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n" + chunkedEnd)
	case 6: // hijacked and held until the client closes
		io.WriteString(c, "PUT /hijack?hold HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"+chunkedEnd)
		http.ReadResponse(br, nil)
		pause(300)
	case 7: // refused by GuardConn (a folded line, handed over mid-head)
		io.WriteString(c, "GET / HTTP/1.1\r\nHost: a\r\nX-A: 1\r\n folded\r\n\r\n")
		br.ReadByte()
	case 8: // handed over mid-head, then gone: New, then Closed
		io.WriteString(c, "GET / HTTP/1.1\r\nHost: a\r\nX-A: 1\r\n folded\r\n")
		pause(100)
		if rnd.IntN(2) == 0 {
			reset()
		}
	case 9: // an answer never read: stalled writes, the write timeout
		io.WriteString(c, "PUT /big HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"+chunkedEnd)
		pause(600)
	case 10: // a head alone, its body never sent: the read timeout
		io.WriteString(c, chunkedPut)
		br.ReadByte()
	case 11: // pipelined, then closed before the answers are read
		io.WriteString(c, strings.Repeat(chunkedPut+chunkedEnd+handedLongHead, 3))
		pause(20)
	case 12: // a whole upload, then half-closed
		io.WriteString(c, "PUT /wait HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"+chunkedEnd)
		c.(*net.TCPConn).CloseWrite()
		io.Copy(io.Discard, br)
	}
}

const handedKinds = 13

// handedStressConfig sets a cap with the smallest share for Fallback
// (64), more clients than that at once, and timeouts short enough to
// fire within the test, long enough for slow bodies to be reclaimed.
func handedStressConfig(s *Server) {
	s.MaxConns = 200 // handedLimit: 64, with room for more clients than that
	s.ReadHeaderTimeout = 300 * time.Millisecond
	s.ReadTimeout = 1500 * time.Millisecond
	s.IdleTimeout = 200 * time.Millisecond
	s.Fallback.ReadHeaderTimeout = 300 * time.Millisecond
	s.Fallback.ReadTimeout = 1500 * time.Millisecond
	s.Fallback.WriteTimeout = 400 * time.Millisecond
	s.Fallback.IdleTimeout = 300 * time.Millisecond
}

// checkHandedLists walks both lists of handed connections under their
// lock and reports what is wrong with them: a broken link, a connection
// marked in another list, a cycle, or more connections listed than are
// counted handed (Close takes a connection out of its list before it
// uncounts it, and handover counts one before it lists it).
func checkHandedLists(s *Server) error {
	l := &s.handedConns
	l.mu.Lock()
	defer l.mu.Unlock()
	listed := 0
	for _, cl := range []*connlist.List[replayConn]{&l.idle, &l.working} {
		var prev *replayConn
		for r := cl.Front(); r != nil; r = r.links.Next() {
			if r.links.In() != cl {
				return fmt.Errorf("a connection in one list marked as in another")
			}
			if r.links.Prev() != prev {
				return fmt.Errorf("a connection's prev is not the one before it")
			}
			if r.list != l {
				return fmt.Errorf("a connection of another server listed")
			}
			if listed++; listed > 100000 {
				return fmt.Errorf("a cycle")
			}
			prev = r
		}
		if cl.Back() != prev {
			return fmt.Errorf("a list's tail is not its last connection")
		}
	}
	if n := s.handed.Load(); int64(listed) > n || n < 0 {
		return fmt.Errorf("%d connections listed, %d counted handed", listed, n)
	}
	return nil
}

// handedListed counts the connections in both lists.
func handedListed(s *Server) (idle, working int) {
	l := &s.handedConns
	l.mu.Lock()
	defer l.mu.Unlock()
	for r := l.idle.Front(); r != nil; r = r.links.Next() {
		idle++
	}
	for r := l.working.Front(); r != nil; r = r.links.Next() {
		working++
	}
	return idle, working
}

// waitHandedGone waits until no connection is counted handed, open or
// listed, and fails the test otherwise.
func waitHandedGone(t *testing.T, s *Server) {
	t.Helper()
	ok := eventually(func() bool {
		i, w := handedListed(s)
		return s.handed.Load() == 0 && s.openConns() == 0 && i == 0 && w == 0
	})
	if !ok {
		i, w := handedListed(s)
		t.Fatalf("all clients gone: handed = %d, open = %d, listed idle %d, working %d; want all 0 (%+v)", s.handed.Load(), s.openConns(), i, w, s.ConnStats())
	}
}

// runHanded runs clients goroutines of rounds handedConn each, of random
// kinds, against addr, and checks s's lists meanwhile; first runs before
// them, during beside them, each if not nil.
func runHanded(t *testing.T, s *Server, addr string, clients, rounds int, seed uint64, first, during func()) {
	stop := make(chan struct{})
	checked := make(chan struct{})
	go func() {
		defer close(checked)
		for {
			if err := checkHandedLists(s); err != nil {
				t.Error(err)
				return
			}
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	if first != nil {
		first()
	}
	var wg sync.WaitGroup
	for g := range clients {
		wg.Go(func() {
			rnd := rand.New(rand.NewPCG(uint64(g), seed))
			for range rounds {
				handedConn(addr, rnd.IntN(handedKinds), rnd)
			}
		})
	}
	if during != nil {
		during()
	}
	wg.Wait()
	close(stop)
	<-checked
}

// TestHandedAccounting drives hundreds of connections through every way a
// connection handed to Fallback ends, more at once than handedLimit, so
// that idle and slow ones are closed to make room and others are
// refused, with the lists of handed connections checked meanwhile; once
// every client is gone, no connection may be counted handed or listed,
// and a chunked upload is served: a connection left counted would shrink
// Fallback's share for the life of the process, until every chunked
// upload got 503.
func TestHandedAccounting(t *testing.T) {
	s, addr := startH1(t, handedStressHandler(), handedStressConfig)
	runHanded(t, s, addr, 80, 6, 1, func() {
		// More slow bodies at once than handedLimit, beside uploads that
		// never leave their connection idle: handovers at the limit,
		// with none idle, look for the slowest working connection while
		// others close and change state.
		var slow, fast sync.WaitGroup
		for g := range int(s.handedLimit()) + 16 {
			slow.Go(func() { handedConn(addr, 3, rand.New(rand.NewPCG(uint64(g), 4))) })
		}
		done := make(chan struct{})
		for g := range 8 {
			fast.Go(func() {
				rnd := rand.New(rand.NewPCG(uint64(g), 5))
				kinds := []int{2, 4, 5, 7, 8, 10}
				for {
					select {
					case <-done:
						return
					default:
						handedConn(addr, kinds[rnd.IntN(len(kinds))], rnd)
					}
				}
			})
		}
		slow.Wait()
		close(done)
		fast.Wait()
	}, nil)
	waitHandedGone(t, s)
	st := s.ConnStats()
	t.Logf("reclaimed %d, handovers refused %d", st.Reclaimed, st.HandoversRefused)
	for range int(s.handedLimit()) + 1 {
		c := dialOver(t, addr)
		if _, err := io.WriteString(c, chunkedPut+chunkedEnd); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("a chunked PUT after the load: %v, %v; want 200", resp, err)
		}
	}
}

// TestHandedAccountingClose is TestHandedAccounting with the Server shut
// down or closed while the connections come and go: each handed one
// still ends uncounted and unlisted, whoever closes it.
func TestHandedAccountingClose(t *testing.T) {
	for _, shutdown := range []bool{false, true} {
		t.Run(fmt.Sprintf("shutdown=%v", shutdown), func(t *testing.T) {
			s, addr := startH1(t, handedStressHandler(), handedStressConfig)
			runHanded(t, s, addr, 80, 3, 2, nil, func() {
				time.Sleep(300 * time.Millisecond)
				if shutdown {
					ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
					defer cancel()
					s.Shutdown(ctx)
				}
				s.Close()
			})
			waitHandedGone(t, s)
		})
	}
}

// TestExpectAccounting: clients that send "Expect: 100-continue" and
// leave in every way (after 100 Continue, before it, with the body sent
// without waiting, refused by the budget) leave nothing counted: no
// connection open or handed, no budget held, and the next such client
// gets its 100 Continue and its answer.
func TestExpectAccounting(t *testing.T) {
	bg := budget.New(48 << 10)
	s, addr := startH1(t, echoLen(), func(s *Server) {
		s.MaxConns = 100
		s.Budget = bg
		s.BodyLimit = func(*http.Request) int64 { return 1 << 20 }
		s.ReadTimeout = time.Second
	})
	sizes := []int{5, 20 << 10, 100 << 10}
	var wg sync.WaitGroup
	for g := range 40 {
		wg.Go(func() {
			rnd := rand.New(rand.NewPCG(uint64(g), 3))
			for range 10 {
				func() {
					c, err := net.Dial("tcp", addr)
					if err != nil {
						return
					}
					defer c.Close()
					c.SetDeadline(time.Now().Add(3 * time.Second))
					br := bufio.NewReader(c)
					size := sizes[rnd.IntN(len(sizes))]
					io.WriteString(c, expectHead("/x", size))
					switch rnd.IntN(4) {
					case 0: // 100 Continue (or a refusal), then gone
						br.ReadByte()
					case 1: // the body without waiting
						io.WriteString(c, strings.Repeat("b", size))
						http.ReadResponse(br, nil)
					case 2: // 100 Continue, then the body
						if resp, err := http.ReadResponse(br, nil); err == nil && resp.StatusCode == 100 {
							io.WriteString(c, strings.Repeat("b", size))
							http.ReadResponse(br, nil)
						}
					case 3: // gone before anything comes
						c.(*net.TCPConn).SetLinger(0)
					}
				}()
			}
		})
	}
	wg.Wait()
	waitHandedGone(t, s)
	if !eventually(func() bool { return bg.Used() == 0 }) {
		t.Errorf("budget holds %d bytes with every client gone", bg.Used())
	}
	c, br := dial(t, addr)
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, expectHead("/x", 5))
	read100(t, br)
	io.WriteString(c, "hello")
	if r, err := readWireResponse(br, "PUT"); err != nil || r.body != "read 5" {
		t.Fatalf("an Expect PUT after the load: %v, %v", r, err)
	}
}
