package faultproxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

const (
	// chunkSize is the largest read one direction of a TCP link does at once.
	chunkSize = 32 << 10
	// tcpQueueLen bounds the chunks in flight per direction. A full queue
	// stops reading from the sender, which is TCP back-pressure, so it only
	// has to hold a bandwidth-delay product that tests actually use.
	tcpQueueLen = 1024
	// dialTimeout bounds the upstream dial of each accepted connection.
	dialTimeout = 5 * time.Second
	// acceptBackoff is the pause after a transient Accept error (EMFILE).
	acceptBackoff = 10 * time.Millisecond
)

// TCPStats is a snapshot of a TCP proxy's counters since Start.
type TCPStats struct {
	Accepted int64 // connections accepted, including refused ones
	Refused  int64 // connections reset at once because SetRefuse was on
	Open     int64 // client connections currently relayed or blackholed
	// BytesFromClient counts bytes read from clients, as they are read:
	// a chunk counted here and not yet in BytesToTarget is in the delay
	// line, its delivery time already fixed (SetLatency).
	BytesFromClient int64
	BytesToTarget   int64 // bytes written to upstream connections
	BytesToClient   int64 // bytes written back to clients
	BytesDropped    int64 // bytes swallowed by blackholed connections
}

// TCP is a fault-injecting TCP proxy. Each accepted client connection gets
// its own upstream connection to the target, like a real network path, and
// bytes are relayed both ways through a delay line.
//
// Create it with NewTCP and start it with Start. All methods are safe for
// concurrent use, and the fault controls take effect at once for existing
// and new connections. A TCP must not be copied.
type TCP struct {
	target string
	dialer net.Dialer

	latency   atomic.Int64 // one-way delay in nanoseconds
	blackhole atomic.Bool
	refuse    atomic.Bool

	accepted, refused, open     atomic.Int64
	fromClient                  atomic.Int64
	toTarget, toClient, dropped atomic.Int64

	mu     sync.Mutex // guards ln, links, closed
	ln     *net.TCPListener
	links  map[*link]struct{}
	closed bool

	done chan struct{} // closed by Close; stops the accept loop's backoff
	wg   sync.WaitGroup
}

// NewTCP returns a stopped proxy that will relay to target, a host:port
// dialled afresh for each client connection. It starts nothing.
func NewTCP(target string) *TCP {
	return &TCP{
		target: target,
		dialer: net.Dialer{Timeout: dialTimeout},
		links:  make(map[*link]struct{}),
		done:   make(chan struct{}),
	}
}

// StartHanging starts n proxies that accept connections and never answer
// on them: servers that hang, as a process stopped with SIGSTOP does but
// cheaper by the dozen. The blackhole is on from the start, so no target
// is ever dialled. The caller closes them; on an error, those started
// are closed.
func StartHanging(n int) ([]*TCP, error) {
	pxs := make([]*TCP, 0, n)
	for range n {
		p := NewTCP("127.0.0.1:1") // never dialled
		p.Blackhole(true)
		if err := p.Start(); err != nil {
			for _, started := range pxs {
				started.Close()
			}
			return nil, err
		}
		pxs = append(pxs, p)
	}
	return pxs, nil
}

// Start listens on 127.0.0.1 on a free port and returns once the listener
// is open; connections are then accepted in the background until Close.
// It returns an error if the proxy was already started or closed, or if
// listening fails.
func (p *TCP) Start() error {
	// The lock is held across Listen, which does not block, so that two
	// concurrent Starts cannot both open a listener.
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.closed:
		return errors.New("faultproxy: start tcp: proxy is closed")
	case p.ln != nil:
		return errors.New("faultproxy: start tcp: already started")
	}
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return fmt.Errorf("faultproxy: listen tcp for %s: %w", p.target, err)
	}
	p.ln = ln
	p.wg.Go(func() { p.acceptLoop(ln) })
	return nil
}

// Addr returns the host:port clients should dial, or "" before Start. The
// address stays the same until Close, whatever the fault settings.
func (p *TCP) Addr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln == nil {
		return ""
	}
	return p.ln.Addr().String()
}

// SetLatency delays every chunk read in either direction by d before it is
// written on, so a request/response round trip takes about 2*d more. Order
// and throughput are kept: chunks read together leave together. A chunk's
// delay is fixed when it is read, so a change affects bytes read from then
// on, on existing and new connections. Zero or negative means no delay.
func (p *TCP) SetLatency(d time.Duration) {
	p.latency.Store(clampLatency(d))
}

