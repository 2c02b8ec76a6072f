package upstream

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream/op"
)

// keysOwnedBy returns n keys whose owner is node idx.
func keysOwnedBy(t *testing.T, c *Cluster, idx, n int) []string {
	t.Helper()
	var keys []string
	owner := c.topo.Load().nodes[idx].name
	for i := 0; len(keys) < n && i < 100000; i++ {
		k := fmt.Sprint("stale-", i)
		if c.Placement(k).Chain[0].Node == owner {
			keys = append(keys, k)
		}
	}
	if len(keys) < n {
		t.Fatalf("found %d keys owned by node %d, want %d", len(keys), idx, n)
	}
	return keys
}

// readmitNow runs probe rounds (the nodes must answer) until node idx is
// up: Rise of them on a quiet machine. A probe that a loaded machine
// starves past its timeout fails and counts the passes from zero again,
// so the rounds go on, for 10 s at most, before the test fails.
func readmitNow(t *testing.T, c *Cluster, idx int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for rounds := 1; ; rounds++ {
		c.checkAll(t.Context())
		if c.topo.Load().nodes[idx].available() {
			return
		}
		if rounds >= c.opts.Health.Rise && time.Now().After(deadline) {
			t.Fatalf("node %d still down after %d probe rounds (%v)", idx, rounds, c.topo.Load().nodes[idx].status().Reason)
		}
	}
}

// read returns key's value, or "<miss>".
func read(t *testing.T, c *Cluster, key string) string {
	t.Helper()
	it, err := c.Get(t.Context(), key)
	if errors.Is(err, ErrNotFound) {
		return "<miss>"
	}
	if err != nil {
		t.Fatalf("Get(%q) = %v", key, err)
	}
	return string(it.Value)
}

// TestReadmitDeletesKeysWrittenElsewhere is the stale read an attacking
// review found: an owner ejected while up kept its values; writes of its
// keys went to its successor; re-admitted, it served the older values.
// Now each key written during the outage reads what was written or a
// miss (its owner no longer has it, its successor is no longer asked),
// never the old value; the keys not written keep theirs.
func TestReadmitDeletesKeysWrittenElsewhere(t *testing.T) {
	mcs := memcachedtest.StartN(t, 3)
	c, reg := newTestCluster(t, mcs, func(o *Options) { o.KeyPrefix = "app:" })
	ctx := t.Context()
	miss := func(err error) error {
		if errors.Is(err, ErrNotFound) {
			return nil // the successor has no copy: a write all the same
		}
		return err
	}
	tests := []struct {
		name    string
		write   func(key string) error // during the outage; nil: not written
		written string                 // what the write left on the successor; "<miss>" if nothing
	}{
		{"set", func(k string) error { return c.Set(ctx, Item{Key: k, Value: []byte("new")}) }, "new"},
		{"delete", func(k string) error { return miss(c.Delete(ctx, k)) }, "<miss>"},
		{"incr of a key the successor lacks", func(k string) error {
			_, err := c.Incr(ctx, k, 1)
			return miss(err)
		}, "<miss>"},
		{"set then incr", func(k string) error {
			if err := c.Set(ctx, Item{Key: k, Value: []byte("10")}); err != nil {
				return err
			}
			_, err := c.Incr(ctx, k, 5)
			return err
		}, "15"},
		{"add", func(k string) error { return c.Add(ctx, Item{Key: k, Value: []byte("added")}) }, "added"},
		{"set then append", func(k string) error {
			if err := c.Set(ctx, Item{Key: k, Value: []byte("a")}); err != nil {
				return err
			}
			return c.Append(ctx, Item{Key: k, Value: []byte("b")})
		}, "ab"},
		{"touch", func(k string) error { return miss(c.Touch(ctx, k, 60)) }, "<miss>"},
		{"set with SetQuiet", func(k string) error {
			_, err := c.SetQuiet(ctx, Item{Key: k, Value: []byte("quiet")})
			return err
		}, "quiet"},
		{"set through a replica set", func(k string) error {
			o := op.Op{Verb: op.Set, Item: Item{Key: k, Value: []byte("replicated")}}
			set := c.Replicas(&o, 1)
			if len(set.Replicas) != 1 {
				return fmt.Errorf("Replicas(%q, 1) = %d replicas, want 1", k, len(set.Replicas))
			}
			return c.DoOn(ctx, o, set.Replicas[0]).Err
		}, "replicated"},
		{"not written: the warm value stays", nil, "old"},
	}
	keys := keysOwnedBy(t, c, 0, len(tests))
	for _, k := range keys {
		if err := c.Set(ctx, Item{Key: k, Value: []byte("old")}); err != nil {
			t.Fatal(err)
		}
	}
	owner := c.topo.Load().nodes[0]
	owner.eject("probe", errors.New("test outage"), false)
	written := 0
	for i, tt := range tests {
		if tt.write == nil {
			continue
		}
		written++
		if err := tt.write(keys[i]); err != nil {
			t.Fatalf("%s: write of %q during the outage: %v", tt.name, keys[i], err)
		}
		if got := read(t, c, keys[i]); got != tt.written {
			t.Fatalf("%s: Get(%q) during the outage = %q, want %q", tt.name, keys[i], got, tt.written)
		}
	}
	if got := c.Nodes()[0].WrittenElsewhere; got != written {
		t.Errorf("NodeStatus.WrittenElsewhere during the outage = %d, want %d", got, written)
	}
	readmitNow(t, c, 0)
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := read(t, c, keys[i])
			if got != tt.written && (got != "<miss>" || tt.write == nil) {
				t.Errorf("Get(%q) after re-admission = %q, want %q or a miss", keys[i], got, tt.written)
			}
		})
	}
	if got := testutil.ToFloat64(owner.m.staleInvalidated); got != float64(written) {
		t.Errorf("memcgate_upstream_readmit_invalidated_keys_total = %v, want %d", got, written)
	}
	if got := c.Nodes()[0].WrittenElsewhere; got != 0 {
		t.Errorf("NodeStatus.WrittenElsewhere after re-admission = %d, want 0", got)
	}
	if n, err := testutil.GatherAndCount(reg, "memcgate_upstream_readmit_invalidated_keys_total"); err != nil || n != 3 {
		t.Errorf("memcgate_upstream_readmit_invalidated_keys_total series = %d (%v), want one per node", n, err)
	}
}

