package mcpipe

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream/op"
)

// The calls FuzzPipelined makes, by the low four bits of a byte of its
// mix; the high four are the call's options (pipeCall).
const (
	pGet       = iota // Do Get: on a shared gets line with the other Gets queued with it
	pGetRoom          // Do Get with a Room, its value lent past op.LentValue
	pGAT              // Do GAT with a Room: a reply of its own
	pMulti            // GetMultiLimit of three keys, a byte limit, no probe
	pProbe            // GetMultiLimit with probe: a size probe, then a gets of the keys that fit
	pSet              // Do Set of a small value; opt&4 Replace, opt&8 Append, both Prepend
	pSetBig           // Do Set of a value written from the caller's buffer (bigValue bytes and more)
	pAdd              // Do Add
	pCAS              // Do CAS
	pDelete           // Do Delete
	pIncr             // Do Incr; opt&4 Decr
	pTouch            // Do Touch
	pHead             // Do Head (mg); opt&4 HeadTouch
	pAppendCAS        // Do AppendCAS (ms), sent once a Head was answered HD; opt&4 PrependCAS
	pAsyncGet         // DoAsync Get
	pAsyncSet         // DoAsync Set
	pKinds
)

// How FuzzPipelined starts its calls, by mix[0]&3.
const (
	launchBurst   = iota // all at once, each from its own goroutine: they share lines and writes
	launchOrdered        // each once the node has read the one before (or it returned): many in flight, in a known order
	launchSerial         // each once the one before returned
	launchModes
)

// maxPipeCalls is the most calls one FuzzPipelined input makes.
const maxPipeCalls = 6

// maxPieces is the most pieces the node cuts its stream into.
const maxPieces = 64

// pipeTiming is mix[0]'s bit for a client with a short timeout, whose
// node may stall past it between two pieces of its stream, and whose
// calls may have short deadlines: outcomes then depend on time.
const pipeTiming = 4

// pipeLarge is a large value's bytes in a stream: a value lent by a
// Room (op.LentValue or more). An input's stream holds pipeLargeMark
// for each, so that inputs with large values stay small: the fuzzer
// minimizes the inputs it finds new byte by byte, for up to a minute
// each, and one grown from a 33 kB seed made make test's short run of
// 20000 executions last 17 s and more.
var pipeLarge = bytes.Repeat([]byte("L"), op.LentValue+100)

// pipeLargeMark stands for pipeLarge in an input's stream: a byte no
// reply of the mixes holds.
const pipeLargeMark = 0x7f

// maxPipeLarge is the most marks an input's stream expands.
const maxPipeLarge = 4

// pipeExpand is stream with its first maxPipeLarge marks replaced by
// pipeLarge.
func pipeExpand(stream []byte) []byte {
	n := min(bytes.Count(stream, []byte{pipeLargeMark}), maxPipeLarge)
	if n == 0 {
		return stream
	}
	out := make([]byte, 0, len(stream)+n*len(pipeLarge))
	for i, b := range stream {
		if b == pipeLargeMark && n > 0 {
			out, n = append(out, pipeLarge...), n-1
			continue
		}
		out = append(out, stream[i])
	}
	return out
}

// pipeCompact is pipeExpand's inverse, for a captured stream.
func pipeCompact(stream []byte) []byte {
	return bytes.ReplaceAll(stream, pipeLarge, []byte{pipeLargeMark})
}

// pipeBigValue is what pSetBig stores: a value written from the
// caller's buffer.
var pipeBigValue = []byte(strings.Repeat("B", bigValue+1))

// FuzzPipelined has several calls of mixed kinds in flight on ONE
// pipelined connection (started at once, one after another as each is
// written, or one after another as each returns), and a node that
// answers the whole stream of requests with arbitrary bytes: the stream
// is cut into pieces, each written once the node has read a number of
// requests (possibly before the request it answers), after yields, or,
// with pipeTiming, after a stall longer than the client's timeout while
// calls with deadlines of 2 ms wait. Whatever the bytes, each call's
// result must be exactly what an independent reading of ITS reply gives
// (pipeReference: the replies read in the order the client sent the
// requests), or an error; never another call's data. A reply that
// breaks the protocol, or ends short, fails its call and every call
// after it on the connection, and an error before it (the connection
// given up: a reply nobody asked for yet, a timeout) fails every call
// after it too, never leaving a later call to read the rest. Every call
// returns within its deadline, the connection is closed, its goroutines
// end, the Rooms hold nothing afterwards, and what was allocated is
// bounded by what the node sent.
//
// mix[0] is the launch mode and pipeTiming; each further byte (at most
// maxPipeCalls) is a call. cuts are (length, gate) byte pairs
// (pipePieces).
func FuzzPipelined(f *testing.F) {
	for _, s := range pipeSeeds() {
		f.Add(s.mix, s.stream, s.cuts)
	}
	f.Fuzz(func(t *testing.T, mix, stream, cuts []byte) {
		if len(mix) < 2 {
			return
		}
		msg, _ := fuzzPipelined(mix, stream, cuts)
		if msg != "" {
			t.Errorf("mix %q, stream %s, cuts %q:\n%s", mix, shown(stream), cuts, msg)
		}
	})
}

// pipeCall is one call of a FuzzPipelined mix. Its key is "k" and its
// index (a multi-key read's keys that with "a", "b", "c"), so that the
// node's requests name the calls they are for.
type pipeCall struct {
	i     int
	kind  int
	opt   byte // the high four bits of its mix byte
	key   string
	keys  []string  // a multi-key read's
	room  *testRoom // pGetRoom's and pGAT's: a budget of 1 byte (opt&1) or 64 KiB
	limit int       // a multi-key read's byte limit
	short bool      // with pipeTiming, opt&2: a deadline 2 ms away

	got  fuzzResult
	took time.Duration
}

// pipeCalls reads a mix.
func pipeCalls(mix []byte) (mode int, timing bool, calls []*pipeCall) {
	mode, timing = int(mix[0]&3)%launchModes, mix[0]&pipeTiming != 0
	for i, b := range mix[1:min(len(mix), maxPipeCalls+1)] {
		opt := b >> 4
		pc := &pipeCall{i: i, kind: int(b & 15), opt: opt, key: "k" + strconv.Itoa(i), short: timing && opt&2 != 0}
		switch pc.kind {
		case pGetRoom, pGAT:
			pc.room = &testRoom{limit: 64 << 10}
			if opt&1 != 0 {
				pc.room.limit = 1
			}
		case pMulti, pProbe:
			pc.keys = []string{pc.key + "a", pc.key + "b", pc.key + "c"}
			pc.limit = []int{0, 4, 64, 32 << 10}[opt>>2]
			if pc.kind == pProbe {
				pc.limit = []int{4, 64, 32 << 10, 1 << 20}[opt>>2]
			}
		}
		calls = append(calls, pc)
	}
	return mode, timing, calls
}

