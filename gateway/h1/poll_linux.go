package h1

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// A poller serves keep-alive connections between requests the way an
// event loop does, on Linux. Every connection that finished a request is
// registered once with an epoll instance of the poller's own
// (edge-triggered) and, instead of waiting for its next request in a
// read of its own, is parked: it then has no goroutine at all. When its
// request arrives the poller queues it, first come first served, for a
// worker: a goroutine that serves ready connections one after another
// and waits only when none is ready. New connections join the same
// queue as they are accepted (admit). The epoll instance is itself
// watched by Go's network poller, so the poller's goroutine waits like
// any socket read.
//
// Against a goroutine per connection waiting in a read, this saves:
//   - memory: a waiting goroutine keeps the stack its handler grew (8 KiB
//     on the gateway's path); with thousands of keep-alive clients
//     those stacks were the largest part of the gateway's memory;
//   - a system call per request: a parked connection needs no read that
//     fails with EAGAIN to learn that its next request is not there;
//   - order: the runtime resumes the goroutines of a network poll last
//     ready first, the poller serves connections in the order their
//     requests arrived.
//
// Connections also wait here in the middle of a request, so that a
// client that is slow to send, or sends nothing, holds no worker: a new
// connection until its first bytes come, and one with part of a head or
// of a body until the rest comes. Those are parked with a deadline (the
// header or read timeout) in a heap of their own, and closed when it
// passes; a body's request is answered first (parkBody).
//
// Ownership of a connection: while its state is stateParked (idle) or
// stateReading (mid-request) it belongs to the poller. wake (the event)
// or a close (closeIdle for idle ones, Close, a timeout) takes it from
// there with a compare-and-swap on the state, to the state a worker
// resumes it in (queued for a worker; an idle one whose peer closed is
// first looked at by the poller's goroutine, which ends it if nothing
// is left to read: endHupped) or stateClosed (whoever swapped finishes
// it).
type poller struct {
	epfd int
	file *os.File        // epfd, so that Go's poller watches it
	rc   syscall.RawConn // of file
	idle time.Duration   // idle timeout of parked connections; <= 0: none
	max  int             // soft cap on workers (maxWorkers but in tests)

	mu        sync.Mutex      // guards the fields below and every conn.pf
	conns     map[int32]*conn // registered connections, by descriptor
	oldest    *conn           // parked connections, oldest first (pf.older, pf.newer)
	newest    *conn
	reading   []*conn // connections parked mid-request, a min-heap by pf.deadline
	head      *conn   // ready connections, in arrival order (pf.next)
	tail      *conn
	queued    int           // connections in the queue
	taken     uint64        // connections taken from the queue, ever
	live      int           // workers started and not yet ended
	idlers    []*idleWorker // workers waiting in take, not yet woken; the last idle first
	workerTTL time.Duration // how long a worker may wait for work before it ends
	closed    bool          // no more parking; workers leave once the queue is empty
	abandoned atomic.Bool   // abandon closed it: epoll failed (Detach then declines)
	closeOnce sync.Once     // closes file
	workers   sync.WaitGroup
	armed     time.Time // the deadline file has now; zero: none

	stall      *time.Timer // runs checkStall while the queue is not empty
	stallArmed bool
	stallTaken uint64 // taken when the stall check was armed

	// The room line: bodies read ahead that the budget could not hold
	// whole, parked (stateReading, also in the reading heap for their
	// deadline) in arrival order until it can (waitRoom).
	room     []*conn
	roomHeld int64        // what the bodies in room hold already
	roomSeq  uint64       // the last conn.roomSeq given
	roomLen  atomic.Int32 // len(room), for readers without mu

	// The room bell: a budget that says when it gives room back
	// (roomNotifier) rings it while bodies wait in the room line, and
	// run then admits those there is room for (ringRoom). It is an
	// eventfd in the epoll set. Without it, run looks every roomTick.
	bell    *os.File        // nil: no eventfd
	bellRC  syscall.RawConn // of bell: no call on its descriptor once closed
	bellFD  int32
	rung    atomic.Bool // the bell rang and run has not read it yet
	belled  bool        // the budget rings the bell (watchRoom): no roomTick; set before run
	unwatch func()      // stops the budget's calls; nil: none

	events [128]syscall.EpollEvent // run's
	drain  func(fd uintptr) bool   // p.drainFD, made once
	hupped []*conn                 // run's: idle connections whose peer closed or reset (endHupped)
}

