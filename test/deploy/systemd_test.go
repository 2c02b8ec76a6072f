package deploy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memcgate/memcgate/test/gatewaytest"
)

// envFile reads KEY=VALUE lines as systemd's EnvironmentFile= does
// (comments and blank lines skipped, optional quotes removed).
func envFile(t *testing.T, rel string) map[string]string {
	t.Helper()
	env := map[string]string{}
	for i, line := range strings.Split(read(t, rel), "\n") {
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

func TestSystemd(t *testing.T) {
	const unitRel, envRel = "deploy/systemd/memcgate.service", "deploy/systemd/memcgate.env"
	unit := read(t, unitRel)
	svc := unitFile(unit)["Service"]
	if svc == nil {
		t.Fatal("no [Service] section")
	}
	cfg := loadConfig(t, envRel, envFile(t, envRel))

	want := map[string]string{
		"EnvironmentFile":         "/etc/memcgate/memcgate.env",
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
