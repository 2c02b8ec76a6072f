package h1

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/memcgate/memcgate/gateway/budget"
)

// tickBudget is a Budget that cannot say when it gives room back: the
// poller looks for room on roomTick.
type tickBudget struct{ Budget }

// TestRoomBell: with a budget that says when it gives room back, a body
// waiting in the room line leaves the poller asleep (no look every
// roomTick) and is let in when another taker's Release makes room for
// it; with one that cannot say, the poller looks every roomTick.
func TestRoomBell(t *testing.T) {
	const limit, size = 400 << 10, 200 << 10
	for _, tt := range []struct {
		name string
		bell bool
	}{{"budget that says", true}, {"budget that cannot say", false}} {
		t.Run(tt.name, func(t *testing.T) {
			bg := budget.New(limit)
			var of Budget = bg
			if !tt.bell {
				of = tickBudget{bg}
			}
			s, addr := startH1(t, echoLen(), func(s *Server) {
				s.Budget, s.BudgetWait = of, 5*time.Second
				s.BodyLimit = func(*http.Request) int64 { return 1 << 20 }
			})
			if err := bg.Acquire(limit - 100<<10); err != nil { // another taker: no room for the body yet
				t.Fatal(err)
			}
			c, br := put(t, addr, "/body", size)
			if !eventually(func() bool { return roomCount(s) == 1 }) {
				t.Fatalf("%d bodies in the room line, want 1", roomCount(s))
			}
			a := answerOf(c, br)
			time.Sleep(20 * time.Millisecond)
			wakes := time.Until(inPoller(s, func(p *poller) time.Time { return p.armed }))
			switch {
			case tt.bell && wakes < time.Second:
				t.Errorf("the poller wakes in %v while a body waits for room, want at BudgetWait's end: the budget rings when room comes back", wakes)
			case !tt.bell && wakes > 100*time.Millisecond:
				t.Errorf("the poller wakes in %v while a body waits for room, want within roomTick", wakes)
			}
			freed := time.Now()
			bg.Release(limit - 100<<10)
			select {
			case got := <-a:
				if got.err != nil || got.r.body != fmt.Sprintf("read %d", size) {
					t.Errorf("the body let in: %v, %v; want it read whole", got.r, got.err)
				}
				t.Logf("answered %v after the room came back", got.at.Sub(freed))
			case <-time.After(3 * time.Second):
				t.Fatalf("the body was not let in within 3 s of the room it needs coming back (%d bodies in the line)", roomCount(s))
			}
			if !eventually(func() bool { return bg.Used() == 0 && roomCount(s) == 0 }) {
				t.Errorf("budget holds %d bytes, %d bodies in the line afterwards", bg.Used(), roomCount(s))
			}
		})
	}
}

// TestRoomBellOnARaisedLimit: a body waiting in the room line is let in
// when a reload raises the budget's limit (SetLimit), with nothing given
// back: the bell rings for the limit too, or the body would wait out its
// BudgetWait and be refused.
func TestRoomBellOnARaisedLimit(t *testing.T) {
	const limit, size, other = 400 << 10, 150 << 10, 300 << 10
	bg := budget.New(limit)
	s, addr := startH1(t, echoLen(), func(s *Server) {
		s.Budget, s.BudgetWait = bg, 5*time.Second
		s.BodyLimit = func(*http.Request) int64 { return 1 << 20 }
	})
	if err := bg.Acquire(other); err != nil { // held on: only the limit can make room
		t.Fatal(err)
	}
	defer bg.Release(other)
	c, br := put(t, addr, "/body", size)
	if !eventually(func() bool { return roomCount(s) == 1 }) {
		t.Fatalf("%d bodies in the room line, want 1", roomCount(s))
	}
	a := answerOf(c, br)
	time.Sleep(20 * time.Millisecond)
	raised := time.Now()
	bg.SetLimit(2 << 20)
	select {
	case got := <-a:
		if got.err != nil || got.r.body != fmt.Sprintf("read %d", size) {
			t.Errorf("the body let in: %v, %v; want it read whole", got.r, got.err)
		}
		t.Logf("answered %v after the limit was raised", got.at.Sub(raised))
	case <-time.After(3 * time.Second):
		t.Fatalf("the body was not let in within 3 s of the limit raised (%d bodies in the line)", roomCount(s))
	}
}