// pollFields are a conn's fields for the poller, guarded by poller.mu.
type pollFields struct {
	fd           int32
	registered   bool // in the epoll set, under fd
	readable     bool // an event came while the connection was not parked
	hup          bool // the peer closed or reset: read until EOF, never park again
	fresh        bool // queued by admit: not served yet
	parkedAt     time.Time
	older, newer *conn // the parked list
	next         *conn // the ready queue
	// Parked mid-request (parkReading): where in reading, the deadline
	// (zero: none) and the state a worker resumes it in.
	hidx     int // index in the reading heap; -1 when not in it
	deadline time.Time
	resumeIn int32
	stall    bool // deadline is its body's bodyStall: a worker resumes it then (parkBody)
	// In the room line (waitRoom): what it needs of the budget, and
	// what it holds already.
	room               bool
	roomNeed, roomHeld int64
}

// idleWorker is a worker waiting in take for a ready connection.
//
// Waiting workers are woken last idle first, like a stack: the workers
// the load needs stay on top, their stacks warm; the rest wait at the
// bottom until workerTTL ends them, which also gives their stacks back.
// Waking them in turn keeps every worker in rotation, each request on a
// cold stack (docs/benchmarks.md, "idle workers last idle first").
type idleWorker struct {
	wake   chan struct{} // buffered: one wake-up per wait
	since  time.Time     // when it began to wait
	retire bool          // woken to end, not for work
}

// Workers are started as connections become ready and no worker waits,
// up to maxWorkers. Past that, ready connections wait in the queue for a
// worker to finish its request, with no goroutine: under full load the
// requests the gateway cannot serve yet stay in the kernel, as with an
// event loop, instead of each being read into a goroutine that then
// waits in the handler, holding its stack. When no worker takes a
// connection from the queue for stallCheck (every worker waits on a
// stopped memcached, say), spawnBatch more start, whatever their number,
// so that the queue never waits for the workers' timeouts. stallCheck is
// well above the gaps between completions under full load: replies from
// memcached come back in batches, and a check near those gaps takes them
// for stalls and starts workers the load does not need (docs/benchmarks.md,
// "stall check 10 ms").
const (
	maxWorkers = 512 // the default of Server.pollWorkers
	spawnBatch = 32
	stallCheck = 10 * time.Millisecond
	// maxIdleWorkers is how many workers may wait for a ready
	// connection; more leave. Waiting workers cost their stacks; too
	// few cost a new goroutine (and its stack growth) per request.
	maxIdleWorkers = 256
	// workerTTL is how long a worker may wait for a ready connection
	// before it ends, so that the workers a burst started do not stay.
	workerTTL = 10 * time.Second
)

// roomTick is how often the poller looks for room for the first body of
// the room line while it is not empty, when the budget cannot say when
// it gives room back (roomNotifier); one that can rings the room bell
// instead (docs/decisions/0082). Looking is a load and a compare.
const roomTick = time.Millisecond

// epollET is EPOLLET, which package syscall spells as a negative int on
// some architectures.
const epollET = 1 << 31

// park results.
const (
	parked    = iota // the poller has it: the goroutine must let go of it
	readable         // data came since it was last read: read before parking
	notParked        // cannot park (poller closed, connection closed, no RawConn)
)

// newPoller returns a poller whose parked connections are closed after
// idle (none if idle <= 0) and which starts up to workers workers
// (maxWorkers if workers <= 0) but for stalls, or an error if the system
// refuses epoll.
func newPoller(idle time.Duration, workers int) (*poller, error) {
	epfd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("h1: epoll_create1: %w", err)
	}
	if err := syscall.SetNonblock(epfd, true); err != nil {
		syscall.Close(epfd)
		return nil, fmt.Errorf("h1: epoll descriptor: %w", err)
	}
	f := os.NewFile(uintptr(epfd), "h1-poller")
	rc, err := f.SyscallConn()
	if err == nil {
		// Deadlines need the descriptor in Go's poller: epoll's is pollable.
		err = f.SetReadDeadline(time.Time{})
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("h1: epoll descriptor: %w", err)
	}
	if workers <= 0 {
		workers = maxWorkers
	}
	p := &poller{epfd: epfd, file: f, rc: rc, idle: idle, max: workers, workerTTL: workerTTL, conns: make(map[int32]*conn)}
	p.drain = p.drainFD
	p.newBell()
	p.stall = time.AfterFunc(time.Hour, p.checkStall)
	p.stall.Stop()
	return p, nil
}

// newBell makes the room bell, an eventfd in the epoll set, level
// triggered: it stays readable until run reads it. If the system refuses
// one, the poller looks for room on roomTick.
func (p *poller) newBell() {
	fd, _, errno := syscall.RawSyscall(syscall.SYS_EVENTFD2, 0, syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if errno != 0 {
		return
	}
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: int32(fd)}
	if syscall.EpollCtl(p.epfd, syscall.EPOLL_CTL_ADD, int(fd), &ev) != nil {
		syscall.Close(int(fd))
		return
	}
	bell := os.NewFile(fd, "h1-room-bell")
	rc, err := bell.SyscallConn()
	if err != nil {
		bell.Close()
		return
	}
	p.bell, p.bellRC, p.bellFD = bell, rc, int32(fd)
}