// Blackhole turns the blackhole on or off. While it is on, bytes read in
// either direction are silently dropped, and new connections are accepted
// but never dialled upstream, so nothing flows: the client sees a hang.
//
// A connection that dropped any byte, or was accepted while the blackhole
// was on, stays dead after the blackhole is turned off, because resuming a
// stream with a hole in it would desynchronise the protocol: it keeps
// swallowing until the client closes it, Reset or Close. Connections that
// dropped nothing (idle ones) resume relaying, as do new connections.
// Chunks already in the delay line when it turns on are still delivered.
func (p *TCP) Blackhole(on bool) {
	p.blackhole.Store(on)
}

// SetRefuse turns refusing on or off. While it is on, every new client
// connection is reset (RST) right after accept. The kernel has completed the
// handshake by then, so the client's dial succeeds and its first read or
// write fails with ECONNRESET (or EPIPE, or EOF). The listener stays open,
// so Addr is unchanged when refusing is turned off. Existing connections
// are not affected; use Reset for those.
func (p *TCP) SetRefuse(on bool) {
	p.refuse.Store(on)
}

// Reset aborts every current connection: the client side is closed with
// SO_LINGER 0, so the client gets a TCP RST (ECONNRESET), and the upstream
// side is closed normally. Bytes still in the delay line are discarded.
// New connections are unaffected. Reset does not wait for the connections'
// goroutines to finish; Stats().Open drops to 0 shortly after.
func (p *TCP) Reset() {
	for _, l := range p.snapshot() {
		l.close(true)
	}
}

// Stats returns a snapshot of the counters.
func (p *TCP) Stats() TCPStats {
	return TCPStats{
		Accepted:        p.accepted.Load(),
		Refused:         p.refused.Load(),
		Open:            p.open.Load(),
		BytesFromClient: p.fromClient.Load(),
		BytesToTarget:   p.toTarget.Load(),
		BytesToClient:   p.toClient.Load(),
		BytesDropped:    p.dropped.Load(),
	}
}

// Close stops listening, closes every connection (normally, not with RST)
// and waits for all of the proxy's goroutines to return. It is idempotent;
// later calls also wait and return nil. It returns the listener's close
// error, if any.
func (p *TCP) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		p.wg.Wait()
		return nil
	}
	p.closed = true
	close(p.done)
	ln := p.ln
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.mu.Unlock()

	var err error
	if ln != nil {
		if cerr := ln.Close(); cerr != nil {
			err = fmt.Errorf("faultproxy: close tcp %s: %w", ln.Addr(), cerr)
		}
	}
	for _, l := range links {
		l.close(false)
	}
	p.wg.Wait()
	return err
}

func (p *TCP) acceptLoop(ln *net.TCPListener) {
	for {
		c, err := ln.AcceptTCP()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			select { // transient, e.g. out of file descriptors
			case <-p.done:
				return
			case <-time.After(acceptBackoff):
			}
			continue
		}
		p.accepted.Add(1)
		if p.refuse.Load() {
			p.refused.Add(1)
			_ = c.SetLinger(0)
			_ = c.Close()
			continue
		}
		// Adding to wg here is safe against Close's Wait: this loop is
		// itself counted in wg, so the counter is not zero.
		p.wg.Go(func() { p.serve(c) })
	}
}

// snapshot returns the current links.
func (p *TCP) snapshot() []*link {
	p.mu.Lock()
	defer p.mu.Unlock()
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	return links
}

// track registers l so Reset and Close can reach it, unless the proxy is
// closed. Close snapshots links after setting closed, so every link is
// either refused here or seen by Close.
func (p *TCP) track(l *link) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.links[l] = struct{}{}
	p.open.Add(1)
	return true
}

func (p *TCP) untrack(l *link) {
	l.close(false)
	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
	p.open.Add(-1)
}

// serve relays one client connection until both directions are done or the
// link is closed. It waits for the goroutines it starts.
func (p *TCP) serve(c *net.TCPConn) {
	ctx, cancel := context.WithCancel(context.Background())
	l := &link{client: c, cancel: cancel}
	if !p.track(l) {
		cancel()
		_ = c.Close()
		return
	}
	defer p.untrack(l)

	if p.blackhole.Load() {
		// Accepted into the blackhole: never dial, swallow until the
		// client goes away or the link is closed.
		l.dead.Store(true)
		p.pump(l, c, nil, &p.fromClient, ctx.Done())
		return
	}

	// The link is tracked before the dial so Reset and Close reach
	// connections whose dial is still in progress: closing the link
	// cancels ctx, which aborts the dial.
	u, err := p.dialer.DialContext(ctx, "tcp", p.target)
	if err != nil {
		l.close(true)
		return
	}
	up := u.(*net.TCPConn)
	if !l.setUpstream(up) {
		return
	}

	var wg sync.WaitGroup
	wg.Go(func() { p.relay(l, c, up, &p.fromClient, &p.toTarget, ctx.Done()) })
	p.relay(l, up, c, nil, &p.toClient, ctx.Done())
	wg.Wait()
}

