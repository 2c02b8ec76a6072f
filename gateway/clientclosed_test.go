package gateway

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestClientClosedSendsNothing: net/http cancels a request whose client
// half-closes, as soon as it reads the end after the request. An
// operation that sees the cancellation before it starts fails with
// context.Canceled, a 499: logged and counted, never sent. The
// connection must then close without an answer; a silent handler would
// let net/http send its implicit 200, telling a client still reading that
// a write it never made was done. Which side of the cancellation a
// request lands on is a race, so each kind is tried several times: every
// answer must be the operation's own, its effect made, and some requests
// must have been cancelled.
func TestClientClosedSendsNothing(t *testing.T) {
	g := newBigRig(t, nil)
	const tries = 10
	tests := []struct {
		name   string
		req    func(i int) string
		status int
		check  func(i int, body []byte) error // the operation's effect, after an answer
	}{
		{"PUT", func(i int) string {
			return fmt.Sprintf("PUT /hc-new-%d HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc", i)
		}, http.StatusCreated, func(i int, _ []byte) error {
			if a := g.do("GET", fmt.Sprintf("/hc-new-%d", i), nil); a.status != http.StatusOK || string(a.body) != "abc" {
				return fmt.Errorf("GET after the PUT = %d %q", a.status, a.body)
			}
			return nil
		}},
		{"DELETE", func(i int) string {
			g.mustPut(fmt.Sprintf("/hc-del-%d", i), []byte("v"))
			return fmt.Sprintf("DELETE /hc-del-%d HTTP/1.1\r\nHost: x\r\n\r\n", i)
		}, http.StatusNoContent, func(i int, _ []byte) error {
			if a := g.do("GET", fmt.Sprintf("/hc-del-%d", i), nil); a.status != http.StatusNotFound {
				return fmt.Errorf("GET after the DELETE = %d", a.status)
			}
			return nil
		}},
		{"incr", func(i int) string {
			g.mustPut(fmt.Sprintf("/hc-n-%d", i), []byte("5"))
			return fmt.Sprintf("POST /hc-n-%d?op=incr HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", i)
		}, http.StatusOK, func(_ int, body []byte) error {
			if string(body) != "6" {
				return fmt.Errorf("incr of 5 answered %q", body)
			}
			return nil
		}},
		{"GET", func(i int) string {
			g.mustPut(fmt.Sprintf("/hc-get-%d", i), []byte("v"))
			return fmt.Sprintf("GET /hc-get-%d HTTP/1.1\r\nHost: x\r\n\r\n", i)
		}, http.StatusOK, func(_ int, body []byte) error {
			if string(body) != "v" {
				return fmt.Errorf("GET answered %q", body)
			}
			return nil
		}},
	}
	cancelled := 0
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for i := range tries {
				req := tt.req(i)
				c, err := net.Dial("tcp", strings.TrimPrefix(g.url, "http://"))
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				if _, err := io.WriteString(c, req); err != nil {
					t.Fatal(err)
				}
				c.(*net.TCPConn).CloseWrite()
				c.SetReadDeadline(time.Now().Add(5 * time.Second))
				got, err := io.ReadAll(c)
				if err != nil {
					t.Fatalf("read: %v (got %q)", err, got)
				}
				if len(got) == 0 {
					cancelled++
					continue
				}
				resp, err := http.ReadResponse(bufio.NewReader(strings.NewReader(string(got))), nil)
				if err != nil {
					t.Fatalf("answer %q: %v", got, err)
				}
				body, _ := io.ReadAll(resp.Body)
				if resp.StatusCode != tt.status {
					t.Fatalf("try %d answered %d %q, want %d or no answer", i, resp.StatusCode, body, tt.status)
				}
				if err := tt.check(i, body); err != nil {
					t.Fatalf("try %d answered %d but %v", i, resp.StatusCode, err)
				}
			}
		})
	}
	if cancelled == 0 {
		t.Fatalf("none of %d requests was cancelled by its client's half-close: the test did not reach the 499", len(tests)*tries)
	}
	t.Logf("%d of %d requests cancelled", cancelled, len(tests)*tries)
}
