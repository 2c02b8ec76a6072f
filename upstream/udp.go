package upstream

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/upstream/op"
)

// udpPort is a node's memcached UDP port (Server.UDPPort): the socket
// SetQuiet's sets leave by, the probe socket the health check asks on,
// and whether sets may use the port now.
//
// Requests use memcached's UDP framing: an 8-byte header (request id,
// sequence number, datagram count, reserved; big-endian uint16s) before
// the command. Sets carry noreply, so the data socket is never read; a
// datagram refused by the host (ICMP port unreachable, nothing listens)
// surfaces only as an error on the socket's next write.
//
// The port starts down: sets use it only once a probe got memcached's
// answer over UDP (memcached listens on UDP only with -U, off by default
// since 1.5.6). One passed probe brings it up; Health.Fall failed probes
// in a row take it down, and so does at once a refusal, seen by a probe
// or by a set's write (up holds the state; change makes every change).
//
// udpPort holds atomics and mutexes: it must not be copied.
type udpPort struct {
	addr  string           // host:udpport; resolved on every dial
	up    atomic.Bool      // sets may go out as datagrams; changed only by change, under smu
	id    atomic.Uint32    // request ids, of sets and probes
	gauge prometheus.Gauge // memcgate_upstream_node_udp_up of the node

	mu   sync.Mutex   // guards conn; held across a set's write, so that the sets behind a refused one see the port down
	conn *net.UDPConn // the data socket; nil until first use or after an error

	pmu   sync.Mutex   // guards probe; never held across I/O
	probe *net.UDPConn // the probe socket; nil until the first probe or after an error

	smu    sync.Mutex // guards the fields below and orders changes of up; taken after mu, never held across I/O
	probed bool       // a probe result or a refusal was applied: the first one is a change even if it says down
	fails  int        // consecutive failed probes
	since  time.Time  // last change of up
	reason string     // why up is what it is
}

func newUDPPort(addr string, gauge prometheus.Gauge) *udpPort {
	u := &udpPort{addr: addr, gauge: gauge, since: time.Now(), reason: "not yet probed"}
	gauge.Set(0)
	return u
}

// maxUDPRequest keeps a request inside one datagram on any path with a
// 1500-byte MTU; memcached refuses requests split over datagrams.
const maxUDPRequest = 1400

// Why a set did not leave as a datagram; callers use TCP.
var (
	errUDPTooLarge = errors.New("upstream: set too large for one UDP datagram")
	errUDPDown     = errors.New("upstream: the node's UDP port is down")
)

// header appends a request header with a new request id to b.
func (u *udpPort) header(b []byte) (id uint16, _ []byte) {
	id = uint16(u.id.Add(1))
	b = binary.BigEndian.AppendUint16(b, id)
	b = binary.BigEndian.AppendUint16(b, 0) // sequence number
	b = binary.BigEndian.AppendUint16(b, 1) // datagrams in this request
	b = binary.BigEndian.AppendUint16(b, 0) // reserved
	return id, b
}

func (u *udpPort) dial() (*net.UDPConn, error) {
	ua, err := net.ResolveUDPAddr("udp", u.addr)
	if err != nil {
		return nil, err
	}
	return net.DialUDP("udp", nil, ua)
}

// set sends it as one datagram. errUDPTooLarge and errUDPDown say that
// nothing was sent and nothing changed. Any other error is the data
// socket's, and takes the port down; downed reports whether this call
// did (its caller then logs the change).
func (u *udpPort) set(it *memcache.Item) (downed bool, err error) {
	head := "set " + it.Key + " " + strconv.FormatUint(uint64(it.Flags), 10) + " " +
		strconv.FormatInt(int64(it.Expiration), 10) + " " + strconv.Itoa(len(it.Value)) + " noreply\r\n"
	size := 8 + len(head) + len(it.Value) + 2
	if size > maxUDPRequest {
		return false, errUDPTooLarge
	}
	_, b := u.header(make([]byte, 0, size))
	b = append(b, head...)
	b = append(b, it.Value...)
	b = append(b, '\r', '\n')
	u.mu.Lock()
	defer u.mu.Unlock()
	if !u.up.Load() { // taken down while this set waited for mu
		return false, errUDPDown
	}
	if u.conn == nil {
		if u.conn, err = u.dial(); err != nil {
			return u.change(false, "dialing for a set: "+err.Error()), err
		}
	}
	if _, err := u.conn.Write(b); err != nil {
		u.conn.Close()
		u.conn = nil
		why := "a set's write failed: " + err.Error()
		if refused(err) {
			why = "datagrams refused (ICMP port unreachable): " + err.Error()
		}
		return u.change(false, why), err
	}
	return false, nil
}

// refused reports whether err is the host's refusal of a datagram: ICMP
// port unreachable, nothing listens on the port.
func refused(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }

// errUDPReply says a probe's answer was not memcached's version.
var errUDPReply = errors.New("upstream: UDP probe: unexpected reply")

// check sends one version request from the probe socket and waits up to
// timeout, or until ctx ends, for memcached's answer to it; answers to
// earlier probes that came late are skipped.
func (u *udpPort) check(ctx context.Context, timeout time.Duration) error {
	u.pmu.Lock()
	c := u.probe
	if c == nil {
		var err error
		if c, err = u.dial(); err != nil {
			u.pmu.Unlock()
			return err
		}
		u.probe = c
	}
	u.pmu.Unlock()
	err := c.SetDeadline(time.Now().Add(timeout))
	cut := false
	if err == nil {
		// A context that ends wakes the read at once; set after the
		// probe's own deadline, so that it is never overwritten.
		stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
		err = u.ask(c)
		cut = !stop()
	}
	if cut || err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		// Cut short, a refusal or a closed socket: start afresh next
		// time. A timeout keeps the socket: a late answer is skipped.
		u.pmu.Lock()
		if u.probe == c {
			u.probe = nil
		}
		u.pmu.Unlock()
		c.Close()
	}
	return err
}

