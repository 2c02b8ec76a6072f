package mcpipe

import (
	"bufio"
	"context"
	"errors"
	"strings"
	"sync/atomic"
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

// TestMetaStoredResult: a meta set's reply lines, as gomemcache's
// errors for a store.
func TestMetaStoredResult(t *testing.T) {
	tests := []struct {
		line string
		err  error // nil: stored; errBad: any other error
	}{
		{line: "HD\r\n"},
		{line: "HD c42\r\n"}, // flags asked for are passed over
		{line: "NS\r\n", err: memcache.ErrNotStored},
		{line: "EX\r\n", err: memcache.ErrCASConflict},
		{line: "NF\r\n", err: memcache.ErrCacheMiss},
		{line: "OK\r\n", err: errBad}, // memcached before 1.6.10, never sent an ms
		{line: "STORED\r\n", err: errBad},
		{line: "SERVER_ERROR object too large for cache\r\n", err: errBad},
		{line: "CLIENT_ERROR bad data chunk\r\n", err: errBad},
	}
	for _, tt := range tests {
		_, err := lineResult(op.MetaStored, "ms", []byte(tt.line))
		switch {
		case tt.err == errBad:
			if err == nil || errors.Is(err, memcache.ErrNotStored) || errors.Is(err, memcache.ErrCASConflict) || errors.Is(err, memcache.ErrCacheMiss) {
				t.Errorf("%q: %v, want an unexpected-reply error", tt.line, err)
			}
		case !errors.Is(err, tt.err):
			t.Errorf("%q: %v, want %v", tt.line, err, tt.err)
		}
	}
}

// TestAppendCAS: op.AppendCAS and op.PrependCAS against a real memcached
// store only while the item's CAS is the one sent, keep its flags, answer
// a missing item NS, and leave the connection in step; before the server
// answered an mg with HD they are refused unsent.
func TestAppendCAS(t *testing.T) {
	srv := memcachedtest.Start(t)
	c := newClient(srv.Addr, 1, nil)
	defer c.Close()
	ctx := context.Background()
	// An mg answered HD, as every subtest's Client but one has seen.
	if _, _, err := c.Do(ctx, op.Op{Verb: op.Head}, "none"); !errors.Is(err, memcache.ErrCacheMiss) {
		t.Fatalf("head of a missing key: %v", err)
	}
	if err := c.Set(&memcache.Item{Key: "some", Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Do(ctx, op.Op{Verb: op.Head}, "some"); err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("b", bigValue) // written from the caller's buffer (segment)
	tests := []struct {
		name   string
		verb   op.Verb
		value  string
		cas    func(head uint64) uint64 // the CAS sent, from the Head's
		noHead bool                     // on a Client that has sent no mg yet
		err    error
		want   string // the value after; "" for a miss
	}{
		{name: "append", verb: op.AppendCAS, value: "de", cas: same, want: "abcde"},
		{name: "prepend", verb: op.PrependCAS, value: "de", cas: same, want: "deabc"},
		{name: "large append", verb: op.AppendCAS, value: big, cas: same, want: "abc" + big},
		{name: "changed since", verb: op.AppendCAS, value: "de", cas: func(h uint64) uint64 { return h + 1 }, err: memcache.ErrCASConflict, want: "abc"},
		{name: "prepend changed since", verb: op.PrependCAS, value: "de", cas: func(h uint64) uint64 { return h - 1 }, err: memcache.ErrCASConflict, want: "abc"},
		{name: "missing", verb: op.AppendCAS, value: "de", cas: func(uint64) uint64 { return 1 }, err: memcache.ErrNotStored},
		{name: "before any mg", verb: op.AppendCAS, value: "de", cas: same, noHead: true, err: ErrNoMeta, want: "abc"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := strings.ReplaceAll(tt.name, " ", "_")
			if tt.want != "" {
				if err := c.Set(&memcache.Item{Key: key, Value: []byte("abc"), Flags: 7, Expiration: 300}); err != nil {
					t.Fatal(err)
				}
			}
			var head uint64
			if it, _, err := c.Do(ctx, op.Op{Verb: op.Head}, key); err == nil {
				head = it.CasID
			}
			cc := c
			if tt.noHead {
				cc = newClient(srv.Addr, 1, nil)
				defer cc.Close()
			}
			o := op.Op{Verb: tt.verb, Item: op.Item{Value: []byte(tt.value), CAS: tt.cas(head)}}
			if _, _, err := cc.Do(ctx, o, key); !errors.Is(err, tt.err) || tt.err == nil && err != nil {
				t.Fatalf("%v = %v, want %v", tt.verb, err, tt.err)
			}
			it, err := c.Get(key) // the connection still in step
			switch {
			case tt.want == "":
				if !errors.Is(err, memcache.ErrCacheMiss) {
					t.Errorf("get after = %v, want a miss", err)
				}
			case err != nil:
				t.Errorf("get after: %v", err)
			case string(it.Value) != tt.want || it.Flags != 7:
				t.Errorf("get after = %.20q (%d bytes) flags %d, want %.20q (%d bytes) flags 7", it.Value, len(it.Value), it.Flags, tt.want, len(tt.want))
			}
		})
	}
}

// same is the CAS an op.Head read.
func same(head uint64) uint64 { return head }

// TestAppendCASOtherServers: a server that answers mg with "OK",
// memcached 1.6.0 to 1.6.9, whose ms takes the data length as a flag, is
// never sent one (op.AppendCAS gets ErrNoMeta); one that answers mg with
// "HD" but ms with ERROR (a proxy that passes on mg only) reads the data
// block as a command too, and the connection, out of step, is replaced.
// A plain append works after either.
func TestAppendCASOtherServers(t *testing.T) {
	tests := []struct {
		name  string
		mg    string // the reply to mg
		err   error  // append_cas's; errBad: any other error
		ms    int64  // ms commands sent
		conns int64  // connections used
	}{
		{name: "memcached 1.6.9", mg: "OK s3 f0 c5\r\n", err: ErrNoMeta, conns: 1},
		{name: "no ms", mg: "HD s3 f0 c5\r\n", err: errBad, ms: 1, conns: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var ms atomic.Int64
			srv := memcachedtest.StartScripted(t, func(line string, br *bufio.Reader) (string, bool) {
				switch f := strings.Fields(line); f[0] {
				case "mg":
					return tt.mg, true
				case "ms":
					ms.Add(1)
				case "append":
					_, err := br.ReadString('\n') // the data block
					return "STORED\r\n", err == nil
				}
				return "ERROR\r\n", true
			})
			c := newClient(srv.Addr, 1, nil)
			defer c.Close()
			ctx := context.Background()
			if _, _, err := c.Do(ctx, op.Op{Verb: op.Head}, "k"); err != nil {
				t.Fatal(err)
			}
			_, _, err := c.Do(ctx, op.Op{Verb: op.AppendCAS, Item: op.Item{Value: []byte("x"), CAS: 5}}, "k")
			if tt.err == errBad && (err == nil || errors.Is(err, ErrNoMeta)) || tt.err != errBad && !errors.Is(err, tt.err) {
				t.Errorf("append_cas = %v, want %v", err, tt.err)
			}
			if err := c.Append(&memcache.Item{Key: "k", Value: []byte("x")}); err != nil {
				t.Errorf("append after: %v", err)
			}
			if n := ms.Load(); n != tt.ms {
				t.Errorf("%d ms commands sent, want %d", n, tt.ms)
			}
			if n := srv.Conns.Load(); n != tt.conns {
				t.Errorf("%d connections, want %d", n, tt.conns)
			}
		})
	}
}

// TestAppendCASAfterRestart: a server that answered mg with HD, then
// comes back at the same address as memcached 1.6.9 (mg answered OK),
// gets no ms on the new connection until its mg answers HD: its ms
// would read differently and put the connection out of step.
func TestAppendCASAfterRestart(t *testing.T) {
	var ms atomic.Int64
	var restarted atomic.Bool
	srv := memcachedtest.StartScripted(t, func(line string, br *bufio.Reader) (string, bool) {
		switch f := strings.Fields(line); f[0] {
		case "mg":
			switch {
			case f[1] == "restart":
				restarted.Store(true)
				return "", false
			case !restarted.Load():
				return "HD s3 f0 c5\r\n", true
			}
			return "OK s3 f0 c5\r\n", true // memcached 1.6.9
		case "ms":
			ms.Add(1)
			return "ERROR\r\n", true
		}
		return "ERROR\r\n", true
	})
	c := newClient(srv.Addr, 1, nil)
	defer c.Close()
	ctx := context.Background()
	if _, _, err := c.Do(ctx, op.Op{Verb: op.Head}, "k"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Do(ctx, op.Op{Verb: op.Head}, "restart"); err == nil {
		t.Fatal("mg answered by a server that closed the connection")
	}
	for range 2 {
		_, _, err := c.Do(ctx, op.Op{Verb: op.AppendCAS, Item: op.Item{Value: []byte("x"), CAS: 5}}, "k")
		if !errors.Is(err, ErrNoMeta) {
			t.Errorf("append_cas after the restart = %v, want %v", err, ErrNoMeta)
		}
		c.Do(ctx, op.Op{Verb: op.Head}, "k") // answered OK: still no ms
	}
	if n := ms.Load(); n != 0 {
		t.Errorf("%d ms commands sent to the older server, want none", n)
	}
	if n := srv.Conns.Load(); n != 2 {
		t.Errorf("%d connections, want 2", n)
	}
}

// TestMetaDeletedResult: a meta delete's reply lines, as gomemcache's
// errors for a delete: memcached 1.6.0 to 1.6.9 answer OK where later
// ones answer HD, and an error line is a server without meta commands.
func TestMetaDeletedResult(t *testing.T) {
	tests := []struct {
		line string
		err  error // nil: deleted; errBad: any other error
	}{
		{line: "HD\r\n"},
		{line: "HD k6b\r\n"}, // flags are passed over
		{line: "OK\r\n"},     // memcached before 1.6.10
		{line: "EX\r\n", err: memcache.ErrCASConflict},
		{line: "NF\r\n", err: memcache.ErrCacheMiss},
		{line: "ERROR\r\n", err: ErrNoMeta},
		{line: "CLIENT_ERROR bad command line format\r\n", err: ErrNoMeta},
		{line: "DELETED\r\n", err: errBad},
		{line: "NS\r\n", err: errBad},
		{line: "SERVER_ERROR out of memory\r\n", err: errBad},
	}
	for _, tt := range tests {
		err := ParseMetaDeleted([]byte(tt.line))
		switch {
		case tt.err == errBad:
			if err == nil || errors.Is(err, ErrNoMeta) || errors.Is(err, memcache.ErrCASConflict) || errors.Is(err, memcache.ErrCacheMiss) {
				t.Errorf("%q: %v, want an unexpected-reply error", tt.line, err)
			}
		case !errors.Is(err, tt.err):
			t.Errorf("%q: %v, want %v", tt.line, err, tt.err)
		}
	}
}

// TestDeleteCAS: op.DeleteCAS against a real memcached deletes only the
// item whose CAS it names (or, with none, any item there), and is sent
// on a new connection at once, with no mg asked first.
func TestDeleteCAS(t *testing.T) {
	srv := memcachedtest.Start(t)
	ctx := context.Background()
	tests := []struct {
		name    string
		preset  bool
		cas     func(read uint64) uint64 // the CAS sent, from the item's
		err     error
		deleted bool
	}{
		{name: "cas matches", preset: true, cas: same, deleted: true},
		{name: "cas differs", preset: true, cas: func(read uint64) uint64 { return read + 1000 }, err: memcache.ErrCASConflict},
		{name: "gone", cas: func(uint64) uint64 { return 1 }, err: memcache.ErrCacheMiss},
		{name: "any item", preset: true, cas: func(uint64) uint64 { return 0 }, deleted: true},
		{name: "any item, gone", cas: func(uint64) uint64 { return 0 }, err: memcache.ErrCacheMiss},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newClient(srv.Addr, 1, nil)
			defer c.Close()
			key := strings.ReplaceAll(tt.name, " ", "_")
			var read uint64
			if tt.preset {
				if err := c.Set(&memcache.Item{Key: key, Value: []byte("v")}); err != nil {
					t.Fatal(err)
				}
				it, err := c.Get(key)
				if err != nil {
					t.Fatal(err)
				}
				c.Close()
				c = newClient(srv.Addr, 1, nil) // a fresh connection: no mg learnt
				read = it.CasID
			}
			_, _, err := c.Do(ctx, op.Op{Verb: op.DeleteCAS, Item: op.Item{CAS: tt.cas(read)}}, key)
			if !errors.Is(err, tt.err) || tt.err == nil && err != nil {
				t.Fatalf("delete_cas = %v, want %v", err, tt.err)
			}
			_, err = c.Get(key)
			if gone := errors.Is(err, memcache.ErrCacheMiss); gone != (tt.deleted || !tt.preset) {
				t.Errorf("get after: %v; want deleted %v", err, tt.deleted)
			}
		})
	}
}

// TestDeleteCASWithoutMeta: a server that answers md with ERROR, as one
// before memcached 1.6 does, gives ErrNoMeta and keeps the connection.
func TestDeleteCASWithoutMeta(t *testing.T) {
	srv := memcachedtest.StartScripted(t, func(line string, br *bufio.Reader) (string, bool) {
		if strings.HasPrefix(line, "set ") {
			_, err := br.ReadString('\n') // the data block
			return "STORED\r\n", err == nil
		}
		return "ERROR\r\n", true
	})
	c := newClient(srv.Addr, 1, nil)
	defer c.Close()
	for range 3 {
		if _, _, err := c.Do(context.Background(), op.Op{Verb: op.DeleteCAS, Item: op.Item{CAS: 5}}, "k"); !errors.Is(err, ErrNoMeta) {
			t.Fatalf("delete_cas: %v, want ErrNoMeta", err)
		}
		if err := c.Set(&memcache.Item{Key: "k", Value: []byte("v")}); err != nil {
			t.Fatalf("set after the ERROR: %v", err)
		}
	}
	if n := srv.Conns.Load(); n != 1 {
		t.Errorf("%d connections, want 1: the ERROR closed one", n)
	}
}