// watchRoom has bg ring the room bell when it gives room back, if it
// can say so (roomNotifier) and the bell was made; it is called before
// run starts.
func (p *poller) watchRoom(bg Budget) {
	n, ok := bg.(roomNotifier)
	if !ok || p.bell == nil {
		return
	}
	p.unwatch, p.belled = n.OnFree(p.ringRoom), true
}

// ringRoom, called by the budget after it gave room back, rings the
// room bell if bodies wait in the room line and it has not rung since
// run last read it. It takes no lock: the budget calls it with its
// callers' locks held, the poller's among them (admitRoomLocked's
// Acquire). No wake-up is lost: run clears rung before it reads the
// budget's room (readBell), so room given back after that read rings
// again; and waitRoom looks at the room after the body is in the line
// (roomLen), so room given back before that is seen there.
func (p *poller) ringRoom() {
	if p.roomLen.Load() == 0 || p.rung.Load() || !p.rung.CompareAndSwap(false, true) {
		return
	}
	one := [8]byte{1} // eventfd adds a host-order uint64: 1 on little-endian machines, 1<<56 on big-endian ones; either is not 0
	p.bellRC.Control(func(fd uintptr) { syscall.Write(int(fd), one[:]) })
}

// readBell reads the room bell, which then stops being readable, and
// lets it ring again; the caller then admits from the room line.
func (p *poller) readBell() {
	var b [8]byte
	p.bellRC.Control(func(fd uintptr) { syscall.Read(int(fd), b[:]) })
	p.rung.Store(false)
}

// run queues the parked connections whose requests arrive and closes the
// ones idle for too long, until close.
func (p *poller) run() {
	for {
		err := p.rc.Read(p.drain)
		if err == nil || !errors.Is(err, os.ErrDeadlineExceeded) {
			p.abandon()
			return
		}
		// Events before timers, as nginx orders them: a request that
		// came before its connection's deadline is served however late
		// this goroutine runs (a deadline that passed while it was busy
		// fails the next Read before any event is read). The time is
		// taken before the events are read, so a connection expired at
		// it had nothing waiting then; Control keeps the descriptor open.
		now := time.Now()
		p.rc.Control(func(fd uintptr) { p.drain(fd) })
		p.expire(now)
	}
}

// abandon, when run ends without close (epoll_wait failed), refuses
// later parks, so that connections keep their goroutines from then on,
// and closes the parked ones, which no event would ever wake.
func (p *poller) abandon() {
	var parked []*conn
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	p.wakeAllLocked()
	for c := p.oldest; c != nil; c = p.oldest {
		p.unparkLocked(c)
		if c.state.CompareAndSwap(stateParked, stateClosed) {
			parked = append(parked, c)
		}
	}
	for len(p.reading) > 0 {
		c := p.reading[0]
		p.unheapLocked(c)
		if c.state.CompareAndSwap(stateReading, stateClosed) {
			parked = append(parked, c)
		}
	}
	p.mu.Unlock()
	p.stall.Stop()
	for _, c := range parked {
		c.closeParked()
	}
}

// drainFD takes every ready event from the epoll set and reports false,
// so that rc.Read waits for more; it reports true only on an error.
func (p *poller) drainFD(fd uintptr) bool {
	for {
		n, err := epollPoll(int(fd), p.events[:])
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return true
		}
		uncovered := 0
		p.mu.Lock()
		for _, ev := range p.events[:n] {
			if p.bell != nil && ev.Fd == p.bellFD {
				p.readBell()
				uncovered += p.admitRoomLocked()
				continue
			}
			uncovered += p.wakeLocked(ev.Fd, ev.Events)
		}
		spawn := p.spawnCappedLocked(uncovered)
		p.mu.Unlock()
		for range spawn {
			go p.work()
		}
		p.endHupped()
		if n < len(p.events) {
			return false
		}
	}
}

