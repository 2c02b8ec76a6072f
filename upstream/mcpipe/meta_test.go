package mcpipe

import (
	"bufio"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream/op"
)

func TestMetaResult(t *testing.T) {
	tests := []struct {
		line      string
		flags     uint32
		cas, size uint64
		err       error // nil: a hit; errBad: any other error
	}{
		{line: "HD s3 f5 c1\r\n", flags: 5, cas: 1, size: 3},
		{line: "HD c18446744073709551615 f4294967295 s0\r\n", flags: 4294967295, cas: 18446744073709551615},
		{line: "HD s1048576 f0 c9 t-1\r\n", cas: 9, size: 1 << 20}, // a flag not asked for is passed over
		{line: "EN\r\n", err: memcache.ErrCacheMiss},
		{line: "ERROR\r\n", err: ErrNoMeta},
		{line: "OK s3 f5 c1\r\n", flags: 5, cas: 1, size: 3}, // memcached before 1.6.10
		{line: "CLIENT_ERROR bad command line format\r\n", err: ErrNoMeta},
		// A success without the flags asked for, or with flags it cannot
		// read: another version of the meta protocol, read with a get.
		{line: "HD\r\n", err: ErrNoMeta},
		{line: "OK\r\n", err: ErrNoMeta},
		{line: "HD s3 f5\r\n", err: ErrNoMeta},
		{line: "HD s3 f5 cx\r\n", err: ErrNoMeta},
		{line: "HD s-1 f5 c1\r\n", err: ErrNoMeta},
		{line: "HD s3 f4294967296 c1\r\n", err: ErrNoMeta},
		{line: "HD s3 f f5 c1\r\n", err: ErrNoMeta},
		{line: "SERVER_ERROR out of memory\r\n", err: errBad},
		{line: "VALUE k 0 1\r\n", err: errBad},
	}
	for _, tt := range tests {
		it, size, err := metaResult([]byte(tt.line))
		switch {
		case tt.err == errBad:
			if err == nil || errors.Is(err, memcache.ErrCacheMiss) || errors.Is(err, ErrNoMeta) {
				t.Errorf("%q: %v, want an unexpected-reply error", tt.line, err)
			}
		case tt.err != nil:
			if !errors.Is(err, tt.err) {
				t.Errorf("%q: %v, want %v", tt.line, err, tt.err)
			}
		case err != nil:
			t.Errorf("%q: %v", tt.line, err)
		case it.Flags != tt.flags || it.CasID != tt.cas || size != tt.size || it.Value != nil:
			t.Errorf("%q: flags %d cas %d size %d value %q, want %d %d %d none", tt.line, it.Flags, it.CasID, size, it.Value, tt.flags, tt.cas, tt.size)
		}
	}
}

var errBad = errors.New("any other error")

// TestHead: op.Head answers a real memcached's item with its flags, CAS
// and size and no value, between gets that share lines.
func TestHead(t *testing.T) {
	srv := memcachedtest.Start(t)
	c := newClient(srv.Addr, 1, nil)
	defer c.Close()
	if err := c.Set(&memcache.Item{Key: "k", Value: make([]byte, 100<<10), Flags: 7}); err != nil {
		t.Fatal(err)
	}
	got, err := c.Get("k")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	it, size, err := c.Do(ctx, op.Op{Verb: op.Head}, "k")
	if err != nil || it.Flags != 7 || it.CasID != got.CasID || size != 100<<10 || it.Value != nil {
		t.Fatalf("head = %+v, %d, %v; want flags 7, CAS %d, size %d, no value", it, size, err, got.CasID, 100<<10)
	}
	if _, _, err := c.Do(ctx, op.Op{Verb: op.Head}, "missing"); !errors.Is(err, memcache.ErrCacheMiss) {
		t.Fatalf("head of a missing key: %v, want a miss", err)
	}
}

// TestHeadWithoutMeta: a server that answers mg with ERROR, as memcached
// before 1.6 does, gives ErrNoMeta, and the connection stays in step for
// the next request.
func TestHeadWithoutMeta(t *testing.T) {
	srv := memcachedtest.StartScripted(t, func(line string, br *bufio.Reader) (string, bool) {
		if strings.HasPrefix(line, "set ") {
			_, err := br.ReadString('\n') // the data block
			return "STORED\r\n", err == nil
		}
		return "ERROR\r\n", true // mg, and any command it does not know
	})
	c := newClient(srv.Addr, 1, nil)
	defer c.Close()
	for range 3 {
		if _, _, err := c.Do(context.Background(), op.Op{Verb: op.Head}, "k"); !errors.Is(err, ErrNoMeta) {
			t.Fatalf("head: %v, want ErrNoMeta", err)
		}
		if err := c.Set(&memcache.Item{Key: "k", Value: []byte("v")}); err != nil {
			t.Fatalf("set after the ERROR: %v", err)
		}
	}
	if n := srv.Conns.Load(); n != 1 {
		t.Errorf("%d connections, want 1: the ERROR closed one", n)
	}
}
