package deploy

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/gatewaytest"
	"github.com/memcgate/memcgate/test/memcachedtest"
)

// envFile reads KEY=VALUE lines as systemd's EnvironmentFile= does
// (comments and blank lines skipped, optional quotes removed).
func envFile(t *testing.T, rel string) map[string]string {
	t.Helper()
	return envText(t, rel, read(t, rel))
}

// envText is envFile for text, the contents of rel.
func envText(t *testing.T, rel, text string) map[string]string {
	t.Helper()
	env := map[string]string{}
	for i, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Errorf("%s:%d: not KEY=VALUE: %q", rel, i+1, line)
			continue
		}
		env[strings.TrimSpace(k)] = strings.Trim(strings.TrimSpace(v), `"'`)
	}
	return env
}

// unitFile returns section → key → values (a key may repeat).
func unitFile(text string) map[string]map[string][]string {
	out := map[string]map[string][]string{}
	section := ""
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "["):
			section = strings.Trim(line, "[]")
			out[section] = map[string][]string{}
		default:
			k, v, _ := strings.Cut(line, "=")
			out[section][k] = append(out[section][k], v)
		}
	}
	return out
}

const unitRel, envRel = "deploy/systemd/memcgate.service", "deploy/systemd/memcgate.env"

func TestSystemd(t *testing.T) {
	unit := read(t, unitRel)
	svc := unitFile(unit)["Service"]
	if svc == nil {
		t.Fatal("no [Service] section")
	}
	cfg := loadConfig(t, envRel, envFile(t, envRel))

	want := map[string]string{
		"ExecReload":              "/bin/kill -HUP $MAINPID",
		"Restart":                 "on-failure",
		"DynamicUser":             "yes",
		"NoNewPrivileges":         "yes",
		"ProtectSystem":           "strict",
		"ProtectHome":             "yes",
		"PrivateTmp":              "yes",
		"PrivateDevices":          "yes",
		"CapabilityBoundingSet":   "",
		"AmbientCapabilities":     "",
		"MemoryDenyWriteExecute":  "yes",
		"LockPersonality":         "yes",
		"RestrictNamespaces":      "yes",
		"RestrictRealtime":        "yes",
		"RestrictSUIDSGID":        "yes",
		"SystemCallArchitectures": "native",
		"KillSignal":              "SIGTERM",
	}
	for k, v := range want {
		got, ok := svc[k]
		if !ok || got[len(got)-1] != v {
			t.Errorf("%s=%v, want %s=%s", k, got, k, v)
		}
	}
	if fams := svc["RestrictAddressFamilies"]; len(fams) == 0 || !strings.Contains(fams[0], "AF_INET") {
		t.Errorf("RestrictAddressFamilies=%v, want the inet families only", fams)
	}
	if len(svc["SystemCallFilter"]) == 0 {
		t.Error("no SystemCallFilter")
	}
	stop, ok := svc["TimeoutStopSec"]
	if !ok {
		t.Fatal("no TimeoutStopSec (systemd's default 90s hides a stuck shutdown)")
	}
	d, err := parseSeconds(stop[0])
	if err != nil {
		t.Fatalf("TimeoutStopSec=%s: %v", stop[0], err)
	}
	graceCovers(t, unitRel, d, cfg)

	t.Run("systemd-analyze verify", func(t *testing.T) {
		sa := gatewaytest.Optional(t, "systemd-analyze")
		dir := t.TempDir()
		env := filepath.Join(dir, "memcgate.env")
		if err := os.WriteFile(env, []byte(read(t, envRel)), 0o644); err != nil {
			t.Fatal(err)
		}
		u := strings.ReplaceAll(unit, "/usr/local/bin/memcgate", binary)
		u = strings.ReplaceAll(u, "/etc/memcgate/memcgate.env", env)
		path := filepath.Join(dir, "memcgate.service")
		if err := os.WriteFile(path, []byte(u), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := run(t, dir, sa, "verify", path); err != nil || strings.TrimSpace(out) != "" {
			t.Errorf("systemd-analyze verify: %v\n%s", err, out)
		}
		out, err := run(t, dir, sa, "security", "--offline=true", "--threshold=20", path)
		if err != nil {
			t.Errorf("systemd-analyze security: exposure above 2.0 or error: %v\n%s", err, out)
		} else if i := strings.LastIndex(out, "Overall exposure"); i >= 0 {
			t.Log(strings.TrimSpace(out[i:]))
		}
	})
}

// serversLineRE is the MEMCGATE_SERVERS line of memcgate.env.
var serversLineRE = regexp.MustCompile(`(?m)^MEMCGATE_SERVERS=.*$`)

// TestSystemdReload runs the gateway as memcgate.service does (the unit's
// Environment= and EnvironmentFile= lines, the shipped memcgate.env with
// a test memcached for its nodes), then edits memcgate.env as an operator
// would and runs the unit's ExecReload= lines as systemd does: the edit
// must take. With the file given to systemd alone (EnvironmentFile=, read
// once, at start), a reload applied nothing and logged "configuration
// reloaded", and "systemctl reload memcgate" was refused (no
// ExecReload=). A bad edit must fail the reload command, naming the
// mistake, and leave the running nodes: with the signal alone,
// "systemctl reload" succeeded whatever the gateway refused.
func TestSystemdReload(t *testing.T) {
	mcs := memcachedtest.StartN(t, 2)
	svc := unitFile(read(t, unitRel))["Service"]
	const installed = "/etc/memcgate/memcgate.env"
	path := filepath.Join(t.TempDir(), "memcgate.env")
	shipped := read(t, envRel)
	write := func(servers string, extra ...string) {
		t.Helper()
		// Renamed into place, as editors and config management write.
		tmp := path + ".tmp"
		text := serversLineRE.ReplaceAllString(shipped, "MEMCGATE_SERVERS="+servers)
		for _, l := range extra {
			text += l + "\n"
		}
		if err := os.WriteFile(tmp, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	write(mcs[0].Addr)

	// The watch is off so that the reload is the signal's alone.
	env := map[string]string{"MEMCGATE_WATCH_INTERVAL": "0"}
	for _, f := range svc["EnvironmentFile"] {
		if f != installed {
			t.Fatalf("EnvironmentFile=%s: the test knows only %s", f, installed)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		maps.Copy(env, envText(t, f, string(b)))
	}
	for _, e := range svc["Environment"] {
		k, v, _ := strings.Cut(strings.Trim(e, `"`), "=")
		env[k] = strings.ReplaceAll(v, installed, path)
	}
	g := gatewaytest.New(t, binary, env)
	g.Start(t)
	if got := nodeNames(t, g); !slices.Equal(got, []string{mcs[0].Addr}) {
		t.Fatalf("nodes at start = %v, want memcgate.env's %s", got, mcs[0].Addr)
	}

	wantReload := []string{"/usr/local/bin/memcgate check", "/bin/kill -HUP $MAINPID"}
	if r := svc["ExecReload"]; !slices.Equal(r, wantReload) {
		t.Fatalf("ExecReload=%q, want %q: without the signal systemctl reload memcgate is refused, without the check it succeeds on an edit the gateway refuses", r, wantReload)
	}
	// reload runs the ExecReload= lines in order, in the unit's
	// environment, and stops at the first that fails, as systemd does.
	reload := func() (string, error) {
		t.Helper()
		var out strings.Builder
		for _, line := range svc["ExecReload"] {
			line = strings.ReplaceAll(line, "/usr/local/bin/memcgate", binary)
			line = strings.ReplaceAll(line, "$MAINPID", strconv.Itoa(g.Pid()))
			f := strings.Fields(line)
			cmd := exec.Command(f[0], f[1:]...)
			for k, v := range env {
				cmd.Env = append(cmd.Env, k+"="+v)
			}
			b, err := cmd.CombinedOutput()
			out.Write(b)
			if err != nil {
				return out.String(), fmt.Errorf("%s: %w", line, err)
			}
		}
		return out.String(), nil
	}

	write(memcachedtest.Addrs(mcs), "MEMCGATE_TIMOUT=1s")
	out, err := reload()
	if err == nil || !strings.Contains(out, "MEMCGATE_TIMOUT is not a memcgate variable; did you mean MEMCGATE_TIMEOUT?") {
		t.Errorf("reload of a memcgate.env with MEMCGATE_TIMOUT: %v, output %q; want it to fail naming the variable", err, out)
	}
	time.Sleep(500 * time.Millisecond) // a signal sent all the same would have been taken by now
	if got := nodeNames(t, g); !slices.Equal(got, []string{mcs[0].Addr}) {
		t.Fatalf("nodes after a refused reload = %v, want %s still", got, mcs[0].Addr)
	}

	write(memcachedtest.Addrs(mcs))
	if out, err := reload(); err != nil || !strings.Contains(out, "configuration ok") {
		t.Fatalf("reload of a good memcgate.env: %v, output %q", err, out)
	}
	want := []string{mcs[0].Addr, mcs[1].Addr}
	deadline := time.Now().Add(30 * time.Second)
	for got := nodeNames(t, g); !slices.Equal(got, want); got = nodeNames(t, g) {
		if time.Now().After(deadline) {
			t.Fatalf("nodes 30 s after memcgate.env listed %v and SIGHUP = %v: the edit was not applied", want, got)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// nodeNames returns the nodes /debug/nodes lists, in order.
func nodeNames(t *testing.T, g *gatewaytest.Gateway) []string {
	t.Helper()
	resp, err := http.Get("http://" + g.AdminAddr + "/debug/nodes")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var nodes []struct{ Node string }
	if err := json.NewDecoder(resp.Body).Decode(&nodes); err != nil {
		t.Fatalf("/debug/nodes: %v", err)
	}
	names := make([]string, len(nodes))
	for i, n := range nodes {
		names[i] = n.Node
	}
	return names
}