// run makes the call on c and records what it came to; async calls
// end once their callback ran.
func (pc *pipeCall) run(c *Client) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	if pc.short {
		ctx, cancel = context.WithTimeout(context.Background(), 2*time.Millisecond)
	}
	defer cancel()
	start := time.Now()
	defer func() { pc.took = time.Since(start) }()
	r := &pc.got
	var it *memcache.Item
	switch pc.kind {
	case pGet, pGetRoom, pGAT, pAsyncGet:
		o := op.Op{Verb: op.Get}
		switch pc.kind {
		case pGetRoom:
			o.Room = pc.room
		case pGAT:
			o = op.Op{Verb: op.GAT, Item: op.Item{Expiration: 10}, Room: pc.room}
		}
		if pc.kind == pAsyncGet {
			// The callback may run before DoAsync returns.
			done := make(chan struct{})
			var cbErr error
			if r.err = c.DoAsync(ctx, o, pc.key, func(i *memcache.Item, _ uint64, err error) {
				it, cbErr = copied(i), err
				close(done)
			}); r.err == nil {
				<-done
				r.err = cbErr
			}
		} else {
			it, _, r.err = c.Do(ctx, o, pc.key)
		}
		r.single(it, r.err, pc.key)
	case pMulti, pProbe:
		var items map[string]*memcache.Item
		items, r.dropped, r.nofit, r.err = c.GetMultiLimit(ctx, pc.keys, pc.limit, nil, pc.kind == pProbe)
		for _, k := range pc.keys {
			if it := items[k]; it != nil {
				r.items = append(r.items, it)
			}
		}
		if len(items) != len(r.items) {
			r.err = fmt.Errorf("keys not asked handed out: %v", items)
		}
	case pAsyncSet:
		done := make(chan struct{})
		var cbErr error
		if r.err = c.DoAsync(ctx, op.Op{Verb: op.Set, Item: op.Item{Value: []byte("a" + pc.key)}}, pc.key, func(_ *memcache.Item, _ uint64, err error) {
			cbErr = err
			close(done)
		}); r.err == nil {
			<-done
			r.err = cbErr
		}
	case pHead:
		o := op.Op{Verb: op.Head}
		if pc.opt&4 != 0 {
			o = op.Op{Verb: op.HeadTouch, Item: op.Item{Expiration: 10}}
		}
		it, r.num, r.err = c.Do(ctx, o, pc.key)
		if it != nil {
			r.items = []*memcache.Item{it}
		}
	default:
		o := op.Op{Verb: op.Set, Item: op.Item{Value: []byte("v" + pc.key), Flags: 7, CAS: 1}}
		switch pc.kind {
		case pSet:
			o.Verb = [4]op.Verb{op.Set, op.Replace, op.Append, op.Prepend}[pc.opt>>2]
		case pSetBig:
			o.Item.Value = pipeBigValue
		case pAdd:
			o.Verb = op.Add
		case pCAS:
			o.Verb = op.CAS
		case pDelete:
			o = op.Op{Verb: op.Delete}
		case pIncr:
			o = op.Op{Verb: op.Incr, Delta: 1}
			if pc.opt&4 != 0 {
				o.Verb = op.Decr
			}
		case pTouch:
			o = op.Op{Verb: op.Touch, Item: op.Item{Expiration: 10}}
		case pAppendCAS:
			o = op.Op{Verb: op.AppendCAS, Item: op.Item{Value: []byte("+"), CAS: 1}}
			if pc.opt&4 != 0 {
				o.Verb = op.PrependCAS
			}
		}
		_, r.num, r.err = c.Do(ctx, o, pc.key)
	}
}

// pipeCmd is one request the node read: its command and the keys it
// names, in order. A size probe's lines ("mg <key> s k q" …, "mn") are
// one request, probe set.
type pipeCmd struct {
	verb  string
	keys  []string
	probe bool
}

// pipeNode is FuzzPipelined's node: it reads the client's requests and
// writes its stream in pieces as the requests arrive.
type pipeNode struct {
	mu       sync.Mutex
	cond     sync.Cond
	calls    int
	launched int
	waitRet  bool   // the launcher waits for a call to return (launchSerial)
	sent     []bool // a request of the call was read
	returned []bool
	closed   bool // the connection is closed: nothing more will come
	cmds     []pipeCmd
	mix      []*pipeCall
	stream   []byte
	written  int // bytes of stream written
}

func newPipeNode(calls []*pipeCall, stream []byte) *pipeNode {
	n := &pipeNode{calls: len(calls), sent: make([]bool, len(calls)), returned: make([]bool, len(calls)), mix: calls, stream: stream}
	n.cond.L = &n.mu
	return n
}

// callOf is the index of the call key is for, -1 if none.
func callOf(key string) int {
	if len(key) < 2 || key[0] != 'k' {
		return -1
	}
	key = strings.TrimRight(key[1:], "abc")
	i, err := strconv.Atoi(key)
	if err != nil {
		return -1
	}
	return i
}

// parseRequests reads the requests of br, as the client writes them,
// and hands each to each, until br ends or breaks.
func parseRequests(br *bufio.Reader, each func(pipeCmd)) {
	var probe []string
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return
		}
		f := strings.Fields(line)
		if len(f) < 1 {
			return
		}
		cmd := pipeCmd{verb: f[0]}
		data := -1
		switch {
		case f[0] == "gets" && len(f) > 1:
			cmd.keys = f[1:]
		case f[0] == "gats" && len(f) > 2:
			cmd.keys = f[2:]
		case slices.Contains([]string{"set", "add", "replace", "append", "prepend", "cas"}, f[0]) && len(f) > 4:
			cmd.keys = f[1:2]
			data, _ = strconv.Atoi(f[4])
		case f[0] == "ms" && len(f) > 2:
			cmd.keys = f[1:2]
			data, _ = strconv.Atoi(f[2])
		case f[0] == "mg" && len(f) > 1 && f[len(f)-1] == "q":
			probe = append(probe, f[1])
			continue
		case f[0] == "mn":
			cmd = pipeCmd{verb: "mg", keys: probe, probe: true}
			probe = nil
		case len(f) > 1:
			cmd.keys = f[1:2]
		}
		if data >= 0 {
			if _, err := br.Discard(data + 2); err != nil {
				// The data block cut short: the request counts from
				// its first byte, as the client owes it its reply from
				// the start of the write (memcached may refuse a value
				// before it reads it).
				each(cmd)
				return
			}
		}
		each(cmd)
	}
}

