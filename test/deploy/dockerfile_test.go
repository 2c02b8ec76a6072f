package deploy

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/memcachedtest"
)

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	line int
	cmd  string // upper case
	args string
}

type stage struct {
	image, name string
	ins         []instruction
}

func parseDockerfile(t *testing.T, text string) []stage {
	t.Helper()
	var stages []stage
	var cur strings.Builder
	start := 0
	flush := func() {
		s := strings.TrimSpace(cur.String())
		cur.Reset()
		if s == "" {
			return
		}
		cmd, args, _ := strings.Cut(s, " ")
		in := instruction{line: start, cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args)}
		if in.cmd == "FROM" {
			f := strings.Fields(in.args)
			f = slices.DeleteFunc(f, func(s string) bool { return strings.HasPrefix(s, "--") })
			st := stage{image: f[0]}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				st.name = f[2]
			}
			stages = append(stages, st)
			return
		}
		if len(stages) == 0 {
			if in.cmd != "ARG" {
				t.Errorf("Dockerfile:%d: %s before the first FROM", in.line, in.cmd)
			}
			return
		}
		stages[len(stages)-1].ins = append(stages[len(stages)-1].ins, in)
	}
	for i, line := range strings.Split(text, "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") {
			continue // comments, parser directives
		}
		if cur.Len() == 0 {
			start = i + 1
		}
		if body, ok := strings.CutSuffix(trimmed, "\\"); ok {
			cur.WriteString(body + " ")
			continue
		}
		cur.WriteString(trimmed)
		flush()
	}
	flush()
	return stages
}

func (s stage) all(cmd string) []instruction {
	var out []instruction
	for _, in := range s.ins {
		if in.cmd == cmd {
			out = append(out, in)
		}
	}
	return out
}

func execForm(t *testing.T, in instruction, s string) []string {
	t.Helper()
	var v []string
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Errorf("Dockerfile:%d: %s %s is not in exec (JSON array) form: %v", in.line, in.cmd, s, err)
	}
	return v
}

