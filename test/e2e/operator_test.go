package e2e

import (
	"encoding/json"
	"net/http"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/gatewaytest"
	"github.com/memcgate/memcgate/test/memcachedtest"
)

// TestVersion: memcgate -version and memcgate version print one line
// naming the version, the VCS revision and the Go version, and the
// running binary exports the same as memcgate_build_info.
func TestVersion(t *testing.T) {
	t.Parallel() // its own gateway and memcached
	var line string
	for _, arg := range []string{"-version", "version"} {
		out, err := exec.Command(binary, arg).CombinedOutput()
		if err != nil {
			t.Fatalf("memcgate %s: %v\n%s", arg, err, out)
		}
		if !regexp.MustCompile(`^memcgate \S+ \(revision \S+, go1\.\d+\S*, \w+/\w+\)\n$`).Match(out) {
			t.Errorf("memcgate %s printed %q, want one line: memcgate VERSION (revision REV, goX.Y, os/arch)", arg, out)
		}
		line = string(out)
	}
	mcs := memcachedtest.StartN(t, 1)
	g := startGateway(t, map[string]string{"MEMCGATE_SERVERS": memcachedtest.Addrs(mcs)})
	text, err := g.Metrics(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^memcgate_build_info\{goversion="([^"]+)",revision="([^"]+)",version="([^"]+)"\} 1$`).FindStringSubmatch(text)
	if m == nil {
		t.Fatalf("/metrics has no memcgate_build_info{goversion,revision,version} 1")
	}
	if want := "memcgate " + m[3] + " (revision " + m[2] + ", " + m[1] + ","; !strings.HasPrefix(line, want) {
		t.Errorf("memcgate_build_info says %q, -version %q", want, line)
	}
	for _, want := range []string{`memcgate_config_reloads_total{result="ok"} 0`, `memcgate_config_reloads_total{result="error"} 0`} {
		if !strings.Contains(text, want+"\n") {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// TestDebugConfig: /debug/config on the admin listener shows the
// configuration in force, never a token, and only with the admin scope.
func TestDebugConfig(t *testing.T) {
	const readTok, adminTok = "reader-token-0123456789", "admin-token-0123456789"
	mcs := memcachedtest.StartN(t, 1)
	g := startGateway(t, map[string]string{
		"MEMCGATE_SERVERS":         memcachedtest.Addrs(mcs),
		"MEMCGATE_AUTH_TOKENS":     "read:" + readTok + ",admin:" + adminTok,
		"MEMCGATE_REQUEST_TIMEOUT": "900ms", // under 2 × 500ms: a warning
		"MEMCGATE_HEALTH_INTERVAL": "1s",    // above HEALTH_TIMEOUT: no warning of its own
	})
	get := func(tok string) *http.Response {
		req, err := http.NewRequestWithContext(t.Context(), "GET", g.Admin+"/debug/config", nil)
		if err != nil {
			t.Fatal(err)
		}
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	for tok, want := range map[string]int{"": 401, readTok: 403} {
		if resp := get(tok); resp.StatusCode != want {
			t.Errorf("/debug/config with token %q = %d, want %d", tok, resp.StatusCode, want)
		}
	}
	resp := get(adminTok)
	var raw json.RawMessage
	if err := json.NewDecoder(resp.Body).Decode(&raw); err != nil || resp.StatusCode != 200 {
		t.Fatalf("/debug/config = %d: %v", resp.StatusCode, err)
	}
	if strings.Contains(string(raw), readTok) || strings.Contains(string(raw), adminTok) {
		t.Fatalf("/debug/config shows a token:\n%s", raw)
	}
	var dc struct {
		Build    struct{ Version, Revision, GoVersion string }
		Values   map[string]string
		Changed  []string
		Warnings []string
		Derived  struct {
			MaxBufferedBytes int64 `json:"max_buffered_bytes"`
		}
	}
	if err := json.Unmarshal(raw, &dc); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{
		"MEMCGATE_SERVERS":     memcachedtest.Addrs(mcs),
		"MEMCGATE_AUTH_TOKENS": "read:REDACTED,admin:REDACTED",
		"MEMCGATE_TIMEOUT":     "500ms",
		"MEMCGATE_LISTEN_ADDR": g.DataAddr,
	} {
		if got := dc.Values[name]; got != want {
			t.Errorf("/debug/config values.%s = %q, want %q", name, got, want)
		}
	}
	if len(dc.Warnings) != 1 || !strings.Contains(dc.Warnings[0], "MEMCGATE_REQUEST_TIMEOUT (900ms)") {
		t.Errorf("/debug/config warnings = %q, want the REQUEST_TIMEOUT one", dc.Warnings)
	}
	if dc.Derived.MaxBufferedBytes <= 0 || dc.Build.Version == "" {
		t.Errorf("/debug/config build %+v, derived %+v: want a version and the byte budget in force", dc.Build, dc.Derived)
	}
	// The log is written in batches (every 200ms at most).
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(g.Logs(), "configuration warning"); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Errorf("the REQUEST_TIMEOUT warning was not logged at start:\n%s", gatewaytest.Tail(g.Logs(), 2000))
			break
		}
	}
}

// TestConfigMistakes: the binary refuses to start on a misspelt or empty
// variable and on a bad listen address, naming each, all at once.
func TestConfigMistakes(t *testing.T) {
	cmd := exec.Command(binary)
	cmd.Env = []string{"MEMCGATE_SERVRES=127.0.0.1:11211", "MEMCGATE_SERVERS=", "MEMCGATE_LISTEN_ADDR=foo", "MEMCGATE_READ_ONLY=yes"}
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("memcgate started with a misspelt variable:\n%s", out)
	}
	for _, want := range []string{
		"MEMCGATE_SERVRES is not a memcgate variable; did you mean MEMCGATE_SERVERS?",
		"MEMCGATE_SERVERS: is set but empty",
		`MEMCGATE_LISTEN_ADDR: "foo" is not host:port`,
		`MEMCGATE_READ_ONLY: "yes" is not true or false`,
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// TestFitProcsIgnoredIsWarned: MEMCGATE_FIT_PROCS=true does nothing while
// GOMAXPROCS is set (the runtime's number stands), and the start says
// so in a configuration warning naming both, rather than leaving the
// operator to find fit_procs false on the start line.
func TestFitProcsIgnoredIsWarned(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		warn bool
	}{
		{name: "with GOMAXPROCS", env: map[string]string{"MEMCGATE_FIT_PROCS": "true", "GOMAXPROCS": "2"}, warn: true},
		{name: "without GOMAXPROCS", env: map[string]string{"MEMCGATE_FIT_PROCS": "true"}},
		{name: "FIT_PROCS unset", env: map[string]string{"GOMAXPROCS": "2"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mc := memcachedtest.Start(t)
			env := map[string]string{"MEMCGATE_SERVERS": mc.Addr}
			for k, v := range tt.env {
				env[k] = v
			}
			g := startGateway(t, env)
			const want = `MEMCGATE_FIT_PROCS=true is ignored: GOMAXPROCS=2 sets the processors`
			deadline := time.Now().Add(5 * time.Second) // the log is written every 200 ms
			for !strings.Contains(g.Logs(), `"msg":"memcgate started"`) && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			logs := g.Logs()
			if got := strings.Contains(logs, want); got != tt.warn {
				t.Errorf("log has %q: %v, want %v", want, got, tt.warn)
			}
		})
	}
}