// read reads the requests until the connection closes.
func (n *pipeNode) read(nc net.Conn) {
	parseRequests(bufio.NewReader(nc), func(cmd pipeCmd) {
		n.update(func() {
			n.cmds = append(n.cmds, cmd)
			for _, k := range cmd.keys {
				if i := callOf(k); i >= 0 && i < n.calls {
					n.sent[i] = true
				}
			}
		})
	})
	n.update(func() { n.closed = true })
}

// allDoneLocked reports whether every call was started, and sent or
// returned: no request comes but a probe's gets.
func (n *pipeNode) allDoneLocked() bool {
	return n.launched == n.calls && n.idleLocked(false)
}

// idleLocked reports whether every call started was sent or returned,
// and, if waiting, the launcher waits for a return (launchSerial) that
// needs more of the stream: a request read is answered only in part by
// what was written. Nothing comes then until the node writes.
func (n *pipeNode) idleLocked(waiting bool) bool {
	if waiting && !n.waitRet {
		return false
	}
	for i := range n.launched {
		if !n.sent[i] && !n.returned[i] {
			return false
		}
	}
	return !waiting || n.needsMoreLocked()
}

// needsMoreLocked reports whether the stream written so far ends short
// of the replies to the requests read: read as pipeReference reads
// them, not broken before.
func (n *pipeNode) needsMoreLocked() bool {
	rd := refReader{b: n.stream[:n.written]}
	for _, cmd := range n.cmds {
		switch refCmd(&rd, cmd, n.mix).outcome {
		case refShort:
			return true
		case refBroken:
			return false
		}
	}
	return false
}

// wait waits until gate requests were read, every call was sent or
// returned, the node idles, or the connection closed.
func (n *pipeNode) wait(gate int) {
	n.mu.Lock()
	for len(n.cmds) < gate && !n.allDoneLocked() && !n.idleLocked(true) && !n.closed {
		n.cond.Wait()
	}
	n.mu.Unlock()
}

// update runs fn on the node's state under its lock and wakes its
// waiters.
func (n *pipeNode) update(fn func()) {
	n.mu.Lock()
	fn()
	n.cond.Broadcast()
	n.mu.Unlock()
}

// gateAll is a piece's gate once every call was sent or returned.
const gateAll = 1 << 30

// pipePiece is a piece of the node's stream and when it is written.
type pipePiece struct {
	b     []byte
	gate  int  // written once this many requests were read (gateAll: every call sent or returned)
	yield bool // after a runtime.Gosched
	pause bool // after a hundred yields: the client reads what came, and waits for more
	stall bool // with pipeTiming: after 8 ms, past the client's timeout
	shut  bool // after the client closed its connection (Client.Close), its calls on it abandoned
}

// pipePieces cuts stream by cuts' (length, gate) pairs: a length byte
// below 192 is that many bytes plus one, another (b-191)*512; a gate
// byte's low 3 bits are the requests to have been read first (7: every
// call sent or returned), 8 yields, 16 pauses, 32 stalls, 64 closes
// the client's connection first. The rest of the stream is one more
// piece, gated on every call.
func pipePieces(stream, cuts []byte) []pipePiece {
	var ps []pipePiece
	for len(stream) > 0 {
		p := pipePiece{gate: gateAll}
		if len(cuts) >= 2 && len(ps) < maxPieces-1 {
			a, g := cuts[0], cuts[1]
			cuts = cuts[2:]
			n := int(a) + 1
			if a >= 192 {
				n = int(a-191) * 512
			}
			p = pipePiece{b: stream[:min(n, len(stream))], gate: int(g & 7), yield: g&8 != 0, pause: g&16 != 0, stall: g&32 != 0, shut: g&64 != 0}
			if p.gate == 7 {
				p.gate = gateAll
			}
		} else {
			p.b = stream
		}
		stream = stream[len(p.b):]
		ps = append(ps, p)
	}
	return ps
}

// write writes the pieces, then hangs up once every call was sent or
// returned.
func (n *pipeNode) write(nc net.Conn, ps []pipePiece, timing bool, shut func()) {
	defer nc.Close()
	stalls := 0
	for _, p := range ps {
		n.wait(p.gate)
		if p.shut {
			shut()
		}
		switch {
		case p.stall && timing && stalls < 2:
			stalls++
			time.Sleep(8 * time.Millisecond)
		case p.pause:
			for range 100 {
				runtime.Gosched()
			}
		case p.yield:
			runtime.Gosched()
		}
		if _, err := nc.Write(p.b); err != nil {
			return
		}
		n.update(func() { n.written += len(p.b) })
	}
	n.wait(gateAll)
}

// sentConn is the client's end of FuzzPipelined's connection: it keeps
// what the client wrote, or began to write, in order. The replies are
// the answers to those requests, not only to those the node finished
// reading: the client owes a request its reply from the start of the
// write (conn.owedLocked), as over TCP, where a reply may come before
// the write that sent its request returns; a node that answers before
// it read may see the connection closed (on a reply nobody asked for)
// before it read the request its first reply was matched to.
type sentConn struct {
	net.Conn
	mu   sync.Mutex
	sent []byte
}

func (c *sentConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.sent = append(c.sent, p...)
	c.mu.Unlock()
	return c.Conn.Write(p)
}