func TestDockerfile(t *testing.T) {
	stages := parseDockerfile(t, read(t, "Dockerfile"))
	if len(stages) < 2 {
		t.Fatalf("Dockerfile has %d stages, want a build stage and a final one", len(stages))
	}
	build, final := stages[0], stages[len(stages)-1]

	t.Run("build stage", func(t *testing.T) {
		if !strings.EqualFold(build.name, "build") || !strings.HasPrefix(build.image, "golang:1.26") {
			t.Errorf("first stage is FROM %s AS %q, want FROM golang:1.26 AS build", build.image, build.name)
		}
		var goBuild string
		for _, in := range build.all("RUN") {
			if strings.Contains(in.args, "go build") {
				goBuild = in.args
			}
		}
		for _, want := range []string{"CGO_ENABLED=0", "-trimpath", "./cmd/memcgate", "-o /out/memcgate"} {
			if !strings.Contains(goBuild, want) {
				t.Errorf("the go build RUN lacks %q: %s", want, goBuild)
			}
		}
		t.Run("version stamp", func(t *testing.T) { versionStamp(t, build, goBuild) })
	})

	t.Run("final stage", func(t *testing.T) {
		if strings.HasPrefix(final.image, "golang") || final.name != "" && final.name == build.name {
			t.Errorf("final stage is FROM %s; want a minimal image, not the builder", final.image)
		}
		copied := false
		for _, in := range final.all("COPY") {
			if strings.Contains(in.args, "--from=build") && strings.HasSuffix(in.args, "/out/memcgate /memcgate") {
				copied = true
			}
		}
		if !copied {
			t.Error("final stage does not COPY --from=build /out/memcgate /memcgate")
		}
		users := final.all("USER")
		if len(users) == 0 {
			t.Fatal("final stage has no USER: the image would run as root")
		}
		user, _, _ := strings.Cut(users[len(users)-1].args, ":")
		if user == "root" || user == "0" || user == "" {
			t.Errorf("USER %s is root", users[len(users)-1].args)
		}
		if !regexp.MustCompile(`^[0-9]+$`).MatchString(user) {
			t.Errorf("USER %s: use a numeric uid, or Kubernetes runAsNonRoot cannot verify it", user)
		}

		env := map[string]string{}
		for _, in := range final.all("ENV") {
			for _, kv := range strings.Fields(in.args) {
				k, v, ok := strings.Cut(kv, "=")
				if !ok {
					t.Errorf("Dockerfile:%d: ENV %s: use key=value", in.line, in.args)
				}
				env[k] = strings.Trim(v, `"`)
			}
		}
		if env["MEMCGATE_ADMIN_ADDR"] != ":9090" {
			t.Errorf("ENV MEMCGATE_ADMIN_ADDR = %q, want :9090 so probes can reach the admin listener", env["MEMCGATE_ADMIN_ADDR"])
		}
		loadConfig(t, "Dockerfile ENV", env)

		var exposed []string
		for _, in := range final.all("EXPOSE") {
			exposed = append(exposed, strings.Fields(in.args)...)
		}
		for _, p := range []string{"8080", "9090"} {
			if !slices.Contains(exposed, p) && !slices.Contains(exposed, p+"/tcp") {
				t.Errorf("EXPOSE lacks %s (have %v)", p, exposed)
			}
		}

		hcs := final.all("HEALTHCHECK")
		if len(hcs) != 1 {
			t.Fatalf("final stage has %d HEALTHCHECK instructions, want 1", len(hcs))
		}
		opts, cmd, ok := strings.Cut(hcs[0].args, "CMD ")
		if !ok {
			t.Fatalf("HEALTHCHECK %s has no CMD", hcs[0].args)
		}
		if got := execForm(t, hcs[0], strings.TrimSpace(cmd)); !slices.Equal(got, []string{"/memcgate", "healthcheck", "/readyz"}) {
			t.Errorf("HEALTHCHECK CMD %v, want [/memcgate healthcheck /readyz] (the image has no shell or curl)", got)
		}
		// The subcommand gives up after 3s; Docker's timeout must be longer
		// or a slow answer reads as a hung check.
		if m := regexp.MustCompile(`--timeout=(\S+)`).FindStringSubmatch(opts); m == nil {
			t.Error("HEALTHCHECK has no --timeout (Docker's default 30s)")
		} else if d, err := time.ParseDuration(m[1]); err != nil || d <= 3*time.Second {
			t.Errorf("HEALTHCHECK --timeout=%s: want more than the subcommand's own 3s", m[1])
		}

		eps := final.all("ENTRYPOINT")
		if len(eps) == 0 || !slices.Equal(execForm(t, eps[len(eps)-1], eps[len(eps)-1].args), []string{"/memcgate"}) {
			t.Errorf(`ENTRYPOINT must be ["/memcgate"] (exec form: SIGTERM must reach the binary, not a shell)`)
		}
	})
}

// TestHealthcheckSubcommand runs the command the image's HEALTHCHECK runs,
// against a gateway whose admin listener is on :port like the image's
// MEMCGATE_ADMIN_ADDR=:9090: 200 exits 0; 503 exits non-zero saying why
// (docker inspect shows it); no listener exits non-zero.
func TestHealthcheckSubcommand(t *testing.T) {
	mc := memcachedtest.Start(t)
	g := startGateway(t, []*memcachedtest.Server{mc})
	env := []string{"MEMCGATE_ADMIN_ADDR=:" + itoa(g.AdminPort)}
	cmd := exec.Command(binary, "healthcheck", "/readyz")
	cmd.Env = env
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("memcgate healthcheck /readyz against a ready gateway: %v\n%s", err, out)
	}
	mc.Kill()
	const want = "healthcheck: /readyz answered 503 Service Unavailable: not ready: no memcached node is up (0 of 1)\n"
	var out []byte
	for deadline := time.Now().Add(30 * time.Second); ; {
		cmd = exec.Command(binary, "healthcheck", "/readyz")
		cmd.Env = env
		var err error
		if out, err = cmd.CombinedOutput(); err != nil && strings.HasSuffix(string(out), want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("memcgate healthcheck /readyz with its memcached killed: %q, want a failure ending %q", out, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
	g.Kill()
	cmd = exec.Command(binary, "healthcheck", "/readyz")
	cmd.Env = env
	if out, err := cmd.CombinedOutput(); err == nil {
		t.Fatalf("memcgate healthcheck succeeded with no gateway running:\n%s", out)
	}
}

// TestDockerignore keeps the build context complete: nothing the build of
// cmd/memcgate reads may be excluded.
func TestDockerignore(t *testing.T) {
	var patterns []string
	for _, line := range strings.Split(read(t, ".dockerignore"), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			patterns = append(patterns, line)
		}
	}
	out, err := exec.Command("go", "list", "-deps", "-f",
		`{{if .Module}}{{if eq .Module.Path "github.com/memcgate/memcgate"}}{{$d := .Dir}}{{range .GoFiles}}{{$d}}/{{.}} {{end}}{{range .EmbedFiles}}{{$d}}/{{.}} {{end}}{{end}}{{end}}`,
		"github.com/memcgate/memcgate/cmd/memcgate").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}
	needed := []string{"go.mod", "go.sum"}
	for _, f := range strings.Fields(string(out)) {
		rel, err := filepath.Rel(abs, f)
		if err != nil {
			t.Fatal(err)
		}
		needed = append(needed, filepath.ToSlash(rel))
	}
	if len(needed) < 10 {
		t.Fatalf("go list found only %v", needed)
	}
	for _, f := range needed {
		if dockerIgnored(patterns, f) {
			t.Errorf(".dockerignore excludes %s, which the build needs", f)
		}
	}
	for _, f := range []string{".git/config", "bin/memcgate", "gateway/gateway_test.go", "deploy/compose/compose.yaml"} {
		if !dockerIgnored(patterns, f) {
			t.Errorf(".dockerignore lets %s into the build context", f)
		}
	}
}

