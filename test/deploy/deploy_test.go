// Package deploy checks the shipped deployment files (Dockerfile,
// deploy/compose, deploy/kubernetes, deploy/systemd, deploy/nginx,
// deploy/haproxy, deploy/monitoring) against the binary: every file parses,
// every MEMCGATE_ variable exists and every configuration they set loads,
// grace periods cover the drain, probes hit the admin port, and every metric
// the dashboard and alerts use is one the binary exports. None of it needs
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

// graceCovers checks that a stop timeout leaves the drain and the shutdown
// their whole time, with a margin.
func graceCovers(t *testing.T, where string, grace time.Duration, cfg config.Config) {
	t.Helper()
	need := cfg.DrainDelay + cfg.ShutdownTimeout
	if grace <= need {
		t.Errorf("%s: stop grace %s must exceed MEMCGATE_DRAIN_DELAY + MEMCGATE_SHUTDOWN_TIMEOUT = %s", where, grace, need)
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
