package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// fakeTools writes go, gofmt and bash scripts into a directory that
// record each call (their arguments, a line each) in a file and exit
// with fail's status for a call whose arguments contain fail's key (0
// otherwise), and returns an environment with that directory first on
// PATH and the file.
func fakeTools(t *testing.T, fail map[string]int) ([]string, string) {
	t.Helper()
	dir := t.TempDir()
	calls := filepath.Join(dir, "calls")
	for _, name := range []string{"go", "gofmt", "bash"} {
		script := "#!/bin/sh\necho \"" + name + " $*\" >> " + calls + "\n"
		for key, code := range fail {
			script += "case \"$*\" in *'" + key + "'*) exit " + strconv.Itoa(code) + ";; esac\n"
		}
		script += "exit 0\n"
		if err := os.WriteFile(filepath.Join(dir, name), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return append(os.Environ(), "PATH="+dir+":"+os.Getenv("PATH")), calls
}

// TestMakeDryRun: make -n test and make -n run print what they would
// run and run none of it, as a user who dry-runs them to see what CI
// does expects; make test still runs every part and fails when any
// fails. make -n runs every recipe line that names $(MAKE), and make
// test's last line called make fuzz: make -n test ran the upstream
// tests written on that line.
func TestMakeDryRun(t *testing.T) {
	mk, err := exec.LookPath("make")
	if err != nil {
		t.Skipf("make not installed: %v", err)
	}
	makeIn := func(t *testing.T, env []string, args ...string) (string, error) {
		t.Helper()
		cmd := exec.Command(mk, args...)
		cmd.Dir, cmd.Env = root, env
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	recorded := func(t *testing.T, calls string) string {
		t.Helper()
		b, err := os.ReadFile(calls)
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		return string(b)
	}
	for _, target := range []string{"test", "run"} {
		t.Run("make -n "+target, func(t *testing.T) {
			env, calls := fakeTools(t, nil)
			out, err := makeIn(t, env, "-n", target)
			if err != nil {
				t.Fatalf("make -n %s: %v\n%s", target, err, out)
			}
			if ran := recorded(t, calls); ran != "" {
				t.Errorf("make -n %s ran:\n%s", target, ran)
			}
			if target == "test" && !strings.Contains(out, "fuzz.sh") {
				t.Errorf("make -n test does not print the fuzz run:\n%s", out)
			}
		})
	}
	for _, tt := range []struct {
		name string
		fail map[string]int
		ok   bool
	}{
		{"every part passes", nil, true},
		{"the package tests fail", map[string]int{"-timeout 15m": 1}, false},
		{"the fuzz run fails", map[string]int{"fuzz.sh": 1}, false},
		{"the fuzz run beside the tests fails", map[string]int{"fuzz.sh 20000x ./": 1}, false},
		{"the fuzz run after the abuse suite fails", map[string]int{"fuzz.sh 20000x --not": 1}, false},
		{"the abuse suite fails", map[string]int{"./test/abuse": 1}, false},
		{"upstream on gomemcache's pool fails", map[string]int{"pipeline-conns=0": 1}, false},
	} {
		t.Run("make test: "+tt.name, func(t *testing.T) {
			env, calls := fakeTools(t, tt.fail)
			out, err := makeIn(t, env, "test", "FUZZTIME=20000x") // the budget the keys name
			if (err == nil) != tt.ok {
				t.Fatalf("make test: %v, want it to pass: %v\n%s", err, tt.ok, out)
			}
			ran := recorded(t, calls)
			for _, part := range []string{"-timeout 15m", "test/scripts/fuzz.sh 20000x ./", "test/scripts/fuzz.sh 20000x --not ./", "./upstream -args -pipeline-conns=0", "./test/abuse"} {
				if !strings.Contains(ran, part) {
					t.Errorf("make test did not run %q; it ran:\n%s", part, ran)
				}
			}
		})
	}
}
