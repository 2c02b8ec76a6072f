//go:build linux

package abuse

import (
	"bufio"
	"bytes"
	"compress/zlib"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
)

// The attacks of issue #16. Each returns its run function for one size.

const (
	bigKey  = "big"
	bigSize = 1_000_000 // the value the amplification attacks read many times
	// maxValue is the default MEMCGATE_MAX_VALUE_BYTES, the largest body
	// of a PUT.
	maxValue = 1_048_000

	// attackerTimeout bounds an amplification request: above the
	// gateway's default WRITE_TIMEOUT (30 s), so that the attacker sees
	// how the gateway ends it.
	attackerTimeout = 45 * time.Second

	floodConns     = 6
	floodValueSize = 256 << 10
	floodPrefix    = 64 // bytes of each flood value that name its key
)

// Attack 13's values: php-memcached zlib values (flags compressed and
// zlib, a length prefix) of a few dozen kilobytes that inflate to
// bombSize bytes of zeros, each under a key of its own. Anyone who can
// write to memcached, or prepend to a value through the gateway, can
// store such a value.
const (
	bombs    = 32
	bombSize = 60 << 20
)

// bombPayload is one compressed bomb as memcached holds it.
func bombPayload() []byte {
	var z bytes.Buffer
	w := zlib.NewWriter(&z)
	_, _ = w.Write(make([]byte, bombSize))
	_ = w.Close()
	n := uint32(bombSize)
	prefix := []byte{byte(n), byte(n >> 8), byte(n >> 16), byte(n >> 24)} // little-endian
	return append(prefix, z.Bytes()...)
}

// storeBombs stores the bombs straight into memcached.
func storeBombs(t *testing.T, r *rig) {
	t.Helper()
	p := bombPayload()
	mc := memcache.New(r.mc.Addr)
	defer mc.Close()
	for i := range bombs {
		if err := mc.Set(&memcache.Item{Key: "bomb" + strconv.Itoa(i), Value: p, Flags: 0x30}); err != nil {
			t.Fatalf("storing bomb %d: %v", i, err)
		}
	}
}

