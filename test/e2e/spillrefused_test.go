package e2e

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/memcachedtest"
)

// TestLargeGETWholeWhenTheBudgetIsHeld: a client that reads its answers
// at once gets a large value whole, or 503, while others hold most of the
// byte budget with bodies they send slowly. A detached GET's answer the
// socket does not take at once (here a 16 KiB send buffer,
// MEMCGATE_SEND_BUFFER_BYTES as security.md advises) is copied into
// memory held in the budget; when the budget refused that copy, the
// answer, its 200 head and Content-Length already sent, was cut short
// and the connection closed: 32 KB of a 1 MB value. Found attacking
// memcgate: three connections each sending 300 KB of a 1 MB PUT body
// held enough of a 4 MiB budget to cut every such GET short.
func TestLargeGETWholeWhenTheBudgetIsHeld(t *testing.T) {
	mc := memcachedtest.Start(t, "-I", "2m")
	g := startGateway(t, map[string]string{
		"MEMCGATE_SERVERS":            mc.Addr,
		"MEMCGATE_MAX_BUFFERED_BYTES": "4194304",
		"MEMCGATE_SEND_BUFFER_BYTES":  "16384",
	})
	value := bytes.Repeat([]byte("0123456789abcdef"), 1000000/16)
	if r := g.do("PUT", "/big", value); r.status != http.StatusCreated {
		t.Fatalf("PUT /big: %d", r.status)
	}
	addr := strings.TrimPrefix(g.URL, "http://")
	// Bodies sent in part hold their whole declared length once a
	// part of them is read (readBody): 3 MB of the 4 MiB.
	for i := range 3 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "PUT /slow%d HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n", i)
		c.Write(make([]byte, 300000))
	}
	deadline := time.Now().Add(5 * time.Second)
	for metricValue(t, g, "memcgate_buffered_bytes") < 3000000 {
		if time.Now().After(deadline) {
			t.Fatalf("the slow bodies hold %v bytes of the budget, want 3 MB", metricValue(t, g, "memcgate_buffered_bytes"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	whole, refused := 0, 0
	for i := range 5 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		io.WriteString(c, "GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("GET %d: %v", i, err)
		}
		body, err := io.ReadAll(resp.Body)
		c.Close()
		switch {
		case resp.StatusCode == http.StatusServiceUnavailable:
			refused++
		case resp.StatusCode != http.StatusOK:
			t.Fatalf("GET %d: %s", i, resp.Status)
		case err != nil || !bytes.Equal(body, value):
			t.Fatalf("GET %d: 200 with %d of the value's %d bytes (%v): an answer cut short", i, len(body), len(value), err)
		default:
			whole++
		}
	}
	t.Logf("%d answered whole, %d refused (503)", whole, refused)
	if whole == 0 {
		t.Errorf("no GET answered whole: the budget had room for the value")
	}
}