// fuzzPipelined runs one FuzzPipelined input and describes what went
// wrong ("" if nothing).
func fuzzPipelined(mix, stream, cuts []byte) (string, []*pipeCall) {
	mode, timing, calls := pipeCalls(mix)
	stream = pipeExpand(stream)
	watchdog := time.AfterFunc(10*time.Second, func() {
		debug.SetTraceback("all")
		panic(fmt.Sprintf("mix %q, stream %s, cuts %q: no end after 10s", mix, shown(stream), cuts))
	})
	defer watchdog.Stop()
	goroutines := runtime.NumGoroutine()
	before := allocated()
	timeout := 2 * time.Second
	if timing {
		timeout = 5 * time.Millisecond
	}
	node := newPipeNode(calls, stream)
	ps := pipePieces(stream, cuts)
	var dials, closes atomic.Int32
	var nodes sync.WaitGroup
	var client sentConn
	var c *Client
	shut := func() { c.Close() }
	c = New(Options{
		Timeout: timeout,
		Closed:  func() { closes.Add(1) },
		Dial: func(context.Context) (net.Conn, error) {
			if dials.Add(1) > 1 {
				return nil, errors.New("dialled again")
			}
			cc, nc := net.Pipe()
			nodes.Add(2)
			go func() { defer nodes.Done(); node.read(nc) }()
			go func() { defer nodes.Done(); node.write(nc, ps, timing, shut) }()
			client.Conn = cc
			return &client, nil
		},
	})
	var wg sync.WaitGroup
	for _, pc := range calls {
		node.update(func() {
			node.launched++
			node.waitRet = mode == launchSerial
		})
		wg.Add(1)
		go func() {
			defer wg.Done()
			pc.run(c)
			node.update(func() {
				node.returned[pc.i] = true
				node.waitRet = false // the launcher starts the next one, if it waits
			})
		}()
		node.mu.Lock()
		for mode == launchOrdered && !node.sent[pc.i] && !node.returned[pc.i] ||
			mode == launchSerial && !node.returned[pc.i] {
			node.cond.Wait()
		}
		node.mu.Unlock()
	}
	wg.Wait()
	if dials.Load() == 0 {
		// Nothing dialled (every call refused unsent): the node was
		// never started.
		node.update(func() { node.closed = true })
	}
	c.Close()
	nodes.Wait()

	var b strings.Builder
	// Without pipeTiming the node never stalls: a call that timed out
	// waited for bytes the node, reading the stream as pipeReference
	// does, held it did not need. (Not a duration: a machine loaded by
	// other work stalls a fuzzing process for a second at times.)
	for _, pc := range calls {
		switch {
		case !timing && errors.Is(pc.got.err, os.ErrDeadlineExceeded):
			fmt.Fprintf(&b, "call %d (kind %d) timed out after %v, though the node never stalls: %v\n", pc.i, pc.kind, pc.took, pc.got.err)
		case pc.took > 2*timeout+time.Second:
			fmt.Fprintf(&b, "call %d (kind %d) took %v\n", pc.i, pc.kind, pc.took)
		}
	}
	budgets := 0
	for _, pc := range calls {
		if pc.room != nil {
			budgets += int(pc.room.limit)
		}
	}
	if n, most := allocated()-before, uint64(8*len(stream)+budgets+2<<20); n > most {
		fmt.Fprintf(&b, "%d bytes allocated for a stream of %d bytes, budgets %d; want at most %d\n", n, len(stream), budgets, most)
	}
	// The connection's reader may still be failing it (the failure
	// shows before Options.Closed is called), and the fuzzing engine's
	// own goroutines come and go: the connection closed first, then the
	// goroutines.
	settled := func(done func() bool) bool {
		for i, deadline := 0, time.Now().Add(2*time.Second); !done(); i++ {
			if i < 1000 {
				runtime.Gosched() // they are ending: far cheaper than a sleep
				continue
			}
			if time.Now().After(deadline) {
				return false
			}
			time.Sleep(100 * time.Microsecond)
		}
		return true
	}
	if !settled(func() bool { return closes.Load() == min(dials.Load(), 1) }) {
		fmt.Fprintf(&b, "%d connections dialled, %d closed\n", min(dials.Load(), 1), closes.Load())
	}
	if !settled(func() bool { return runtime.NumGoroutine() <= goroutines }) {
		fmt.Fprintf(&b, "%d goroutines left behind\n", runtime.NumGoroutine()-goroutines)
	}
	// A call that the connection's failure answers (a close, a write
	// error) returns while the reader may still be reading a value into
	// its Room; the reader gives the Room back once its read fails, as
	// the failure closed the connection (op.Room.Release): after the
	// goroutines, nothing is held.
	for _, pc := range calls {
		if pc.room != nil && !settled(func() bool { return pc.room.held.Load() == 0 }) {
			fmt.Fprintf(&b, "call %d (kind %d): its Room holds %d bytes once the connection's goroutines ended\n", pc.i, pc.kind, pc.room.held.Load())
		}
	}
	strict := !timing && mode != launchSerial
	for _, p := range ps {
		strict = strict && p.gate == gateAll && !p.shut
	}
	for _, pc := range calls {
		strict = strict && pc.kind != pProbe
	}
	var sent []pipeCmd
	parseRequests(bufio.NewReader(bytes.NewReader(client.sent)), func(cmd pipeCmd) { sent = append(sent, cmd) })
	b.WriteString(pipeCheck(stream, sent, calls, timing, strict))
	return b.String(), calls
}

// pipeWant is what a call's result must be, as pipeReference reads the
// stream.
type pipeWant struct {
	want  ref
	pos   int    // the index of the call's last request in the order sent; -1: none sent
	after bool   // a request of the call came after the reply that broke the stream
	at    bool   // its reply broke the stream (want.outcome says how)
	lost  bool   // a request it had to send was not sent: it must fail
	wrong string // what the call sent that it should not have
}

// pipeReference reads stream as the replies to cmds, the requests the
// client sent, in order, independently of the client's readers: each
// call's reply, and where the stream broke.
func pipeReference(stream []byte, cmds []pipeCmd, calls []*pipeCall) []pipeWant {
	wants := make([]pipeWant, len(calls))
	parts := make([][]ref, len(calls)) // each call's replies, in order
	partCmds := make([][]pipeCmd, len(calls))
	for i := range wants {
		wants[i].pos = -1
	}
	rd := refReader{b: stream}
	broken := false
	for ci, cmd := range cmds {
		var owners []int
		for _, k := range cmd.keys {
			if i := callOf(k); i >= 0 && i < len(calls) && !slices.Contains(owners, i) {
				owners = append(owners, i)
			}
		}
		if len(owners) == 0 {
			continue // not a mix's request: reported as the call's mismatch, if any
		}
		for _, i := range owners {
			wants[i].pos = ci
		}
		if broken {
			for _, i := range owners {
				wants[i].after = true
			}
			continue
		}
		first := calls[owners[0]]
		r := refCmd(&rd, cmd, calls)
		if r.outcome == refBroken || r.outcome == refShort {
			broken = true
			for _, i := range owners {
				wants[i].at, wants[i].want = true, ref{outcome: r.outcome}
			}
			continue
		}
		for _, i := range owners {
			part := r
			if cmd.verb == "gets" && first.keys == nil && r.outcome == refOK {
				// A shared line: the call's own key's part.
				k := calls[i].key
				part = ref{}
				for _, it := range r.items {
					if it.Key == k {
						part.items = append(part.items, it)
					}
				}
				if slices.Contains(r.nofit, k) {
					part.nofit = []string{k}
				}
			}
			parts[i] = append(parts[i], part)
			partCmds[i] = append(partCmds[i], cmd)
		}
	}
	for i, pc := range calls {
		w := &wants[i]
		if w.at || w.after || w.pos < 0 {
			continue
		}
		switch {
		case pc.kind == pProbe && partCmds[i][0].probe:
			w.want, w.wrong, w.lost = probeWant(pc, parts[i], partCmds[i])
		case len(parts[i]) != 1:
			w.wrong = fmt.Sprintf("%d requests", len(parts[i]))
		default:
			w.want = parts[i][0]
		}
	}
	return wants
}

