//go:build linux

package bigvalue

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/gatewaytest"
	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/test/slowreader"
)

// itemRig is one memcached (-I 2m, and memcachedArgs) and a memcgate that
// takes values of up to 1 MiB, with a byte budget of budget bytes (0:
// the default) and values in chunks off.
func itemRig(t *testing.T, budget int, memcachedArgs ...string) *rig {
	t.Helper()
	mc := memcachedtest.Start(t, append([]string{"-I", "2m"}, memcachedArgs...)...)
	vars := map[string]string{
		"MEMCGATE_SERVERS":         mc.Addr,
		"MEMCGATE_MAX_VALUE_BYTES": strconv.Itoa(1 << 20),
		"MEMCGATE_ACCESS_LOG":      "false",
	}
	if budget > 0 {
		vars["MEMCGATE_MAX_BUFFERED_BYTES"] = strconv.Itoa(budget)
	}
	gw := gatewaytest.New(t, binary, vars)
	gw.Start(t)
	return &rig{mc: mc, gw: gw, url: "http://" + gw.DataAddr}
}

// TestPutBodyHeldOnce: a PUT body read ahead by the fast path is held
// against the budget once, not once by the server and again by the
// handler's copy: with a budget of 1.5 MiB, 1 MB bodies are stored one
// after another (held twice they needed 2 MB each and were answered
// 503), and the budget is empty after each.
func TestPutBodyHeldOnce(t *testing.T) {
	r := itemRig(t, 3<<19)
	v := randomValue(1_000_000, 7)
	for i := range 3 {
		r.put(t, "once"+strconv.Itoa(i), v)
		if used := r.metric(t, "memcgate_buffered_bytes"); used != 0 {
			t.Errorf("after PUT %d the budget holds %v bytes, want 0", i, used)
		}
	}
}

