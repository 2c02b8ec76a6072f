//go:build linux

package abuse

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/gatewaytest"
	"github.com/memcgate/memcgate/test/memcachedtest"
)

// TestContentLengthWithChunked sends requests with both Content-Length
// and Transfer-Encoding: chunked, each with a GET pipelined behind it.
// RFC 9112 §6.3 lets a server treat such a message as chunked only if it
// then closes the connection, since a proxy in front may have framed it
// by Content-Length; nginx answers 400 and closes. The gateway must too,
// on both paths (issue #16): a 400, then the connection closed with the
// pipelined GET unanswered.
func TestContentLengthWithChunked(t *testing.T) {
	const chunkedEnd = "0\r\n\r\n"
	smuggled := "GET /" + canaryKey + " HTTP/1.1\r\nHost: x\r\n\r\n"
	batch := `{"ops":[{"op":"get","key":"smug"}]}` // a valid batch: only the framing is wrong
	tests := []struct {
		name string
		req  string
	}{
		{"CL then TE, same length", "PUT /smug HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n" + chunkedEnd},
		{"TE then CL, same length", "PUT /smug HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n" + chunkedEnd},
		{"CL covers a smuggled GET", "PUT /smug HTTP/1.1\r\nHost: x\r\nContent-Length: " + strconv.Itoa(len(chunkedEnd+smuggled)) +
			"\r\nTransfer-Encoding: chunked\r\n\r\n" + chunkedEnd + smuggled},
		{"CL shorter than the chunked body", "PUT /smug HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n" +
			"3\r\nabc\r\n" + chunkedEnd},
		{"POST batch", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n" +
			strconv.FormatInt(int64(len(batch)), 16) + "\r\n" + batch + "\r\n" + chunkedEnd},
	}
	mc := memcachedtest.Start(t)
	for _, fast := range []string{"true", "false"} {
		t.Run("FAST_PATH="+fast, func(t *testing.T) {
			gw := gatewaytest.New(t, binary, map[string]string{"MEMCGATE_SERVERS": mc.Addr, "MEMCGATE_FAST_PATH": fast})
			gw.Start(t)
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					c, err := net.DialTimeout("tcp", gw.DataAddr, time.Second)
					if err != nil {
						t.Fatal(err)
					}
					defer c.Close()
					_ = c.SetDeadline(time.Now().Add(5 * time.Second))
					if _, err := io.WriteString(c, tt.req+smuggled); err != nil {
						t.Fatalf("write: %v", err)
					}
					br := bufio.NewReader(c)
					resp, err := http.ReadResponse(br, nil)
					if err != nil {
						t.Fatalf("reading the answer: %v", err)
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusBadRequest {
						t.Errorf("status %d, want 400", resp.StatusCode)
					}
					// h1 lingers up to 500 ms for the client to close;
					// 3 s is plenty for the close to come.
					_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
					switch next, err := http.ReadResponse(br, nil); {
					case err == nil:
						next.Body.Close()
						t.Errorf("the GET pipelined behind it was answered %d; want the connection closed after the 400", next.StatusCode)
					case errors.Is(err, os.ErrDeadlineExceeded):
						t.Errorf("connection still open 3 s after the answer; want it closed")
					case !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && errKind(err) != "reset":
						// ReadResponse reports a connection closed
						// before any byte as io.ErrUnexpectedEOF.
						t.Errorf("after the answer: %v; want the connection closed", err)
					}
				})
			}
		})
	}
}
