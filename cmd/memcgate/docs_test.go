package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/memcgate/memcgate/config"
)

// helpVars runs `memcgate -help` and returns each variable it prints
// with its default as printed ("" for an empty one).
func helpVars(t *testing.T) (names []string, defaults map[string]string) {
	t.Helper()
	var out bytes.Buffer
	if err := run(context.Background(), []string{"-help"}, nil, &out, io.Discard, nil); err != nil {
		t.Fatalf("memcgate -help: %v", err)
	}
	line := regexp.MustCompile(`^  (MEMCGATE_[A-Z0-9_]+) \(default (.*)\)$`)
	defaults = map[string]string{}
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		m := line.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		def := m[2]
		if def == `""` {
			def = ""
		}
		names = append(names, m[1])
		defaults[m[1]] = def
	}
	if len(names) == 0 {
		t.Fatalf("memcgate -help printed no variable in the form %q:\n%s", line, out.String())
	}
	return names, defaults
}

// varRows returns the rows of the Markdown tables in text whose first
// cell is a variable: name -> the default cells of its rows. A default
// cell is a value in backticks, or "empty".
func varRows(t *testing.T, file, text string) map[string][]string {
	t.Helper()
	rows := map[string][]string{}
	for i, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, "| `MEMCGATE_") {
			continue
		}
		cells := strings.Split(line, "|")
		if len(cells) < 4 {
			t.Errorf("%s:%d: a variable's row needs a name, a default and a meaning: %s", file, i+1, line)
			continue
		}
		name := strings.Trim(strings.TrimSpace(cells[1]), "`")
		def := strings.TrimSpace(cells[2])
		switch {
		case def == "empty":
			def = ""
		case len(def) >= 2 && strings.HasPrefix(def, "`") && strings.HasSuffix(def, "`") && !strings.Contains(def[1:len(def)-1], "`"):
			def = def[1 : len(def)-1]
		default:
			t.Errorf("%s:%d: %s: default cell %q is neither a value in backticks nor \"empty\"", file, i+1, name, def)
			continue
		}
		rows[name] = append(rows[name], def)
	}
	return rows
}

// TestConfigurationReferenceMatchesHelp keeps docs/configuration.md and
// `memcgate -help` telling the same story: every variable -help prints
// has exactly one row there with the same default, and the page names no
// variable that -help does not print (other MEMCGATE_ names only as
// memcgate treats them: ignored, or refused as misspelt). The README's
// settings table, a selection, must agree with -help where it has a row.
func TestConfigurationReferenceMatchesHelp(t *testing.T) {
	names, defaults := helpVars(t)

	const ref = "../../docs/configuration.md"
	b, err := os.ReadFile(ref)
	if err != nil {
		t.Fatal(err)
	}
	rows := varRows(t, ref, string(b))
	for _, name := range names {
		switch defs := rows[name]; {
		case len(defs) == 0:
			t.Errorf("%s has no row for %s (default %q), which -help prints", ref, name, defaults[name])
		case len(defs) > 1:
			t.Errorf("%s has %d rows for %s; want one", ref, len(defs), name)
		case defs[0] != defaults[name]:
			t.Errorf("%s gives %s the default %q; -help says %q", ref, name, defs[0], defaults[name])
		}
	}
	// Besides the variables, the page explains what memcgate does with
	// other MEMCGATE_ names: the ones it ignores (the test suite's
	// MEMCGATE_TEST_ prefix, Kubernetes' service links), which config.Load
	// must then really ignore, and misspelt names in its examples of the
	// error, which config.Load must really refuse.
	misspelt := map[string]bool{"MEMCGATE_SERVRES": true, "MEMCGATE_TOKENS": true, "MEMCGATE_LISTEN": true}
	for _, name := range regexp.MustCompile(`MEMCGATE_[A-Z0-9_]*[A-Z0-9]_?`).FindAllString(string(b), -1) {
		if _, ok := defaults[name]; ok {
			continue
		}
		probe := name
		if strings.HasSuffix(name, "_") { // a prefix, such as MEMCGATE_TEST_
			if slices.ContainsFunc(names, func(v string) bool { return strings.HasPrefix(v, name) }) {
				continue
			}
			probe += "X"
		}
		// Ignored names are ignored with the values they come with
		// (Kubernetes' service links: an address, a port, a URL).
		refused := true
		for _, v := range []string{"1", "10.0.0.1", "tcp://10.0.0.1:80", "tcp"} {
			_, err := config.Load(map[string]string{probe: v})
			refused = refused && err != nil && strings.Contains(err.Error(), probe+" is not a memcgate variable")
		}
		switch {
		case misspelt[name] && !refused:
			t.Errorf("%s gives %s as a misspelling memcgate refuses, but config.Load accepts it", ref, name)
		case !misspelt[name] && refused:
			t.Errorf("%s names %s, which -help does not print and memcgate refuses", ref, name)
		}
	}

	const readme = "../../README.md"
	b, err = os.ReadFile(readme)
	if err != nil {
		t.Fatal(err)
	}
	for name, defs := range varRows(t, readme, string(b)) {
		want, ok := defaults[name]
		if !ok {
			t.Errorf("%s has a row for %s, which -help does not print", readme, name)
			continue
		}
		for _, def := range defs {
			if def != want {
				t.Errorf("%s gives %s the default %q; -help says %q", readme, name, def, want)
			}
		}
	}
}