// refCmd reads the reply to cmd, a request of calls, off rd.
func refCmd(rd *refReader, cmd pipeCmd, calls []*pipeCall) ref {
	var first *pipeCall
	for _, k := range cmd.keys {
		if i := callOf(k); i >= 0 && i < len(calls) {
			first = calls[i]
			break
		}
	}
	switch {
	case first == nil:
		return ref{outcome: refBroken}
	case cmd.probe:
		return rd.probe(cmd.keys)
	case cmd.verb == "gets" && first.keys == nil: // single Gets, a shared line
		rooms, budgets := make([]int, len(cmd.keys)), []int(nil)
		for j, k := range cmd.keys {
			rooms[j] = -1
			if i := callOf(k); i >= 0 && i < len(calls) && calls[i].room != nil {
				rooms[j] = len(budgets)
				budgets = append(budgets, int(calls[i].room.limit))
			}
		}
		return rd.itemsIn(cmd.keys, 0, false, rooms, budgets)
	case cmd.verb == "gets":
		return rd.itemsIn(cmd.keys, first.limit, false, slices.Repeat([]int{-1}, len(cmd.keys)), nil)
	case cmd.verb == "gats":
		return rd.itemsIn(cmd.keys, 0, false, []int{0}, []int{int(first.room.limit)})
	case cmd.verb == "ms":
		return rd.metaStored()
	}
	m := map[string]int{
		"set": fuzzSet, "add": fuzzSet, "replace": fuzzSet, "append": fuzzSet, "prepend": fuzzSet, "cas": fuzzSet,
		"incr": fuzzIncr, "decr": fuzzIncr, "touch": fuzzTouch, "delete": fuzzDelete, "mg": fuzzHead,
	}[cmd.verb]
	return rd.oneLine(m)
}

// probeWant is what a GetMultiLimit with probe comes to: the probe's
// reply says which keys are sent in a gets (Client.fitting), and that
// gets' reply the items; the keys past the limit are dropped unsent.
func probeWant(pc *pipeCall, parts []ref, cmds []pipeCmd) (want ref, wrong string, lost bool) {
	p := parts[0]
	send, over := pc.keys, []string(nil)
	if p.outcome == refOK {
		send = nil
		kept := 0
		for j, k := range pc.keys {
			switch n := p.sizes[j]; {
			case n < 0:
			case kept+n > pc.limit:
				over = append(over, k)
			default:
				kept += n
				send = append(send, k)
			}
		}
	}
	switch {
	case len(send) == 0 && len(parts) == 1:
		return ref{dropped: over}, "", false
	case len(parts) == 1:
		return ref{}, "", true
	case len(parts) > 2 || len(send) == 0 || !slices.Equal(cmds[1].keys, send):
		return ref{}, fmt.Sprintf("sent %v after a probe that answered %v; want a gets of %q", cmds[1:], p.sizes, send), false
	}
	g := parts[1]
	if g.outcome == refOK {
		g.dropped = append(over, g.dropped...)
	}
	return g, "", false
}

// metaStored reads the one-line reply to an ms (op.MetaStored): HD,
// with or without flags, NS, EX or NF; SERVER_ERROR is a refusal; ERROR
// (a server that read the data block as a command) and CLIENT_ERROR (a
// data block it took for another length) put the connection out of
// step.
func (rd *refReader) metaStored() ref {
	line, st := rd.line()
	if st != refOK {
		return ref{outcome: st}
	}
	s := string(line[:len(line)-2])
	switch {
	case s == "HD" || strings.HasPrefix(s, "HD "):
		return ref{}
	case s == "NS":
		return ref{err: memcache.ErrNotStored}
	case s == "EX":
		return ref{err: memcache.ErrCASConflict}
	case s == "NF":
		return ref{miss: true}
	case strings.HasPrefix(s, "SERVER_ERROR "):
		return ref{outcome: refRefuse}
	}
	return ref{outcome: refBroken}
}

// pipeCheck compares each call's result with pipeReference's and
// describes the differences. Strict (no timing, no probe, requests all
// read before the first byte of the stream is written, in one order the
// client chose) makes the outcome exact: a call fails only at or after
// the reply that broke the stream, its own with errProtocol or io.EOF.
// Otherwise a call may fail sooner, as a connection given up does (a
// reply that came before its request; a timeout; with the node gone, a
// write), but then every call after it fails too.
func pipeCheck(stream []byte, cmds []pipeCmd, calls []*pipeCall, timing, strict bool) string {
	wants := pipeReference(stream, cmds, calls)
	var b strings.Builder
	failedAt := -1 // the earliest request whose call failed though its reply read whole
	order := make([]int, len(calls))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(x, y int) int { return wants[x].pos - wants[y].pos })
	for _, i := range order {
		pc, w, got := calls[i], wants[i], calls[i].got
		switch {
		case w.wrong != "":
			fmt.Fprintf(&b, "call %d (kind %d): %s\n", i, pc.kind, w.wrong)
		case w.pos < 0 || w.after || w.lost:
			if got.err == nil {
				fmt.Fprintf(&b, "call %d (kind %d): succeeded (%d items, number %d) though %s\n", i, pc.kind, len(got.items), got.num, map[bool]string{true: "its request came after a broken reply", false: "the client sent no request of it"}[w.after])
			}
		case w.at:
			if got.err == nil {
				fmt.Fprintf(&b, "call %d (kind %d): succeeded (%d items, number %d) on a reply that breaks the protocol (outcome %d)\n", i, pc.kind, len(got.items), got.num, w.want.outcome)
			} else if msg := w.want.check(got); strict && msg != "" && !(failedAt >= 0 && failedAt < w.pos) {
				fmt.Fprintf(&b, "call %d (kind %d) on the broken reply: %s", i, pc.kind, msg)
			}
		default:
			msg := w.want.check(got)
			switch {
			case msg == "":
			case got.err == nil:
				fmt.Fprintf(&b, "call %d (kind %d): WRONG RESULT: %s", i, pc.kind, msg)
			default:
				if failedAt < 0 || w.pos < failedAt {
					failedAt = w.pos
				}
				if strict || !timing && !errors.Is(got.err, io.ErrClosedPipe) && !errors.Is(got.err, ErrClosed) && !strings.Contains(got.err.Error(), "a reply nobody asked for") {
					fmt.Fprintf(&b, "call %d (kind %d): failed before the stream broke: %s", i, pc.kind, msg)
				}
			}
		}
	}
	if failedAt >= 0 {
		for _, i := range order {
			if wants[i].pos > failedAt && calls[i].got.err == nil {
				fmt.Fprintf(&b, "call %d (kind %d): succeeded after a call before it failed on the connection (request %d)\n", i, calls[i].kind, failedAt)
			}
		}
	}
	if b.Len() > 0 {
		fmt.Fprintf(&b, "requests as sent: %v\n", cmds)
		for _, pc := range calls {
			fmt.Fprintf(&b, "call %d (kind %d): err %v, %d items, number %d, dropped %q, nofit %q\n", pc.i, pc.kind, pc.got.err, len(pc.got.items), pc.got.num, pc.got.dropped, pc.got.nofit)
		}
	}
	return b.String()
}

