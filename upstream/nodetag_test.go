package upstream

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/memcgate/memcgate/test/memcachedtest"
)

// TestNodeStatusCASTag: /debug/nodes names each node's CAS tag, the 8 hex
// digits an ETag's "@<node>" carries, so that an operator can tell which
// node gave a CAS out without computing FNV-1a by hand.
func TestNodeStatusCASTag(t *testing.T) {
	mcs := memcachedtest.StartN(t, 2)
	c, _ := newTestCluster(t, mcs, nil)
	for _, st := range c.Nodes() {
		want := fmt.Sprintf("%08x", NodeTag(st.Node))
		if st.CASTag != want {
			t.Errorf("node %s: cas_tag %q, want %q", st.Node, st.CASTag, want)
		}
		b, err := json.Marshal(st)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), `"cas_tag":"`+want+`"`) {
			t.Errorf("node %s as JSON: %s, want \"cas_tag\":%q", st.Node, b, want)
		}
	}
	// The vector of pools.md: FNV-1a, 32 bits, of host:port as written.
	if got := fmt.Sprintf("%08x", NodeTag("127.0.0.1:21214")); got != "3c2c2964" {
		t.Errorf("NodeTag(127.0.0.1:21214) = %s, want 3c2c2964", got)
	}
}