// batchBombs is attack 13: one POST / batch of gets of n bombs, each
// inflating to bombSize bytes if nothing holds it first.
func batchBombs(n int) func(*testing.T, *rig, func()) result {
	var ops []string
	for i := range n {
		ops = append(ops, `{"op":"get","key":"bomb`+strconv.Itoa(i)+`"}`)
	}
	body := `{"ops":[` + strings.Join(ops, ",") + `]}`
	req := []byte("POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body)
	return amplify(req)
}

// storeBig stores the 1,000,000-byte value the amplification attacks
// read.
func storeBig(t *testing.T, r *rig) {
	t.Helper()
	r.put(t, bigKey, bytes.Repeat([]byte("b"), bigSize))
}

// holdConns opens n connections, calls send on each (sends nothing if
// send is nil), holds them while the canary runs, and closes them:
// attacks 1, 3, 4 and 6. The attacker got what each connection held when
// it let go.
func holdConns(n int, send func(c net.Conn, i int) error) func(t *testing.T, r *rig, hold func()) result {
	return holdReaders(n, 0, send)
}

// holdReaders is holdConns with connections whose receive buffer is
// rcvbuf bytes (0: the kernel's): clients that never read what they
// asked for.
func holdReaders(n, rcvbuf int, send func(c net.Conn, i int) error) func(t *testing.T, r *rig, hold func()) result {
	return func(t *testing.T, r *rig, hold func()) result {
		f := openFlood(t, r.gw.DataAddr, n, rcvbuf, send)
		notes := []string{fmt.Sprintf("%s of %s connections opened", thousands(f.open()), thousands(n))}
		hold()
		got := f.states()
		f.close()
		return result{got: got.String(), setup: f.took, notes: notes}
	}
}

// sendHead returns a send func that writes head(i) and nothing more.
func sendHead(head func(i int) string) func(net.Conn, int) error {
	return func(c net.Conn, i int) error {
		_, err := io.WriteString(c, head(i))
		return err
	}
}

// silentConns is attack 1: connections that never send a byte.
func silentConns(n int) func(*testing.T, *rig, func()) result {
	return holdConns(n, nil)
}

// putHeads is attack 3: PUT heads declaring a 1-byte body that never
// comes, one per connection, each holding a request slot while the
// gateway waits for the body (MAX_REQUESTS is 10,000 by default).
func putHeads(n int) func(*testing.T, *rig, func()) result {
	return holdConns(n, sendHead(func(i int) string {
		return "PUT /slot" + strconv.Itoa(i) + " HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\n"
	}))
}

// declaredHead is the head of attack 4: a PUT declaring the largest
// value the gateway accepts by default.
func declaredHead(i int) string {
	return "PUT /big" + strconv.Itoa(i) + " HTTP/1.1\r\nHost: x\r\nContent-Length: " + strconv.Itoa(maxValue) + "\r\n\r\n"
}

// declaredBodies is attack 4: PUT heads declaring the largest value and
// sending none of it, so any memory reserved from the declared length is
// reserved for nothing. Go hands out fresh pages untouched, so such a
// reservation shows in the heap in use long before it shows in RSS.
func declaredBodies(n int) func(*testing.T, *rig, func()) result {
	return holdConns(n, sendHead(declaredHead))
}

// nearlyBodies is attack 4 sent by a patient attacker: each declared
// body but its last byte, so that whatever the gateway holds for it is
// written to and counts in RSS.
func nearlyBodies(n int) func(*testing.T, *rig, func()) result {
	body := bytes.Repeat([]byte("n"), maxValue-1)
	return holdConns(n, func(c net.Conn, i int) error {
		bufs := net.Buffers{[]byte(declaredHead(i)), body}
		_, err := bufs.WriteTo(c)
		return err
	})
}

// slowBigReaders is attack 6: n connections, each pipelining k GETs of
// the 1 MB key and never reading, with a small receive buffer. Each
// answer asks memcached for a megabyte on the node's connections, where
// the canary's small GETs go too.
func slowBigReaders(n, k int) func(*testing.T, *rig, func()) result {
	req := strings.Repeat("GET /"+bigKey+" HTTP/1.1\r\nHost: x\r\n\r\n", k)
	return holdReaders(n, 4096, sendHead(func(int) string { return req }))
}

// manyBig is how many 1 MB values attack 11's multi-gets name.
const manyBig = 10

// storeManyBig stores manyBig values of 1,000,000 bytes, big0 to big9.
func storeManyBig(t *testing.T, r *rig) {
	t.Helper()
	for i := range manyBig {
		r.put(t, bigKey+strconv.Itoa(i), bytes.Repeat([]byte("b"), bigSize))
	}
}

// slowMultiGets is attack 11: n connections, each sending one multi-get
// of the manyBig 1 MB keys (a 200-byte request asking for 10 MB) and
// never reading, with a small receive buffer. Each value must be held
// against the byte budget from before it is read off memcached's
// connection, or the connections hold ten megabytes each.
func slowMultiGets(n int) func(*testing.T, *rig, func()) result {
	q := make([]string, manyBig)
	for i := range q {
		q[i] = "key=" + bigKey + strconv.Itoa(i)
	}
	req := "GET /?" + strings.Join(q, "&") + " HTTP/1.1\r\nHost: x\r\n\r\n"
	return holdReaders(n, 4096, sendHead(func(int) string { return req }))
}

// slowMemcReaders is attack 12: attack 6 on the HttpMemcModule endpoint,
// n connections each pipelining k gets of the 1 MB key through /memc and
// never reading: the module's answers hold the budget as the REST API's
// do.
func slowMemcReaders(n, k int) func(*testing.T, *rig, func()) result {
	req := strings.Repeat("GET /memc?cmd=get&key="+bigKey+" HTTP/1.1\r\nHost: x\r\n\r\n", k)
	return holdReaders(n, 4096, sendHead(func(int) string { return req }))
}

// pipelinedFlood is attacks 7 and 9: n connections pipelining req as
// fast as they can for as long as the attack is held, never reading:
// each keeps a goroutine of the gateway busy until its answers fill the
// socket. The flood runs in a process of its own (this test binary,
// started again with ABUSE_CHILD=pipeline), as an attacker would: run
// here, its goroutines, always runnable, would delay the canary's own
// (Go polls the network when a processor runs out of work), and the
// canary would measure the attacker's scheduler.
func pipelinedFlood(n int, req string) func(*testing.T, *rig, func()) result {
	return func(t *testing.T, r *rig, hold func()) result {
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), "ABUSE_CHILD=pipeline", "ABUSE_ADDR="+r.gw.DataAddr, "ABUSE_CONNS="+strconv.Itoa(n), "ABUSE_REQ="+req)
		stop, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatalf("starting the flood: %v", err)
		}
		hold()
		stop.Close()
		if err := cmd.Wait(); err != nil {
			t.Fatalf("the flood: %v\n%s", err, out.String())
		}
		got, note, _ := strings.Cut(strings.TrimSpace(out.String()), "\n")
		return result{got: got, notes: []string{note}}
	}
}