// pipeSeed is a FuzzPipelined input.
type pipeSeed struct {
	mix, stream, cuts []byte
}

// pipeSeeds are the seeds of FuzzPipelined added in code: what the
// replies captured from a real memcached (testdata/fuzz/FuzzPipelined)
// do not have, a stall past the timeout with calls of short deadlines
// waiting, and the client closing its connection between two replies.
func pipeSeeds() []pipeSeed {
	return []pipeSeed{
		{[]byte{launchBurst, pGet, pGet, pGet}, []byte("VALUE k0 0 1 1\r\na\r\nVALUE k2 0 1 2\r\nc\r\nEND\r\n"), nil},
		{[]byte{launchOrdered, pSet, pIncr, pDelete}, []byte("STORED\r\n2\r\nDELETED\r\n"), []byte{3, 0, 1, 1, 0, 7}},
		{
			[]byte{launchOrdered | pipeTiming, pGet | 2<<4, pIncr, pGetRoom, pDelete | 2<<4},
			[]byte("VALUE k0 0 1 1\r\nx\r\nEND\r\n42\r\nEND\r\nDELETED\r\n"),
			[]byte{23, 7, 3, 7, 2, 7 | 32}, // a stall after the incr's reply
		},
		{
			[]byte{launchBurst | pipeTiming, pGet, pGet | 2<<4, pGet, pSet},
			[]byte("VALUE k0 0 1\r\na\r\nVALUE k2 0 1\r\nc\r\nEND\r\nSTORED\r\n"),
			[]byte{38, 7, 7, 7 | 32}, // a stall after the shared line's reply (if the Gets shared one)
		},
		{
			[]byte{launchSerial, pGet, pMulti | 1<<6, pIncr, pAsyncSet},
			[]byte("VALUE k0 0 1\r\nx\r\nEND\r\nVALUE k1a 0 2\r\nab\r\nVALUE k1c 0 9\r\n123456789\r\nEND\r\n3\r\nSTORED\r\n"),
			[]byte{21, 1, 49, 2 | 8, 2, 3 | 64}, // closed before the incr's reply
		},
	}
}

// recordConn is a connection to a real memcached that records what it
// reads, piece by piece, with how many requests had been written before
// each piece: the cuts of a FuzzPipelined seed that replays it.
type recordConn struct {
	net.Conn
	mu      sync.Mutex
	written []byte
	reads   [][]byte
	gates   []int
}

func (r *recordConn) Write(p []byte) (int, error) {
	r.mu.Lock()
	r.written = append(r.written, p...)
	r.mu.Unlock()
	return r.Conn.Write(p)
}

func (r *recordConn) Read(p []byte) (int, error) {
	n, err := r.Conn.Read(p)
	if n > 0 {
		r.mu.Lock()
		reqs := 0
		parseRequests(bufio.NewReader(bytes.NewReader(r.written)), func(pipeCmd) { reqs++ })
		r.reads, r.gates = append(r.reads, bytes.Clone(p[:n])), append(r.gates, reqs)
		r.mu.Unlock()
	}
	return n, err
}

// cuts encodes the recorded pieces as FuzzPipelined's cuts.
func (r *recordConn) cuts() []byte {
	var cuts []byte
	for i, b := range r.reads {
		g := byte(min(r.gates[i], 7)) // 7: every call sent, as the seventh request (a probe's gets) is
		for d := len(b); d > 0; {
			switch {
			case d >= 512:
				k := min(d/512, 64)
				cuts, d = append(cuts, byte(191+k), g), d-k*512
			default:
				l := min(d, 192)
				cuts, d = append(cuts, byte(l-1), g), d-l
			}
		}
	}
	return cuts
}