// wakeLocked handles events for fd: a parked connection is queued for
// a worker, any other is marked readable. It returns the number of
// workers to start (0 or 1).
func (p *poller) wakeLocked(fd int32, events uint32) int {
	c := p.conns[fd]
	if c == nil || p.closed { // closed: the closer closes what is parked
		return 0
	}
	if events&(syscall.EPOLLRDHUP|syscall.EPOLLHUP|syscall.EPOLLERR) != 0 {
		// A read may take the FIN along with the last data and not
		// report it; no event would follow.
		c.pf.hup = true
	}
	if c.pf.room {
		// Its body's bytes wait in the socket until there is room for
		// them. A close of the client's side too: one that half-closed
		// after its whole request still wants the answer, and one gone
		// holds nothing while it waits its turn or its deadline.
		c.pf.readable = true
		return 0
	}
	if c.state.CompareAndSwap(stateReading, c.pf.resumeIn) {
		p.unheapLocked(c)
		c.pf.stall = false
		c.pf.fresh = c.pf.resumeIn == stateNew
		return p.queueLocked(c)
	}
	if !c.state.CompareAndSwap(stateParked, stateIdle) {
		c.pf.readable = true // active or queued; or being closed, which needs nothing
		return 0
	}
	p.unparkLocked(c)
	if c.pf.hup {
		p.hupped = append(p.hupped, c) // endHupped's, now that it is idle
		return 0
	}
	return p.queueLocked(c)
}

// endHupped closes the idle connections in p.hupped whose peer closed
// (or reset) with nothing left to read, and queues the others for a
// worker. A client that connects per request closes after its response:
// closing here spares the wake-up of a worker only to read the end.
func (p *poller) endHupped() {
	for i, c := range p.hupped {
		p.hupped[i] = nil
		if c.peerGone() || !p.requeue(c) {
			c.close()
			c.finish()
		}
	}
	p.hupped = p.hupped[:0]
}

// spawnLocked counts n workers about to start, and arms the stall check
// if the queue is not empty. It returns n, or 0 once the poller is
// closed.
func (p *poller) spawnLocked(n int) int {
	if p.closed {
		return 0
	}
	p.workers.Add(n) // under mu, so never after close has begun to wait
	p.live += n
	if p.head != nil && !p.stallArmed {
		p.stallArmed, p.stallTaken = true, p.taken
		p.stall.Reset(stallCheck)
	}
	return n
}

// spawnCappedLocked is spawnLocked for up to n workers, as many as the
// cap on workers still allows.
func (p *poller) spawnCappedLocked(n int) int {
	return p.spawnLocked(min(n, max(0, p.max-p.live)))
}

// checkStall starts more workers if none took a connection from the
// queue since the check was armed.
func (p *poller) checkStall() {
	p.mu.Lock()
	p.stallArmed = false
	n := 0
	if p.head != nil && p.taken == p.stallTaken {
		n = min(p.queued, spawnBatch)
	}
	n = p.spawnLocked(n)
	p.mu.Unlock()
	for range n {
		go p.work()
	}
}

// queueLocked appends c to the ready queue and signals a waiting worker,
// or reports that one must be started.
func (p *poller) queueLocked(c *conn) int {
	c.pf.next = nil
	if p.tail != nil {
		p.tail.pf.next = c
	} else {
		p.head = c
	}
	p.tail = c
	p.queued++
	if n := len(p.idlers); n > 0 {
		w := p.idlers[n-1]
		p.idlers[n-1] = nil
		p.idlers = p.idlers[:n-1]
		w.wake <- struct{}{}
		return 0
	}
	return 1
}

// retireLocked ends the workers that have waited for work since before
// now minus workerTTL. They are at the bottom of the stack.
func (p *poller) retireLocked(now time.Time) {
	n := 0
	for n < len(p.idlers) && now.Sub(p.idlers[n].since) >= p.workerTTL {
		p.idlers[n].retire = true
		p.idlers[n].wake <- struct{}{}
		n++
	}
	if n > 0 {
		m := copy(p.idlers, p.idlers[n:])
		clear(p.idlers[m:])
		p.idlers = p.idlers[:m]
	}
}

// wakeAllLocked wakes every waiting worker, to see that the poller closed.
func (p *poller) wakeAllLocked() {
	for i, w := range p.idlers {
		w.wake <- struct{}{}
		p.idlers[i] = nil
	}
	p.idlers = p.idlers[:0]
}

// work serves ready connections until there are none and enough workers
// wait already.
func (p *poller) work() {
	defer p.workers.Done()
	w := &idleWorker{wake: make(chan struct{}, 1)}
	for c, fresh := p.take(w); c != nil; c, fresh = p.take(w) {
		if fresh {
			c.serve()
		} else {
			c.resume()
		}
	}
}

// admit queues a new connection for a worker, which serves it as its own
// goroutine would have (c.serve), and reports false once the poller is
// closed. New connections then wait for a worker like parked ones: when
// 2048 clients connect at once, the gateway runs at most its workers,
// not a goroutine per connection. (The runtime keeps every goroutine it
// has ever run at once, for reuse: 2048 of them, 1.1 MB of descriptors
// that every GC walks from then on, and their stacks.)
func (p *poller) admit(c *conn) bool { return p.enqueue(c, true) }

