// Package deploy checks the shipped deployment files (Dockerfile,
// deploy/compose, deploy/kubernetes, deploy/systemd, deploy/nginx,
// deploy/haproxy, deploy/monitoring) against the binary: every file parses,
// every MEMCGATE_ variable exists and every configuration they set loads,
// grace periods cover the drain, probes hit the admin port, and every metric
// the dashboard and alerts use is one the binary exports; the metrics the
// README and docs/ name, and the examples they give, against the binary
// and make run's script; and the Makefile's test and run targets, dry-run
// and run over recording stand-ins for go, gofmt and bash. None of it needs
// Docker or Kubernetes. kubectl and systemd-analyze are used when
// installed; haproxy and promtool are installed by make test, so a missing
// one skips only where tests may skip (gatewaytest.Tool).
package deploy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/memcgate/memcgate/config"
	"github.com/memcgate/memcgate/test/gatewaytest"
)

// root is the repository, relative to this package.
const root = "../.."

var binary string

func TestMain(m *testing.M) { gatewaytest.Main(m, false, &binary) }

// deployFiles returns every regular file under deploy/, relative to root.
func deployFiles(t *testing.T) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(filepath.Join(root, "deploy"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			rel, _ := filepath.Rel(root, p)
			out = append(out, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func read(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// yamlDocs decodes every document of a (multi-document) YAML file.
func yamlDocs(data string) ([]*yaml.Node, error) {
	dec := yaml.NewDecoder(strings.NewReader(data))
	var docs []*yaml.Node
	for {
		var n yaml.Node
		err := dec.Decode(&n)
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", len(docs)+1, err)
		}
		docs = append(docs, &n)
	}
}

func decodeYAML(t *testing.T, rel string, v any) {
	t.Helper()
	if err := yaml.Unmarshal([]byte(read(t, rel)), v); err != nil {
		t.Fatalf("%s: %v", rel, err)
	}
}

func TestFilesParse(t *testing.T) {
	n := 0
	for _, rel := range deployFiles(t) {
		switch filepath.Ext(rel) {
		case ".yaml", ".yml":
			docs, err := yamlDocs(read(t, rel))
			if err != nil {
				t.Errorf("%s: %v", rel, err)
				continue
			}
			if len(docs) == 0 {
				t.Errorf("%s: no YAML document", rel)
			}
			n++
		case ".json":
			var v any
			if err := json.Unmarshal([]byte(read(t, rel)), &v); err != nil {
				t.Errorf("%s: %v", rel, err)
			}
			n++
		}
	}
	if n < 10 {
		t.Errorf("parsed only %d YAML/JSON files under deploy/; the walk is broken", n)
	}
}

var varRE = regexp.MustCompile(`MEMCGATE_[A-Z0-9_]*[A-Z0-9]`)

// TestVariablesExist: a misspelt variable is silently ignored by the
// binary, so every MEMCGATE_ name in deploy/ and the Dockerfile must be one
// config.Vars() knows.
func TestVariablesExist(t *testing.T) {
	known := map[string]bool{}
	for _, v := range config.Vars() {
		known[v.Name] = true
	}
	seen := 0
	for _, rel := range append(deployFiles(t), "Dockerfile") {
		for i, line := range strings.Split(read(t, rel), "\n") {
			for _, name := range varRE.FindAllString(line, -1) {
				seen++
				if !known[name] {
					t.Errorf("%s:%d: %s is not a memcgate variable (memcgate -help lists them)", rel, i+1, name)
				}
			}
		}
	}
	if seen < 20 {
		t.Errorf("found only %d MEMCGATE_ names; the scan is broken", seen)
	}
}

// loadConfig runs the variables through the binary's own parser and
// validation, so a value it would refuse at start fails here.
func loadConfig(t *testing.T, where string, env map[string]string) config.Config {
	t.Helper()
	for k := range env {
		if !strings.HasPrefix(k, config.Prefix) {
			t.Errorf("%s: %s is not a MEMCGATE_ variable", where, k)
		}
	}
	cfg, err := config.Load(env)
	if err != nil {
		t.Fatalf("%s: the gateway would refuse this configuration:\n%v", where, err)
	}
	return cfg
}

// logStopWait is how long the gateway waits at exit for a slow stderr to
// take its last log lines (cmd/memcgate's logStopWait).
const logStopWait = 5 * time.Second

// graceCovers checks that a stop timeout leaves the drain, the shutdown
// and the last log lines their whole time, with a margin.
func graceCovers(t *testing.T, where string, grace time.Duration, cfg config.Config) {
	t.Helper()
	need := cfg.DrainDelay + cfg.ShutdownTimeout + logStopWait
	if grace <= need {
		t.Errorf("%s: stop grace %s must exceed MEMCGATE_DRAIN_DELAY + MEMCGATE_SHUTDOWN_TIMEOUT + 5 s for the log = %s", where, grace, need)
	}
}

// parseSeconds reads systemd/compose style durations: "30", "30s", "1min", "1m30s".
func parseSeconds(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, errors.New("empty duration")
	}
	if strings.Trim(s, "0123456789") == "" {
		s += "s"
	}
	s = strings.ReplaceAll(strings.ReplaceAll(s, "min", "m"), "sec", "s")
	s = strings.ReplaceAll(s, " ", "")
	return time.ParseDuration(s)
}

func run(t *testing.T, dir, name string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

func keys[M ~map[string]V, V any](m M) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// setting is one MEMCGATE_ variable a shipped file sets.
type setting struct {
	line        int // 1-based
	name, value string
	reason      bool // a comment in its paragraph says why it is set
}

// Where each kind of file sets a variable.
var (
	envLineRE     = regexp.MustCompile(`^(MEMCGATE_[A-Z0-9_]+)=(.*)$`)                                               // KEY=VALUE files
	yamlLineRE    = regexp.MustCompile(`^(\s*)(MEMCGATE_[A-Z0-9_]+):\s*(.*?)\s*$`)                                   // a YAML mapping
	exportLineRE  = regexp.MustCompile(`^\s*export (MEMCGATE_[A-Z0-9_]+)=(?:\$\{MEMCGATE_[A-Z0-9_]+:-(.*)\}|(.*))$`) // shell
	dockerLineRE  = regexp.MustCompile(`^(?:ENV\s+)?(MEMCGATE_[A-Z0-9_]+)=(\S*?)\s*\\?$`)                            // Dockerfile ENV
	unitEnvLineRE = regexp.MustCompile(`^Environment="?(MEMCGATE_[A-Z0-9_]+)=(.*?)"?$`)                              // systemd unit
)

// fileSettings returns the MEMCGATE_ variables file rel sets (not those
// its comments mention), each with whether a comment in its paragraph
// (the lines above it up to a blank one, and in YAML up to its parent
// key) gives a reason.
func fileSettings(t *testing.T, rel string) []setting {
	t.Helper()
	return settingsIn(rel, read(t, rel))
}

// settingsIn is fileSettings for text, the contents of rel.
func settingsIn(rel, text string) []setting {
	lines := strings.Split(text, "\n")
	var out []setting
	for i, line := range lines {
		var s setting
		indent := -1 // YAML only: the key's indentation
		switch ext := filepath.Ext(rel); {
		case ext == ".env":
			if m := envLineRE.FindStringSubmatch(line); m != nil {
				s.name, s.value = m[1], strings.Trim(m[2], `"'`)
			}
		case ext == ".yaml" || ext == ".yml":
			if m := yamlLineRE.FindStringSubmatch(line); m != nil {
				s.name, s.value, indent = m[2], strings.Trim(m[3], `"'`), len(m[1])
			}
		case ext == ".sh":
			if m := exportLineRE.FindStringSubmatch(line); m != nil {
				s.name, s.value = m[1], m[2]+m[3]
			}
		case ext == ".service":
			if m := unitEnvLineRE.FindStringSubmatch(line); m != nil {
				s.name, s.value = m[1], m[2]
			}
		case filepath.Base(rel) == "Dockerfile":
			if m := dockerLineRE.FindStringSubmatch(strings.TrimSpace(line)); m != nil {
				s.name, s.value = m[1], strings.Trim(m[2], `"`)
			}
		}
		if s.name == "" {
			continue
		}
		s.line = i + 1
		for j := i - 1; j >= 0; j-- {
			above := lines[j]
			trimmed := strings.TrimSpace(above)
			if trimmed == "" {
				break
			}
			if strings.HasPrefix(trimmed, "#") {
				s.reason = true
				break
			}
			if indent >= 0 && len(above)-len(strings.TrimLeft(above, " ")) < indent {
				break // the parent key: the comments above it are its own
			}
		}
		out = append(out, s)
	}
	return out
}

// TestSettingsDifferFromDefaults: a shipped file sets a variable only to
// change its default, and says why. A variable set to its default hides
// a later change of the default (deploy/ kept MAX_IN_FLIGHT_PER_NODE=256
// after the default became 4096) and makes every reader wonder what it is
// for.
func TestSettingsDifferFromDefaults(t *testing.T) {
	defaults := loadConfig(t, "defaults", map[string]string{}).Effective().Values
	seen := 0
	for _, rel := range append(deployFiles(t), "Dockerfile") {
		settings := fileSettings(t, rel)
		if len(settings) == 0 {
			continue
		}
		env := map[string]string{}
		for _, s := range settings {
			env[s.name] = s.value
		}
		values := loadConfig(t, rel, env).Effective().Values
		for _, s := range settings {
			seen++
			if values[s.name] == defaults[s.name] {
				t.Errorf("%s:%d: %s=%s is the default; remove it (memcgate -help lists the defaults)", rel, s.line, s.name, s.value)
			}
			if !s.reason {
				t.Errorf("%s:%d: %s is set with no comment above it saying why it differs from the default (%s)", rel, s.line, s.name, defaults[s.name])
			}
		}
	}
	if seen < 6 {
		t.Errorf("found only %d settings in deploy/ and the Dockerfile; the scan is broken", seen)
	}
}

// TestFileSettings checks the scan itself on each kind of file.
func TestFileSettings(t *testing.T) {
	tests := []struct {
		rel, text string
		want      []setting
	}{
		{"x.env", "# why\nMEMCGATE_SERVERS=a:1\n\nMEMCGATE_TIMEOUT=1s\n# MEMCGATE_KEEPALIVE=3\n",
			[]setting{{2, "MEMCGATE_SERVERS", "a:1", true}, {4, "MEMCGATE_TIMEOUT", "1s", false}}},
		{"c.yaml", "x:\n  # about x\n  environment:\n    MEMCGATE_SERVERS: \"a:1\"\n    # why\n    MEMCGATE_ADMIN_ADDR: \":9090\"\n",
			[]setting{{4, "MEMCGATE_SERVERS", "a:1", false}, {6, "MEMCGATE_ADMIN_ADDR", ":9090", true}}},
		{"r.sh", "# why\nexport MEMCGATE_LOG_FORMAT=${MEMCGATE_LOG_FORMAT:-text}\nexport MEMCGATE_X=1\n",
			[]setting{{2, "MEMCGATE_LOG_FORMAT", "text", true}, {3, "MEMCGATE_X", "1", true}}},
		{"Dockerfile", "# why\nENV MEMCGATE_A=1 \\\n    MEMCGATE_B=2\n",
			[]setting{{2, "MEMCGATE_A", "1", true}, {3, "MEMCGATE_B", "2", true}}},
	}
	for _, tt := range tests {
		if got := settingsIn(tt.rel, tt.text); fmt.Sprint(got) != fmt.Sprint(tt.want) {
			t.Errorf("fileSettings(%q) = %+v, want %+v", tt.text, got, tt.want)
		}
	}
}