// TestPipelinedCapture writes FuzzPipelined's seeds: each mix of
// pipeCaptures made one call after another (launchSerial) on a real
// memcached, whose items it first stores, and its replies recorded as
// they came; then the same replies for the mix started in order or in a
// burst, written whole once every call was sent. It runs only with
// MEMCGATE_TEST_CAPTURE_SEEDS set (the files are committed).
func TestPipelinedCapture(t *testing.T) {
	if os.Getenv("MEMCGATE_TEST_CAPTURE_SEEDS") == "" {
		t.Skip("MEMCGATE_TEST_CAPTURE_SEEDS is not set")
	}
	for _, dir := range []string{pipeCorpus, pipeReplays} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, pc := range pipeCaptures {
		dir := pipeCorpus
		if pc.replay {
			dir = pipeReplays
		}
		srv := memcachedtest.Start(t)
		mix := append([]byte{launchSerial}, pc.mix...)
		_, _, calls := pipeCalls(mix)
		setup := memcache.New(srv.Addr)
		for _, cl := range calls {
			items := pipeItems(cl)
			for _, k := range slices.Sorted(maps.Keys(items)) { // in order: the CAS values follow it
				if err := setup.Set(&memcache.Item{Key: k, Value: items[k], Flags: uint32(cl.i)}); err != nil {
					t.Fatal(err)
				}
			}
		}
		var rec *recordConn
		c := New(Options{Dial: func(ctx context.Context) (net.Conn, error) {
			var d net.Dialer
			nc, err := d.DialContext(ctx, "tcp", srv.Addr)
			if err != nil {
				return nil, err
			}
			rec = &recordConn{Conn: nc}
			return rec, nil
		}})
		for _, cl := range calls {
			cl.run(c)
		}
		c.Close()
		stream := pipeCompact(bytes.Join(rec.reads, nil))
		for _, mode := range pc.modes {
			var cuts []byte
			if mode == launchSerial {
				cuts = rec.cuts()
			}
			mix[0] = mode
			body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n[]byte(%q)\n[]byte(%q)\n", mix, stream, cuts)
			name := filepath.Join(dir, fmt.Sprintf("memcached-%s-%d", pc.name, mode))
			if err := os.WriteFile(name, []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: %d bytes of replies", name, len(stream))
		}
	}
}

// pipeCaptures are the mixes TestPipelinedCapture records, by name.
// The mixes replayed as captured are TestPipelinedReplays', which
// checks that every call gets memcached's answer (replay); the others
// are FuzzPipelined's seeds.
var pipeCaptures = []struct {
	name   string
	mix    []byte
	modes  []byte // the launch modes it is replayed in: launchSerial with the cuts captured, the others written whole
	replay bool   // in pipeReplays, not in the corpus
}{
	{"meta", []byte{pHead, pAppendCAS, pGet, pGAT, pIncr, pDelete}, []byte{launchSerial}, true},
	{"reads", []byte{pGetRoom | 1<<4, pMulti | 2<<6, pProbe, pGet, pGAT | 1<<4, pHead}, []byte{launchSerial}, true},
	{"writes", []byte{pSet, pSetBig, pAdd, pCAS, pTouch, pIncr}, []byte{launchSerial, launchOrdered, launchBurst}, false},
	{"async", []byte{pGet, pAsyncGet, pAsyncSet, pProbe | 2<<6, pMulti, pDelete}, []byte{launchSerial, launchOrdered, launchBurst}, false},
	{"gets", []byte{pGet, pGetRoom | 1<<4, pGet, pAsyncGet, pGet, pGet}, []byte{launchBurst}, false},
}

// Where TestPipelinedCapture writes: FuzzPipelined's corpus, and the
// captures TestPipelinedReplays replays.
const (
	pipeCorpus  = "testdata/fuzz/FuzzPipelined"
	pipeReplays = "testdata/pipelined"
)

// TestPipelinedReplays replays the captures of pipeReplays as captured
// (launchSerial, each piece of memcached's replies written as it was
// read): every call gets memcached's own answer, as the reference
// reads it, and none fails on the connection.
func TestPipelinedReplays(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(pipeReplays, "*"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no captures in %s: %v", pipeReplays, err)
	}
	for _, name := range files {
		t.Run(filepath.Base(name), func(t *testing.T) {
			in := readPipeInput(t, name)
			msg, calls := fuzzPipelined(in[0], in[1], in[2])
			if msg != "" {
				t.Error(msg)
			}
			for _, pc := range calls {
				switch err := pc.got.err; {
				case err == nil, errors.Is(err, memcache.ErrNotStored), errors.Is(err, memcache.ErrCASConflict), errors.Is(err, memcache.ErrCacheMiss):
				default:
					t.Errorf("call %d (kind %d): %v", pc.i, pc.kind, err)
				}
			}
		})
	}
}

// readPipeInput reads a FuzzPipelined input file: mix, stream, cuts.
func readPipeInput(t *testing.T, name string) [3][]byte {
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	var in [3][]byte
	if len(lines) < 4 || lines[0] != "go test fuzz v1" {
		t.Fatalf("%s: not a fuzz input file", name)
	}
	for i := range in {
		q, ok := strings.CutPrefix(lines[i+1], "[]byte(")
		q, ok2 := strings.CutSuffix(q, ")")
		s, err := strconv.Unquote(q)
		if !ok || !ok2 || err != nil {
			t.Fatalf("%s: line %d: %q", name, i+2, lines[i+1])
		}
		in[i] = []byte(s)
	}
	return in
}

// pipeItems are the items a captured call's keys hold before the mix
// runs: small values, large ones for the reads with a Room, a number
// for incr; a multi-key read's second key missing; Add's key missing.
func pipeItems(pc *pipeCall) map[string][]byte {
	switch pc.kind {
	case pMulti, pProbe:
		return map[string][]byte{pc.keys[0]: []byte("va"), pc.keys[2]: []byte(strings.Repeat("c", 40))}
	case pGetRoom, pGAT:
		return map[string][]byte{pc.key: pipeLarge}
	case pIncr:
		return map[string][]byte{pc.key: []byte("41")}
	case pAdd:
		return nil
	}
	return map[string][]byte{pc.key: []byte("v" + pc.key)}
}

// TestPipelinedMixes runs FuzzPipelined's harness on mixes whose
// outcome does not depend on timing, and checks each call's result
// besides: a reply cut, merged, extended or sent before its request
// fails the calls from there on, and never hands a call another's
// data.
func TestPipelinedMixes(t *testing.T) {
	tests := []struct {
		name   string
		mix    []byte
		stream string
		cuts   []byte
		want   []string // per call: "value:<v>", "miss", "num:<n>", "ok", "err", "err:<part of the error>", or "any" (what pipeCheck accepts)
	}{
		{
			"replies split one byte a time, with yields",
			[]byte{launchOrdered, pSet, pIncr, pGet, pDelete},
			"STORED\r\n42\r\nVALUE k2 0 1 9\r\nx\r\nEND\r\nDELETED\r\n",
			[]byte{0, 15, 0, 15, 0, 15, 0, 15, 0, 15, 0, 15, 0, 15, 0, 15, 0, 15, 0, 15, 0, 15, 0, 15, 0, 15, 0, 15, 0, 15}, // each after every request, and a yield
			[]string{"ok", "num:42", "value:x", "ok"},
		},
		{
			"a get reply without its END takes the next reply as a line of its own",
			[]byte{launchOrdered, pGet, pIncr},
			"VALUE k0 0 1\r\nx\r\n42\r\nEND\r\n",
			nil,
			[]string{"err:\"42\\r\\n\" in a get reply", "err"},
		},
		{
			"an END too many is the next call's broken reply, not its miss",
			[]byte{launchOrdered, pGet, pDelete, pGet},
			"END\r\nEND\r\nDELETED\r\nEND\r\n",
			nil,
			[]string{"miss", "err:\"END\\r\\n\" to delete", "err"},
		},
		{
			"a multi-key read answered with the next call's key fails both",
			[]byte{launchOrdered, pMulti, pGet},
			"VALUE k1 0 1\r\nx\r\nEND\r\nEND\r\n",
			nil,
			[]string{"err:answers a key gets did not ask for", "err"},
		},
		{
			"a value one byte longer than declared",
			[]byte{launchOrdered, pGet, pSet},
			"VALUE k0 0 2\r\nabc\r\nEND\r\nSTORED\r\n",
			nil,
			[]string{"err:not followed by CRLF", "err"},
		},
		{
			"a reply cut short and the node gone",
			[]byte{launchOrdered, pIncr, pGAT, pTouch},
			"7\r\nVALUE k1 0 5\r\nab",
			nil,
			[]string{"num:7", "err:EOF", "err"},
		},
		{
			"the next call's reply sent before its request",
			[]byte{launchSerial, pGet, pIncr},
			"VALUE k0 0 1\r\nx\r\nEND\r\n42\r\n",
			[]byte{255, 7}, // all at once, after the first request
			[]string{"value:x", "err"},
		},
		{
			"an ms after an mg answered HD, its NS the ms's own",
			[]byte{launchSerial, pHead, pAppendCAS, pGet},
			"HD s1 f3 c9\r\nNS\r\nEND\r\n",
			[]byte{12, 1, 3, 2},
			[]string{"num:1", "err:item not stored", "miss"},
		},
		{
			"an ms refused unsent before any HD: its NS read by nobody, the next call's reply broken",
			[]byte{launchOrdered, pAppendCAS, pGet},
			"NS\r\nEND\r\n",
			nil,
			[]string{"err:does not know meta", "err:\"NS\\r\\n\" in a get reply"},
		},
		{
			"a size probe's reply, then the gets of the keys that fit",
			[]byte{launchSerial, pProbe | 1<<6, pIncr},
			"HD s2 kk0a\r\nHD s90 kk0c\r\nMN\r\nVALUE k0a 0 2\r\nab\r\nEND\r\n5\r\n",
			[]byte{28, 1, 23, 2, 2, 3},
			[]string{"value:ab", "num:5"},
		},
		{
			"a Room that refuses a large value reads it off, and the next call gets its own",
			[]byte{launchOrdered, pGetRoom | 1<<4, pGet},
			"VALUE k0 0 16400\r\n" + strings.Repeat("L", 16400) + "\r\nEND\r\nVALUE k1 0 1\r\ny\r\nEND\r\n",
			nil,
			[]string{"err:" + ErrNoFit.Error(), "value:y"},
		},
		{
			"the client closes its connection while the next reply is owed",
			[]byte{launchSerial, pGet, pIncr, pGet},
			"VALUE k0 0 1\r\nx\r\nEND\r\n42\r\n",
			[]byte{21, 1, 3, 2 | 64},
			[]string{"value:x", "err:" + ErrClosed.Error(), "err:dialled again"},
		},
		{
			// Past 256 KiB the reply's progress moves its deadline, capped
			// at the caller's: the call fails with ErrBehind, or with the
			// timeout the stall ends in, and the calls behind it too. (A
			// reader starved of the CPU through the whole stall may find
			// the next piece there with its deadline passed, and
			// net.Pipe's Read takes either: then all succeed. The
			// outcomes are checked by pipeCheck alone.)
			"a caller's deadline passes while its long reply arrives, then a stall",
			[]byte{launchOrdered | pipeTiming, pGet | 2<<4, pGet, pIncr},
			"VALUE k0 0 300000\r\n" + strings.Repeat("x", 300000) + "\r\nEND\r\nVALUE k1 0 1\r\ny\r\nEND\r\n5\r\n",
			[]byte{255, 7, 255, 7, 255, 7, 255, 7, 255, 7, 255, 7, 255, 7, 255, 7, 255, 7 | 32},
			[]string{"any", "any", "any"},
		},
		{
			// The call returns on the close; its Room is given back by
			// the reader once its read fails (checked by fuzzPipelined
			// after the connection's goroutines ended).
			"the client closes its connection while a value is read into a Room",
			[]byte{launchSerial, pGetRoom, pIncr},
			"VALUE k0 0 20000\r\n" + strings.Repeat("L", 10000),
			[]byte{191 + 16, 1, 255, 1 | 64}, // 8 KiB, then the close
			[]string{"err:" + ErrClosed.Error(), "err"},
		},
		{
			"append, decr and mg with T read their own replies",
			[]byte{launchOrdered, pSet | 8<<4, pIncr | 4<<4, pHead | 4<<4, pAppendCAS | 4<<4},
			"NOT_STORED\r\n0\r\nEN\r\n",
			nil,
			[]string{"err:item not stored", "ok", "err:cache miss", "err:does not know meta"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msg, calls := fuzzPipelined(tt.mix, []byte(tt.stream), tt.cuts)
			if msg != "" {
				t.Error(msg)
			}
			for i, pc := range calls {
				if got := pipeOutcome(pc); !pipeMatches(got, tt.want[i]) {
					t.Errorf("call %d (kind %d): %s, want %s", i, pc.kind, got, tt.want[i])
				}
			}
		})
	}
}

// pipeOutcome says what a call came to as TestPipelinedMixes expects it.
func pipeOutcome(pc *pipeCall) string {
	r := pc.got
	switch {
	case len(r.nofit) > 0:
		return "err:" + ErrNoFit.Error()
	case r.err != nil:
		return "err:" + r.err.Error()
	case len(r.items) > 0 && pc.kind == pHead:
		return "num:" + strconv.FormatUint(r.num, 10)
	case len(r.items) > 0:
		if v := r.items[0].Value; len(v) > 40 {
			return fmt.Sprintf("value:%s... (%d bytes)", v[:40], len(v))
		}
		return "value:" + string(r.items[0].Value)
	case r.num != 0:
		return "num:" + strconv.FormatUint(r.num, 10)
	case pc.kind == pGet || pc.kind == pGetRoom || pc.kind == pGAT || pc.kind == pAsyncGet:
		return "miss"
	}
	return "ok"
}

// pipeMatches reports whether got is want: equal, or for "err:…" an
// error containing it ("err": any error).
func pipeMatches(got, want string) bool {
	if want == "any" {
		return true
	}
	if part, ok := strings.CutPrefix(want, "err"); ok && strings.HasPrefix(got, "err:") {
		return strings.Contains(got, strings.TrimPrefix(part, ":"))
	}
	return got == want
}