// TestReadmitAfterPause is the outage as it happens: memcached stops
// answering, probes eject it, writes go to its successor, it answers
// again and probes re-admit it.
func TestReadmitAfterPause(t *testing.T) {
	mcs := memcachedtest.StartN(t, 3)
	c, _ := newTestCluster(t, mcs, faultOptions)
	runCluster(t, c)
	keys := keysOwnedBy(t, c, 0, 20)
	for _, k := range keys {
		if err := c.Set(t.Context(), Item{Key: k, Value: []byte("v1")}); err != nil {
			t.Fatal(err)
		}
	}
	owner := c.topo.Load().nodes[0]
	mcs[0].Pause()
	waitFor(t, 3*time.Second, "ejection of the paused owner", func() bool { return !owner.available() })
	for _, k := range keys[:10] {
		if err := c.Set(t.Context(), Item{Key: k, Value: []byte("v16")}); err != nil {
			t.Fatalf("Set(%q) with its owner down = %v", k, err)
		}
	}
	mcs[0].Resume()
	waitFor(t, 3*time.Second, "re-admission", owner.available)
	for i, k := range keys {
		got := read(t, c, k)
		switch {
		case i >= 10 && got != "v1":
			t.Errorf("Get(%q), not written during the outage = %q, want v1 (the warm cache kept)", k, got)
		case i < 10 && got != "v16" && got != "<miss>":
			t.Errorf("Get(%q) after re-admission = %q, want v16 or a miss, never v1", k, got)
		}
	}
}

