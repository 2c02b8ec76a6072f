package upstream

import (
	"bufio"
	"context"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/memcgate/memcgate/gateway/budget"
	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream/hashring"
	"github.com/memcgate/memcgate/upstream/op"
)

// budgetRoom is an op.Room that holds values in a budget.Budget, as the
// gateway's does.
type budgetRoom struct{ b *budget.Budget }

func (r budgetRoom) Reserve(n int) bool { return r.b.Acquire(int64(n)) == nil }
func (r budgetRoom) Fits(n int) bool    { return r.b.Fits(int64(n)) }
func (r budgetRoom) Holds(n int) int    { return n }
func (r budgetRoom) Release(n int)      { r.b.Release(int64(n)) }
func (r budgetRoom) Lend(n int) []byte  { return make([]byte, n) }

// breakingNode is a scripted node whose answer to a get depends on the
// key's first word: "ok" sends the value whole, "cut" half of it and
// then closes the connection, "noend" all of it and closes before END,
// "stall" half of it and then nothing until the connection closes
// (stalled, when not nil, hears that it did). Values are size bytes.
// Its probes pass. It is returned as a Server of the cluster's list.
func breakingNode(t *testing.T, size int, stalled chan<- struct{}) *memcachedtest.Server {
	value := strings.Repeat("v", size)
	addr := memcachedtest.StartRaw(t, func(c net.Conn, br *bufio.Reader) {
		w := bufio.NewWriter(c)
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return
			}
			f := strings.Fields(line)
			switch {
			case len(f) == 1 && f[0] == "version":
				w.WriteString("VERSION 1.6.21\r\n")
			case len(f) > 1 && (f[0] == "get" || f[0] == "gets"):
				for _, k := range f[1:] {
					head := "VALUE " + k + " 0 " + strconv.Itoa(size) + "\r\n"
					switch strings.SplitN(k, "-", 2)[0] {
					case "ok":
						w.WriteString(head + value + "\r\n")
					case "cut":
						w.WriteString(head + value[:size/2])
						w.Flush()
						return
					case "noend":
						w.WriteString(head + value + "\r\n")
						w.Flush()
						return
					case "stall":
						w.WriteString(head + value[:size/2])
						w.Flush()
						if stalled != nil {
							stalled <- struct{}{}
						}
						br.ReadByte() // until the client closes it
						return
					}
				}
				w.WriteString("END\r\n")
			default:
				w.WriteString("ERROR\r\n")
			}
			if err := w.Flush(); err != nil {
				return
			}
		}
	})
	_, p, _ := net.SplitHostPort(addr)
	port, _ := strconv.Atoi(p)
	return &memcachedtest.Server{Port: port}
}

// TestReadHoldGivenBack: whatever way a node's reply to a read of large
// values ends (a value cut by the connection's close, a reply cut before
// its END, a stalled value whose caller gives up or whose read times out,
// a multi-get cut after values it held, values the share refused and read
// off), the node's reads hold nothing of its share (readHold) and the
// budget holds nothing once the connection is done with, and the node's
// next reads of large values are not refused: a Take not given back on
// any path would refuse them for good. Pipelined and gomemcache's pool
// alike.
func TestReadHoldGivenBack(t *testing.T) {
	const size = 200_000
	for _, pipe := range []int{1, 0} {
		t.Run("pipeline_conns="+strconv.Itoa(pipe), func(t *testing.T) {
			stalled := make(chan struct{}, 16)
			b := budget.New(2 * size * 3) // a fair part of two nodes is three values
			c, _ := newTestCluster(t, []*memcachedtest.Server{breakingNode(t, size, stalled), memcachedtest.Start(t)}, func(o *Options) {
				o.PipelineConns, o.Claims, o.UnheldClaim = pipe, b, 1024
				o.Timeout = 300 * time.Millisecond // a stalled value's read fails at it
				o.Health.PassiveFails = 0          // the breaking node stays in, its keys on it
			})
			c.ShareBytes(b)
			n := c.topo.Load().nodes[0]
			room := budgetRoom{b}
			seq := 0
			key := func(kind string) string { // a key of kind on the breaking node
				for {
					seq++
					k := kind + "-" + strconv.Itoa(seq)
					if o, _ := c.Owner(k); o == 0 {
						return k
					}
				}
			}
			settled := func(t *testing.T, what string) {
				t.Helper()
				waitFor(t, 10*time.Second, what+": the node's reads to give back what they held", func() bool {
					return n.reads.held.Load() == 0 && b.Used() == 0
				})
			}
			get := func(ctx context.Context, k string) op.Result {
				return c.Do(ctx, op.Op{Verb: op.Get, Item: op.Item{Key: k}, Room: room})
			}
			for _, tt := range []struct {
				name string
				run  func(t *testing.T)
			}{
				{"a value cut by the close", func(t *testing.T) {
					if res := get(t.Context(), key("cut")); res.Err == nil {
						t.Error("get of a cut value succeeded")
					}
				}},
				{"a reply cut before its END", func(t *testing.T) {
					get(t.Context(), key("noend"))
				}},
				{"a stalled value whose caller gave up", func(t *testing.T) {
					ctx, cancel := context.WithCancel(t.Context())
					done := make(chan op.Result, 1)
					go func() { done <- get(ctx, key("stall")) }()
					<-stalled
					cancel()
					if res := <-done; res.Err == nil {
						t.Error("get of a stalled value succeeded")
					}
				}},
				{"a stalled value timed out", func(t *testing.T) {
					done := make(chan op.Result, 1)
					go func() { done <- get(t.Context(), key("stall")) }()
					<-stalled
					if res := <-done; res.Err == nil {
						t.Error("get of a stalled value succeeded")
					}
				}},
				{"a multi-get cut after values it held", func(t *testing.T) {
					c.GetMulti(t.Context(), []string{key("ok"), key("ok"), key("cut")}, 0, room)
				}},
				{"a multi-get stalled after values it held", func(t *testing.T) {
					done := make(chan struct{})
					go func() {
						defer close(done)
						c.GetMulti(t.Context(), []string{key("ok"), key("ok"), key("stall")}, 0, room)
					}()
					<-stalled
					<-done
				}},
				{"values past the share, read off", func(t *testing.T) {
					keys := []string{key("ok"), key("ok"), key("ok"), key("ok"), key("ok"), key("ok")}
					_, errs := c.GetMulti(t.Context(), keys, 0, room)
					if len(errs) == 0 {
						t.Error("a multi-get of the whole budget from one node of two: nothing refused")
					}
				}},
			} {
				t.Run(tt.name, func(t *testing.T) {
					tt.run(t)
					settled(t, tt.name)
					// The node's next large read is not refused.
					if res := get(t.Context(), key("ok")); res.Err != nil {
						t.Errorf("the next get of a large value: %v", res.Err)
					}
					settled(t, tt.name+", then a get")
				})
			}
		})
	}
}

