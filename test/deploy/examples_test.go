package deploy

import (
	"context"
	"fmt"
	"net"
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
)

// shExamples returns the commands of the ```sh blocks of page, in order.
// A command whose single quotes are left open goes on to the next line.
// Lines that start make or name bin/memcgate, and comment lines, are not
// commands; a comment line right under a command is what it prints. A
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

// flushAll empties the memcached at ports, so that each page's examples
// start on an empty cache, as on a new make run.
func flushAll(t *testing.T, ports []int) {
	t.Helper()
	for _, p := range ports {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", p), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 64)
		_, err = c.Write([]byte("flush_all\r\n"))
		if err == nil {
			var n int
			n, err = c.Read(buf)
			if err == nil && string(buf[:n]) != "OK\r\n" {
				err = fmt.Errorf("answered %q", buf[:n])
			}
		}
		c.Close()
		if err != nil {
			t.Fatalf("flush_all on port %d: %v", p, err)
		}
	}
}

// TestDocExamples runs what a new user runs after make run, as the pages
// give it: the examples make run prints, the README's and every sh block
// of docs/http-api.md, each page from an empty cache and in its order,
// on make run's script (with values in chunks on, which one example
// needs). Each must succeed, and print what its comment says: a status,
// or its output. So an example that needs a step its page does not give,
// or answers otherwise than its page says, fails here.
func TestDocExamples(t *testing.T) {
	gatewaytest.Tool(t, "curl", "curl")
	p := freeAddrs(t, 5)
	listen, admin := fmt.Sprintf("127.0.0.1:%d", p[3]), fmt.Sprintf("127.0.0.1:%d", p[4])
	r := startLocal(t, p[:3], listen, admin, "MEMCGATE_BIG_VALUE_MAX_BYTES=67108864")
	lines := r.lines()
	banner := until(t, lines, "Ctrl-C stops")
	go func() {
		for range lines { // the access log, read so that it never fills the pipe
		}
	}()
	dir := t.TempDir()

	// make run's banner: the lines between "Try" and "Ctrl-C", with the
	// addresses it was given.
	var printed []example
	_, tries, _ := strings.Cut(banner, "Try, from another shell:\n")
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
		t.Fatalf("make run printed %d curl examples; its banner:\n%s", len(printed), banner)
	}

	for _, page := range []struct {
		name     string
		examples []example
	}{
		{"make run", printed},
		{"README.md", shExamples(t, "README.md")},
		{filepath.Join("docs", "http-api.md"), shExamples(t, filepath.Join("docs", "http-api.md"))},
	} {
		if len(page.examples) == 0 {
			t.Errorf("%s: no examples found", page.name)
		}
		flushAll(t, p[:3])
		for _, e := range page.examples {
			e.check(t, listen, admin, dir)
		}
	}
}
