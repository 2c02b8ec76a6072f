package gateway

import (
	"strconv"
	"testing"

	"github.com/memcgate/memcgate/gateway/chunk"
	"github.com/memcgate/memcgate/upstream/op"
)

// TestDropKeepsANewerCopy: a value in chunks found with a chunk gone is
// let go (chunk.Values.Drop) on the replica its index was read from,
// checked, and on the other replica only where that replica still holds
// the same index: a newer version written there since (here straight to
// memcached, as another gateway's write not yet on the first) stays;
// the same index there goes as before.
func TestDropKeepsANewerCopy(t *testing.T) {
	for _, conns := range replConns {
		g := newReplRig(t, conns)
		for _, tt := range []struct {
			name  string
			newer bool // the second replica holds a newer version
		}{{"newer on the second", true}, {"same index on both", false}} {
			t.Run(tt.name+"/conns="+strconv.Itoa(conns), func(t *testing.T) {
				g.t = t
				key := "drop-" + strconv.FormatBool(tt.newer) + "-" + strconv.Itoa(conns)
				first, second := g.replicas(key)
				g.mustPut("/"+key, value(5*rigChunk, "v1")) // in chunks
				idx, _, ok := mcGets(t, first.Addr, key)
				if !ok {
					t.Fatal("no index on the first replica")
				}
				x, isIndex, err := chunk.Parse(op.Item{Flags: chunk.IndexFlags, Value: []byte(idx)})
				if !isIndex || err != nil {
					t.Fatalf("the first replica holds %q, not an index (%v)", idx, err)
				}
				for _, m := range []string{first.Addr, second.Addr} { // the value is lost
					mcCmd(t, m, "delete "+chunk.Key(key, x.Version, 0)+"\r\n")
				}
				if tt.newer {
					if l := mcCmd(t, second.Addr, "set "+key+" 0 0 5\r\nnewer\r\n"); l[0] != "STORED" {
						t.Fatalf("set on the second replica: %q", l)
					}
				}
				if a := g.do("GET", "/"+key, nil); a.status == 200 && a.err == nil {
					t.Fatalf("GET of a value with a chunk gone = 200, whole")
				}
				if v, _, ok := mcGets(t, first.Addr, key); ok {
					t.Errorf("the first replica holds %d bytes after the drop, want none", len(v))
				}
				v, _, ok := mcGets(t, second.Addr, key)
				switch {
				case tt.newer && (!ok || v != "newer"):
					t.Errorf("the second replica holds %q (%v) after the drop, want the newer version it was given", v, ok)
				case !tt.newer && ok:
					t.Errorf("the second replica holds %d bytes after the drop, want none: it held the lost index", len(v))
				}
			})
		}
	}
}