// relay moves bytes from src to dst through a delay line until src is at
// EOF and everything read, then the FIN, has been passed on, or the link is
// closed. read counts the bytes read from src (nil: not counted), written
// those written to dst.
func (p *TCP) relay(l *link, src, dst *net.TCPConn, read, written *atomic.Int64, done <-chan struct{}) {
	q := make(chan packet, tcpQueueLen)
	var wg sync.WaitGroup
	wg.Go(func() { p.deliver(l, dst, q, written, done) })
	p.pump(l, src, q, read, done)
	wg.Wait()
}

// pump reads chunks from src, stamps each with its delivery time and queues
// it on q, or drops it if the link is dead or the blackhole is on (a nil q
// means the link is dead from the start); it counts what it reads in read
// (nil: not counted). It closes q when it returns. On EOF it queues an EOF
// marker and the link stays up for the other direction, unless the link
// is dead; on any other error the link is aborted.
func (p *TCP) pump(l *link, src *net.TCPConn, q chan<- packet, read *atomic.Int64, done <-chan struct{}) {
	if q != nil {
		defer close(q)
	}
	buf := make([]byte, chunkSize)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if q == nil || l.dead.Load() || p.blackhole.Load() {
				l.dead.Store(true)
				p.dropped.Add(int64(n))
				if read != nil {
					read.Add(int64(n))
				}
			} else {
				pk := packet{
					data: bytes.Clone(buf[:n]),
					due:  time.Now().Add(time.Duration(p.latency.Load())),
				}
				if read != nil {
					read.Add(int64(n)) // once stamped: a reader of the count knows the chunk's delay is fixed
				}
				select {
				case q <- pk:
				case <-done:
					return
				}
			}
		}
		if err != nil {
			switch {
			case errors.Is(err, io.EOF) && !l.dead.Load():
				// Half-close: the FIN travels the delay line like data,
				// and the other direction stays open.
				pk := packet{due: time.Now().Add(time.Duration(p.latency.Load())), eof: true}
				select {
				case q <- pk:
				case <-done:
				}
			case errors.Is(err, io.EOF):
				l.close(false) // a dead link has nothing left to carry
			default:
				l.close(true)
			}
			return
		}
	}
}

// deliver writes queued chunks to dst, each no earlier than its stamp, in
// order, and half-closes dst when it reaches the EOF marker, passing the
// FIN on. A write error aborts the link.
func (p *TCP) deliver(l *link, dst *net.TCPConn, q <-chan packet, written *atomic.Int64, done <-chan struct{}) {
	t := stoppedTimer()
	for {
		var pk packet
		var ok bool
		select {
		case pk, ok = <-q:
		case <-done:
			return
		}
		if !ok {
			return
		}
		if !waitUntil(t, pk.due, done) {
			return
		}
		if pk.eof {
			_ = dst.CloseWrite()
			return
		}
		if _, err := dst.Write(pk.data); err != nil {
			l.close(true)
			return
		}
		written.Add(int64(len(pk.data)))
	}
}

// link is one client connection and, once dialled, its upstream connection.
type link struct {
	client *net.TCPConn
	cancel context.CancelFunc // ends the link's context, stopping its goroutines
	dead   atomic.Bool        // set when a byte is swallowed; never cleared

	mu       sync.Mutex // guards upstream, closed
	upstream *net.TCPConn
	closed   bool
}

// setUpstream records u as the link's upstream, or closes u and reports
// false if the link was closed during the dial.
func (l *link) setUpstream(u *net.TCPConn) bool {
	l.mu.Lock()
	closed := l.closed
	if !closed {
		l.upstream = u
	}
	l.mu.Unlock()
	if closed {
		_ = u.Close()
	}
	return !closed
}

// close ends the link: it cancels its context and closes both connections,
// the client's with RST if rst. Only the first call has an effect.
func (l *link) close(rst bool) {
	l.cancel()
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.closed = true
	u := l.upstream
	l.mu.Unlock()

	if rst {
		_ = l.client.SetLinger(0)
	}
	_ = l.client.Close()
	if u != nil {
		_ = u.Close()
	}
}
