package mcpipe

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/memcgate/memcgate/test/memcachedtest"
)

// TestReadProbe: the reply to a size probe gives each present key's size
// whatever the order of its flags, leaves the misses at -1, ends at MN,
// and reads all of an old server's ERROR lines (one per mg and one for
// mn) before answering ErrNoMeta, so that the next reply is read from
// its start; a success it cannot read (another version of the meta
// protocol) makes the probe refused, read to its end; what fits none of
// that breaks the stream.
func TestReadProbe(t *testing.T) {
	keys := []string{"a", "bb", "c"}
	tests := []struct {
		name  string
		reply string
		sizes []int
		err   error // r.err; errBad: a broken stream
	}{
		{name: "all present", reply: "HD s1 ka\r\nHD s22 kbb\r\nHD s1048576 kc\r\nMN\r\n", sizes: []int{1, 22, 1 << 20}},
		{name: "flags in any order", reply: "HD ka s5\r\nHD t-1 kbb s0 f3\r\nMN\r\n", sizes: []int{5, 0, -1}},
		{name: "misses left out", reply: "HD s7 kbb\r\nMN\r\n", sizes: []int{-1, 7, -1}},
		{name: "none present", reply: "MN\r\n", sizes: []int{-1, -1, -1}},
		{name: "a miss not left out", reply: "EN\r\nHD s2 kc\r\nMN\r\n", sizes: []int{-1, -1, 2}},
		{name: "no meta commands", reply: strings.Repeat("ERROR\r\n", 4), err: ErrNoMeta},
		{name: "a key refused", reply: "HD s1 ka\r\nCLIENT_ERROR bad command line format\r\nMN\r\n", err: errProbeRefused},
		{name: "some ERRORs", reply: "ERROR\r\nHD s1 kbb\r\nMN\r\n", err: errProbeRefused},
		{name: "OK, as before memcached 1.6.10", reply: "OK s1 ka\r\nOK s22 kbb\r\nMN\r\n", sizes: []int{1, 22, -1}},
		// A success without the flags asked for: another version of the
		// meta protocol, read to its end and read without a probe.
		{name: "without its size", reply: "HD ka\r\nMN\r\n", err: errProbeRefused},
		{name: "without its key", reply: "HD s1\r\nMN\r\n", err: errProbeRefused},
		{name: "bare", reply: "HD\r\nOK\r\nMN\r\n", err: errProbeRefused},
		{name: "a bad size", reply: "HD s-1 ka\r\nMN\r\n", err: errProbeRefused},
		// memcached returns each flag asked once: a line with two sizes
		// or two keys says neither, and the keys are read without a probe.
		{name: "size twice", reply: "HD s1 s9 ka\r\nMN\r\n", err: errProbeRefused},
		{name: "key twice", reply: "HD s1 ka kbb\r\nMN\r\n", err: errProbeRefused},
		{name: "a key not asked for", reply: "HD s1 kz\r\nMN\r\n", err: errBad},
		{name: "out of order", reply: "HD s1 kc\r\nHD s1 ka\r\nMN\r\n", err: errBad},
		{name: "a value", reply: "VALUE a 0 1\r\nx\r\nMN\r\n", err: errBad},
		{name: "no CR", reply: "HD s1 ka\nMN\r\n", err: errBad},
		{name: "more lines than sent", reply: "HD s1 ka\r\nHD s1 kbb\r\nHD s1 kc\r\nEN\r\nMN\r\n", err: errBad},
		{name: "cut short", reply: "HD s1 ka\r\n", err: errBad},
	}
	const next = "STORED\r\n" // the reply after the probe's
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			br := bufio.NewReader(strings.NewReader(tt.reply + next))
			if tt.err == errBad {
				br = bufio.NewReader(strings.NewReader(tt.reply))
			}
			r, err := readProbe(br, keys)
			switch {
			case tt.err == errBad:
				if err == nil {
					t.Fatalf("readProbe = %v, %v; want a broken stream", r.sizes, r.err)
				}
				return
			case err != nil:
				t.Fatalf("readProbe: %v", err)
			case tt.err != nil && !errors.Is(r.err, tt.err):
				t.Fatalf("r.err = %v, want %v", r.err, tt.err)
			case tt.err == nil && (r.err != nil || !slices.Equal(r.sizes, tt.sizes)):
				t.Fatalf("sizes %v, err %v; want %v", r.sizes, r.err, tt.sizes)
			}
			if line, err := readLine(br); err != nil || string(line) != next {
				t.Errorf("the line after the probe's reply = %q, %v; want %q: out of step", line, err, next)
			}
		})
	}
}

