package e2e

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/memcachedtest"
)

// TestAsyncFailureLogged: a write answered 202 that memcached then
// refuses (a value over its item size) is counted and logged at warn,
// with why: the client was told it was accepted, and the log is where an
// operator reading it finds out otherwise.
func TestAsyncFailureLogged(t *testing.T) {
	mc := memcachedtest.Start(t) // items of 1 MiB at most
	g := startGateway(t, map[string]string{"MEMCGATE_SERVERS": mc.Addr, "MEMCGATE_MAX_VALUE_BYTES": "2000000"})
	if r := g.do("PUT", "/too-big", bytes.Repeat([]byte("x"), 1500000), "Prefer", "respond-async"); r.status != 202 {
		t.Fatalf("async PUT = %d %q, want 202", r.status, r.body)
	}
	const line = "an asynchronous write accepted with 202 was not applied"
	for deadline := time.Now().Add(20 * time.Second); !strings.Contains(g.Logs(), line); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no log line %q", line)
		}
	}
	for _, l := range strings.Split(g.Logs(), "\n") {
		if strings.Contains(l, line) && (!strings.Contains(strings.ToLower(l), "warn") || !strings.Contains(l, "refused")) {
			t.Errorf("logged %q, want a warning with the reason refused", l)
		}
	}
}
