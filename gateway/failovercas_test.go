package gateway

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream"
)

// failRig is a handler over a pool of one copy of real memcached whose
// health checks eject a paused node within a few hundred milliseconds and
// re-admit it as fast once it answers again, so that a key moves to the
// next node of its ring and back.
type failRig struct {
	*replRig // condWrite; router unused
	byAddr   map[string]*memcachedtest.Server
}

func newFailRig(t *testing.T, pipelineConns int) *failRig {
	t.Helper()
	up := upstream.Options{PipelineConns: pipelineConns, Timeout: 300 * time.Millisecond, FailoverTTL: time.Minute,
		Health: upstream.HealthOptions{Interval: 50 * time.Millisecond, Timeout: 100 * time.Millisecond, Fall: 2, Rise: 2,
			PassiveFails: 2, MaxEjectedPercent: 100, FlapBackoff: 50 * time.Millisecond, FlapBackoffMax: 100 * time.Millisecond}}
	g := newBigRigUpstream(t, up, nil, nil)
	ctx, stop := context.WithCancel(context.Background())
	ran := make(chan error)
	go func() { ran <- g.cluster.Run(ctx) }()
	t.Cleanup(func() { stop(); <-ran })
	f := &failRig{replRig: &replRig{bigRig: g}, byAddr: map[string]*memcachedtest.Server{}}
	for _, m := range g.mcs {
		f.byAddr[m.Addr] = m
	}
	f.waitServing("", "")
	return f
}

// chain is key's owner and the node it fails over to.
func (f *failRig) chain(key string) (owner, next *memcachedtest.Server) {
	f.t.Helper()
	p := f.cluster.Placement(key)
	return f.byAddr[p.Chain[0].Node], f.byAddr[p.Chain[1].Node]
}