// BenchmarkRoomAdmission measures how long a body waiting in the room
// line takes from the Release that makes room for it to its handler's
// start: rung by the budget (bell), or found on the poller's next look
// (tick). ns/op is that time's mean; p50 and p99 are reported too.
func BenchmarkRoomAdmission(b *testing.B) {
	for _, mode := range []string{"bell", "tick"} {
		b.Run(mode, func(b *testing.B) {
			const limit, size = 400 << 10, 200 << 10
			bg := budget.New(limit)
			started := make(chan time.Time, 1)
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				started <- time.Now()
				echoLen().ServeHTTP(w, r)
			})
			var budgetOf Budget = bg
			if mode == "tick" {
				budgetOf = tickBudget{bg}
			}
			s, addr := startH1(b, h, func(s *Server) {
				s.Budget, s.BudgetWait = budgetOf, 5*time.Second
				s.BodyLimit = func(*http.Request) int64 { return 1 << 20 }
			})
			c, err := net.Dial("tcp", addr)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			br := bufio.NewReader(c)
			body := []byte(strings.Repeat("r", size))
			var took []time.Duration
			b.ResetTimer()
			for range b.N {
				if err := bg.Acquire(limit - 100<<10); err != nil {
					b.Fatal(err)
				}
				fmt.Fprintf(c, "PUT /body HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n", size)
				go c.Write(body)
				for roomCount(s) != 1 {
					time.Sleep(50 * time.Microsecond)
				}
				time.Sleep(time.Duration(len(took)%7) * 100 * time.Microsecond) // not in step with the tick
				freed := time.Now()
				bg.Release(limit - 100<<10)
				took = append(took, (<-started).Sub(freed))
				if _, err := readWireResponse(br, "PUT"); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			slices.Sort(took)
			var sum time.Duration
			for _, d := range took {
				sum += d
			}
			b.ReportMetric(float64(sum.Nanoseconds())/float64(len(took)), "ns/admission")
			b.ReportMetric(float64(took[len(took)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(took[len(took)*99/100].Microseconds()), "p99-µs")
		})
	}
}

// roomAfterLook is a budget that gives back another taker's bytes just
// after a Room once armed: room that comes back just after a body found
// none, or just after the poller looked for room for the room line.
type roomAfterLook struct {
	*budget.Budget
	armed atomic.Bool
	held  int64
}

func (b *roomAfterLook) Room() int64 {
	r := b.Budget.Room()
	if b.armed.CompareAndSwap(true, false) {
		b.Budget.Release(b.held)
	}
	return r
}

// TestRoomBackJustAfterALook: room given back just after a body found
// none and before it joined the room line (no body waited: nothing
// rang), or just after the poller looked for room for it, lets it in at
// once, not at BudgetWait's end: no wake-up is lost.
func TestRoomBackJustAfterALook(t *testing.T) {
	const limit, size, held = 40 << 10, 16 << 10, 30 << 10
	for _, tt := range []struct {
		name   string
		inLine bool // armed once the body waits in the line, with a Release too small for it
	}{{"before the line", false}, {"after the poller looked", true}} {
		t.Run(tt.name, func(t *testing.T) {
			bg := &roomAfterLook{Budget: budget.New(limit), held: held}
			s, addr := startH1(t, echoLen(), func(s *Server) {
				s.Budget, s.BudgetWait = bg, 3*time.Second
				s.BodyLimit = func(*http.Request) int64 { return 1 << 20 }
			})
			if err := bg.Acquire(held + 2<<10); err != nil { // another taker: 8 KiB left
				t.Fatal(err)
			}
			bg.armed.Store(!tt.inLine)
			c, br := dial(t, addr)
			fmt.Fprintf(c, "PUT /body HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n", size)
			time.Sleep(20 * time.Millisecond) // the head alone: the body is read ahead
			start := time.Now()
			c.Write([]byte(strings.Repeat("r", size)))
			a := answerOf(c, br)
			if tt.inLine {
				if !eventually(func() bool { return roomCount(s) == 1 }) {
					t.Fatalf("%d bodies in the room line, want 1", roomCount(s))
				}
				start = time.Now()
				bg.armed.Store(true)
				bg.Release(2 << 10) // rings; the poller's look finds 10 KiB, then the rest comes back
			}
			got := <-a
			if got.err != nil || got.r.body != fmt.Sprintf("read %d", size) {
				t.Fatalf("the body: %v, %v; want it read whole", got.r, got.err)
			}
			if took := got.at.Sub(start); took > time.Second {
				t.Errorf("the body was answered after %v: it waited for room that had come back", took)
			}
			if tt.inLine {
				bg.Release(0)
			} else {
				bg.Release(2 << 10)
			}
			if !eventually(func() bool { return bg.Used() == 0 && roomCount(s) == 0 }) {
				t.Errorf("budget holds %d bytes, %d bodies in the line afterwards", bg.Used(), roomCount(s))
			}
		})
	}
}
