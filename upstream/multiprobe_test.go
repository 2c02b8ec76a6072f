package upstream

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/memcachedtest"
)

// TestGetMultiProbe: a multi-get of 100 different 1 MB keys with a 16 MiB
// limit makes memcached send about the limit on pipelined connections,
// which ask the values' sizes first, not the 100 MB it sent before; the
// keys kept fit the limit, the others present fail with ErrOverLimit,
// and the misses are in neither map. gomemcache's pool has no meta
// commands: there memcached still sends every value (no bound). Plain
// and replica reads alike.
func TestGetMultiProbe(t *testing.T) {
	mcs := memcachedtest.StartN(t, 2, "-m", "256")
	// A megabyte value written or read under a loaded machine's stalls:
	// the package's 300ms stall timeout is for faults, not for this.
	c, _ := newTestCluster(t, mcs, func(o *Options) { o.KeyPrefix, o.Timeout = "p:", 2*time.Second })
	ctx := t.Context()
	const size, limit = 1000000, 16 << 20
	var keys []string
	for i := range 120 {
		k := "big" + strconv.Itoa(i)
		keys = append(keys, k)
		if i%6 == 5 { // a miss
			continue
		}
		if err := c.Set(ctx, Item{Key: k, Value: bytes.Repeat([]byte{byte(i)}, size)}); err != nil {
			t.Fatal(err)
		}
	}
	written := func() int { return memcachedtest.SumStat(t, "bytes_written", mcs...) }
	reads := []struct {
		name string
		read func() (map[string]Item, map[string]error)
	}{
		{"GetMulti", func() (map[string]Item, map[string]error) { return c.GetMulti(ctx, keys, limit, nil) }},
		{"GetMultiReplica", func() (map[string]Item, map[string]error) {
			return c.GetMultiReplica(ctx, keys, limit, nil, 0, 1)
		}},
	}
	for _, r := range reads {
		t.Run(r.name, func(t *testing.T) {
			before := written()
			found, failed := r.read()
			w := written() - before
			kept := 0
			for k, it := range found {
				i, _ := strconv.Atoi(strings.TrimPrefix(k, "big"))
				if len(it.Value) != size || it.Value[0] != byte(i) {
					t.Errorf("%s: %d bytes starting %d", k, len(it.Value), it.Value[0])
				}
				kept += len(it.Value)
			}
			for k, err := range failed {
				if !errors.Is(err, ErrOverLimit) {
					t.Errorf("%s failed with %v, want ErrOverLimit", k, err)
				}
			}
			for i, k := range keys {
				_, ok1 := found[k]
				_, ok2 := failed[k]
				if i%6 == 5 && (ok1 || ok2) || i%6 != 5 && ok1 == ok2 {
					t.Errorf("%s: found %v, failed %v; want a miss in neither, the others in one", k, ok1, ok2)
				}
			}
			if kept > limit || len(found) < limit/size/2 {
				t.Errorf("kept %d values, %d bytes; want within the limit %d, and at least half of it", len(found), kept, limit)
			}
			switch {
			case *pipelineConns > 0 && w >= 2*limit:
				t.Errorf("memcached wrote %d bytes, want less than twice the limit (%d)", w, 2*limit)
			case *pipelineConns == 0 && w < 100*size:
				t.Errorf("memcached wrote %d bytes with gomemcache's pool, want every value (%d): it has no probe", w, 100*size)
			}
			t.Logf("found %d (%d bytes), %d over the limit, memcached wrote %d bytes", len(found), kept, len(failed), w)
		})
	}
}

// TestGetMultiProbeWithoutMeta: a node that answers mg and mn with ERROR
// (memcached before 1.6) still answers a multi-get of many keys with a
// limit, from plain gets, and is sent a size probe only once.
func TestGetMultiProbeWithoutMeta(t *testing.T) {
	var probes atomic.Int64
	srv := memcachedtest.StartScripted(t, func(line string, _ *bufio.Reader) (string, bool) {
		switch f := strings.Fields(line); f[0] {
		case "mn":
			probes.Add(1)
		case "gets", "get":
			var reply strings.Builder
			for i, k := range f[1:] {
				reply.WriteString(memcachedtest.Value(k, "abc", 0, uint64(i+1)))
			}
			return reply.String() + "END\r\n", true
		case "version":
			return "VERSION 1.5.22\r\n", true
		}
		return "ERROR\r\n", true
	})
	c, _ := newTestCluster(t, []*memcachedtest.Server{{Addr: srv.Addr, Port: srv.Port}}, nil)
	var keys []string
	for i := range 2 * probeKeys {
		keys = append(keys, "k"+strconv.Itoa(i))
	}
	for range 3 {
		found, failed := c.GetMulti(context.Background(), keys, 3*probeKeys, nil)
		if len(found) != probeKeys || len(failed) != probeKeys {
			t.Fatalf("GetMulti found %d, %d failed; want %d each (3 bytes each, room for half)", len(found), len(failed), probeKeys)
		}
		for k, err := range failed {
			if !errors.Is(err, ErrOverLimit) {
				t.Fatalf("%s failed with %v, want ErrOverLimit", k, err)
			}
		}
	}
	if n := probes.Load(); n > 1 || *pipelineConns == 0 && n != 0 {
		t.Errorf("%d size probes, want at most one (none with gomemcache's pool)", n)
	}
}