// waitServing waits until key is served by the node at addr (with key
// "", until every node is up).
func (f *failRig) waitServing(key, addr string) {
	f.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ok := true
		if key == "" {
			for _, n := range f.cluster.Nodes() {
				ok = ok && n.Up
			}
		} else {
			ok = f.cluster.Placement(key).Serving == addr
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("key %q not served by %q within 10s: %+v", key, addr, f.cluster.Placement(key))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// read reads key through the gateway as how says (GET, HEAD, or a
// multi-get) and returns the CAS as the read gave it out.
func (f *failRig) read(key, how string) string {
	f.t.Helper()
	switch how {
	case "GET", "HEAD":
		a := f.do(how, "/"+key, nil)
		if a.status != 200 || a.hdr.Get("ETag") == "" {
			f.t.Fatalf("%s %s = %d %q", how, key, a.status, a.body)
		}
		return a.hdr.Get("ETag")
	}
	a := f.do("GET", "/?key="+key, nil)
	i := strings.Index(string(a.body), `"cas":"`)
	if a.status != 200 || i < 0 {
		f.t.Fatalf("multi-get %s = %d %s", key, a.status, a.body)
	}
	rest := string(a.body[i+len(`"cas":"`):])
	return rest[:strings.IndexByte(rest, '"')]
}

// casOf is the number a CAS read names, without its node.
func casOf(t *testing.T, got string) uint64 {
	t.Helper()
	c, err := strconv.ParseUint(strings.Trim(strings.SplitN(got, "@", 2)[0], `"`), 10, 64)
	if err != nil {
		t.Fatalf("CAS %q read: %v", got, err)
	}
	return c
}

// nodeTagOf is the node tag of the memcached at addr, as an ETag writes it.
func nodeTagOf(addr string) string { return fmt.Sprintf("%08x", upstream.NodeTag(addr)) }

// ahead writes the memcached at a until its CAS counter runs 50 ahead of
// b's.
func ahead(t *testing.T, a, b string) {
	t.Helper()
	bumpTo(t, a, max(mcCounter(t, a), mcCounter(t, b))+50)
}

// deletes reports whether a conditional write deletes.
func deletes(cond string) bool { return strings.Contains(strings.ToLower(cond), "delete") }

// TestFailoverCASOwnersCASOnTheNext: on a pool of one copy, a CAS read
// from a key's owner, used after the owner was ejected, is checked on the
// node the key failed over to, whose CAS counter is its own: once that
// node gives a later version of the key the same number, a conditional
// write with it acted on a version its client never read. It must answer
// 412, and the later version stay.
func TestFailoverCASOwnersCASOnTheNext(t *testing.T) {
	for _, pc := range []int{2, 0} {
		// Each kind of connection on a rig of its own, beside the other:
		// the cases mostly wait for the owner's ejection and return.
		t.Run(fmt.Sprintf("pipeline=%d", pc), func(t *testing.T) {
			t.Parallel()
			f := newFailRig(t, pc)
			for _, tt := range casWrites {
				t.Run(tt.name, func(t *testing.T) {
					f.t = t
					key := "owner-" + strings.ReplaceAll(tt.name, " ", "-")
					owner, next := f.chain(key)
					// The owner's count runs ahead of the next node's.
					ahead(t, owner.Addr, next.Addr)
					before := mcCounter(t, owner.Addr)
					f.mustPut("/"+key, value(tt.size, "v1"))
					_, casV1, _ := mcGets(t, owner.Addr, key)
					perWrite := casV1 - before
					got := f.read(key, tt.read)
					if strings.Contains(got, "@") {
						t.Fatalf("CAS %q read from the owner names a node: a pool of one copy answers \"<cas>\"", got)
					}
					c := casOf(t, got)
					owner.Pause()
					defer f.waitServing("", "") // the next case starts with every node up
					defer owner.Resume()
					f.waitServing(key, next.Addr)
					// Another client's write of v2, served by the next node,
					// is given there the CAS read from the owner.
					bumpTo(t, next.Addr, c-perWrite)
					v2 := value(tt.size, "v2")
					f.mustPut("/"+key, v2)
					if _, now, _ := mcGets(t, next.Addr, key); now != c {
						t.Fatalf("scenario: v2 has CAS %d on the next node, want %d (the CAS read from the owner)", now, c)
					}
					if st := f.condWrite(key, tt.cond, got, value(tt.size, "v3")); st != 412 {
						t.Errorf("%s naming %s (read from the owner, ejected since) = %d, want 412: it acted on v2, which the client never read", tt.cond, got, st)
					}
					if a := f.do("GET", "/"+key, nil); a.status != 200 || string(a.body) != string(v2) {
						t.Errorf("GET after = %d, %d bytes, want v2", a.status, len(a.body))
					}
				})
			}
		})
	}
}

// TestFailoverCASNextsCASOnTheOwner: a CAS read during a failover from
// the node the key failed over to names that node; a conditional write
// with it succeeds while that node serves the key, and answers 412 once
// the owner is back, where the same number names another version.
func TestFailoverCASNextsCASOnTheOwner(t *testing.T) {
	for _, pc := range []int{2, 0} {
		// Each kind of connection on a rig of its own, beside the other:
		// the cases mostly wait for the owner's ejection and return.
		t.Run(fmt.Sprintf("pipeline=%d", pc), func(t *testing.T) {
			t.Parallel()
			f := newFailRig(t, pc)
			for _, tt := range casWrites {
				t.Run(tt.name, func(t *testing.T) {
					f.t = t
					key := "next-" + strings.ReplaceAll(tt.name, " ", "-")
					owner, next := f.chain(key)
					ahead(t, next.Addr, owner.Addr)
					before := mcCounter(t, owner.Addr)
					f.mustPut("/"+key, value(tt.size, "v0"))
					_, casV0, _ := mcGets(t, owner.Addr, key)
					perWrite := casV0 - before

					owner.Pause()
					f.waitServing(key, next.Addr)
					f.mustPut("/"+key, value(tt.size, "v1"))
					got := f.read(key, tt.read)
					if want := "@" + nodeTagOf(next.Addr); !strings.Contains(got, want) {
						t.Errorf("CAS %q read from %s, the key failed over to, does not name it (%s)", got, next.Addr, want)
					}
					// While the next node serves the key, the CAS is its:
					// the conditional write succeeds.
					want := 201
					if deletes(tt.cond) {
						want = 204
					}
					if st := f.condWrite(key, tt.cond, got, value(tt.size, "v2")); st != want {
						t.Errorf("%s naming %s while %s serves the key = %d, want %d", tt.cond, got, next.Addr, st, want)
					}
					f.mustPut("/"+key, value(tt.size, "v1"))
					got = f.read(key, tt.read)

					owner.Resume()
					f.waitServing(key, owner.Addr)
					// The owner, back, gives another client's write the CAS
					// read from the next node.
					c := casOf(t, got)
					bumpTo(t, owner.Addr, c-perWrite)
					v3 := value(tt.size, "v3")
					f.mustPut("/"+key, v3)
					if _, now, _ := mcGets(t, owner.Addr, key); now != c {
						t.Fatalf("scenario: v3 has CAS %d on the owner, want %d (the CAS read from the next node)", now, c)
					}
					if st := f.condWrite(key, tt.cond, got, value(tt.size, "v4")); st != 412 {
						t.Errorf("%s naming %s (read from %s, the owner back since) = %d, want 412: it acted on v3, which the client never read", tt.cond, got, next.Addr, st)
					}
					if a := f.do("GET", "/"+key, nil); a.status != 200 || string(a.body) != string(v3) {
						t.Errorf("GET after = %d, %d bytes, want v3", a.status, len(a.body))
					}
				})
			}
		})
	}
}

// TestFailoverCASNamingTheOwner: on a pool of one copy a CAS value that
// names the key's owner while it serves the key (a pool reloaded from
// replicated, whose first replica the ETag named) is checked there, its
// own counter: the conditional write succeeds. One that names another
// node of the pool is 412 and writes nothing.
func TestFailoverCASNamingTheOwner(t *testing.T) {
	f := newFailRig(t, 2)
	owner, next := f.chain("named")
	ahead(t, next.Addr, owner.Addr)
	for _, tt := range []struct {
		cond string
		node *memcachedtest.Server
		want int
	}{
		{"PUT", next, 412}, {"batch cas", next, 412}, {"DELETE", next, 412}, {"batch delete", next, 412},
		{"PUT", owner, 201}, {"batch cas", owner, 201}, {"DELETE", owner, 204},
	} {
		f.mustPut("/named", []byte("v1"))
		etag := strings.TrimSuffix(f.read("named", "GET"), `"`) + "@" + nodeTagOf(tt.node.Addr) + `"`
		if st := f.condWrite("named", tt.cond, etag, []byte("v2")); st != tt.want {
			t.Errorf("%s naming %s (%s) = %d, want %d", tt.cond, etag, tt.node.Addr, st, tt.want)
		}
		want := "v2"
		if tt.want == 412 {
			want = "v1"
		}
		if v, _, ok := mcGets(t, owner.Addr, "named"); ok != (tt.want != 204) || ok && v != want {
			t.Errorf("after %s naming %s: the owner holds %q (%v), want %q", tt.cond, tt.node.Addr, v, ok, want)
		}
	}
}
