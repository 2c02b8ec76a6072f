package e2e

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/memcgate/memcgate/test/memcachedtest"
)

// requirePHP returns the php binary if it has the given extensions, or
// skips (fails under CI, where make test installs them).
func requirePHP(t *testing.T, exts ...string) string {
	t.Helper()
	php, err := exec.LookPath("php")
	if err == nil {
		out, _ := exec.Command(php, "-m").Output()
		mods := "\n" + string(out)
		for _, e := range exts {
			if !strings.Contains(mods, "\n"+e+"\n") {
				err = &exec.Error{Name: "php extension " + e, Err: exec.ErrNotFound}
			}
		}
	}
	if err != nil {
		if os.Getenv("CI") != "" || os.Getenv("MEMCGATE_TEST_REQUIRE_MEMCACHED") != "" {
			t.Fatalf("php with %v is required (apt-get install php-cli php-curl php-memcached): %v", exts, err)
		}
		t.Skipf("php with %v not installed: %v", exts, err)
	}
	return php
}

// TestPHPExample runs the PHP client example shipped in test/php against a
// running gateway, as the README tells PHP users to.
func TestPHPExample(t *testing.T) {
	php := requirePHP(t, "curl")
	mcs := memcachedtest.StartN(t, 3)
	g := startGateway(t, map[string]string{"MEMCGATE_SERVERS": serversEnv(mcs)})
	cmd := exec.Command(php, "../php/example.php")
	cmd.Env = append(os.Environ(), "MEMCGATE_URL="+g.URL)
	out, err := cmd.CombinedOutput()
	t.Logf("php example.php:\n%s", out)
	if err != nil {
		t.Fatalf("php example.php failed: %v", err)
	}
	if !strings.Contains(string(out), "all ok") {
		t.Errorf("php example.php did not finish: %s", out)
	}
}
