package gateway

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/gateway/budget"
	"github.com/memcgate/memcgate/gateway/h1"
	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream"
)

// TestRoomLineUnderAttack: bodies that wait in h1's room line for room
// in a small budget are each let in once there is room, with nothing
// but the budget's own word that room came back (no poller tick):
// clients PUT values to real memcached at once, more than the budget
// holds, while another taker grabs and gives back room and makes
// Acquires fail (each counted for a moment), and some clients drop their
// connection halfway through a body. A wake-up lost would leave a body
// waiting out its BudgetWait (20 s) for room that is free; every answer
// comes well before, and every value stored is in memcached whole.
func TestRoomLineUnderAttack(t *testing.T) {
	mcs := memcachedtest.StartN(t, 1)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	reg := prometheus.NewRegistry()
	c, err := upstream.New(upstream.Options{Servers: []upstream.Server{{Host: "127.0.0.1", Port: mcs[0].Port}}, Timeout: 5 * time.Second}, log, reg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	const limit = 2 << 20
	bg := budget.New(limit)
	h := NewHandler(c, log, reg, Options{Budget: bg, MaxValueBytes: 600 << 10, RequestTimeout: 30 * time.Second, TakeBody: h1.TakeAhead})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &h1.Server{Handler: h, Detached: h.ServeDetached, Fallback: &http.Server{Handler: h}, Budget: bg, BudgetWait: 20 * time.Second,
		BodyLimit: h.BodyLimit, NewContext: h.NewContext, ReadTimeout: 30 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	addr := ln.Addr().String()

	stop := make(chan struct{})
	var attackers sync.WaitGroup
	var peak atomic.Int64
	attackers.Add(2)
	go func() { // another taker: grabs room, gives it back, and is refused
		defer attackers.Done()
		r := rand.New(rand.NewPCG(1, 2))
		for {
			select {
			case <-stop:
				return
			default:
			}
			n := int64(r.IntN(600<<10) + 1)
			if bg.Acquire(n) == nil {
				time.Sleep(time.Duration(r.IntN(300)) * time.Microsecond)
				bg.Release(n)
			}
			time.Sleep(time.Duration(r.IntN(200)) * time.Microsecond)
		}
	}()
	go func() {
		defer attackers.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
			peak.Store(max(peak.Load(), int64(srv.ConnStats().WaitingForRoom)))
		}
	}()

	const clients, puts = 24, 6
	type result struct {
		key   string
		value []byte
		took  time.Duration
		err   error
	}
	results := make(chan result, clients*puts)
	var wg sync.WaitGroup
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(i), 7))
			for j := range puts {
				key := fmt.Sprintf("room-%d-%d", i, j)
				v := bytes.Repeat([]byte{byte('a' + j)}, 100<<10+r.IntN(400<<10))
				if i%6 == 5 && j == 0 {
					// Drops its connection halfway through the body.
					if conn, err := net.Dial("tcp", addr); err == nil {
						fmt.Fprintf(conn, "PUT /%s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", key, len(v))
						conn.Write(v[:len(v)/2])
						time.Sleep(time.Duration(r.IntN(20)) * time.Millisecond)
						conn.Close()
					}
				}
				for {
					start := time.Now()
					status, err := putOnce(addr, key, v)
					took := time.Since(start)
					if err == nil && status == http.StatusServiceUnavailable && took < 2*time.Second {
						// The line was full (refused at once): again.
						time.Sleep(time.Duration(r.IntN(5)+1) * time.Millisecond)
						continue
					}
					if err == nil && status != http.StatusCreated && status != http.StatusNoContent {
						err = fmt.Errorf("PUT %s: status %d", key, status)
					}
					results <- result{key, v, took, err}
					break
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	attackers.Wait()
	close(results)
	var slowest time.Duration
	for res := range results {
		slowest = max(slowest, res.took)
		if res.err != nil {
			t.Errorf("%s: %v (after %v)", res.key, res.err, res.took)
			continue
		}
		resp, err := http.Get("http://" + addr + "/" + res.key)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || !bytes.Equal(got, res.value) {
			t.Errorf("GET %s: %d, %d bytes (%v); want the %d sent", res.key, resp.StatusCode, len(got), err, len(res.value))
		}
	}
	t.Logf("slowest PUT %v; at most %d bodies waited for room at once", slowest, peak.Load())
	if slowest > 10*time.Second {
		t.Errorf("a PUT took %v: a body waited for room that had come back", slowest)
	}
	if peak.Load() < 2 {
		t.Errorf("at most %d bodies waited for room at once: the test did not fill the line", peak.Load())
	}
	if !eventuallyTrue(func() bool { return bg.Used() == 0 }) {
		t.Errorf("the budget holds %d bytes afterwards", bg.Used())
	}
}

// putOnce sends one PUT of v to key on its own connection and returns
// the status.
func putOnce(addr, key string, v []byte) (int, error) {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(40 * time.Second))
	fmt.Fprintf(conn, "PUT /%s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", key, len(v))
	go conn.Write(v)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return 0, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// eventuallyTrue retries cond for up to 5 s.
func eventuallyTrue(cond func() bool) bool {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}