// TestReadHoldAcrossReload: a node a reload removes while its read holds
// a stalled value gives it back when that read ends (the budget holds
// nothing then), the nodes left take the budget over fewer nodes, and the
// node added again starts with nothing held and reads large values.
func TestReadHoldAcrossReload(t *testing.T) {
	const size = 200_000
	for _, pipe := range []int{1, 0} {
		t.Run("pipeline_conns="+strconv.Itoa(pipe), func(t *testing.T) {
			stalled := make(chan struct{}, 16)
			mcs := []*memcachedtest.Server{breakingNode(t, size, stalled), memcachedtest.Start(t), memcachedtest.Start(t)}
			b := budget.New(3 * size * 3)
			c, _ := newTestCluster(t, mcs, func(o *Options) {
				o.PipelineConns, o.Claims, o.UnheldClaim = pipe, b, 1024
				o.Timeout = 300 * time.Millisecond
				o.Health.PassiveFails = 0
			})
			c.ShareBytes(b)
			servers := c.opts.Servers
			old := c.topo.Load().nodes[0]
			key := ""
			for i := 0; key == ""; i++ {
				if k := "stall-" + strconv.Itoa(i); func() bool { o, _ := c.Owner(k); return o == 0 }() {
					key = k
				}
			}
			done := make(chan op.Result, 1)
			go func() { done <- c.Do(t.Context(), op.Op{Verb: op.Get, Item: op.Item{Key: key}, Room: budgetRoom{b}}) }()
			<-stalled
			waitFor(t, 10*time.Second, "the stalled read to hold its value in its node's share", func() bool { return old.reads.held.Load() > 0 })
			if _, err := c.SetServers(t.Context(), servers[1:], hashring.Ketama); err != nil {
				t.Fatal(err)
			}
			if got := c.share.nodes.Load(); got != 2 {
				t.Errorf("the share counts %d nodes after the reload, want 2", got)
			}
			<-done
			waitFor(t, 10*time.Second, "the removed node's read to give back what it held", func() bool {
				return old.reads.held.Load() == 0 && b.Used() == 0
			})
			if _, err := c.SetServers(t.Context(), servers, hashring.Ketama); err != nil {
				t.Fatal(err)
			}
			n := c.topo.Load().nodes[0]
			if n == old || n.reads.held.Load() != 0 {
				t.Fatalf("the node added again: a new node %v, holding %d", n != old, n.reads.held.Load())
			}
			waitFor(t, 10*time.Second, "the node added again to be up", func() bool { return n.up.Load() })
			ok := ""
			for i := 0; ok == ""; i++ {
				if k := "ok-" + strconv.Itoa(i); func() bool { o, _ := c.Owner(k); return o == 0 }() {
					ok = k
				}
			}
			if res := c.Do(t.Context(), op.Op{Verb: op.Get, Item: op.Item{Key: ok}, Room: budgetRoom{b}}); res.Err != nil {
				t.Errorf("a large get from the node added again: %v", res.Err)
			}
			waitFor(t, 10*time.Second, "the read to give back what it held", func() bool {
				return n.reads.held.Load() == 0 && b.Used() == 0
			})
		})
	}
}
