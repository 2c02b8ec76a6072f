package deploy

import (
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/gatewaytest"
)

// example is one shell command of a page, with what its comment says it
// prints.
type example struct {
	where string // page:line
	cmd   string
	// want is the comment after the command, up to its first ';', or the
	// comment line under it: a status (the last one the command prints,
	// from -i or -w '%{http_code}'), or the command's last line of output,
	// "…" standing for anything and a "cas" value for any other.
	want string
	// run, when not nil, makes this a make run line: the variables it
	// sets (NAME=value before make run), for a new run the commands
	// after it use.
	run []string
}

var (
	// commentRE is a command's own comment: spaces, then "# ".
	commentRE = regexp.MustCompile(`\s+# (.*)$`)
	// wantStatusRE is a comment that starts with a status.
	wantStatusRE = regexp.MustCompile(`^([1-5][0-9][0-9])(?:$|[^0-9])`)
	statusLineRE = regexp.MustCompile(`(?m)^HTTP/1\.[01] ([0-9]{3}) `)
	casRE        = regexp.MustCompile(`"cas":"[^"]*"`)
	// assignRE is a command that sets a shell variable.
	assignRE = regexp.MustCompile(`^[a-z_]+=\$\(`)
	// envRE is a variable set before a command: NAME=value or NAME='value'.
	envRE = regexp.MustCompile(`^([A-Z][A-Z0-9_]*)=('[^']*'|\S*)\s*`)
)

