package h1

import (
	"bufio"
	"net"
	"net/http"
	"testing"
	"time"
)

// TestConnStats checks the counts of connections in each state: a silent
// new one (reading), one between requests (idle), one whose handler runs
// (active), one handed over to Fallback (not counted), and Accepted.
func TestConnStats(t *testing.T) {
	release := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/block" {
			<-release
		}
	})
	s, addr := startH1(t, h, nil)
	defer close(release)
	dial := func() net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	dial() // silent
	idle := dial()
	idle.Write([]byte("GET / HTTP/1.1\r\nHost: a\r\n\r\n"))
	if _, err := http.ReadResponse(bufio.NewReader(idle), nil); err != nil {
		t.Fatal(err)
	}
	dial().Write([]byte("GET /block HTTP/1.1\r\nHost: a\r\n\r\n"))
	dial().Write([]byte("GET / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\n")) // Fallback's

	want := ConnStats{Reading: 1, Idle: 1, Active: 1, Accepted: 4}
	var got ConnStats
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if got = s.ConnStats(); got == want {
			return
		}
	}
	t.Fatalf("ConnStats() = %+v, want %+v", got, want)
}
