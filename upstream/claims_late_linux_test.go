//go:build linux && (amd64 || arm64 || 386 || arm || riscv64 || s390x || loong64)

package upstream

import (
	"bufio"
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream/hashring"
	"github.com/memcgate/memcgate/upstream/op"
)

// lateConn is a connection of gomemcache's pool whose first read starts
// only once its operation's deadline has passed, after the node has
// handled the request: a gateway too busy to read in time (under a flood of
// large values its goroutines waited for the processor and for the
// collector while they allocated the values), whatever the node did.
type lateConn struct {
	*net.TCPConn // so that claimConn sees the socket (syscall.Conn)
	handled      <-chan struct{}
	answered     bool // the node sends a reply: wait for its bytes in the socket

	mu       sync.Mutex
	deadline time.Time
	late     bool // the first read was late
}

func (c *lateConn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	c.deadline = t
	c.mu.Unlock()
	return c.TCPConn.SetDeadline(t)
}

func (c *lateConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	late := c.late
	c.late = true
	c.mu.Unlock()
	if late {
		return c.TCPConn.Read(p)
	}
	<-c.handled
	for c.answered && c.unread() == 0 {
		time.Sleep(time.Millisecond) // the reply's bytes on their way into the socket
	}
	c.mu.Lock()
	d := c.deadline
	c.mu.Unlock()
	time.Sleep(time.Until(d))
	return c.TCPConn.Read(p)
}

// unread is ioctl(FIONREAD) on the socket, apart from claimConn's.
func (c *lateConn) unread() int {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0
	}
	var q int32
	rc.Control(func(fd uintptr) {
		syscall.RawSyscall(syscall.SYS_IOCTL, fd, 0x541B, uintptr(unsafe.Pointer(&q)))
	})
	return int(q)
}

// TestALateReadEjectsNoNode: on gomemcache's pool (PipelineConns 0) an
// operation's deadline that passes while the node's reply waits unread
// in the socket is no timeout: the reply is read, and nothing counts
// towards the node's ejection (PassiveFails). A client that asked for
// large values and reset, in a loop, kept the gateway so busy that its
// reads came late, and got healthy nodes ejected and their keys moved.
// A node that sends nothing in time is still ejected. So with a health
// probe: an answer that waits unread passes it, and its connection is
// kept for the next probe.
func TestALateReadEjectsNoNode(t *testing.T) {
	for _, tt := range []struct {
		name   string
		probe  bool // a health probe (version) instead of a get
		answer bool // the node answers
		wantUp bool
	}{
		{"the reply waits unread", false, true, true},
		{"no reply comes", false, false, false},
		{"a probe's answer waits unread", true, true, true},
		{"no probe answer comes", true, false, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			handled := make(chan struct{})
			var dials atomic.Int64
			var once sync.Once
			addr := memcachedtest.StartRaw(t, func(c net.Conn, br *bufio.Reader) {
				for {
					line, err := br.ReadString('\n')
					if err != nil {
						return
					}
					reply := "ERROR\r\n"
					switch f := strings.Fields(line); {
					case len(f) > 1 && strings.HasPrefix(f[0], "get"):
						reply = ""
						if tt.answer {
							reply = "VALUE " + f[1] + " 0 10000\r\n" + strings.Repeat("v", 10000) + "\r\nEND\r\n"
						}
					case len(f) == 1 && f[0] == "version":
						reply = ""
						if tt.answer {
							reply = "VERSION 1.6.21\r\n"
						}
					}
					if _, err := c.Write([]byte(reply)); err != nil {
						return
					}
					once.Do(func() { close(handled) })
				}
			})
			c := claimCluster(t, addr, func(o *Options) {
				o.Timeout = 100 * time.Millisecond
				o.Health.Timeout = 100 * time.Millisecond
				o.Health.PassiveFails = 1
				o.Dialer = func(ctx context.Context, network, address string) (net.Conn, error) {
					dials.Add(1)
					var d net.Dialer
					nc, err := d.DialContext(ctx, network, address)
					if err != nil {
						return nil, err
					}
					return &lateConn{TCPConn: nc.(*net.TCPConn), handled: handled, answered: tt.answer}, nil
				}
			})
			n := c.topo.Load().nodes[0]
			if tt.probe {
				err := n.probe.Ping(t.Context())
				if (err == nil) != tt.answer {
					t.Errorf("probe = %v, want it to pass: %v", err, tt.answer)
				}
				if tt.answer { // its connection kept: dialling again when late may time out
					if err := n.probe.Ping(t.Context()); err != nil || dials.Load() != 1 {
						t.Errorf("next probe = %v after %d dials, want it to pass on the one connection", err, dials.Load())
					}
				}
				return
			}
			res := c.Do(t.Context(), op.Op{Verb: op.Get, Item: op.Item{Key: "k"}})
			var ne *NodeError
			switch {
			case tt.answer && (res.Err != nil || len(res.Item.Value) != 10000):
				t.Errorf("get = %v, want the value read", res.Err)
			case !tt.answer && (!errors.As(res.Err, &ne) || !ne.Timeout()):
				t.Errorf("get = %v, want a timeout", res.Err)
			}
			if up := n.available(); up != tt.wantUp {
				t.Errorf("the node is up: %v, want %v (%v)", up, tt.wantUp, res.Err)
			}
		})
	}
}