// shExamples returns the commands of the ```sh blocks of page, in order.
// A command whose single quotes are left open goes on to the next line.
// A make run line, with the variables set before it, is a new run for
// the commands after it; other make lines, lines that name bin/memcgate
// and comment lines are not commands. A comment line right under a
// command is what it prints. A
// variable a command of a block sets (etag=$(curl …)) is set again for
// each command after it in the block, as each runs in a shell of its own.
func shExamples(t *testing.T, page string) []example {
	t.Helper()
	var (
		out     []example
		in      bool
		cmd     []string
		start   int
		lastEnd = -1 // the line the last command ended on
		assigns []string
	)
	for i, line := range strings.Split(read(t, page), "\n") {
		switch {
		case strings.HasPrefix(line, "```sh"):
			in, assigns = true, nil
			continue
		case strings.HasPrefix(line, "```"):
			in = false
			continue
		case !in:
			continue
		}
		if len(cmd) == 0 {
			trimmed := strings.TrimSpace(line)
			if strings.HasPrefix(trimmed, "# ") && lastEnd == i-1 && out[len(out)-1].want == "" {
				out[len(out)-1].want = strings.TrimPrefix(trimmed, "# ")
				continue
			}
			if trimmed == "" || strings.HasPrefix(trimmed, "#") {
				continue
			}
			start = i + 1
		}
		cmd = append(cmd, line)
		joined := strings.Join(cmd, "\n")
		if strings.Count(joined, "'")%2 == 1 || strings.HasSuffix(line, `\`) {
			continue
		}
		cmd = nil
		e := example{where: fmt.Sprintf("%s:%d", page, start)}
		if m := commentRE.FindStringSubmatchIndex(joined); m != nil && !strings.Contains(joined[m[0]:], "'") {
			e.want, _, _ = strings.Cut(joined[m[2]:m[3]], ";")
			joined = joined[:m[0]]
		}
		if run, ok := makeRun(joined); ok {
			e.run = run
			out = append(out, e)
			continue
		}
		if f := strings.Fields(joined); f[0] == "make" || strings.Contains(joined, "bin/memcgate") {
			continue
		}
		e.cmd = strings.Join(append(slices.Clone(assigns), joined), "\n")
		if assignRE.MatchString(joined) {
			assigns = append(assigns, joined)
		}
		out = append(out, e)
		lastEnd = i
	}
	return out
}

// makeRun returns the variables cmd sets before make run, and whether it
// is a make run line.
func makeRun(cmd string) ([]string, bool) {
	rest := strings.TrimSpace(strings.ReplaceAll(cmd, "\\\n", " "))
	run := []string{}
	for {
		m := envRE.FindStringSubmatch(rest)
		if m == nil {
			break
		}
		run = append(run, m[1]+"="+strings.Trim(m[2], "'"))
		rest = rest[len(m[0]):]
	}
	return run, rest == "make run"
}

// check runs e against the gateway at data and admin, what the page
// calls localhost:8080 and 127.0.0.1:9090, with files under dir.
func (e example) check(t *testing.T, data, admin, dir string) {
	t.Helper()
	cmd := strings.NewReplacer("localhost:8080", data, "127.0.0.1:9090", admin, "/tmp/", dir+"/").Replace(e.cmd)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	c := exec.CommandContext(ctx, "bash", "-o", "pipefail", "-c", cmd)
	var stderr strings.Builder
	c.Stderr = &stderr
	b, err := c.Output()
	out := strings.ReplaceAll(string(b), "\r", "")
	if err != nil {
		t.Errorf("%s: %s: %v\nstdout:\n%s\nstderr:\n%s", e.where, cmd, err, out, stderr.String())
		return
	}
	if e.want == "" {
		return
	}
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	last := lines[len(lines)-1]
	if m := wantStatusRE.FindStringSubmatch(e.want); m != nil {
		got := ""
		if s := statusLineRE.FindAllStringSubmatch(out, -1); s != nil {
			got = s[len(s)-1][1]
		} else if wantStatusRE.MatchString(last) && len(last) == 3 {
			got = last
		}
		if got != m[1] {
			t.Errorf("%s: %s: status %q, the page says %s; it printed:\n%s", e.where, cmd, got, e.want, out)
		}
		return
	}
	parts := strings.Split(casRE.ReplaceAllString(e.want, `"cas":"…"`), "…")
	for i, p := range parts {
		parts[i] = regexp.QuoteMeta(p)
	}
	if !regexp.MustCompile("^" + strings.Join(parts, ".*") + "$").MatchString(last) {
		t.Errorf("%s: %s: printed %q last, the page says %q", e.where, cmd, last, e.want)
	}
}

// docRun is a run of make run's script, for a page's examples.
type docRun struct {
	data, admin string
	banner      string
}

// startDocRun runs make run's script on ports of its own with env
// (NAME=value), for the examples of where, and waits for its banner.
func startDocRun(t *testing.T, where string, env ...string) docRun {
	t.Helper()
	t.Logf("%s: make run with %v", where, env)
	p := freeAddrs(t, 5)
	r := docRun{data: fmt.Sprintf("127.0.0.1:%d", p[3]), admin: fmt.Sprintf("127.0.0.1:%d", p[4])}
	lr := startLocal(t, p[:3], r.data, r.admin, env...)
	lines := lr.lines()
	r.banner = until(t, lines, "Ctrl-C stops")
	go func() {
		for range lines { // the access log, read so that it never fills the pipe
		}
	}()
	// A user types the first example a moment after the banner, when the
	// first round of health checks, which runs beside the listeners'
	// start, has ended: the README's /readyz answers ready then.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		resp, err := http.Get("http://" + r.admin + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: make run's gateway not ready within 10s (%v)", where, err)
		}
	}
	return r
}

// TestDocExamples runs what a new user runs after make run, as the pages
// give it: the examples make run prints, the README's and every sh block
// of docs/http-api.md and docs/security.md, each page in its order on a
// new run of make run's script, and on another from each make run line
// it has, with the variables that line sets. Each command must succeed,
// and print what its comment says: a status, or its output. So an example
// that needs a step its page does not give, or answers otherwise than its
// page says, fails here.
func TestDocExamples(t *testing.T) {
	gatewaytest.Tool(t, "curl", "curl")
	dir := t.TempDir()
	first := startDocRun(t, "make run's banner")

	// make run's banner: the lines between "Try" and "Ctrl-C", with the
	// addresses it was given.
	var printed []example
	_, tries, _ := strings.Cut(first.banner, "Try, from another shell:\n")
	for i, line := range strings.Split(tries, "\n") {
		if !strings.HasPrefix(line, "  curl ") {
			continue
		}
		e := example{where: fmt.Sprintf("make run's banner, line %d", i+1), cmd: strings.TrimSpace(line)}
		if m := commentRE.FindStringSubmatchIndex(e.cmd); m != nil {
			e.want, _, _ = strings.Cut(e.cmd[m[2]:m[3]], ";")
			e.cmd = e.cmd[:m[0]]
		}
		printed = append(printed, e)
	}
	if len(printed) < 5 {
		t.Fatalf("make run printed %d curl examples; its banner:\n%s", len(printed), first.banner)
	}
	for _, e := range printed {
		e.check(t, first.data, first.admin, dir)
	}

	for _, page := range []string{"README.md", filepath.Join("docs", "http-api.md"), filepath.Join("docs", "security.md")} {
		examples := shExamples(t, page)
		if len(examples) == 0 {
			t.Errorf("%s: no examples found", page)
		}
		var r *docRun
		for _, e := range examples {
			if e.run != nil {
				env := make([]string, len(e.run))
				for i, v := range e.run {
					env[i] = strings.ReplaceAll(v, "/tmp/", dir+"/")
				}
				next := startDocRun(t, e.where, env...)
				r = &next
				continue
			}
			if r == nil {
				next := startDocRun(t, page)
				r = &next
			}
			e.check(t, r.data, r.admin, dir)
		}
	}
}
