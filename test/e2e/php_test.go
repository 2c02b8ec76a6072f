package e2e

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/memcgate/memcgate/test/gatewaytest"
	"github.com/memcgate/memcgate/test/memcachedtest"
)

// TestPHPExample runs the PHP client example shipped in test/php against a
// running gateway, as docs/php.md tells PHP users to.
func TestPHPExample(t *testing.T) {
	php := gatewaytest.PHP(t, "curl")
	mcs := memcachedtest.StartN(t, 3)
	g := startGateway(t, map[string]string{"MEMCGATE_SERVERS": memcachedtest.Addrs(mcs)})
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