// dockerIgnored applies .dockerignore rules as Docker does: patterns match
// the path or one of its parent directories, ** spans directories, and the
// last matching pattern wins (! re-includes).
func dockerIgnored(patterns []string, path string) bool {
	ignored := false
	for _, p := range patterns {
		exclude := !strings.HasPrefix(p, "!")
		p = strings.TrimPrefix(filepath.ToSlash(filepath.Clean(strings.TrimPrefix(p, "!"))), "/")
		re := regexp.MustCompile("^" + globRegexp(p) + "$")
		for q := path; q != "." && q != "/" && q != ""; q = filepath.ToSlash(filepath.Dir(q)) {
			if re.MatchString(q) {
				ignored = exclude
				break
			}
		}
	}
	return ignored
}

func globRegexp(p string) string {
	var b strings.Builder
	for i := 0; i < len(p); i++ {
		switch c := p[i]; {
		case strings.HasPrefix(p[i:], "**/"):
			b.WriteString("(.*/)?")
			i += 2
		case strings.HasPrefix(p[i:], "**"):
			b.WriteString(".*")
			i++
		case c == '*':
			b.WriteString("[^/]*")
		case c == '?':
			b.WriteString("[^/]")
		default:
			b.WriteString(regexp.QuoteMeta(string(c)))
		}
	}
	return b.String()
}

// versionStamp builds the binary with the Dockerfile's own -ldflags, its
// VERSION and REVISION build arguments filled in, and checks that
// memcgate -version reports them: -X on a variable that does not exist
// is silently ignored, so only running the result shows it works.
func versionStamp(t *testing.T, build stage, goBuild string) {
	args := map[string]bool{}
	for _, in := range build.all("ARG") {
		name, _, _ := strings.Cut(in.args, "=")
		args[name] = true
	}
	if !args["VERSION"] || !args["REVISION"] {
		t.Fatalf("the build stage lacks ARG VERSION or ARG REVISION (have %v)", keys(args))
	}
	m := regexp.MustCompile(`-ldflags="([^"]*)"`).FindStringSubmatch(goBuild)
	if m == nil {
		t.Fatalf("the go build RUN has no -ldflags=\"…\": %s", goBuild)
	}
	ldflags := strings.NewReplacer("${VERSION}", "v9.8.7-test", "${REVISION}", "0123456789abcdef").Replace(m[1])
	bin := filepath.Join(t.TempDir(), "memcgate")
	abs, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := run(t, abs, "go", "build", "-trimpath", "-ldflags="+ldflags, "-o", bin, "./cmd/memcgate"); err != nil {
		t.Fatalf("go build -ldflags=%q: %v\n%s", ldflags, err, out)
	}
	out, err := run(t, "", bin, "-version")
	if want := "memcgate v9.8.7-test (revision 0123456789abcdef, "; err != nil || !strings.HasPrefix(out, want) {
		t.Errorf("the Dockerfile's -ldflags give -version %q (%v), want it to start %q", out, err, want)
	}
}
