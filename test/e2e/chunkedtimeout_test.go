package e2e

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/memcachedtest"
)

// TestChunkedBodyTimeout: a chunked body that stops anywhere in its
// framing, from the first chunk's size line to the CRLF that ends the
// trailer section, is answered 408 once MEMCGATE_READ_TIMEOUT has passed,
// as every body that does not arrive whole in time is, on the fast path
// (which hands a chunked body over to net/http) and on Go's net/http
// (FAST_PATH=false, TLS), on TCP and on the Unix socket, for a body read whole and for one over
// MAX_VALUE_BYTES, stored in chunks as it comes; nothing is stored. The
// clients wait on the answers, never on a sleep.
func TestChunkedBodyTimeout(t *testing.T) {
	t.Parallel() // its own gateways and memcached
	mc := memcachedtest.Start(t)
	// Where a client may stop: the bytes it sends after the head, its
	// one chunk of data being data.
	stops := func(data string) []struct{ name, sent string } {
		size := fmt.Sprintf("%x", len(data))
		chunk := size + "\r\n" + data + "\r\n"
		return []struct{ name, sent string }{
			{"no body", ""},
			{"size line", size},
			{"extension", size + ";ext=x"},
			{"size line CR", size + ";ext=x\r"},
			{"data", size + "\r\n" + data[:len(data)/2]},
			{"data whole", size + "\r\n" + data},
			{"data CR", size + "\r\n" + data + "\r"},
			{"next size line", chunk},
			{"last chunk", chunk + "0"},
			{"last chunk CR", chunk + "0\r"},
			{"after last chunk", chunk + "0\r\n"},
			{"trailer field", chunk + "0\r\nX-Sum: 1"},
			{"trailer field CR", chunk + "0\r\nX-Sum: 1\r"},
			{"after trailer field", chunk + "0\r\nX-Sum: 1\r\n"},
			{"final CR", chunk + "0\r\n\r"},
			{"final CR after trailer", chunk + "0\r\nX-Sum: 1\r\n\r"},
		}
	}
	caFile, certFile, keyFile := writeCert(t)
	pemBytes, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pemBytes)
	tcp := func(t *testing.T, g *gateway, _ string) net.Conn {
		c, _ := dialRaw(t, g.DataAddr)
		return c
	}
	for _, path := range []struct {
		name string
		env  map[string]string
		dial func(t *testing.T, g *gateway, sock string) net.Conn // a connection to the listener under test
	}{
		{name: "fast_path", env: map[string]string{}, dial: tcp},
		{name: "net_http", env: map[string]string{"MEMCGATE_FAST_PATH": "false"}, dial: tcp},
		// TLS: net/http over a tls.Conn, the read deadline's timeout
		// under it.
		{name: "tls", env: map[string]string{"MEMCGATE_TLS_CERT_FILE": certFile, "MEMCGATE_TLS_KEY_FILE": keyFile},
			dial: func(t *testing.T, g *gateway, _ string) net.Conn {
				c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", g.DataAddr, &tls.Config{RootCAs: roots, ServerName: "127.0.0.1"})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { c.Close() })
				return c
			}},
		// The Unix socket, served by the fast path and by net/http.
		{name: "unix_socket", env: map[string]string{}, dial: unixDial},
		{name: "unix_socket_net_http", env: map[string]string{"MEMCGATE_FAST_PATH": "false"}, dial: unixDial},
	} {
		for _, value := range []struct {
			name string
			data string
			big  string // MEMCGATE_BIG_VALUE_MAX_BYTES
		}{
			// Read whole: with values in chunks off, the handler reads
			// the body before it stores it.
			{"whole", "hello", "0"},
			// Over MAX_VALUE_BYTES (below): stored in chunks as it comes.
			{"in_chunks", strings.Repeat("v", 3000), "65536"},
		} {
			t.Run(path.name+"/"+value.name, func(t *testing.T) {
				env := map[string]string{
					"MEMCGATE_SERVERS":             mc.Addr,
					"MEMCGATE_READ_HEADER_TIMEOUT": "1s",
					"MEMCGATE_READ_TIMEOUT":        "1s",
					"MEMCGATE_MAX_VALUE_BYTES":     "1024",
					"MEMCGATE_BIG_VALUE_MAX_BYTES": value.big,
				}
				for k, v := range path.env {
					env[k] = v
				}
				sock := filepath.Join(t.TempDir(), "memcgate.sock")
				env["MEMCGATE_LISTEN_SOCKET"] = sock
				scheme := "http"
				if env["MEMCGATE_TLS_CERT_FILE"] != "" {
					scheme = "https"
				}
				g := startGatewayScheme(t, scheme, env)
				client := httpsClient(t, caFile)
				// Every stop at once, each on its own connection: they all
				// time out together.
				stops := stops(value.data)
				var wg sync.WaitGroup
				got := make([]string, len(stops))
				for i, s := range stops {
					wg.Go(func() {
						key := fmt.Sprintf("/chunked-stop-%s-%s-%d", path.name, value.name, i)
						c := path.dial(t, g, sock)
						br := bufio.NewReader(c)
						c.SetDeadline(time.Now().Add(30 * time.Second))
						fmt.Fprintf(c, "PUT %s HTTP/1.1\r\nHost: %s\r\nTransfer-Encoding: chunked\r\n\r\n%s", key, g.DataAddr, s.sent)
						resp, err := http.ReadResponse(br, nil)
						if err != nil {
							got[i] = fmt.Sprintf("no answer: %v", err)
							return
						}
						body, _ := io.ReadAll(resp.Body)
						resp.Body.Close()
						got[i] = fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(body)))
						if resp.StatusCode == http.StatusRequestTimeout && !resp.Close {
							got[i] += " (without Connection: close)"
						}
						if r, err := client.Get(g.URL + key); err != nil || r.StatusCode != http.StatusNotFound {
							got[i] += fmt.Sprintf("; GET after it = %v %v, want 404", r, err)
						} else {
							r.Body.Close()
						}
					})
				}
				wg.Wait()
				const want = "408 request body did not arrive within MEMCGATE_READ_TIMEOUT"
				for i, s := range stops {
					if got[i] != want {
						t.Errorf("stopped at %s (%.40q): %s; want %s", s.name, s.sent, got[i], want)
					}
				}
			})
		}
	}
}

// unixDial is a connection to the gateway's Unix socket sock.
func unixDial(t *testing.T, _ *gateway, sock string) net.Conn {
	c, err := net.DialTimeout("unix", sock, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