// TestReadmitDeleteFailureKeepsNodeDown: a delete that cannot reach the
// node keeps it out, and its keys are kept for the next attempt.
func TestReadmitDeleteFailureKeepsNodeDown(t *testing.T) {
	mcs := memcachedtest.StartN(t, 2)
	c, _ := newTestCluster(t, mcs, nil)
	keys := keysOwnedBy(t, c, 0, 3)
	owner := c.topo.Load().nodes[0]
	owner.eject("probe", errors.New("test outage"), false)
	for _, k := range keys {
		if err := c.Set(t.Context(), Item{Key: k, Value: []byte("new")}); err != nil {
			t.Fatal(err)
		}
	}
	// The probe says the node is back, the data connections cannot be
	// made.
	mcs[0].Kill()
	fake := &fakeProber{}
	fake.ok.Store(true)
	real := owner.probe
	owner.probe = fake
	c.checkAll(t.Context())
	c.checkAll(t.Context())
	if owner.available() {
		t.Fatal("node admitted though deleting its keys failed")
	}
	if got := c.Nodes()[0].WrittenElsewhere; got != len(keys) {
		t.Errorf("NodeStatus.WrittenElsewhere after a failed invalidation = %d, want %d (kept)", got, len(keys))
	}
	mcs[0].Restart()
	owner.probe = real
	readmitNow(t, c, 0)
	if got := testutil.ToFloat64(owner.m.staleInvalidated); got != float64(len(keys)) {
		t.Errorf("keys invalidated = %v, want %d", got, len(keys))
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent writes, for a logger.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestStaleKeysOverflowAndFlush: past its bound the set stops recording,
// counts and warns once; with ReadmitFlush the node is flushed instead
// and the set dropped.
func TestStaleKeysOverflowAndFlush(t *testing.T) {
	tests := []struct {
		name          string
		flush         bool
		wantUntracked int
		wantOld       string // an owned key not written during the outage
		wantWarnings  int    // "too many keys" lines
		wantDeleted   float64
	}{
		{name: "overflow", wantUntracked: 3, wantOld: "old", wantWarnings: 1, wantDeleted: 2},
		{name: "readmit flush", flush: true, wantUntracked: 0, wantOld: "<miss>", wantWarnings: 0, wantDeleted: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mcs := memcachedtest.StartN(t, 2)
			var logs syncBuffer
			var servers []Server
			for _, m := range mcs {
				servers = append(servers, Server{Host: "127.0.0.1", Port: m.Port})
			}
			c, err := New(Options{Servers: servers, Timeout: 300 * time.Millisecond, PipelineConns: *pipelineConns,
				Health:        HealthOptions{Fall: 2, Rise: 2, ReadmitFlush: tt.flush},
				staleKeyBytes: 2 * (len("stale-00000") + staleKeyOverhead)}, // two keys of keysOwnedBy's, not three
				slog.New(slog.NewTextHandler(&logs, nil)), prometheus.NewRegistry())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			keys := keysOwnedBy(t, c, 0, 6)
			for _, k := range keys {
				if err := c.Set(t.Context(), Item{Key: k, Value: []byte("old")}); err != nil {
					t.Fatal(err)
				}
			}
			owner := c.topo.Load().nodes[0]
			owner.eject("probe", errors.New("test outage"), false)
			for _, k := range keys[:5] {
				if err := c.Set(t.Context(), Item{Key: k, Value: []byte("new")}); err != nil {
					t.Fatal(err)
				}
			}
			if st := c.Nodes()[0]; st.WrittenElsewhere != 2 || st.Untracked != tt.wantUntracked {
				t.Errorf("NodeStatus during the outage: %d recorded, %d untracked; want 2 and %d",
					st.WrittenElsewhere, st.Untracked, tt.wantUntracked)
			}
			if got := testutil.ToFloat64(owner.m.staleUntracked); got != float64(tt.wantUntracked) {
				t.Errorf("memcgate_upstream_readmit_untracked_keys_total = %v, want %d", got, tt.wantUntracked)
			}
			readmitNow(t, c, 0)
			if got := strings.Count(logs.String(), "too many keys written to other nodes"); got != tt.wantWarnings {
				t.Errorf("overflow warnings logged = %d, want %d:\n%s", got, tt.wantWarnings, logs.String())
			}
			if got := testutil.ToFloat64(owner.m.staleInvalidated); got != tt.wantDeleted {
				t.Errorf("keys invalidated = %v, want %v", got, tt.wantDeleted)
			}
			if st := c.Nodes()[0]; st.WrittenElsewhere != 0 || st.Untracked != 0 {
				t.Errorf("NodeStatus after re-admission: %d recorded, %d untracked; want none", st.WrittenElsewhere, st.Untracked)
			}
			if got := read(t, c, keys[5]); got != tt.wantOld {
				t.Errorf("Get(%q), not written during the outage = %q, want %q", keys[5], got, tt.wantOld)
			}
			if !tt.flush && !strings.Contains(logs.String(), "re-admitted after deleting 2 keys written to other nodes while it was down; 3 more were not remembered") {
				t.Errorf("no re-admission line naming the deleted and untracked keys:\n%s", logs.String())
			}
		})
	}
}

// TestStaleKeysCopyTheirKeys: a key recorded is a copy of the key alone,
// not a view into the longer string it came from (a request's target,
// with a query string kilobytes long), which the set would otherwise keep
// whole while charging only the key.
func TestStaleKeysCopyTheirKeys(t *testing.T) {
	target := "k1?" + strings.Repeat("q", 16<<10)
	s := &staleKeys{limit: 1 << 20}
	if !s.add(staleKey{store: target[:2]}) {
		t.Fatal("add refused a key into an empty set")
	}
	for k := range s.keys {
		if unsafe.StringData(k) == unsafe.StringData(target) {
			t.Errorf("the set keeps the %d-byte string its key %q came from", len(target), k)
		}
	}
}

// TestSecondOutageReadsNoCopyLeftBehind: the writes of an owner's keys
// during its outage leave their values on its successor. Once the owner
// is back and its keys are written again, a second outage (or a read that
// fails over from the owner) must not find the first outage's values
// there: the successor's copies are deleted at the re-admission, with or
// without the flush.
func TestSecondOutageReadsNoCopyLeftBehind(t *testing.T) {
	for _, flush := range []bool{false, true} {
		t.Run(fmt.Sprintf("readmit flush %v", flush), func(t *testing.T) {
			mcs := memcachedtest.StartN(t, 3)
			c, _ := newTestCluster(t, mcs, func(o *Options) {
				o.KeyPrefix = "app:"
				o.Health.ReadmitFlush = flush
			})
			ctx := t.Context()
			set := func(k, v string) {
				t.Helper()
				if err := c.Set(ctx, Item{Key: k, Value: []byte(v)}); err != nil {
					t.Fatalf("Set(%q, %q) = %v", k, v, err)
				}
			}
			keys := keysOwnedBy(t, c, 0, 10)
			for _, k := range keys {
				set(k, "v1")
			}
			owner := c.topo.Load().nodes[0]
			owner.eject("probe", errors.New("first outage"), false)
			for _, k := range keys {
				set(k, "v2") // on the successor
			}
			readmitNow(t, c, 0)
			for _, k := range keys[:5] {
				set(k, "v3") // on the owner again
			}
			owner.eject("probe", errors.New("second outage"), false)
			for i, k := range keys {
				got := read(t, c, k)
				if i < 5 && got != "<miss>" {
					t.Errorf("Get(%q) in the second outage = %q, want a miss (v3 was acknowledged; the successor's v2 is older)", k, got)
				}
				if i >= 5 && got != "<miss>" && got != "v2" {
					t.Errorf("Get(%q) in the second outage = %q, want v2 or a miss", k, got)
				}
			}
		})
	}
}

// TestReadmitUnknownHistory: a node away since before the cluster was
// built (a gateway restarted during its outage) returns with keys
// written elsewhere that no one here recorded; its re-admission is
// counted, unless it holds nothing or this cluster saw it in service
// before its outage. /debug/nodes shows history_unknown while it is
// away.
func TestReadmitUnknownHistory(t *testing.T) {
	tests := []struct {
		name      string
		items     bool // the node holds an item when it returns
		seenFirst bool // the node answers the cluster's first probes, then goes away
		want      float64
	}{
		{name: "away since before the start, holding items", items: true, want: 1},
		{name: "away since before the start, empty", want: 0},
		{name: "outage seen whole", items: true, seenFirst: true, want: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mcs := memcachedtest.StartN(t, 2)
			if tt.items {
				// Written by the gateway before this one, as it were.
				if err := memcache.New(mcs[0].Addr).Set(&memcache.Item{Key: "before", Value: []byte("v1")}); err != nil {
					t.Fatal(err)
				}
			}
			if !tt.seenFirst {
				mcs[0].Pause()
			}
			c, _ := newTestCluster(t, mcs, faultOptions)
			n := c.topo.Load().nodes[0]
			if tt.seenFirst {
				c.checkAll(t.Context())
				mcs[0].Pause()
			}
			for range c.opts.Health.Fall {
				c.checkAll(t.Context())
			}
			if n.available() {
				t.Fatal("the paused node is still up")
			}
			if got := n.status().HistoryUnknown; got != !tt.seenFirst {
				t.Errorf("history_unknown while away = %v, want %v", got, !tt.seenFirst)
			}
			mcs[0].Resume()
			readmitNow(t, c, 0)
			if got := testutil.ToFloat64(c.m.unknown.WithLabelValues(n.name)); got != tt.want {
				t.Errorf("readmit_unknown_history_total = %v, want %v", got, tt.want)
			}
			if n.status().HistoryUnknown {
				t.Error("history_unknown still set after the re-admission")
			}
		})
	}
}
