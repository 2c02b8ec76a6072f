package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/memcachedtest"
)

// rawRequest sends req as it is on a new connection to addr and reads one
// answer.
func rawRequest(t *testing.T, addr, req string) (*http.Response, string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatalf("send %.80q: %v", req, err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("answer to %.80q: %v", req, err)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("answer to %.80q: body: %v", req, err)
	}
	return resp, string(body)
}

// waitLogged waits until the gateway's log has a line with want in it:
// lines go out through a backlog, after the answer.
func waitLogged(t *testing.T, g *gateway, want string) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		logs := g.Logs()
		if strings.Contains(logs, want) {
			return logs
		}
		if time.Now().After(deadline) {
			t.Fatalf("no log line with %q within 10s", want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestHostileStrings: strings a client chooses reach the gateway's answers
// and its log as data, and bounded. Each case is sent as raw bytes to the
// built binary, at the info level (the access log's own JSON writer), at
// debug (slog, with the path) and in the text format: every log line must
// stay one record, whatever the bytes (quotes, newlines, tabs, U+2028,
// escapes, invalid UTF-8), and no line, answer or quoted string may grow
// with what the client sent (a 10,000-byte method, a 100 KB batch op name).
func TestHostileStrings(t *testing.T) {
	mcs := memcachedtest.StartN(t, 1)
	long := strings.Repeat("A", 10000)
	batch := func(op string) string {
		body := `{"ops":[{"op":` + strconv.Quote(op) + `,"key":"k"}]}`
		return "POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
	}
	tests := []struct {
		name   string
		req    string // sent as it is; X-Request-Id: hs-N is added after the request line
		status int
	}{
		{"request ID with a quote and a forged field", "GET /k HTTP/1.1\r\nHost: x\r\nX-Request-Id: a\"},{\"level\":\"ERROR\",\"msg\":\"forged\r\n\r\n", 404},
		{"request ID with U+2028 and U+2029", "GET /k HTTP/1.1\r\nHost: x\r\nX-Request-Id: a\u2028b\u2029c\r\n\r\n", 404},
		{"request ID with a tab and forged fields", "GET /k HTTP/1.1\r\nHost: x\r\nX-Request-Id: a\tlevel=ERROR\tmsg=forged\r\n\r\n", 404},
		{"request ID of invalid UTF-8", "GET /k HTTP/1.1\r\nHost: x\r\nX-Request-Id: \xff\xfe\xc3\r\n\r\n", 404},
		{"request ID with a backslash and markup", "GET /k HTTP/1.1\r\nHost: x\r\nX-Request-Id: \\u0022<script>\r\n\r\n", 404},
		{"key with escapes, quotes and invalid UTF-8", "GET /%E2%80%A8%22%5C%FF%3Cimg%3E HTTP/1.1\r\nHost: x\r\n\r\n", 404},
		{"key with an escape byte", "GET /a%1B%5B31mred HTTP/1.1\r\nHost: x\r\n\r\n", 400},
		{"key with a newline", "GET /a%0A%7B%22level%22:%22ERROR%22%7D HTTP/1.1\r\nHost: x\r\n\r\n", 400},
		{"key with markup and a space", "GET /%3Cimg%20src=x%20onerror=alert(1)%3E HTTP/1.1\r\nHost: x\r\n\r\n", 400},
		{"long method", long + " /k HTTP/1.1\r\nHost: x\r\n\r\n", 405},
		{"long method on /", long + " / HTTP/1.1\r\nHost: x\r\n\r\n", 405},
		{"long method on /memc", long + " /memc?key=k HTTP/1.1\r\nHost: x\r\n\r\n", 400},
		{"long exptime", "PUT /k?exptime=" + long + " HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nv", 400},
		{"exptime with CR LF and markup", "PUT /k?exptime=%3Cb%3E%0D%0AX-Injected:%201 HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nv", 400},
		{"long POST op", "POST /k?op=" + long + " HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nv", 400},
		{"long multi-get key", "GET /?key=" + long + " HTTP/1.1\r\nHost: x\r\n\r\n", 400},
		{"long /memc command", "GET /memc?cmd=" + long + "&key=k HTTP/1.1\r\nHost: x\r\n\r\n", 400},
		{"/memc command with markup", "GET /memc?cmd=%3Cscript%3Ealert(1)%3C/script%3E&key=k HTTP/1.1\r\nHost: x\r\n\r\n", 400},
		{"long batch op", batch(strings.Repeat("B", 100000)), 200},
		{"batch op with markup and U+2028", batch("<script>\u2028"), 200},
	}
	for _, logs := range []struct{ level, format string }{{"info", "json"}, {"debug", "json"}, {"debug", "text"}} {
		t.Run(logs.level+"/"+logs.format, func(t *testing.T) {
			g := startGateway(t, map[string]string{
				"MEMCGATE_SERVERS":    memcachedtest.Addrs(mcs),
				"MEMCGATE_LOG_LEVEL":  logs.level,
				"MEMCGATE_LOG_FORMAT": logs.format,
			})
			for i, tt := range tests {
				id := "hs-" + strconv.Itoa(i)
				req := tt.req
				if !strings.Contains(req, "X-Request-Id") {
					first, rest, _ := strings.Cut(req, "\r\n")
					req = first + "\r\nX-Request-Id: " + id + "\r\n" + rest
				}
				resp, body := rawRequest(t, g.DataAddr, req)
				if resp.StatusCode != tt.status {
					t.Errorf("%s: status %d, want %d: %.200s", tt.name, resp.StatusCode, tt.status, body)
				}
				if len(body) > 1000 {
					t.Errorf("%s: an answer of %d bytes quotes what the client sent whole: %.200s…", tt.name, len(body), body)
				}
				for k := range resp.Header {
					if strings.HasPrefix(k, "X-Injected") {
						t.Errorf("%s: header %s injected", tt.name, k)
					}
				}
				if resp.StatusCode >= 400 {
					ct := resp.Header.Get("Content-Type")
					switch {
					case strings.HasPrefix(ct, "text/html"): // /memc's pages, as nginx's
						if strings.Contains(body, "<script") || strings.Contains(body, "<img") {
							t.Errorf("%s: the page carries the client's markup: %.300s", tt.name, body)
						}
					case ct != "text/plain; charset=utf-8" || resp.Header.Get("X-Content-Type-Options") != "nosniff":
						t.Errorf("%s: Content-Type %q, X-Content-Type-Options %q; want text/plain; charset=utf-8 and nosniff", tt.name, ct, resp.Header.Get("X-Content-Type-Options"))
					}
				}
			}
			// A last request whose line, once logged, says the others are.
			rawRequest(t, g.DataAddr, "GET /last HTTP/1.1\r\nHost: x\r\nX-Request-Id: hs-last\r\n\r\n")
			last := `"request_id":"hs-last"`
			if logs.format == "text" {
				last = "request_id=hs-last"
			}
			requests := 0
			for line := range strings.Lines(waitLogged(t, g, last)) {
				rec, err := parseLogLine(logs.format, line)
				if err != nil || !strings.HasSuffix(line, "\n") || strings.Count(line, "\n") != 1 {
					t.Errorf("log line is not one %s record (%v): %.300q", logs.format, err, line)
					continue
				}
				if len(line) > 2000 {
					t.Errorf("log line of %d bytes: %.300s…", len(line), line)
				}
				if rec["msg"] == "request" {
					requests++
					if rec["level"] != "INFO" {
						t.Errorf("access log line at level %v: %.300s", rec["level"], line)
					}
				}
				if rec["msg"] == "forged" {
					t.Errorf("a request ID forged a log line: %.300s", line)
				}
			}
			if want := len(tests) + 1; requests != want {
				t.Errorf("%d access log lines, want one per request, %d", requests, want)
			}
		})
	}
}

// parseLogLine reads one log line of format json or text (slog's
// key=value, a value with spaces or escapes quoted as a Go string).
func parseLogLine(format, line string) (map[string]any, error) {
	rec := map[string]any{}
	if format == "json" {
		err := json.Unmarshal([]byte(line), &rec)
		return rec, err
	}
	rest := strings.TrimSuffix(line, "\n")
	for rest != "" {
		k, v, ok := strings.Cut(rest, "=")
		if !ok || k == "" || strings.ContainsAny(k, " \"") {
			return nil, fmt.Errorf("no key=value at %.40q", rest)
		}
		if strings.HasPrefix(v, `"`) {
			q, err := strconv.QuotedPrefix(v)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", k, err)
			}
			rec[k], _ = strconv.Unquote(q)
			v = v[len(q):]
		} else {
			// A bare value ends at any white space, as a reader splitting
			// fields would end it: a tab a value let through would start
			// a field of its own, level=ERROR say, which the caller sees.
			end := strings.IndexAny(v, " \t")
			if end < 0 {
				end = len(v)
			}
			rec[k] = v[:end]
			v = v[end:]
		}
		if v != "" && v[0] != ' ' && v[0] != '\t' {
			return nil, fmt.Errorf("%s: no space after its value", k)
		}
		rest = strings.TrimLeft(v, " \t")
	}
	return rec, nil
}

// TestMetricsBoundedAgainstClientStrings: what a client chooses (methods,
// paths, status-making requests, /memc commands, batch ops, Hosts) never
// becomes a label value: a flood of 2,000 distinct ones adds no series to
// /metrics, whose size stays put.
func TestMetricsBoundedAgainstClientStrings(t *testing.T) {
	mcs := memcachedtest.StartN(t, 1)
	g := startGateway(t, map[string]string{"MEMCGATE_SERVERS": memcachedtest.Addrs(mcs), "MEMCGATE_ACCESS_LOG": "false"})
	ctx := context.Background()
	send := func(i int) {
		n := strconv.Itoa(i)
		body := `{"ops":[{"op":"op` + n + `","key":"k"}]}`
		for _, req := range []string{
			"M" + n + " /k" + n + " HTTP/1.1\r\nHost: x\r\n\r\n",
			"GET /memc?cmd=c" + n + "&key=k HTTP/1.1\r\nHost: x\r\n\r\n",
			"POST /k?op=o" + n + " HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nv",
			"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body,
			"GET /k" + n + " HTTP/1.1\r\nHost: h" + n + ".example\r\nContent-Type: x/y" + n + "\r\n\r\n",
		} {
			rawRequest(t, g.DataAddr, req)
		}
	}
	// One round first, so that every series a request of each kind makes
	// exists before the baseline.
	send(0)
	before, err := g.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 400; i++ {
		send(i)
	}
	after, err := g.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	series := func(text string) int {
		n := 0
		for line := range strings.Lines(text) {
			if line != "" && line[0] != '#' {
				n++
			}
		}
		return n
	}
	t.Logf("/metrics: %d series, %d bytes before 2,000 distinct client strings; %d series, %d bytes after", series(before), len(before), series(after), len(after))
	if series(after) != series(before) {
		t.Errorf("%d series after the flood, %d before: a client string became a label", series(after), series(before))
	}
	if len(after) > len(before)+len(before)/10 {
		t.Errorf("/metrics grew from %d to %d bytes", len(before), len(after))
	}
}

// TestSecretsNotShown: a tokens file written the wrong way round
// (token:scopes) is refused at the reload, and neither the log nor the
// status page, which shows the reload's error, quotes the token; with
// tokens set in the environment and in the file, /debug/config, /status
// and /debug/nodes show none of them, and /debug/owners answers a key of
// markup as JSON that has none.
func TestSecretsNotShown(t *testing.T) {
	mcs := memcachedtest.StartN(t, 1)
	tokFile := filepath.Join(t.TempDir(), "tokens")
	const admin, envTok, leaked = "admin-token-0123456789", "env-read-token-0123456789", "Zq7s3cretTok3n0042xyW"
	writeAtomic(t, tokFile, "# admin\nadmin:"+admin+"\n")
	g := startGateway(t, map[string]string{
		"MEMCGATE_SERVERS":          memcachedtest.Addrs(mcs),
		"MEMCGATE_AUTH_TOKENS":      "read:" + envTok + ", read+write :" + envTok + "-w",
		"MEMCGATE_AUTH_TOKENS_FILE": tokFile,
		"MEMCGATE_WATCH_INTERVAL":   "100ms",
	})
	get := func(path string) (string, http.Header) {
		t.Helper()
		req, _ := http.NewRequest("GET", g.Admin+path, nil)
		req.Header.Set("Authorization", "Bearer "+admin)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s = %d: %s", path, resp.StatusCode, body)
		}
		return string(body), resp.Header
	}
	config, _ := get("/debug/config")
	if !strings.Contains(config, `"read:REDACTED,read+write :REDACTED"`) {
		t.Errorf("/debug/config does not show MEMCGATE_AUTH_TOKENS redacted with its scopes:\n%s", config)
	}
	owners, hdr := get("/debug/owners?key=%3Cscript%3Ealert(1)%3C/script%3E")
	if ct := hdr.Get("Content-Type"); ct != "application/json" || strings.Contains(owners, "<script") || !strings.Contains(owners, `\u003cscript\u003e`) {
		t.Errorf("/debug/owners of a key of markup: Content-Type %q, body %s; want JSON with the markup escaped", ct, owners)
	}

	writeAtomic(t, tokFile, "admin:"+admin+"\n"+leaked+":read\n")
	logs := waitLogged(t, g, "configuration reload refused")
	page, _ := get("/status")
	nodes, _ := get("/debug/nodes")
	if !strings.Contains(logs, "entry 2") || !strings.Contains(page, "entry 2") {
		t.Errorf("the log or the status page does not name the entry refused")
	}
	for what, text := range map[string]string{"log": logs, "/status": page, "/debug/config": config, "/debug/nodes": nodes} {
		for _, tok := range []string{admin, envTok, leaked} {
			if strings.Contains(text, tok[:12]) {
				t.Errorf("%s shows the token %s…", what, tok[:12])
			}
		}
	}
}
