package h1

import (
	"context"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// TestGone: the client NewContext is given reports a connection its
// client closed, half-closed or reset as gone, and one still open as
// there, whether it sent more after the request or nothing.
func TestGone(t *testing.T) {
	type clientKey struct{}
	type running struct {
		client  interface{ Gone() bool }
		proceed chan struct{}
	}
	runs := make(chan *running)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/wait" {
			io.WriteString(w, "ok")
			return
		}
		run := &running{client: r.Context().Value(clientKey{}).(interface{ Gone() bool }), proceed: make(chan struct{})}
		runs <- run
		<-run.proceed
		io.WriteString(w, "ok")
	})
	_, addr := startH1(t, h, func(s *Server) {
		s.NewContext = func(parent context.Context, _ time.Time, client interface{ Gone() bool }) context.Context {
			return context.WithValue(parent, clientKey{}, client)
		}
	})
	tests := []struct {
		name  string
		leave func(c *net.TCPConn) // what the client does while its request runs
		gone  bool
	}{
		{"stays", func(*net.TCPConn) {}, false},
		{"sends more", func(c *net.TCPConn) { io.WriteString(c, "GET /next HTTP/1.1\r\nHost: a\r\n\r\n") }, false},
		{"half-closes", func(c *net.TCPConn) { c.CloseWrite() }, true},
		{"closes", func(c *net.TCPConn) { c.Close() }, true},
		{"resets", func(c *net.TCPConn) { c.SetLinger(0); c.Close() }, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			nc, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			c := nc.(*net.TCPConn)
			io.WriteString(c, "GET /wait HTTP/1.1\r\nHost: a\r\n\r\n")
			run := <-runs
			defer close(run.proceed)
			if run.client.Gone() {
				t.Fatal("Gone before the client did anything")
			}
			tt.leave(c)
			if !tt.gone {
				if run.client.Gone() {
					t.Error("Gone = true for a client still there")
				}
				return
			}
			// The close crosses loopback at once, but nothing promises
			// it: wait for it, with no bound on how long it may take
			// but the test's.
			for !run.client.Gone() {
				time.Sleep(time.Millisecond)
			}
		})
	}
}