// starvedConn is a connection whose first read starts lag after its
// deadline, once the answer waits in the socket: a goroutine starved of
// the processor, whose answer came in time (0061).
type starvedConn struct {
	*net.TCPConn // so that onTimeConn sees the socket (syscall.Conn)
	lag          time.Duration

	mu       sync.Mutex
	deadline time.Time
	late     bool // the first read was late
}

func (c *starvedConn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	c.deadline = t
	c.mu.Unlock()
	return c.TCPConn.SetDeadline(t)
}

func (c *starvedConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	late, d := c.late, c.deadline
	c.late = true
	c.mu.Unlock()
	if !late {
		lc := lateConn{TCPConn: c.TCPConn}
		for lc.unread() == 0 {
			time.Sleep(time.Millisecond)
		}
		time.Sleep(time.Until(d.Add(c.lag)))
	}
	return c.TCPConn.Read(p)
}

// TestSetServersLateProbeStartsUp: a node a reload adds whose probe
// passes takes traffic, its answer read late included: an answer in the
// socket at the probe's deadline passes the probe (0061), and
// SetServers waits as long for it. It waited one Health.Timeout: the
// probe passed after the wait ended, and the node started down, taking
// traffic Rise probes later.
func TestSetServersLateProbeStartsUp(t *testing.T) {
	mcs := memcachedtest.StartN(t, 2)
	const timeout = 200 * time.Millisecond
	var dials atomic.Int32
	c, _ := newTestCluster(t, mcs[:1], func(o *Options) {
		o.Health.Timeout = timeout
		o.Health.Interval = time.Hour // no round admits the node meanwhile
		o.Dialer = func(ctx context.Context, network, address string) (net.Conn, error) {
			var d net.Dialer
			nc, err := d.DialContext(ctx, network, address)
			if err != nil || address != mcs[1].Addr || dials.Add(1) > 1 {
				return nc, err
			}
			// The probe's connection: read half a timeout late.
			return &starvedConn{TCPConn: nc.(*net.TCPConn), lag: timeout / 2}, nil
		}
	})
	start := time.Now()
	if _, err := c.SetServers(t.Context(), serversOf(mcs...), hashring.Ketama); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	t.Logf("SetServers took %v (probe timeout %v, the probe read %v past its deadline)", took, timeout, timeout/2)
	for _, st := range c.Nodes() {
		if !st.Up {
			t.Errorf("%s: down (%s) after SetServers (%v), want up: its probe passed", st.Node, st.Reason, took)
		}
	}
}