// requeue queues a connection whose detached response is done for a
// worker, which resumes it as a parked connection whose request came,
// and reports false once the poller is closed.
func (p *poller) requeue(c *conn) bool { return p.enqueue(c, false) }

// enqueue queues c for a worker, as admit (fresh) or requeue, starting
// workers as needed, and reports false once the poller is closed.
func (p *poller) enqueue(c *conn, fresh bool) bool {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return false
	}
	c.pf.fresh = fresh
	n := p.spawnCappedLocked(p.queueLocked(c))
	p.mu.Unlock()
	for range n {
		go p.work()
	}
	return true
}

// take returns the oldest ready connection, waiting for one, and whether
// admit queued it; nil means the worker ends.
func (p *poller) take(w *idleWorker) (c *conn, fresh bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.head == nil {
		if p.closed || w.retire || len(p.idlers) >= maxIdleWorkers {
			p.live--
			return nil, false
		}
		w.since = time.Now()
		p.retireLocked(w.since)
		p.idlers = append(p.idlers, w)
		// Wake by the oldest's end, should no other worker go idle
		// before: with no traffic, nothing else would end them.
		p.armLocked(p.idlers[0].since.Add(p.workerTTL))
		p.mu.Unlock()
		<-w.wake
		p.mu.Lock()
	}
	c = p.head
	p.head = c.pf.next
	if p.head == nil {
		p.tail = nil
	}
	c.pf.next = nil
	c.pf.readable = false // the worker reads first: that covers the events so far
	fresh, c.pf.fresh = c.pf.fresh, false
	p.queued--
	p.taken++
	return c, fresh
}

// claimLocked moves c from state from to state to for a park, and
// returns parked, or what else became of it: notParked if the poller is
// closed or c was closed meanwhile, readyLocked's answer if bytes or a
// close came before the park.
func (p *poller) claimLocked(c *conn, from, to int32) int {
	if p.closed {
		return notParked
	}
	if res := p.readyLocked(c); res != parked {
		return res
	}
	if !c.state.CompareAndSwap(from, to) {
		return notParked // closed meanwhile (closeIdle, close)
	}
	return parked
}

// park takes c, idle with nothing buffered, from its goroutine (see the
// park results). A connection is registered on its first park; from
// then on every arrival of data is an event, so parking needs no read.
func (p *poller) park(c *conn) int {
	if c.in.rc == nil {
		return notParked
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if res := p.claimLocked(c, stateIdle, stateParked); res != parked {
		return res
	}
	pf := &c.pf
	pf.parkedAt = time.Now()
	pf.older, pf.newer = p.newest, nil
	if p.newest != nil {
		p.newest.pf.newer = c
	} else {
		p.oldest = c
		if p.idle > 0 {
			p.armLocked(pf.parkedAt.Add(p.idle))
		}
	}
	p.newest = c
	return parked
}

// readyLocked registers c if it is not yet, and reports whether it may
// park: parked if so, else readable or notParked as park reports them.
func (p *poller) readyLocked(c *conn) int {
	pf := &c.pf
	if !p.registerLocked(c) {
		return notParked
	}
	// Edge-triggered: the event that woke the connection was its last
	// until more data comes, so whatever was there then must be read
	// before it parks. It was if the last read came back short: the
	// socket's queue was empty then, and every byte since is an event.
	if pf.hup {
		return notParked // its goroutine reads on, to EOF
	}
	if pf.readable || !c.in.drained {
		pf.readable = false
		return readable
	}
	return parked
}

// registerLocked adds c to the epoll set if it is not there yet, and
// reports whether it is.
func (p *poller) registerLocked(c *conn) bool {
	pf := &c.pf
	if pf.registered {
		return true
	}
	var err error
	cerr := c.in.rc.Control(func(fd uintptr) {
		pf.fd = int32(fd)
		ev := syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLRDHUP | epollET, Fd: int32(fd)}
		err = syscall.EpollCtl(p.epfd, syscall.EPOLL_CTL_ADD, int(fd), &ev)
	})
	if cerr != nil || err != nil {
		return false
	}
	// Registering reports data already there at once, as an event
	// that finds the connection parked.
	pf.registered = true
	pf.hidx = -1
	p.conns[pf.fd] = c
	return true
}

// roomWaiting reports whether bodies wait in the room line: a body that
// needs room then queues behind them (waitRoom) instead of taking what
// frees up before the first of them does.
func (p *poller) roomWaiting() bool { return p != nil && p.roomLen.Load() > 0 }

