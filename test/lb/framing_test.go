package lb

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/gatewaytest"
	"github.com/memcgate/memcgate/test/memcachedtest"
)

// framingCases are requests whose framing a front balancer and the
// gateway could read differently. {body} is the body as the balancer
// reads it: a request of its own, a PUT of {smuggled}, which must never
// run. {body} is sent raw, or chunked as {chunked}.
var framingCases = []struct{ name, raw string }{
	{"Transfer-Encoding on HTTP/1.0", "PUT /{key} HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n{chunked}"},
	{"Transfer-Encoding on HTTP/1.0, no keep-alive", "PUT /{key} HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n{chunked}"},
	{"Content-Length and Transfer-Encoding", "PUT /{key} HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n{chunked}"},
	{"Transfer-Encoding continued", "PUT /{key} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding:\r\n chunked\r\n\r\n{chunked}"},
	{"Content-Length in a continuation", "PUT /{key} HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n Content-Length: {len}\r\nContent-Length: {len}\r\n\r\n{body}"},
	{"Content-Length continued", "PUT /{key} HTTP/1.1\r\nHost: x\r\nContent-Length:\r\n {len}\r\n\r\n{body}"},
	{"Transfer-Encoding in a continuation, with Content-Length", "PUT /{key} HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n Transfer-Encoding: chunked\r\nContent-Length: {len}\r\n\r\n{body}"},
	{"Content-Length in a continuation, chunked", "PUT /{key} HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n{chunked}"},
	{"chunk size with extension", "PUT /{key} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n{chunked;ext}"},
	{"Expect: 100-continue", "PUT /{key} HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: {len}\r\n\r\n{body}"},
	// Answered before the body is read: the body must still be read as
	// one, or the connection closed.
	{"refused key, the body unread", "PUT /{key}" + strings.Repeat("k", 250) + " HTTP/1.1\r\nHost: x\r\nContent-Length: {len}\r\n\r\n{body}"},
	{"DELETE with a body", "DELETE /{key} HTTP/1.1\r\nHost: x\r\nContent-Length: {len}\r\n\r\n{body}"},
	{"GET with a chunked body", "GET /{key} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n{chunked}"},
}

// TestFramingThroughBalancers sends each of framingCases through nginx
// and HAProxy, as shipped, to the gateway, and to the gateway directly:
// whatever each answers, the gateway must read the body where the
// balancer (or the client) put it, so that the PUT stores the body or
// nothing and the request in the body never runs, on a connection the
// balancer shares with other clients.
func TestFramingThroughBalancers(t *testing.T) {
	if testing.Short() {
		t.Skip("runs nginx, HAProxy, two gateways and memcached")
	}
	mc := memcachedtest.Start(t)
	env := map[string]string{"MEMCGATE_SERVERS": mc.Addr, "MEMCGATE_ACCESS_LOG": "false", "MEMCGATE_LOG_FORMAT": "text"}
	a, b := gatewaytest.New(t, binary, env), gatewaytest.New(t, binary, env)
	a.Start(t)
	b.Start(t)
	ups := [2]upstream{{a.DataAddr, a.AdminPort}, {b.DataAddr, b.AdminPort}}
	for _, lb := range []struct {
		name  string
		start func(*testing.T, [2]upstream) *balancer
	}{{"nginx", startNginx}, {"haproxy", startHAProxy}, {"direct", direct}} {
		t.Run(lb.name, func(t *testing.T) {
			bal := lb.start(t, ups)
			u, err := url.Parse(bal.url)
			if err != nil {
				t.Fatal(err)
			}
			for i, c := range framingCases {
				t.Run(c.name, func(t *testing.T) {
					key := fmt.Sprintf("framing-%s-%d", lb.name, i)
					smuggled := key + "-smuggled"
					setUp(t, a, key, "")
					setUp(t, a, smuggled, "")
					body := "PUT /" + smuggled + " HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nZ"
					size := strconv.FormatInt(int64(len(body)), 16)
					raw := strings.NewReplacer(
						"{key}", key,
						"{len}", strconv.Itoa(len(body)),
						"{body}", body,
						"{chunked}", size+"\r\n"+body+"\r\n0\r\n\r\n",
						"{chunked;ext}", size+";a=b\r\n"+body+"\r\n0;c\r\n\r\n",
					).Replace(c.raw)
					status := sendRaw(t, u.Host, raw)
					// A balancer holds a request's answer until its
					// body is sent; what the gateway read as a request
					// of its own has run by the time the next is
					// answered on the same connection.
					do(t, http.MethodGet, bal.url+"/"+key, nil, nil)
					got := value(t, a, key)
					t.Logf("answered %d, stored %q", status, got)
					if got != "" && got != body {
						t.Errorf("the PUT answered %d stored %q, want the body sent or nothing", status, got)
					}
					if status/100 == 2 && got != body {
						t.Errorf("the PUT answered %d but stored %q, want the body sent", status, got)
					}
					if v := value(t, a, smuggled); v != "" {
						t.Errorf("the request in the body ran: %s is %q", smuggled, v)
					}
				})
			}
			// HTTP/1.0 lets a client send no Host; what the balancer
			// forwards on HTTP/1.1 must then carry one of its own.
			t.Run("HTTP/1.0 without Host", func(t *testing.T) {
				key := "framing-" + lb.name + "-nohost"
				setUp(t, a, key, "v")
				if status := sendRaw(t, u.Host, "GET /"+key+" HTTP/1.0\r\n\r\n"); status != http.StatusOK {
					t.Errorf("GET without Host on HTTP/1.0 = %d, want 200", status)
				}
			})
		})
	}
}

// direct is no balancer: the first gateway itself.
func direct(t *testing.T, gws [2]upstream) *balancer {
	return &balancer{url: "http://" + gws[0].data}
}

// sendRaw writes raw to addr on a connection of its own and returns the
// status of the first final answer (0 if none came).
func sendRaw(t *testing.T, addr, raw string) int {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatalf("write: %v", err)
	}
	br := bufio.NewReader(c)
	for {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return 0
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode >= 200 {
			return resp.StatusCode
		}
	}
}
