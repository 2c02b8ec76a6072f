package upstream

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/memcgate/memcgate/upstream/op"
)

// udpSender sends fire-and-forget sets to one node's UDP port in
// memcached's UDP framing: an 8-byte header (request id, sequence number,
// datagram count, reserved; big-endian uint16s) before the command. It
// never reads: the sets carry noreply.
type udpSender struct {
	addr string // host:udpport; resolved on first use
	mu   sync.Mutex
	conn *net.UDPConn // guarded by mu; nil until first use or after an error
	id   atomic.Uint32
}

// maxUDPRequest keeps a request inside one datagram on any path with a
// 1500-byte MTU; memcached refuses requests split over datagrams.
const maxUDPRequest = 1400

// errUDPTooLarge says the set does not fit one datagram; callers use TCP.
var errUDPTooLarge = errors.New("upstream: set too large for one UDP datagram")

func (u *udpSender) set(it *memcache.Item) error {
	head := "set " + it.Key + " " + strconv.FormatUint(uint64(it.Flags), 10) + " " +
		strconv.FormatInt(int64(it.Expiration), 10) + " " + strconv.Itoa(len(it.Value)) + " noreply\r\n"
	size := 8 + len(head) + len(it.Value) + 2
	if size > maxUDPRequest {
		return errUDPTooLarge
	}
	b := make([]byte, 8, size)
	binary.BigEndian.PutUint16(b[0:], uint16(u.id.Add(1)))
	binary.BigEndian.PutUint16(b[2:], 0) // sequence number
	binary.BigEndian.PutUint16(b[4:], 1) // datagrams in this request
	binary.BigEndian.PutUint16(b[6:], 0) // reserved
	b = append(b, head...)
	b = append(b, it.Value...)
	b = append(b, '\r', '\n')
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.conn == nil {
		ua, err := net.ResolveUDPAddr("udp", u.addr)
		if err != nil {
			return err
		}
		if u.conn, err = net.DialUDP("udp", nil, ua); err != nil {
			return err
		}
	}
	if _, err := u.conn.Write(b); err != nil {
		u.conn.Close()
		u.conn = nil
		return err
	}
	return nil
}

func (u *udpSender) close() {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.conn != nil {
		u.conn.Close()
		u.conn = nil
	}
}

// SetQuiet stores an item without waiting for memcached to confirm it
// when the serving node has a UDP port (Server.UDPPort): the set goes out
// as one UDP datagram with noreply, and nothing says whether it arrived.
// udp reports whether it went that way; the caller cannot tell such a set
// applied from lost. Without a UDP port, or for a value that does not fit
// one datagram, it is an ordinary Set over TCP, and err is its outcome.
func (c *Cluster) SetQuiet(ctx context.Context, it op.Item) (udp bool, err error) {
	set := func() error { return c.Do(ctx, op.Op{Verb: op.Set, Item: it}).Err }
	sk, hk := c.keys(it.Key)
	n, failover, err := c.pick(c.topo.Load(), hk)
	if err != nil {
		return false, err
	}
	if n.udp == nil {
		return false, set()
	}
	mi := &memcache.Item{Key: sk, Value: it.Value, Flags: it.Flags, Expiration: it.Expiration}
	if failover {
		mi.Expiration = c.capTTL(mi.Expiration)
	}
	switch err := n.udp.set(mi); {
	case err == nil:
		n.m.ops[opSetUDP][resOK].Inc()
		return true, nil
	case errors.Is(err, errUDPTooLarge):
		return false, set()
	default:
		n.m.ops[opSetUDP][resError].Inc()
		return false, set() // e.g. ICMP port unreachable: try TCP
	}
}
