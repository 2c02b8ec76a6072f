//go:build unix

package h1

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// benchHandler is shaped like the gateway's hot path: a GET answers a
// 400-byte value with Content-Type and Content-Length, a PUT reads its
// 400-byte body and answers 204.
func benchHandler() http.Handler {
	value := bytes.Repeat([]byte("v"), 400)
	ctype, clen := []string{"application/octet-stream"}, []string{strconv.Itoa(len(value))}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut {
			buf := make([]byte, r.ContentLength)
			if _, err := io.ReadFull(r.Body, buf); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			w.WriteHeader(http.StatusNoContent)
			return
		}
		h := w.Header()
		h["Content-Type"], h["Content-Length"] = ctype, clen
		w.Write(value)
	})
}

// benchRequests are raw requests with ~100-byte URLs, as wrk sends them.
func benchRequests() map[string][]byte {
	path := "/v1/kv/" + strings.Repeat("k", 93)
	return map[string][]byte{
		"GET": []byte("GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\r\n"),
		"PUT": []byte("PUT " + path + " HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nContent-Length: 400\r\n\r\n" + strings.Repeat("v", 400)),
	}
}

// benchServers starts benchHandler behind h1 and behind net/http, with
// the timeouts a production server sets, and returns their names and
// addresses.
func benchServers(b *testing.B) [][2]string {
	h := benchHandler()
	timeouts := func(s *http.Server) {
		s.ReadHeaderTimeout, s.ReadTimeout, s.WriteTimeout, s.IdleTimeout = 5*time.Second, 30*time.Second, 30*time.Second, 2*time.Minute
	}
	_, fast := startH1(b, h, func(s *Server) {
		s.ReadHeaderTimeout, s.ReadTimeout, s.WriteTimeout, s.IdleTimeout = 5*time.Second, 30*time.Second, 30*time.Second, 2*time.Minute
		timeouts(s.Fallback)
	})
	std := &http.Server{Handler: h}
	timeouts(std)
	ln := listen(b, "tcp")
	go std.Serve(ln)
	b.Cleanup(func() { std.Close() })
	return [][2]string{{"h1", fast}, {"net-http", ln.Addr().String()}}
}

// BenchmarkServe runs the same handler behind h1.Server and net/http:
// one request and response per iteration on a keep-alive connection, and
// in parallel on many connections.
func BenchmarkServe(b *testing.B) {
	servers := benchServers(b)
	reqs := benchRequests()
	for _, method := range []string{"GET", "PUT"} {
		for _, mode := range []string{"serial", "parallel"} {
			for _, srv := range servers {
				b.Run(method+"/"+mode+"/"+srv[0], func(b *testing.B) {
					b.ReportAllocs()
					if mode == "serial" {
						c := newBenchClient(b, srv[1])
						for b.Loop() {
							c.do(b, reqs[method])
						}
						return
					}
					b.SetParallelism(32)
					b.RunParallel(func(pb *testing.PB) {
						c := newBenchClient(b, srv[1])
						for pb.Next() {
							c.do(b, reqs[method])
						}
					})
				})
			}
		}
	}
}

type benchClient struct {
	c  net.Conn
	br *bufio.Reader
}

func newBenchClient(b testing.TB, addr string) *benchClient {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	return &benchClient{c: c, br: bufio.NewReaderSize(c, 8<<10)}
}

// do sends req and reads its response, which must have a Content-Length
// or no body.
func (c *benchClient) do(b testing.TB, req []byte) {
	if _, err := c.c.Write(req); err != nil {
		b.Fatal(err)
	}
	n := 0
	for {
		line, err := c.br.ReadSlice('\n')
		if err != nil {
			b.Fatal(err)
		}
		if len(line) == 2 {
			break
		}
		if v, ok := bytes.CutPrefix(line, []byte("Content-Length: ")); ok {
			n, _ = strconv.Atoi(string(bytes.TrimSpace(v)))
		}
	}
	if _, err := c.br.Discard(n); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkServeProcess is BenchmarkServe with the client in a child
// process, like wrk: ns/op is wall time and includes starting the child,
// server-ns/op is the CPU time this process (the server) spent per
// request, and allocs/op are the server's alone. Run it with -cpu 1 for
// the one-core case.
func BenchmarkServeProcess(b *testing.B) {
	servers := benchServers(b)
	for _, method := range []string{"GET", "PUT"} {
		for _, conns := range []int{1, 64} {
			for _, srv := range servers {
				b.Run(fmt.Sprintf("%s/conns=%d/%s", method, conns, srv[0]), func(b *testing.B) {
					b.ReportAllocs()
					cmd := exec.Command(os.Args[0], "-test.run=^TestBenchClient$", "-test.count=1")
					cmd.Env = append(os.Environ(), fmt.Sprintf("H1_BENCH_CLIENT=%s %s %d %d", srv[1], method, conns, b.N))
					before := cpuTime(b)
					b.ResetTimer()
					out, err := cmd.CombinedOutput()
					b.StopTimer()
					if err != nil {
						b.Fatalf("client: %v\n%s", err, out)
					}
					b.ReportMetric(float64(cpuTime(b)-before)/float64(b.N), "server-ns/op")
				})
			}
		}
	}
}

func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestBenchClient is BenchmarkServeProcess's client, run in a child
// process: H1_BENCH_CLIENT is "addr method conns requests".
func TestBenchClient(t *testing.T) {
	var addr, method string
	var conns, n int
	if _, err := fmt.Sscan(os.Getenv("H1_BENCH_CLIENT"), &addr, &method, &conns, &n); err != nil {
		t.Skip("only run by BenchmarkServeProcess")
	}
	req := benchRequests()[method]
	var wg sync.WaitGroup
	for i := range conns {
		c := newBenchClient(t, addr)
		wg.Go(func() {
			for range n/conns + min(1, max(0, n%conns-i)) {
				c.do(t, req)
			}
		})
	}
	wg.Wait()
}