// TestPooledBodiesKeepTheirBytes: request bodies are read into buffers
// that are lent again once their value is stored. Clients PUT values of
// every buffer class at once, in one piece, in slow pieces (so that the
// body is read ahead across several buffers) or cut off halfway (the
// connection's buffer is given back without a handler), and with
// Prefer: respond-async (the queued write keeps its buffer); each value
// read back, from the gateway and from memcached itself, is the one its
// client sent, and a cut-off PUT stores nothing.
func TestPooledBodiesKeepTheirBytes(t *testing.T) {
	r := itemRig(t, 0, "-m", "512")
	url := r.url
	sizes := []int{1000, 5000, 20_000, 100_000, 300_000, 1_000_000}
	const clients, rounds = 16, 8
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			for i := range rounds {
				size := sizes[(c+i)%len(sizes)]
				key := fmt.Sprintf("pooled-%d-%d", c, i)
				v := randomValue(size, byte(c*rounds+i+1))
				switch mode := (c + 2*i) % 4; mode {
				case 0:
					if err := putWhole(url, key, v, false); err != nil {
						t.Error(err)
						return
					}
				case 1:
					if err := putRaw(r.gw.DataAddr, key, v, 4, false); err != nil {
						t.Error(err)
						return
					}
				case 2:
					if err := putRaw(r.gw.DataAddr, key, v, 4, true); err != nil {
						t.Error(err)
						return
					}
					v = nil // cut off: nothing stored
				case 3:
					if err := putWhole(url, key, v, true); err != nil {
						t.Error(err)
						return
					}
				}
				if err := expectValue(url, key, v); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	// The buffers of the last bodies wait for the next ones, within
	// the budget (64 MiB by default).
	if kept := r.metric(t, "memcgate_body_buffers_kept_bytes"); kept <= 0 || kept > 64<<20 {
		t.Errorf("memcgate_body_buffers_kept_bytes = %v, want more than 0 and at most 64 MiB", kept)
	}
	// Everything again, now that every buffer has been lent many times.
	d := dialDirect(t, r.mc.Addr)
	for c := range clients {
		for i := range rounds {
			key := fmt.Sprintf("pooled-%d-%d", c, i)
			want := randomValue(sizes[(c+i)%len(sizes)], byte(c*rounds+i+1))
			if (c+2*i)%4 == 2 {
				want = nil
			}
			if got := d.getOne(t, key); !bytes.Equal(got, want) {
				t.Errorf("memcached has %d bytes under %s (sha256 %x), want %d (%x)", len(got), key, sha256.Sum256(got), len(want), sha256.Sum256(want))
			}
		}
	}
}

// putWhole PUTs v under key with net/http's client, with Prefer:
// respond-async if async.
func putWhole(url, key string, v []byte, async bool) error {
	req, _ := http.NewRequest("PUT", url+"/"+key, bytes.NewReader(v))
	if async {
		req.Header.Set("Prefer", "respond-async")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if want := map[bool]int{false: 201, true: 202}[async]; resp.StatusCode != want {
		return fmt.Errorf("PUT %s (%d bytes, async %v) = %d, want %d", key, len(v), async, resp.StatusCode, want)
	}
	return nil
}

// putRaw PUTs v under key over a connection of its own, the body in
// pieces with pauses between them; with cut, it sends half the body and
// closes the connection.
func putRaw(addr, key string, v []byte, pieces int, cut bool) error {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	body := v
	if cut {
		body = v[:len(v)/2]
	}
	if _, err := fmt.Fprintf(c, "PUT /%s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", key, len(v)); err != nil {
		return err
	}
	step := max(1, len(body)/pieces)
	for len(body) > 0 {
		n := min(step, len(body))
		if _, err := c.Write(body[:n]); err != nil {
			return err
		}
		body = body[n:]
		time.Sleep(5 * time.Millisecond)
	}
	if cut {
		return nil
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return fmt.Errorf("PUT %s in pieces: %w", key, err)
	}
	resp.Body.Close()
	if resp.StatusCode != 201 {
		return fmt.Errorf("PUT %s in pieces = %d", key, resp.StatusCode)
	}
	return nil
}

// expectValue GETs key until it is v (nil: absent), for up to 5 s: a
// write queued with Prefer: respond-async lands a little later.
func expectValue(url, key string, v []byte) error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, err := http.Get(url + "/" + key)
		if err != nil {
			return err
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		switch {
		case err != nil:
			return err
		case v == nil && resp.StatusCode == 404, v != nil && resp.StatusCode == 200 && bytes.Equal(got, v):
			return nil
		case resp.StatusCode == 200 && (v == nil || len(got) == len(v)):
			// A value of the right length and the wrong bytes is the
			// failure this test is for; never retry it.
			return fmt.Errorf("GET %s: %d bytes (sha256 %x), want %d (%x)", key, len(got), sha256.Sum256(got), len(v), sha256.Sum256(v))
		case time.Now().After(deadline):
			return fmt.Errorf("GET %s = %d with %d bytes, want %d bytes", key, resp.StatusCode, len(got), len(v))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestRefusedGetsAllocateNothing: a GET whose value the byte budget
// cannot take is answered 503 without the value ever being kept. With a
// budget of 1 MiB, one client holds most of it with a PUT body it has not
// finished sending; 100 GETs of a 200 KB value are then refused, and the
// gateway allocates far less than the 20 MB the values would take (it
// reads them off memcached's connection and drops them); once the
// holder leaves, the value is served.
func TestRefusedGetsAllocateNothing(t *testing.T) {
	const size = 200_000
	mc := memcachedtest.Start(t, "-I", "2m")
	gw := gatewaytest.New(t, binary, map[string]string{
		"MEMCGATE_SERVERS":            mc.Addr,
		"MEMCGATE_MAX_VALUE_BYTES":    strconv.Itoa(1 << 20),
		"MEMCGATE_MAX_BUFFERED_BYTES": strconv.Itoa(1 << 20),
		"MEMCGATE_ACCESS_LOG":         "false",
	})
	gw.Start(t)
	r := &rig{mc: mc, gw: gw, url: "http://" + gw.DataAddr}
	r.put(t, "big", randomValue(size, 9))
	// The holder: most of a 1 MB body, read ahead and held against the
	// budget while the rest does not come.
	holder, err := net.Dial("tcp", gw.DataAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	fmt.Fprintf(holder, "PUT /held HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n%s", bytes.Repeat([]byte("h"), 900_000))
	for deadline := time.Now().Add(5 * time.Second); r.metric(t, "memcgate_buffered_bytes") < 900_000; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("after 5s the budget holds %v bytes, want the holder's 900,000 or more", r.metric(t, "memcgate_buffered_bytes"))
		}
	}
	before := r.metric(t, "go_memstats_alloc_bytes_total")
	for range 100 {
		resp, err := http.Get(r.url + "/big")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("GET of a value past the budget = %s, want 503 with Retry-After", resp.Status)
		}
	}
	allocated := r.metric(t, "go_memstats_alloc_bytes_total") - before
	t.Logf("100 refused GETs of %d bytes: %.1f MB allocated", size, allocated/1e6)
	if allocated > 5e6 {
		t.Errorf("100 refused GETs of %d bytes allocated %.1f MB, want far less than the values' %d MB", size, allocated/1e6, 100*size/1_000_000)
	}
	// The holder gone, the value is served: the node was not failed for
	// the refusals, and its connections are in step.
	holder.Close()
	for deadline := time.Now().Add(5 * time.Second); r.metric(t, "memcgate_buffered_bytes") != 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the holder's bytes are still held 5s after it closed")
		}
	}
	resp, err := http.Get(r.url + "/big")
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 || !bytes.Equal(got, randomValue(size, 9)) {
		t.Errorf("GET after the holder left = %s, %d bytes, %v; want the value", resp.Status, len(got), err)
	}
}