// waitRoom takes c, whose body read ahead needs need more bytes of the
// budget bg than it could have, from its goroutine into the room line
// until bg has room for it or deadline passes; a worker then resumes it
// (stateActive), with c.roomGaveUp set in the second case. front puts it
// first: it had its turn and lost the room to another taker. It returns
// park's results: notParked when the poller cannot take it or the line
// is full.
//
// The line is full when the bodies in it would hold more than a quarter
// of bg's limit, and a body that needs more than half of it is never in
// it: the first body waiting then always gets room once what the others
// hold (bodies being read, values, responses: none of them waits for
// the line) is given back. How long the line may grow is the waiters'
// deadline's to bound: a parked connection costs its descriptor and
// what its client sent waits in the kernel.
func (p *poller) waitRoom(c *conn, bg Budget, need int64, deadline time.Time, front bool) int {
	limit := bg.Limit()
	if c.in.rc == nil || limit <= 0 {
		return notParked
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || need > limit/2 || p.roomHeld+c.aheld > limit/4 {
		return notParked
	}
	if !p.registerLocked(c) {
		return notParked
	}
	if !c.state.CompareAndSwap(stateActive, stateReading) {
		return notParked // closed meanwhile
	}
	pf := &c.pf
	pf.deadline, pf.resumeIn = deadline, stateActive
	pf.room, pf.roomNeed, pf.roomHeld = true, need, c.aheld
	p.heapPushLocked(c)
	if !front || c.roomSeq == 0 {
		p.roomSeq++
		c.roomSeq = p.roomSeq
		p.room = append(p.room, c)
	} else {
		// Back where it was: before those that came in after it.
		i := 0
		for i < len(p.room) && p.room[i].roomSeq < c.roomSeq {
			i++
		}
		p.room = slices.Insert(p.room, i, c)
	}
	p.roomHeld += c.aheld
	p.roomLen.Store(int32(len(p.room)))
	if !p.belled {
		p.armLocked(time.Now().Add(roomTick))
		return parked
	}
	p.armLocked(deadline) // BudgetWait's end
	if p.room[0].pf.roomNeed <= bg.Room() {
		// Room came back before the line had c to ring for: after
		// roomLen is stored, any that comes rings.
		p.ringRoom()
	}
	return parked
}

// unroomLocked takes c out of the room line.
func (p *poller) unroomLocked(c *conn) {
	pf := &c.pf
	if !pf.room {
		return
	}
	if i := slices.Index(p.room, c); i >= 0 {
		p.room = slices.Delete(p.room, i, i+1)
	}
	p.roomHeld -= pf.roomHeld
	pf.room, pf.roomNeed, pf.roomHeld = false, 0, 0
	p.roomLen.Store(int32(len(p.room)))
	if len(p.room) == 0 && cap(p.room) > 1024 {
		p.room = nil // the burst is over: let its array go
	}
}

// admitRoomLocked queues for a worker the bodies at the front of the room
// line that the budget has room for now, in order, holding that room for
// each, and returns the number of workers to start. One that needs more
// than half the limit (lowered since it came in) will never have room:
// it ends its wait.
func (p *poller) admitRoomLocked() int {
	if len(p.room) == 0 {
		return 0
	}
	bg := p.room[0].srv.Budget
	room, limit := bg.Room(), bg.Limit()
	start := 0
	for len(p.room) > 0 {
		c := p.room[0]
		never := limit > 0 && c.pf.roomNeed > limit/2
		if c.pf.roomNeed > room && !never {
			break
		}
		need := c.pf.roomNeed
		p.unroomLocked(c)
		p.unheapLocked(c)
		if !c.state.CompareAndSwap(stateReading, stateActive) {
			continue // being closed
		}
		if never {
			c.roomGaveUp = true
		} else {
			room -= need
			c.roomTurn = true
			// Its room is held for it from here (c.aheld, which growAhead
			// counts and dropAhead gives back): until its worker runs,
			// a body that came after it, seeing the line empty, or any
			// other taker would otherwise take what freed up, and send it
			// back to the front of the line for another wait and another
			// worker's turn (docs/decisions/0076).
			if bg.Room() >= need && bg.Acquire(need) == nil {
				c.aheld += need
			}
		}
		start += p.queueLocked(c)
	}
	return start
}

// parkReading takes c, which waits for more of its request with nothing
// left to read, from its goroutine until the request's bytes come or
// deadline passes (zero: never), when it is closed; from is its state
// (stateNew or stateActive), which a worker resumes it in. It returns
// park's results.
func (p *poller) parkReading(c *conn, from int32, deadline time.Time) int {
	return p.parkUntil(c, from, deadline, time.Time{})
}

// parkBody is parkReading for a body read ahead (from stateActive), but
// that a worker resumes it at deadline instead of closing it, so that
// its handler answers the request (readAhead). If the body holds the
// budget for all of itself and stall comes before deadline, a worker
// resumes it then too, whether or not bytes came, to give back what it
// holds beyond what it sent (conn.shrinkAhead).
func (p *poller) parkBody(c *conn, deadline, stall time.Time) int {
	return p.parkUntil(c, stateActive, deadline, stall)
}

// parkUntil implements parkReading and parkBody.
func (p *poller) parkUntil(c *conn, from int32, deadline, stall time.Time) int {
	if c.in.rc == nil {
		return notParked
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if res := p.claimLocked(c, from, stateReading); res != parked {
		return res
	}
	pf := &c.pf
	pf.deadline, pf.resumeIn, pf.stall = deadline, from, false
	if !stall.IsZero() && (deadline.IsZero() || stall.Before(deadline)) {
		pf.deadline, pf.stall = stall, true
	}
	p.heapPushLocked(c)
	if !pf.deadline.IsZero() {
		p.armLocked(pf.deadline)
	}
	return parked
}

// armLocked makes sure the poller wakes by t to expire what is due.
func (p *poller) armLocked(t time.Time) {
	if p.armed.IsZero() || t.Before(p.armed) {
		p.armed = t
		p.file.SetReadDeadline(t)
	}
}

// unparkLocked takes c off the parked list.
func (p *poller) unparkLocked(c *conn) {
	pf := &c.pf
	if pf.older != nil {
		pf.older.pf.newer = pf.newer
	} else if p.oldest == c {
		p.oldest = pf.newer
	}
	if pf.newer != nil {
		pf.newer.pf.older = pf.older
	} else if p.newest == c {
		p.newest = pf.older
	}
	pf.older, pf.newer = nil, nil
}

// forget drops c, which is being closed or handed over, from the poller:
// from the parked list if a close took it from there, and from the epoll
// set (which a close of its descriptor would also do).
func (p *poller) forget(c *conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pf := &c.pf
	if !pf.registered {
		return
	}
	p.unparkLocked(c)
	p.unheapLocked(c)
	first := pf.room && len(p.room) > 1 && p.room[0] == c
	p.unroomLocked(c)
	if first && p.belled {
		// The body behind it may fit where it did not, with no room
		// given back to ring for it.
		p.ringRoom()
	}
	if p.conns[pf.fd] == c {
		delete(p.conns, pf.fd)
	}
	pf.registered = false
	// Control fails once the connection is closed, so this never
	// touches a descriptor number that another connection now has.
	c.in.rc.Control(func(fd uintptr) {
		syscall.EpollCtl(p.epfd, syscall.EPOLL_CTL_DEL, int(fd), nil)
	})
}

// evict takes from the poller, for the caller to close (closeParked),
// the connection whose close best makes room for a new one: the one the
// server would close soonest anyway. Of the one idle the longest (closed
// at the idle timeout) and, of those parked mid-request that wait for a
// request head (a new connection that has sent nothing, or part of a
// head) or linger after their answer, the one nearest its deadline, the
// one due first goes; a connection without a deadline is never due
// before one with. So a client's silent connections make room before a
// keep-alive client served a moment ago, which loses nothing but a
// connection it would reopen. One whose body is being read is left
// alone: that would lose a request the client is sending. Nil if there
// is none.
func (p *poller) evict() *conn {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		idle, reading := p.oldest, p.evictableLocked()
		if idle == nil && reading == nil {
			return nil
		}
		if reading != nil && (idle == nil || dueBefore(reading.pf.deadline, p.idleDue(idle))) {
			p.unheapLocked(reading)
			if reading.state.CompareAndSwap(stateReading, stateClosed) {
				return reading
			}
			continue // being closed or resumed: no longer a candidate
		}
		p.unparkLocked(idle)
		if idle.state.CompareAndSwap(stateParked, stateClosed) {
			return idle
		}
	}
}

// idleDue is when the idle connection c reaches the idle timeout, zero
// if there is none.
func (p *poller) idleDue(c *conn) time.Time {
	if p.idle <= 0 {
		return time.Time{}
	}
	return c.pf.parkedAt.Add(p.idle)
}

// dueBefore reports whether deadline a comes before b, zero being never.
func dueBefore(a, b time.Time) bool {
	return !a.IsZero() && (b.IsZero() || a.Before(b))
}

// evictScan bounds how many connections of the reading heap evict looks
// at, so that a client holding many bodies part-way cannot make every
// connection over the cap cost a walk of them all under the lock.
const evictScan = 1024

// evictableLocked returns the connection of the reading heap nearest its
// deadline whose body is not being read, or nil. The heap's minimum may
// be a body (its read timeout can come before a new connection's header
// timeout), so the search goes on below the bodies it meets, and only
// there: no connection under another one is due before it.
func (p *poller) evictableLocked() *conn {
	var best *conn
	var buf [64]int
	next := append(buf[:0], 0) // heap indexes to look at
	for seen := 0; len(next) > 0 && seen < evictScan; seen++ {
		i := next[len(next)-1]
		next = next[:len(next)-1]
		if i >= len(p.reading) {
			continue
		}
		c := p.reading[i]
		if best != nil && !before(c, best) {
			continue // nor is anything under it
		}
		// c.phase was set before parkReading took the lock, and nothing
		// sets it while the connection is in the heap. One being
		// closed (Close swapped its state) is left to its closer.
		if c.phase != phaseBody && c.state.Load() == stateReading {
			best = c
			continue
		}
		next = append(next, 2*i+1, 2*i+2)
	}
	return best
}

// expire closes the connections parked for the idle timeout or longer,
// and those parked mid-request past their deadline but for a body read
// ahead, which it queues for a worker to answer; and sets the deadline
// for the next.
func (p *poller) expire(now time.Time) {
	var expired []*conn
	p.mu.Lock()
	p.retireLocked(now)
	for c := p.oldest; c != nil && p.idle > 0 && now.Sub(c.pf.parkedAt) >= p.idle; c = p.oldest {
		p.unparkLocked(c)
		if c.state.CompareAndSwap(stateParked, stateClosed) {
			c.srv.timedOut(phaseIdle, true)
			expired = append(expired, c)
		}
	}
	start := 0
	for len(p.reading) > 0 {
		c := p.reading[0]
		if d := c.pf.deadline; d.IsZero() || d.After(now) {
			break
		}
		p.unheapLocked(c)
		if c.pf.room {
			// It waited its BudgetWait: a worker answers the refusal.
			p.unroomLocked(c)
			if c.state.CompareAndSwap(stateReading, stateActive) {
				c.roomGaveUp = true
				start += p.queueLocked(c)
			}
			continue
		}
		if c.pf.stall {
			// Its body stopped: a worker gives back what it holds
			// beyond what came, and parks it again till its deadline.
			c.pf.stall = false
			if c.state.CompareAndSwap(stateReading, c.pf.resumeIn) {
				start += p.queueLocked(c)
			}
			continue
		}
		if c.phase == phaseBody {
			// Its body did not come within the read timeout: a worker
			// hands its request to the handler, which answers it
			// (readAhead), as it does a body that fails another way.
			if c.state.CompareAndSwap(stateReading, c.pf.resumeIn) {
				start += p.queueLocked(c)
			}
			continue
		}
		if c.state.CompareAndSwap(stateReading, stateClosed) {
			c.srv.timedOut(c.phase, false)
			expired = append(expired, c)
		}
	}
	start += p.admitRoomLocked()
	start = p.spawnCappedLocked(start)
	var next time.Time
	if p.oldest != nil && p.idle > 0 {
		next = p.oldest.pf.parkedAt.Add(p.idle)
	}
	if len(p.reading) > 0 {
		if d := p.reading[0].pf.deadline; !d.IsZero() && (next.IsZero() || d.Before(next)) {
			next = d
		}
	}
	if len(p.room) > 0 && !p.belled {
		if tick := now.Add(roomTick); next.IsZero() || tick.Before(next) {
			next = tick
		}
	}
	if len(p.idlers) > 0 {
		if end := p.idlers[0].since.Add(p.workerTTL); next.IsZero() || end.Before(next) {
			next = end
		}
	}
	p.armed = next
	p.file.SetReadDeadline(next) // under mu, or a park in between could lose its deadline
	p.mu.Unlock()
	for range start {
		go p.work()
	}
	for _, c := range expired {
		c.closeParked()
	}
}

// close refuses later parks, stops run and lets idle workers end; with
// wait it also waits for every worker to end. Connections still parked
// or queued are the caller's to close.
func (p *poller) close(wait bool) {
	p.mu.Lock()
	p.closed = true
	p.wakeAllLocked()
	p.mu.Unlock()
	p.closeOnce.Do(func() {
		p.stall.Stop()
		if p.unwatch != nil {
			p.unwatch()
		}
		p.file.Close()
		if p.bell != nil {
			p.bell.Close() // a ring under way fails its Control
		}
	})
	if wait {
		p.workers.Wait()
	}
}

// peerGone reports whether the idle connection c has nothing left to read
// and its peer has closed or reset it, peeking so that a request that
// came with the close stays for a worker to read. Gone asks the same of
// a connection whose request runs.
func (c *conn) peerGone() bool {
	gone := true // Control fails only on a closed socket
	c.in.rc.Control(func(fd uintptr) {
		for {
			n, errno := peek(fd)
			if errno == syscall.EINTR {
				continue
			}
			gone = errno == 0 && n == 0 || errno != 0 && errno != syscall.EAGAIN
			return
		}
	})
	return gone
}