// TestGetMultiLimitProbe: with the probe, a multi-key get asks memcached
// only for the values that fit its limit, taken in order as a reply's
// values are kept (a value past what is kept is skipped, a smaller one
// after it still fits); the present keys past it come back in dropped
// and the misses in neither, and memcached sends little more than the
// values kept. Without the probe it sends every value.
func TestGetMultiLimitProbe(t *testing.T) {
	srv := memcachedtest.Start(t)
	c := newClient(srv.Addr, 1, nil)
	defer c.Close()
	const size = 100 << 10
	var keys []string
	for i := range 20 {
		k := "k" + strconv.Itoa(i)
		keys = append(keys, k)
		switch {
		case i%5 == 4: // a miss
			continue
		case i == 10: // a small value past the limit's first refusal
			if err := c.Set(&memcache.Item{Key: k, Value: []byte("small")}); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := c.Set(&memcache.Item{Key: k, Value: bytes.Repeat([]byte{byte('a' + i)}, size)}); err != nil {
			t.Fatal(err)
		}
	}
	written := func() int { return memcachedtest.SumStat(t, "bytes_written", srv) }
	// slack is what memcached writes besides the values: the probe's
	// and the reply's lines, and the stats replies that read
	// bytes_written, which it counts as they leave, so a read may count
	// one, two or three of them (about 2.3 KB each, with its counters'
	// digits). A value it should not have sent is 100 KB.
	const slack = 8000
	tests := []struct {
		name        string
		probe       bool
		limit       int
		wantItems   []string
		wantDropped []string
		maxWritten  int // memcached's bytes_written for the call
	}{
		{"probe", true, 3*size + 100, []string{"k0", "k1", "k10", "k2"},
			[]string{"k3", "k5", "k6", "k7", "k8", "k11", "k12", "k13", "k15", "k16", "k17", "k18"}, 3*size + slack},
		{"probe, room for none", true, 4, nil,
			[]string{"k0", "k1", "k2", "k3", "k5", "k6", "k7", "k8", "k10", "k11", "k12", "k13", "k15", "k16", "k17", "k18"}, slack},
		{"probe, room for the small one", true, 100, []string{"k10"},
			[]string{"k0", "k1", "k2", "k3", "k5", "k6", "k7", "k8", "k11", "k12", "k13", "k15", "k16", "k17", "k18"}, slack},
		{"no probe", false, 3*size + 100, []string{"k0", "k1", "k10", "k2"},
			[]string{"k3", "k5", "k6", "k7", "k8", "k11", "k12", "k13", "k15", "k16", "k17", "k18"}, 15*size + slack},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := written()
			items, dropped, nofit, err := c.GetMultiLimit(t.Context(), keys, tt.limit, nil, tt.probe)
			w := written() - before
			if err != nil || len(nofit) > 0 {
				t.Fatalf("GetMultiLimit: %v, nofit %v", err, nofit)
			}
			got := slices.Sorted(maps.Keys(items))
			if !slices.Equal(got, tt.wantItems) || !slices.Equal(dropped, tt.wantDropped) {
				t.Fatalf("items %v, dropped %v; want %v, %v", got, dropped, tt.wantItems, tt.wantDropped)
			}
			for k, it := range items {
				if k != "k10" && (len(it.Value) != size || it.Value[0] != byte('a'+k[1]-'0')) {
					t.Errorf("%s: %d bytes starting %q", k, len(it.Value), it.Value[:1])
				}
			}
			if w > tt.maxWritten || !tt.probe && w < 15*size {
				t.Errorf("memcached wrote %d bytes, want at most %d", w, tt.maxWritten)
			}
			t.Logf("memcached wrote %d bytes for %d kept", w, len(items))
		})
	}
}

// TestGetMultiLimitProbeWithoutMeta: a server that answers mg and mn with
// ERROR, as memcached before 1.6 does, still answers the multi-key get
// with plain gets on the same connection, and is probed only once per
// Client.
func TestGetMultiLimitProbeWithoutMeta(t *testing.T) {
	var probes atomic.Int64
	srv := memcachedtest.StartScripted(t, func(line string, _ *bufio.Reader) (string, bool) {
		switch f := strings.Fields(line); f[0] {
		case "mn":
			probes.Add(1)
		case "gets":
			var reply strings.Builder
			for i, k := range f[1:] {
				reply.WriteString(memcachedtest.Value(k, "abc", 0, uint64(i+1)))
			}
			return reply.String() + "END\r\n", true
		}
		return "ERROR\r\n", true // mg, mn, and any command it does not know
	})
	c := newClient(srv.Addr, 1, nil)
	defer c.Close()
	keys := []string{"a", "b", "c"}
	for range 3 {
		items, dropped, _, err := c.GetMultiLimit(context.Background(), keys, 7, nil, true)
		if err != nil || len(items) != 2 || items["a"] == nil || items["b"] == nil || !slices.Equal(dropped, []string{"c"}) {
			t.Fatalf("GetMultiLimit = %v, dropped %v, %v; want a and b, c dropped", items, dropped, err)
		}
	}
	if n := probes.Load(); n != 1 {
		t.Errorf("%d probes, want 1: the first ERROR says the server has no meta commands", n)
	}
	if n := srv.Conns.Load(); n != 1 {
		t.Errorf("%d connections, want 1: the ERRORs must leave the connection in step", n)
	}
}
