package bigvalue

import (
	"strconv"
	"testing"

	"github.com/memcgate/memcgate/test/gatewaytest"
	"github.com/memcgate/memcgate/test/memcachedtest"
)

// TestPutBodyHeldOnce: a PUT body read ahead by the fast path is held
// against the budget once, not once by the server and again by the
// handler's copy: with a budget of 1.5 MiB, 1 MB bodies are stored one
// after another (held twice they needed 2 MB each and were answered
// 503), and the budget is empty after each.
func TestPutBodyHeldOnce(t *testing.T) {
	mc := memcachedtest.Start(t, "-I", "2m")
	gw := gatewaytest.New(t, binary, map[string]string{
		"MEMCGATE_SERVERS":            mc.Addr,
		"MEMCGATE_MAX_VALUE_BYTES":    strconv.Itoa(1 << 20),
		"MEMCGATE_MAX_BUFFERED_BYTES": strconv.Itoa(3 << 19),
		"MEMCGATE_ACCESS_LOG":         "false",
	})
	gw.Start(t)
	r := &rig{mc: mc, gw: gw, url: "http://" + gw.DataAddr}
	v := randomValue(1_000_000, 7)
	for i := range 3 {
		r.put(t, "once"+strconv.Itoa(i), v)
		if used := r.metric(t, "memcgate_buffered_bytes"); used != 0 {
			t.Errorf("after PUT %d the budget holds %v bytes, want 0", i, used)
		}
	}
}