// TestChunkReadsKeepTheirHold: a GET of a value in chunks holds two
// chunks' bytes against the budget before it answers, and its chunk
// reads are never refused for the budget after that: the reads that
// may be refused (op.Op.Room) are those of requests holding nothing, so
// a full budget cannot cut a response short. The budget here takes the
// GET's two chunks beside a holder's body, but not a third chunk: a
// refusal that counted the request's own hold refused every chunk read,
// and the client got 200 and part of the value.
func TestChunkReadsKeepTheirHold(t *testing.T) {
	const chunkSize, holderSent = 1_048_000, 900_000
	const budget = 1<<20 + 2*chunkSize + chunkSize/2
	r := newRig(t, "MEMCGATE_MAX_VALUE_BYTES", strconv.Itoa(chunkSize), "MEMCGATE_MAX_BUFFERED_BYTES", strconv.Itoa(budget))
	v := randomValue(3*chunkSize, 11)
	want := sha256.Sum256(v)
	r.put(t, "chunked", v)
	holder, err := net.Dial("tcp", r.gw.DataAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	fmt.Fprintf(holder, "PUT /held HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n%s", bytes.Repeat([]byte("h"), holderSent))
	var held float64
	for deadline := time.Now().Add(5 * time.Second); held < holderSent; held = r.metric(t, "memcgate_buffered_bytes") {
		if time.Now().After(deadline) {
			t.Fatalf("after 5s the budget holds %v bytes, want the holder's %d or more", held, holderSent)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The scene this test needs: two chunks fit beside the holder, a
	// third does not.
	if held+2*chunkSize > budget || held+3*chunkSize <= budget {
		t.Fatalf("the holder holds %v bytes: with a budget of %d, want two chunks of %d to fit beside it and three not", held, budget, chunkSize)
	}
	for i := range 3 {
		resp, err := http.Get(r.url + "/chunked")
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.New()
		n, err := io.Copy(h, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || err != nil || !bytes.Equal(h.Sum(nil), want[:]) {
			t.Fatalf("GET %d with the budget nearly full = %s, %d bytes, %v; want the value's %d", i, resp.Status, n, err, len(v))
		}
	}
}

// TestPooledValuesKeepTheirBytes: GET values are read into buffers lent
// by the pool that request bodies come from, and given back once their
// response is written. Clients GET values of every buffer class at once,
// as whole values, HEAD, ranges, and through small receive buffers read
// slowly (so that a response is spilled and written later), while others
// PUT values into the same pool; every response is the stored value's.
// A buffer given back while a response still read it would show another
// value's bytes.
func TestPooledValuesKeepTheirBytes(t *testing.T) {
	r := itemRig(t, 0, "-m", "512")
	sizes := []int{16 << 10, 20_000, 65_536, 100_000, 300_000, 1_000_000}
	want := make([][]byte, len(sizes))
	for i, n := range sizes {
		want[i] = randomValue(n, byte(100+i))
		if err := putWhole(r.url, "value"+strconv.Itoa(i), want[i], false); err != nil {
			t.Fatal(err)
		}
	}
	const clients, rounds = 16, 12
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			for i := range rounds {
				k := (c + i) % len(sizes)
				key := "value" + strconv.Itoa(k)
				var err error
				switch mode := (c + 3*i) % 5; mode {
				case 0:
					err = expectValue(r.url, key, want[k])
				case 1: // the pool's other borrowers
					err = putWhole(r.url, fmt.Sprintf("other-%d-%d", c, i), randomValue(sizes[(k+1)%len(sizes)], byte(c+i)), false)
				case 2:
					err = getRange(r.url, key, want[k])
				case 3:
					err = getSlowly(r.gw.DataAddr, key, want[k])
				case 4:
					err = headLength(r.url, key, len(want[k]))
				}
				if err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// getRange GETs the second half of key's value and checks it against v.
func getRange(url, key string, v []byte) error {
	req, _ := http.NewRequest("GET", url+"/"+key, nil)
	req.Header.Set("Range", fmt.Sprintf("bytes=%d-", len(v)/2))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusPartialContent || !bytes.Equal(got, v[len(v)/2:]) {
		return fmt.Errorf("GET %s bytes=%d- = %s, %d bytes, %v; want 206 and the value's second half", key, len(v)/2, resp.Status, len(got), err)
	}
	return nil
}

// getSlowly GETs key over a connection with a small receive buffer,
// reading in small pieces with pauses, and checks the body against v.
func getSlowly(addr, key string, v []byte) error {
	c, err := slowreader.DialErr(addr, 64<<10)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	fmt.Fprintf(c, "GET /%s HTTP/1.1\r\nHost: x\r\n\r\n", key)
	time.Sleep(50 * time.Millisecond) // the response fills the socket first
	resp, err := http.ReadResponse(bufio.NewReaderSize(c, 4<<10), nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	h := sha256.New()
	buf := make([]byte, 64<<10)
	for n := 0; ; n++ {
		m, err := resp.Body.Read(buf)
		h.Write(buf[:m])
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		if n%8 == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	if sum := sha256.Sum256(v); resp.StatusCode != 200 || !bytes.Equal(h.Sum(nil), sum[:]) {
		return fmt.Errorf("slow GET %s = %s, not the value", key, resp.Status)
	}
	return nil
}

// headLength HEADs key and checks its Content-Length.
func headLength(url, key string, n int) error {
	resp, err := http.Head(url + "/" + key)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.ContentLength != int64(n) {
		return fmt.Errorf("HEAD %s = %s, length %d; want 200, %d", key, resp.Status, resp.ContentLength, n)
	}
	return nil
}
