package faultproxy

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

const (
	// maxDatagram is the read buffer size: the largest UDP payload.
	maxDatagram = 64 << 10
	// udpQueueLen bounds the datagrams in flight per client and direction;
	// datagrams beyond it are dropped, as a full router queue would.
	udpQueueLen = 1024
)

// UDPStats is a snapshot of a UDP relay's datagram counters since Start.
type UDPStats struct {
	ToTarget int64 // datagrams sent on to the target
	ToClient int64 // replies sent back to clients
	Dropped  int64 // datagrams lost to full queues or send errors
	Clients  int64 // distinct client addresses seen
}

// UDP is a UDP relay with one-way latency. Datagrams from any client are
// sent on to the target from an upstream socket kept per client address,
// and whatever the target sends to that socket goes back to that client,
// which is how memcached's UDP protocol answers the sender's address.
//
// Create it with NewUDP and start it with Start. All methods are safe for
// concurrent use. Per-client sockets live until Close. A UDP must not be
// copied.
type UDP struct {
	target string

	latency atomic.Int64 // one-way delay in nanoseconds

	toTarget, toClient, dropped, nclients atomic.Int64

	mu      sync.Mutex // guards conn, raddr, clients, closed
	conn    *net.UDPConn
	raddr   *net.UDPAddr
	clients map[netip.AddrPort]*udpClient
	closed  bool

	done chan struct{} // closed by Close; stops every goroutine
	wg   sync.WaitGroup
}

// udpClient is the upstream side of one client address.
type udpClient struct {
	addr     netip.AddrPort
	upstream *net.UDPConn // connected to the target
	requests chan packet  // client to target, stamped
}

// NewUDP returns a stopped relay that will forward to target, a host:port
// resolved at Start. It starts nothing.
func NewUDP(target string) *UDP {
	return &UDP{
		target:  target,
		clients: make(map[netip.AddrPort]*udpClient),
		done:    make(chan struct{}),
	}
}

// Start resolves the target, listens on 127.0.0.1 on a free port and
// returns once the socket is open; datagrams are then relayed in the
// background until Close. It returns an error if the relay was already
// started or closed, or if resolving or listening fails.
func (r *UDP) Start() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.closed:
		return errors.New("faultproxy: start udp: relay is closed")
	case r.conn != nil:
		return errors.New("faultproxy: start udp: already started")
	}
	raddr, err := net.ResolveUDPAddr("udp", r.target)
	if err != nil {
		return fmt.Errorf("faultproxy: resolve udp %s: %w", r.target, err)
	}
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return fmt.Errorf("faultproxy: listen udp for %s: %w", r.target, err)
	}
	r.conn, r.raddr = conn, raddr
	r.wg.Go(func() { r.readLoop(conn) })
	return nil
}

// Addr returns the host:port clients should send to, or "" before Start.
func (r *UDP) Addr() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.conn == nil {
		return ""
	}
	return r.conn.LocalAddr().String()
}

// SetLatency holds every datagram, in each direction, for d before sending
// it on, so a request/reply exchange takes about 2*d more. Datagrams do not
// wait for each other: n sent together arrive together, in order. A
// datagram's delay is fixed when it is received. Zero or negative means no
// delay.
func (r *UDP) SetLatency(d time.Duration) {
	r.latency.Store(clampLatency(d))
}

// Datagrams returns a snapshot of the counters.
func (r *UDP) Datagrams() UDPStats {
	return UDPStats{
		ToTarget: r.toTarget.Load(),
		ToClient: r.toClient.Load(),
		Dropped:  r.dropped.Load(),
		Clients:  r.nclients.Load(),
	}
}

// Close closes every socket and waits for all of the relay's goroutines to
// return; datagrams still in the delay line are discarded. It is
// idempotent; later calls also wait and return nil. It returns the
// listening socket's close error, if any.
func (r *UDP) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		r.wg.Wait()
		return nil
	}
	r.closed = true
	close(r.done)
	conn := r.conn
	ups := make([]*net.UDPConn, 0, len(r.clients))
	for _, c := range r.clients {
		ups = append(ups, c.upstream)
	}
	r.mu.Unlock()

	var err error
	if conn != nil {
		if cerr := conn.Close(); cerr != nil {
			err = fmt.Errorf("faultproxy: close udp %s: %w", conn.LocalAddr(), cerr)
		}
	}
	for _, u := range ups {
		_ = u.Close()
	}
	r.wg.Wait()
	return err
}