const (
	// badKeyGet is attack 7's request: a GET of a key memcached cannot
	// carry, answered 400 by the fast path without asking it.
	badKeyGet = "GET /bad%20key HTTP/1.1\r\nHost: x\r\n\r\n"
	// handedGet is attack 9's: the same GET with a Connection header
	// listing a token besides keep-alive, which the fast path hands to
	// Go's net/http with the rest of its connection.
	handedGet = "GET /bad%20key HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, x\r\n\r\n"
)

// pipelineChild is the flood of attacks 7 and 9, run by the child
// process until its stdin closes; it prints what the connections got,
// then a note.
func pipelineChild() {
	n, err := strconv.Atoi(os.Getenv("ABUSE_CONNS"))
	if err != nil {
		fmt.Println("ABUSE_CONNS:", err)
		os.Exit(2)
	}
	stop := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); close(stop) }()
	got, sent := pipeline(os.Getenv("ABUSE_ADDR"), n, os.Getenv("ABUSE_REQ"), stop)
	fmt.Printf("%s\nsent %s of requests\n", got, size(sent))
}

// pipeline floods addr from n connections with one until stop closes,
// a thousand at a time.
func pipeline(addr string, n int, one string, stop <-chan struct{}) (got string, sent int64) {
	req := []byte(strings.Repeat(one, 1000))
	var (
		statuses tally
		mu       sync.Mutex
	)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			c, err := net.DialTimeout("tcp", addr, 10*time.Second)
			if err != nil {
				statuses.add("connect "+errKind(err), 1)
				return
			}
			defer c.Close()
			n := 0
			defer func() { mu.Lock(); sent += int64(n); mu.Unlock() }()
			for {
				select {
				case <-stop:
					statuses.add("held", 1)
					return
				default:
				}
				_ = c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
				m, err := c.Write(req)
				n += m
				if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
					statuses.add("write "+errKind(err), 1)
					return
				}
			}
		})
	}
	wg.Wait()
	return statuses.String(), sent
}

// batchFanOut is attack 8: n connections, each sending one POST / batch
// of 1000 deletes of keys that do not exist (about 34 KB) and never
// reading: 1000 operations on memcached for one request slot each.
func batchFanOut(n int) func(*testing.T, *rig, func()) result {
	return holdConns(n, sendHead(func(i int) string {
		ops := make([]string, 1000)
		for j := range ops {
			ops[j] = `{"op":"delete","key":"fan` + strconv.Itoa(i) + "-" + strconv.Itoa(j) + `"}`
		}
		body := `{"ops":[` + strings.Join(ops, ",") + "]}"
		return "POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
	}))
}

// chunkedUploads is attack 10: n connections, each sending the head of
// a chunked PUT with a 15 KB header and one chunk of its body, then
// nothing: each request needs Go's net/http, which would hold a
// goroutine, buffers and the parsed head for it (about 65 KB) and never
// close it to make room. The gateway hands a thirty-second of the cap
// over at most, and past that closes the slowest of them, once under
// 1 KiB/s for a second, for each new one, or answers 503.
func chunkedUploads(n int) func(*testing.T, *rig, func()) result {
	pad := strings.Repeat("p", 15000)
	return holdConns(n, sendHead(func(i int) string {
		return "PUT /chunked" + strconv.Itoa(i) + " HTTP/1.1\r\nHost: x\r\nX-Pad: " + pad + "\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n"
	}))
}

