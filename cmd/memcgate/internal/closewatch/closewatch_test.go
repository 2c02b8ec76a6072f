package closewatch

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// TestCounts: each way net/http closes a connection without a handler
// seeing its request is counted under its reason, and a request that
// reaches the handler, or a client that goes away in the middle of a
// head, is not counted at all.
func TestCounts(t *testing.T) {
	tests := []struct {
		name string
		// client talks to the server over c and returns once the server
		// closed c, or c is done with.
		client func(t *testing.T, c net.Conn)
		want   [Reasons]uint64
	}{
		{"a head net/http cannot parse", func(t *testing.T, c net.Conn) {
			io.WriteString(c, "GET / HTTP/1.1\r\nno colon\r\n\r\n")
			readToEOF(t, c)
		}, [Reasons]uint64{BadRequest: 1}},
		{"no byte within the header timeout", func(t *testing.T, c net.Conn) {
			readToEOF(t, c)
		}, [Reasons]uint64{HeaderTimeout: 1}},
		{"half a head within the header timeout", func(t *testing.T, c net.Conn) {
			io.WriteString(c, "GET / HTTP/1.1\r\nHost: a\r\n")
			readToEOF(t, c)
		}, [Reasons]uint64{HeaderTimeout: 1}},
		{"idle past the idle timeout", func(t *testing.T, c net.Conn) {
			io.WriteString(c, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			readToEOF(t, br)
		}, [Reasons]uint64{IdleTimeout: 1}},
		{"the client gone in the middle of a head", func(t *testing.T, c net.Conn) {
			io.WriteString(c, "GET / HTTP/1.1\r\nHost: a\r\n")
			c.Close()
		}, [Reasons]uint64{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := New("data", nil)
			closed := make(chan struct{}, 1)
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
			srv.Listener = Listener(srv.Listener)
			srv.Config.ReadHeaderTimeout = 200 * time.Millisecond
			srv.Config.IdleTimeout = 200 * time.Millisecond
			w.Serve(srv.Config)
			watched := srv.Config.ConnState
			srv.Config.ConnState = func(c net.Conn, s http.ConnState) {
				watched(c, s)
				if s == http.StateClosed {
					closed <- struct{}{}
				}
			}
			srv.Start()
			defer srv.Close()
			c, err := net.Dial("tcp", srv.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			tt.client(t, c)
			select {
			case <-closed: // w has counted it
			case <-time.After(10 * time.Second):
				t.Fatal("the server did not close the connection")
			}
			if got := w.Counts(); got != tt.want {
				t.Errorf("Counts() = %v, want %v", got, tt.want)
			}
		})
	}
}

// readToEOF reads r until the server closes the connection, failing t if
// it stays open for 10 s.
func readToEOF(t *testing.T, r io.Reader) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, r)
		done <- err
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the server did not close the connection")
	}
}