// ask sends a version request on c and reads until its answer, within
// c's deadline.
func (u *udpPort) ask(c *net.UDPConn) error {
	id, req := u.header(make([]byte, 0, 8+len("version\r\n")))
	req = append(req, "version\r\n"...)
	if _, err := c.Write(req); err != nil {
		return err
	}
	var buf [256]byte
	for {
		n, err := c.Read(buf[:])
		if err != nil {
			return err
		}
		if n < 8 || binary.BigEndian.Uint16(buf[0:]) != id {
			continue // an earlier probe's answer, come late
		}
		if !bytes.HasPrefix(buf[8:n], []byte("VERSION ")) {
			return fmt.Errorf("%w: %q", errUDPReply, buf[8:n])
		}
		return nil
	}
}

// change makes the port up or down, with why, and reports whether that
// changed it (the first change after start always does). The gauge and
// the status change with up, under smu, so they never disagree with it.
func (u *udpPort) change(up bool, why string) bool {
	u.smu.Lock()
	defer u.smu.Unlock()
	if up {
		u.fails = 0
	}
	if u.probed && u.up.Load() == up {
		return false
	}
	u.probed = true
	u.up.Store(up)
	u.since, u.reason = time.Now(), why
	if up {
		u.gauge.Set(1)
	} else {
		u.gauge.Set(0)
	}
	return true
}

// failed counts one failed probe and returns the count in a row.
func (u *udpPort) failed() int {
	u.smu.Lock()
	defer u.smu.Unlock()
	u.fails++
	return u.fails
}

// UDPStatus is the state of a node's memcached UDP port (Server.UDPPort),
// for the admin API.
type UDPStatus struct {
	Addr string `json:"addr"` // host:port
	// Up is true while asynchronous sets to the node go out as datagrams;
	// false while they go over TCP.
	Up         bool      `json:"up"`
	Since      time.Time `json:"since"`                   // last change of Up
	Reason     string    `json:"reason"`                  // why it is in its state
	ProbeFails int       `json:"consecutive_probe_fails"` // failed UDP probes in a row
}

func (u *udpPort) status() *UDPStatus {
	u.smu.Lock()
	defer u.smu.Unlock()
	return &UDPStatus{Addr: u.addr, Up: u.up.Load(), Since: u.since, Reason: u.reason, ProbeFails: u.fails}
}

// close closes both sockets and takes the port down (a node removed, or
// the cluster closed): sets go over TCP until a probe passes again.
func (u *udpPort) close() {
	u.mu.Lock()
	if u.conn != nil {
		u.conn.Close()
		u.conn = nil
	}
	u.change(false, "closed")
	u.mu.Unlock()
	u.pmu.Lock()
	if u.probe != nil {
		u.probe.Close()
		u.probe = nil
	}
	u.pmu.Unlock()
}

// SetQuiet stores an item without waiting for memcached to confirm it
// when the serving node has a UDP port (Server.UDPPort) that is up (see
// udpPort): the set goes out as one UDP datagram with noreply, and
// nothing says whether it arrived. udp reports whether it went that way;
// the caller cannot tell such a set applied from lost. Otherwise (no UDP
// port, the port or the node down, a value that does not fit one
// datagram, the data socket failing) it is an ordinary Set over TCP, and
// err is its outcome; the caller is a queue's (op.Op.Queued).
func (c *Cluster) SetQuiet(ctx context.Context, it op.Item) (udp bool, err error) {
	set := func() error { return c.Do(ctx, op.Op{Verb: op.Set, Item: it, Queued: true}).Err }
	sk, hk := c.keys(it.Key)
	// pick records the key on the nodes down it passes over, as Do does
	// for a set sent over TCP.
	n, failover, err := c.pick(c.topo.Load(), hk, sk, true)
	if err != nil {
		return false, err
	}
	// pick ignores health in panic mode: a node down takes no datagrams.
	if n.udp == nil || !n.udp.up.Load() || !n.available() {
		return false, set()
	}
	mi := &memcache.Item{Key: sk, Value: it.Value, Flags: it.Flags, Expiration: it.Expiration}
	if failover {
		mi.Expiration = c.capTTL(mi.Expiration)
	}
	switch downed, err := n.udp.set(mi); {
	case err == nil:
		n.m.ops[opSetUDP][resOK].Inc()
		return true, nil
	case errors.Is(err, errUDPTooLarge), errors.Is(err, errUDPDown):
		return false, set()
	default:
		// A refusal says an earlier datagram (at least the last one) was
		// lost; this one was not sent and goes over TCP.
		n.m.ops[opSetUDP][resError].Inc()
		if downed {
			if refused(err) {
				n.log.Warn("memcached's UDP port refused datagrams (ICMP port unreachable: nothing listens there); at least the last set sent to it was lost; sets to this node go over TCP until a UDP probe passes", "udp", n.udp.addr, "err", err.Error())
			} else {
				n.log.Warn("memcached's UDP port failed; sets to this node go over TCP until a UDP probe passes", "udp", n.udp.addr, "err", err.Error())
			}
		}
		return false, set()
	}
}