// multiGet is attack 2a: one multi-get naming the 1 MB key n times.
func multiGet(n int) func(*testing.T, *rig, func()) result {
	q := strings.TrimSuffix(strings.Repeat("key="+bigKey+"&", n), "&")
	req := []byte("GET /?" + q + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	return amplify(req)
}

// batchGets is attack 2b: one POST / batch of n gets of the 1 MB key.
func batchGets(n int) func(*testing.T, *rig, func()) result {
	body := `{"ops":[` + strings.TrimSuffix(strings.Repeat(`{"op":"get","key":"`+bigKey+`"},`, n), ",") + `]}`
	req := []byte("POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body)
	return amplify(req)
}

// amplify sends req on one connection and reads the answer while the
// canary runs; the attacker got its status, size and time.
func amplify(req []byte) func(*testing.T, *rig, func()) result {
	return func(t *testing.T, r *rig, hold func()) result {
		done := make(chan string, 1)
		go func() { done <- exchange(r.gw.DataAddr, req) }()
		hold()
		return result{got: <-done, notes: []string{"request " + size(int64(len(req)))}}
	}
}

// exchange sends req on a new connection and reads the answer within
// attackerTimeout; it says what came back: status, body size, time.
func exchange(addr string, req []byte) string {
	start := time.Now()
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return "connect " + errKind(err)
	}
	defer c.Close()
	_ = c.SetDeadline(start.Add(attackerTimeout))
	if _, err := c.Write(req); err != nil {
		return "write " + errKind(err) + " after " + dur(time.Since(start))
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return "no answer (" + errKind(err) + ") after " + dur(time.Since(start))
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	got := fmt.Sprintf("%d, %s in %s", resp.StatusCode, size(n), dur(time.Since(start)))
	if err != nil {
		got += " then " + errKind(err) + " (cut short)"
	}
	return got
}

// asyncFlood is attack 5: floodConns connections pipelining
// Prefer: respond-async PUTs of floodValueSize values under distinct
// keys for as long as the attack is held. Every key answered 202 must be
// in memcached afterwards.
func asyncFlood(t *testing.T, r *rig, hold func()) result {
	tail := bytes.Repeat([]byte("v"), floodValueSize-floodPrefix)
	var (
		statuses tally
		mu       sync.Mutex // guards accepted, sent
		accepted []string
		sent     int
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range floodConns {
		wg.Go(func() {
			ok, n := floodConn(r.gw.DataAddr, i, tail, stop, &statuses)
			mu.Lock()
			accepted = append(accepted, ok...)
			sent += n
			mu.Unlock()
		})
	}
	hold()
	close(stop)
	wg.Wait()
	check := func(key string, v []byte) bool {
		return len(v) == floodValueSize && bytes.Equal(v[:floodPrefix], floodKeyPrefix(key)) && bytes.Equal(v[floodPrefix:], tail)
	}
	return result{
		got:      statuses.String(),
		accepted: accepted,
		check:    check,
		notes:    []string{fmt.Sprintf("sent %s PUTs (%s)", thousands(sent), size(int64(sent)*floodValueSize))},
	}
}

// floodKeyPrefix is the start of key's flood value: the key, padded.
func floodKeyPrefix(key string) []byte {
	p := bytes.Repeat([]byte("."), floodPrefix)
	copy(p, key)
	return p
}

// floodConn pipelines async PUTs on one connection until stop, then
// half-closes it and reads the answers still due. It tallies every
// answer's status (or what happened instead) and returns the keys
// answered 202 and how many PUTs it sent.
func floodConn(addr string, id int, tail []byte, stop <-chan struct{}, statuses *tally) (accepted []string, sent int) {
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		statuses.add("connect "+errKind(err), 1)
		return nil, 0
	}
	defer c.Close()
	keys := make(chan string, 1<<16) // sent, in order; far more than 10 s of 256 KiB PUTs
	go func() {
		defer close(keys)
		defer func() {
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.CloseWrite()
			}
		}()
		for seq := 0; ; seq++ {
			select {
			case <-stop:
				return
			default:
			}
			key := "flood-" + strconv.Itoa(id) + "-" + strconv.Itoa(seq)
			head := "PUT /" + key + " HTTP/1.1\r\nHost: x\r\nPrefer: respond-async\r\nContent-Length: " +
				strconv.Itoa(floodValueSize) + "\r\n\r\n"
			_ = c.SetWriteDeadline(time.Now().Add(attackerTimeout))
			bufs := net.Buffers{[]byte(head), floodKeyPrefix(key), tail}
			if _, err := bufs.WriteTo(c); err != nil {
				statuses.add("write "+errKind(err), 1)
				return
			}
			keys <- key
		}
	}()
	br := bufio.NewReader(c)
	var failed error
	for key := range keys {
		sent++
		if failed != nil {
			statuses.add("unanswered", 1)
			continue
		}
		_ = c.SetReadDeadline(time.Now().Add(attackerTimeout))
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			failed = err
			statuses.add("unanswered ("+errKind(err)+")", 1)
			continue
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		statuses.add(strconv.Itoa(resp.StatusCode), 1)
		if resp.StatusCode == http.StatusAccepted {
			accepted = append(accepted, key)
		}
		if err != nil {
			failed = err
		}
	}
	return accepted, sent
}

// storeManyBigRead is storeManyBig, each value then read once through
// the gateway, as values are read before anyone attacks them: the
// gateway knows them for large (sizeHints) from the first answer on.
func storeManyBigRead(t *testing.T, r *rig) {
	t.Helper()
	storeManyBig(t, r)
	for i := range manyBig {
		resp, err := http.Get(r.url + "/" + bigKey + strconv.Itoa(i))
		if err != nil {
			t.Fatal(err)
		}
		n, _ := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || n != bigSize {
			t.Fatalf("GET /%s%d = %d with %d bytes, want 200 with %d", bigKey, i, resp.StatusCode, n, bigSize)
		}
	}
}

// resetGets is attack 14 (and 14b, on gomemcache's pool): n connections
// at a time, each sending a GET of one of the manyBig 1 MB keys and
// resetting at once (SO_LINGER 0), for as long as the attack is held. A 40-byte request makes memcached send
// a megabyte that nobody reads; without a bound in bytes on the large
// reads queued for a node, thousands wait there, holding its in-flight
// slots, and the canary's request for the node waits behind them.
func resetGets(n int) func(*testing.T, *rig, func()) result {
	return resetting(n, "GETs", func(j int) string {
		return "GET /" + bigKey + strconv.Itoa(j%manyBig) + " HTTP/1.1\r\nHost: x\r\n\r\n"
	})
}

// resetTouches is attack 16: attack 14 with ?touch=60, a GAT, which
// touches the item whether or not its value is kept.
func resetTouches(n int) func(*testing.T, *rig, func()) result {
	return resetting(n, "GETs with touch", func(j int) string {
		return "GET /" + bigKey + strconv.Itoa(j%manyBig) + "?touch=60 HTTP/1.1\r\nHost: x\r\n\r\n"
	})
}

// resetMultiGets is attack 15: attack 14 with a multi-get of all manyBig
// keys, a 200-byte request for 10 MB.
func resetMultiGets(n int) func(*testing.T, *rig, func()) result {
	q := make([]string, manyBig)
	for i := range q {
		q[i] = "key=" + bigKey + strconv.Itoa(i)
	}
	req := "GET /?" + strings.Join(q, "&") + " HTTP/1.1\r\nHost: x\r\n\r\n"
	return resetting(n, "multi-gets", func(int) string { return req })
}

// resetting runs n connections at a time, each sending request(j) for
// its j-th request and resetting at once (SO_LINGER 0), for as long as
// the attack is held.
func resetting(n int, what string, request func(j int) string) func(*testing.T, *rig, func()) result {
	return func(t *testing.T, r *rig, hold func()) result {
		var sent atomic.Int64
		written := func() int64 {
			st, err := r.mc.Stats()
			if err != nil {
				t.Fatalf("memcached stats: %v", err)
			}
			n, _ := strconv.ParseInt(st["bytes_written"], 10, 64)
			return n
		}
		before, began := written(), time.Now()
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				for j := i; ; j += n {
					select {
					case <-stop:
						return
					default:
					}
					c, err := net.DialTimeout("tcp", r.gw.DataAddr, 10*time.Second)
					if err != nil {
						time.Sleep(time.Millisecond)
						continue
					}
					if _, err := io.WriteString(c, request(j)); err == nil {
						sent.Add(1)
					}
					_ = c.(*net.TCPConn).SetLinger(0)
					c.Close()
				}
			})
		}
		hold()
		close(stop)
		wg.Wait()
		// What memcached sent for answers nobody read.
		out, took := written()-before, time.Since(began)
		return result{got: thousands(int(sent.Load())) + " " + what + " sent and reset",
			notes: []string{fmt.Sprintf("memcached sent %s in %s", size(out), dur(took))}}
	}
}