// closing reports whether a read error means the relay is shutting down;
// any other error is transient and the read loop goes on.
func (r *UDP) closing(err error) bool {
	if errors.Is(err, net.ErrClosed) {
		return true
	}
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// stamp copies a datagram and gives it its due time on the delay line.
func (r *UDP) stamp(b []byte) packet {
	return packet{data: bytes.Clone(b), due: time.Now().Add(time.Duration(r.latency.Load()))}
}

// readLoop receives client datagrams and queues each, stamped, for its
// client's upstream socket.
func (r *UDP) readLoop(conn *net.UDPConn) {
	buf := make([]byte, maxDatagram)
	for {
		n, from, err := conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			if r.closing(err) {
				return
			}
			continue
		}
		pk := r.stamp(buf[:n])
		c := r.client(conn, from)
		if c == nil {
			r.dropped.Add(1)
			continue
		}
		select {
		case c.requests <- pk:
		default:
			r.dropped.Add(1)
		}
	}
}

// client returns the upstream side for addr, creating it and starting its
// goroutines on first use. It returns nil if the relay is closed or the
// upstream socket cannot be opened.
func (r *UDP) client(conn *net.UDPConn, addr netip.AddrPort) *udpClient {
	// Held across DialUDP, which for UDP only binds and connects a socket.
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil
	}
	if c, ok := r.clients[addr]; ok {
		return c
	}
	up, err := net.DialUDP("udp", nil, r.raddr)
	if err != nil {
		return nil
	}
	c := &udpClient{addr: addr, upstream: up, requests: make(chan packet, udpQueueLen)}
	r.clients[addr] = c
	r.nclients.Add(1)
	replies := make(chan packet, udpQueueLen)
	// Safe against Close's Wait: readLoop, our caller, is counted in wg.
	r.wg.Go(func() { r.forward(c) })
	r.wg.Go(func() { r.readReplies(c, replies) })
	r.wg.Go(func() { r.sendReplies(conn, c, replies) })
	return c
}

// forward sends c's requests to the target, each no earlier than its stamp.
func (r *UDP) forward(c *udpClient) {
	t := stoppedTimer()
	for {
		var pk packet
		select {
		case pk = <-c.requests:
		case <-r.done:
			return
		}
		if !waitUntil(t, pk.due, r.done) {
			return
		}
		if _, err := c.upstream.Write(pk.data); err != nil {
			r.dropped.Add(1)
			continue
		}
		r.toTarget.Add(1)
	}
}

// readReplies receives datagrams from the target on c's socket and queues
// them, stamped, for sendReplies.
func (r *UDP) readReplies(c *udpClient, replies chan<- packet) {
	buf := make([]byte, maxDatagram)
	for {
		n, err := c.upstream.Read(buf)
		if err != nil {
			// ECONNREFUSED from an earlier send to a closed port is
			// reported once; anything but our own Close is transient.
			if r.closing(err) {
				return
			}
			continue
		}
		pk := r.stamp(buf[:n])
		select {
		case replies <- pk:
		default:
			r.dropped.Add(1)
		}
	}
}

// sendReplies sends queued replies back to c's address from the listening
// socket, each no earlier than its stamp.
func (r *UDP) sendReplies(conn *net.UDPConn, c *udpClient, replies <-chan packet) {
	t := stoppedTimer()
	for {
		var pk packet
		select {
		case pk = <-replies:
		case <-r.done:
			return
		}
		if !waitUntil(t, pk.due, r.done) {
			return
		}
		if _, err := conn.WriteToUDPAddrPort(pk.data, c.addr); err != nil {
			r.dropped.Add(1)
			continue
		}
		r.toClient.Add(1)
	}
}
