package gatewaytest

import (
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/memcgate/memcgate/test/memcachedtest"
)

// Missing ends t because what (a tool, a PHP extension, a module file) is
// not there: it skips t, or fails it when tests must not skip
// (memcachedtest.Required: CI or MEMCGATE_TEST_REQUIRE_MEMCACHED is set;
// make test installs every tool, so there a skip is a check silently not
// run). debianPackages names what to apt-get install; err says what was
// looked for.
func Missing(t testing.TB, what, debianPackages string, err error) {
	t.Helper()
	if memcachedtest.Required() {
		t.Fatalf("%s is required (apt-get install %s; make test installs it); CI or MEMCGATE_TEST_REQUIRE_MEMCACHED is set, so tests must not skip: %v",
			what, debianPackages, err)
	}
	t.Skipf("%s not available (apt-get install %s): %v", what, debianPackages, err)
}

// Tool returns the path of the program name, one that make test installs
// (test/scripts/deps.sh), or ends t through Missing.
func Tool(t testing.TB, name, debianPackages string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		Missing(t, name, debianPackages, err)
	}
	return p
}

// Optional returns the path of the program name, one that make test does
// not install (kubectl, systemd-analyze), or skips t, whatever the
// environment says.
func Optional(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Skipf("%s not installed (optional; make test does not install it): %v", name, err)
	}
	return p
}

// builtinExts are PHP extensions php-cli has built in: they add no
// Debian package to Missing's advice.
var builtinExts = []string{"Core", "ctype", "date", "filter", "hash", "json", "pcntl", "pcre", "random", "Reflection", "session", "SPL", "standard", "tokenizer"}

// PHP returns the path of php if it loads every extension in exts (as
// `php -m` lists them), or ends t through Missing, naming php-cli and the
// php-<ext> packages of the extensions.
func PHP(t testing.TB, exts ...string) string {
	t.Helper()
	pkgs := []string{"php-cli"}
	for _, e := range exts {
		if !slices.Contains(builtinExts, e) {
			pkgs = append(pkgs, "php-"+e)
		}
	}
	what := "php"
	switch len(exts) {
	case 0:
	case 1:
		what = "php with the " + exts[0] + " extension"
	default:
		what = "php with the " + strings.Join(exts, ", ") + " extensions"
	}
	php, err := exec.LookPath("php")
	if err == nil {
		var out []byte
		if out, err = exec.Command(php, "-m").Output(); err != nil {
			err = fmt.Errorf("php -m: %w", err)
		} else {
			loaded := map[string]bool{} // one module a line, under [PHP Modules] and [Zend Modules]
			for _, line := range strings.Split(string(out), "\n") {
				loaded[strings.TrimSpace(line)] = true
			}
			var absent []string
			for _, e := range exts {
				if !loaded[e] {
					absent = append(absent, e)
				}
			}
			if len(absent) > 0 {
				err = fmt.Errorf("php -m lists no %s", strings.Join(absent, ", "))
			}
		}
	}
	if err != nil {
		Missing(t, what, strings.Join(pkgs, " "), err)
	}
	return php
}
