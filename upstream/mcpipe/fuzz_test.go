package mcpipe

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime/debug"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/memcgate/memcgate/upstream/op"
)

// The requests FuzzReply sends, by the mode byte of its input (modulo
// fuzzModes).
const (
	fuzzGet     = iota // Get "k": a shared gets line of one key
	fuzzGAT            // GAT "k" with a Room: a reply of its own, lent past op.LentValue
	fuzzMulti          // GetMultiLimit a b c, a byte limit, no Room
	fuzzMultiRm        // GetMultiLimit a b c with a Room for every value
	fuzzSet            // Set
	fuzzIncr           // Incr
	fuzzTouch          // Touch
	fuzzDelete         // Delete
	fuzzHead           // Head (mg)
	fuzzShared         // readReply of a shared line a b a, with Rooms, handed out by share
	fuzzProbe          // readProbe of a b c
	fuzzModes
)

// fuzzKeys are the keys of FuzzReply's multi-key reads and probes.
var fuzzKeys = []string{"a", "b", "c"}

// FuzzReply has a node answer one request of the pipelined client with
// arbitrary bytes, then hang up: the client talks to it over a net.Pipe,
// through its public calls (the last two modes read a shared gets line
// and a size probe with the reply readers themselves). Whatever the
// bytes, the client must not panic, must end the call (within its
// deadline), must hand out only what an independent reading of the bytes
// (refReply) finds a well-formed reply to say, must allocate about what
// came rather than what the node claims (a value's length is only the
// node's word: at most eight times the bytes sent, plus what the
// caller's budget lends), and must give up a connection whose reply broke
// the protocol before anyone else could read from it. lim is the byte
// limit of a multi-key read, or the Room's budget in 256-byte units.
func FuzzReply(f *testing.F) {
	// memcached 1.6's own replies to the requests of each mode.
	seeds := []struct {
		mode  int
		lim   uint16
		reply string
	}{
		{fuzzGet, 0, "VALUE k 5 3 1\r\nabc\r\nEND\r\n"},
		{fuzzGet, 0, "END\r\n"},
		{fuzzGet, 0, "VALUE k 0 0 2\r\n\r\nEND\r\n"},
		{fuzzGet, 0, "SERVER_ERROR out of memory reading request\r\n"},
		{fuzzGet, 0, "VALUE k 0 268435456\r\n"},
		{fuzzGAT, 64, "VALUE k 5 3 1\r\nabc\r\nEND\r\n"},
		{fuzzGAT, 1, "VALUE k 0 20000 7\r\n" + strings.Repeat("v", 20000) + "\r\nEND\r\n"},
		{fuzzMulti, 4, "VALUE a 5 3 1\r\nabc\r\nVALUE c 0 2 9\r\nxy\r\nEND\r\n"},
		{fuzzMulti, 0, "VALUE a 5 3 1\r\nabc\r\nVALUE b 0 0 2\r\n\r\nEND\r\n"},
		{fuzzMultiRm, 1, "VALUE a 5 3 1\r\nabc\r\nVALUE b 0 300 2\r\n" + strings.Repeat("w", 300) + "\r\nEND\r\n"},
		{fuzzSet, 0, "STORED\r\n"},
		{fuzzSet, 0, "NOT_STORED\r\n"},
		{fuzzSet, 0, "CLIENT_ERROR bad data chunk\r\nERROR\r\n"},
		{fuzzSet, 0, "SERVER_ERROR object too large for cache\r\n"},
		{fuzzIncr, 0, "15\r\n"},
		{fuzzIncr, 0, "CLIENT_ERROR cannot increment or decrement non-numeric value\r\n"},
		{fuzzIncr, 0, "NOT_FOUND\r\n"},
		{fuzzTouch, 0, "TOUCHED\r\n"},
		{fuzzTouch, 0, "NOT_FOUND\r\n"},
		{fuzzDelete, 0, "DELETED\r\n"},
		{fuzzDelete, 0, "NOT_FOUND\r\n"},
		{fuzzHead, 0, "HD s3 f5 c1\r\n"},
		{fuzzHead, 0, "EN\r\n"},
		{fuzzHead, 0, "ERROR\r\n"},
		{fuzzShared, 0, "VALUE a 5 3 1\r\nabc\r\nVALUE a 0 1 2\r\nz\r\nEND\r\n"},
		{fuzzShared, 1, "VALUE b 0 20000 7\r\n" + strings.Repeat("v", 20000) + "\r\nEND\r\n"},
		{fuzzProbe, 0, "HD s3 ka\r\nHD s0 kc\r\nMN\r\n"},
		{fuzzProbe, 0, "ERROR\r\nERROR\r\nERROR\r\nERROR\r\n"},
		{fuzzProbe, 0, "CLIENT_ERROR bad command line format\r\nMN\r\n"},
	}
	for _, s := range seeds {
		f.Add([]byte(s.reply), uint8(s.mode), s.lim)
	}
	f.Fuzz(func(t *testing.T, reply []byte, mode uint8, lim uint16) {
		m := int(mode) % fuzzModes
		budget := int(lim) << 8
		// A call that never ends is a finding too, and the fuzzer
		// records only the inputs of a worker that dies.
		watchdog := time.AfterFunc(10*time.Second, func() {
			debug.SetTraceback("all")
			panic(fmt.Sprintf("mode %d, lim %d, reply %q: no end after 10s", m, lim, reply))
		})
		defer watchdog.Stop()
		before := allocated()
		var got fuzzResult
		switch m {
		case fuzzShared:
			got = fuzzSharedLine(reply, budget)
		case fuzzProbe:
			r, err := readProbe(bufio.NewReaderSize(bytes.NewReader(reply), 16<<10), fuzzKeys)
			if err == nil {
				err = r.err
			}
			if errors.Is(err, errProbeRefused) {
				// A refusal that may quote the line refused as
				// malformed: the reply was read to its end.
				err = errors.New(err.Error())
			}
			got = fuzzResult{err: err, sizes: r.sizes}
		default:
			got = fuzzCall(t, m, reply, int(lim), budget)
		}
		// A value's length claimed and not sent costs at most eight
		// times what came (readValue), and what a Room lends is within
		// its budget; the rest is the client's and the pipe's own.
		if n, most := allocated()-before, uint64(8*len(reply)+budget+1<<20); n > most {
			t.Errorf("mode %d: %d bytes allocated for a reply of %d bytes, budget %d; want at most %d", m, n, len(reply), budget, most)
		}
		want := refReply(m, reply, int(lim), budget)
		if msg := want.check(got); msg != "" {
			t.Errorf("mode %d, lim %d, reply %q:\n%s", m, lim, reply, msg)
		}
	})
}

// allocated is the bytes the process allocated so far.
func allocated() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// fuzzResult is what a FuzzReply request came to.
// single sets r from a single-key read's item and error, as a multi-key
// read says them: a miss is no item, a value the Room refused a key in
// nofit.
func (r *fuzzResult) single(it *memcache.Item, err error, key string) {
	r.err = err
	if it != nil {
		r.items = []*memcache.Item{it}
	}
	switch {
	case errors.Is(err, memcache.ErrCacheMiss):
		r.err = nil
	case errors.Is(err, ErrNoFit):
		r.err, r.nofit = nil, []string{key}
	}
}

type fuzzResult struct {
	items   []*memcache.Item // in reply order for a shared line; by key for a multi-key read
	dropped []string
	nofit   []string
	num     uint64
	sizes   []int // a probe's
	err     error
}

// fuzzCall sends the request of mode m to a node on a net.Pipe that reads
// it, answers reply and hangs up, and returns what the call came to.
func fuzzCall(t *testing.T, m int, reply []byte, lim, budget int) fuzzResult {
	lines := 1 // the request's lines, for the node to read before it answers
	if m == fuzzSet {
		lines = 2
	}
	var dials atomic.Int32
	served := make(chan struct{})
	c := New(Options{
		Timeout: 2 * time.Second,
		Dial: func(context.Context) (net.Conn, error) {
			if dials.Add(1) > 1 {
				return nil, errors.New("dialled again")
			}
			cc, nc := net.Pipe()
			go func() {
				defer close(served)
				defer nc.Close()
				br := bufio.NewReader(nc)
				for range lines {
					if _, err := br.ReadSlice('\n'); err != nil {
						return
					}
				}
				nc.Write(reply)
			}()
			return cc, nil
		},
	})
	defer func() {
		c.Close()
		if dials.Load() > 0 {
			<-served
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	var r fuzzResult
	switch m {
	case fuzzGet, fuzzGAT:
		o := op.Op{Verb: op.Get}
		if m == fuzzGAT {
			o = op.Op{Verb: op.GAT, Item: op.Item{Expiration: 10}, Room: &testRoom{limit: int64(max(budget, 1))}}
		}
		it, _, err := c.Do(ctx, o, "k")
		r.single(it, err, "k")
	case fuzzMulti, fuzzMultiRm:
		var items map[string]*memcache.Item
		if m == fuzzMulti {
			items, r.dropped, r.nofit, r.err = c.GetMultiLimit(ctx, fuzzKeys, lim, nil, false)
		} else {
			items, r.dropped, r.nofit, r.err = c.GetMultiLimit(ctx, fuzzKeys, 0, &testRoom{limit: int64(max(budget, 1))}, false)
		}
		for _, k := range fuzzKeys {
			if it := items[k]; it != nil {
				r.items = append(r.items, it)
			}
		}
		if len(items) != len(r.items) {
			t.Errorf("multi-key read of %q handed out keys not asked: %v", fuzzKeys, items)
		}
	case fuzzSet:
		_, _, r.err = c.Do(ctx, op.Op{Verb: op.Set, Item: op.Item{Value: []byte("v")}}, "k")
	case fuzzIncr:
		_, r.num, r.err = c.Do(ctx, op.Op{Verb: op.Incr, Delta: 1}, "k")
	case fuzzTouch:
		_, _, r.err = c.Do(ctx, op.Op{Verb: op.Touch, Item: op.Item{Expiration: 10}}, "k")
	case fuzzDelete:
		_, _, r.err = c.Do(ctx, op.Op{Verb: op.Delete}, "k")
	case fuzzHead:
		var it *memcache.Item
		it, r.num, r.err = c.Do(ctx, op.Op{Verb: op.Head}, "k")
		if it != nil {
			r.items = []*memcache.Item{it}
		}
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("mode %d: the call took %v, past its deadline", m, d)
	}
	if errors.Is(r.err, errProtocol) {
		// The reader fails the connection before it answers anyone:
		// no later call may read the rest of a broken stream.
		for _, l := range []*lane{&c.small, &c.large} {
			for i := range l.slots {
				if cn := l.slots[i].c.Load(); cn != nil && !cn.failed() {
					t.Errorf("mode %d: %v, and the connection is still open", m, r.err)
				}
			}
		}
	}
	return r
}

// fuzzSharedLine reads reply as the answer to a shared gets line of a b
// a, each call with a Room of budget bytes (at least 1), and returns
// what share hands each call, in line order: their items (a miss left
// out), and the keys of those refused for room (nofit).
func fuzzSharedLine(reply []byte, budget int) fuzzResult {
	keys := []string{"a", "b", "a"}
	room := &testRoom{limit: int64(max(budget, 1))}
	rooms := []op.Room{room, room, room}
	var holds []held
	r, err := readReply(bufio.NewReaderSize(bytes.NewReader(reply), 16<<10), op.Items, "gets", keys, nil, replyLimit{}, rooms, &holds, nil, nil)
	for _, h := range holds {
		h.room.Release(h.n)
	}
	if err != nil {
		return fuzzResult{err: err}
	}
	calls := make([]*call, len(keys))
	for i, k := range keys {
		calls[i] = &call{key: k}
	}
	share(calls, r)
	var got fuzzResult
	for i, cl := range calls {
		switch {
		case errors.Is(cl.reply.err, ErrNoFit):
			got.nofit = append(got.nofit, keys[i])
		case cl.reply.err != nil:
			got.err = cl.reply.err
		case len(cl.reply.items) > 0:
			got.items = append(got.items, cl.reply.items...)
		}
	}
	if room.held.Load() != 0 {
		got.err = fmt.Errorf("the room holds %d bytes after the reply was handed out", room.held.Load())
	}
	return got
}

// The outcomes refReply tells apart.
const (
	refOK     = iota // a whole reply, memcached's answer (a miss and a refusal too)
	refRefuse        // an error line ending the reply: the request's error, the connection in step
	refBroken        // bytes no reply to the request can be: errProtocol
	refShort         // a reply cut short: the node's hang-up (io.EOF)
)

// ref is refReply's reading of a reply.
type ref struct {
	outcome int
	items   []*memcache.Item
	dropped []string
	nofit   []string
	num     uint64
	miss    bool  // a one-line reply: NOT_FOUND, EN
	err     error // a one-line reply's refusal that callers tell apart (memcache.ErrNotStored …)
	sizes   []int // a probe's
}

// refReply reads reply, the answer to the request of mode m, as the
// protocol says it reads, independently of the client's readers, with
// the client's own limits: a line of at most 16 KiB (its reader's
// buffer), and what lim and budget keep of the values. A multi-key
// read's Room takes every value, a GAT's and a shared line's those of
// op.LentValue bytes or more.
func refReply(m int, reply []byte, lim, budget int) ref {
	rd := refReader{b: reply}
	switch m {
	case fuzzGet, fuzzGAT, fuzzMulti, fuzzMultiRm, fuzzShared:
		asked, limit, roomAll, hasRoom := []string{"k"}, 0, false, m != fuzzGet && m != fuzzMulti
		switch m {
		case fuzzMulti:
			asked, limit = fuzzKeys, lim
		case fuzzMultiRm:
			asked, roomAll = fuzzKeys, true
		case fuzzShared:
			asked = []string{"a", "b", "a"}
		}
		return rd.items(asked, limit, hasRoom, roomAll, max(budget, 1))
	case fuzzProbe:
		return rd.probe(fuzzKeys)
	}
	return rd.oneLine(m)
}

// oneLine reads the one-line reply to the request of mode m (fuzzSet,
// fuzzIncr, fuzzTouch, fuzzDelete or fuzzHead).
func (rd *refReader) oneLine(m int) ref {
	line, st := rd.line()
	if st != refOK {
		return ref{outcome: st}
	}
	s := string(line[:len(line)-2])
	isErr := s == "ERROR" || strings.HasPrefix(s, "CLIENT_ERROR ") || strings.HasPrefix(s, "SERVER_ERROR ")
	switch m {
	case fuzzSet:
		switch {
		case s == "STORED":
			return ref{}
		case s == "NOT_STORED":
			return ref{err: memcache.ErrNotStored}
		case s == "EXISTS":
			return ref{err: memcache.ErrCASConflict}
		case s == "NOT_FOUND":
			return ref{miss: true}
		case isErr && !strings.HasPrefix(s, "CLIENT_ERROR "):
			return ref{outcome: refRefuse}
		}
	case fuzzIncr:
		if n, err := strconv.ParseUint(s, 10, 64); err == nil {
			return ref{num: n}
		}
		switch {
		case s == "NOT_FOUND":
			return ref{miss: true}
		case isErr:
			return ref{outcome: refRefuse}
		}
	case fuzzTouch, fuzzDelete:
		switch {
		case m == fuzzTouch && s == "TOUCHED", m == fuzzDelete && (s == "DELETED" || s == "OK"):
			return ref{}
		case s == "NOT_FOUND":
			return ref{miss: true}
		case isErr:
			return ref{outcome: refRefuse}
		}
	case fuzzHead:
		switch {
		case s == "EN":
			return ref{miss: true}
		case isErr:
			return ref{outcome: refRefuse}
		case s == "HD" || s == "OK" || strings.HasPrefix(s, "HD ") || strings.HasPrefix(s, "OK "):
			return refHead(s)
		}
	}
	return ref{outcome: refBroken}
}

// refHead reads an mg's hit, "HD <flags>": its s, f and c flags, any
// others passed over; one without all three is the server's refusal
// (ErrNoMeta), the connection in step.
func refHead(s string) ref {
	var size, flags, cas uint64
	seen := 0 // a bit per flag: each once
	for _, tok := range strings.Fields(s[2:]) {
		var err error
		bit := 0
		switch tok[0] {
		case 's':
			size, err = strconv.ParseUint(tok[1:], 10, 31)
			bit = 1
		case 'f':
			var n uint64
			n, err = strconv.ParseUint(tok[1:], 10, 32)
			flags, bit = n, 2
		case 'c':
			cas, err = strconv.ParseUint(tok[1:], 10, 64)
			bit = 4
		default:
			continue
		}
		if err != nil || seen&bit != 0 {
			return ref{outcome: refRefuse}
		}
		seen |= bit
	}
	if seen != 7 {
		return ref{outcome: refRefuse}
	}
	return ref{items: []*memcache.Item{{Flags: uint32(flags), CasID: cas}}, num: size}
}

// refReader reads a reply's lines and values.
type refReader struct {
	b  []byte
	at int
}

// line reads one line, CRLF included: refShort without its LF,
// refBroken past 16 KiB or without its CR.
func (rd *refReader) line() ([]byte, int) {
	rest := rd.b[rd.at:]
	i := bytes.IndexByte(rest, '\n')
	switch {
	case i < 0 && len(rest) >= 16<<10, i >= 16<<10:
		return nil, refBroken
	case i < 0:
		return nil, refShort
	case i == 0 || rest[i-1] != '\r':
		return nil, refBroken
	}
	rd.at += i + 1
	return rest[:i+1], refOK
}

// value reads n bytes and their CRLF.
func (rd *refReader) value(n int) ([]byte, int) {
	rest := rd.b[rd.at:]
	switch {
	case len(rest) < n+2:
		return nil, refShort
	case string(rest[n:n+2]) != "\r\n":
		return nil, refBroken
	}
	rd.at += n + 2
	return rest[:n], refOK
}

// items reads a get reply to asked: VALUE blocks for keys asked, in the
// order asked, then END. limit (0: none) drops the values past it; with
// a Room (hasRoom) of budget bytes, the values it is asked for (every
// value but empty ones with roomAll, else those of op.LentValue bytes or
// more) are refused once it would hold more.
func (rd *refReader) items(asked []string, limit int, hasRoom, roomAll bool, budget int) ref {
	rooms := slices.Repeat([]int{-1}, len(asked))
	if hasRoom {
		clear(rooms) // all the same Room: budget holds for all of them
	}
	return rd.itemsIn(asked, limit, roomAll, rooms, []int{budget})
}

// itemsIn is items with a Room per key asked: rooms[i] is the index in
// budgets of the Room asked[i]'s value is asked of, -1 for none. Each
// Room holds what it took until the reply ends.
func (rd *refReader) itemsIn(asked []string, limit int, roomAll bool, rooms, budgets []int) ref {
	var r ref
	next, kept := 0, 0
	held := make([]int, len(budgets))
	for {
		line, st := rd.line()
		if st != refOK {
			return ref{outcome: st}
		}
		s := string(line[:len(line)-2])
		switch {
		case s == "END":
			return r
		case s == "ERROR" || strings.HasPrefix(s, "CLIENT_ERROR ") || strings.HasPrefix(s, "SERVER_ERROR "):
			return ref{outcome: refRefuse}
		case !strings.HasPrefix(s, "VALUE "):
			return ref{outcome: refBroken}
		}
		f := strings.Split(s[len("VALUE "):], " ")
		if len(f) != 3 && len(f) != 4 || f[0] == "" {
			return ref{outcome: refBroken}
		}
		flags, err1 := strconv.ParseUint(f[1], 10, 32)
		size, err2 := strconv.ParseUint(f[2], 10, 31)
		var cas uint64
		var err3 error
		if len(f) == 4 {
			cas, err3 = strconv.ParseUint(f[3], 10, 64)
		}
		if err1 != nil || err2 != nil || err3 != nil {
			return ref{outcome: refBroken}
		}
		i := slices.Index(asked[next:], f[0])
		if i < 0 {
			return ref{outcome: refBroken}
		}
		next += i + 1
		n := int(size)
		v, st := rd.value(n)
		if st != refOK {
			return ref{outcome: st}
		}
		rm := rooms[next-1]
		asks := rm >= 0 && (n >= op.LentValue || roomAll && n > 0)
		switch {
		case limit > 0 && kept+n > limit:
			r.dropped = append(r.dropped, f[0])
		case asks && held[rm]+n > budgets[rm]:
			r.nofit = append(r.nofit, f[0])
		default:
			if asks {
				held[rm] += n
			}
			kept += n
			r.items = append(r.items, &memcache.Item{Key: f[0], Value: v, Flags: uint32(flags), CasID: cas})
		}
	}
}

// probe reads the reply to a size probe of keys: "HD" lines with the
// size and key of the keys present, in the order asked, then "MN"; or
// ERROR for every line sent, a server without meta commands.
func (rd *refReader) probe(keys []string) ref {
	r := ref{sizes: slices.Repeat([]int{-1}, len(keys))}
	next, errs, refused := 0, 0, false
	for lines := 0; ; lines++ {
		if lines > len(keys) {
			return ref{outcome: refBroken}
		}
		line, st := rd.line()
		if st != refOK {
			return ref{outcome: st}
		}
		s := string(line[:len(line)-2])
		switch {
		case s == "MN":
			if errs > 0 || refused {
				r.outcome = refRefuse
			}
			return r
		case s == "ERROR":
			if errs++; errs == len(keys)+1 {
				return ref{outcome: refRefuse, sizes: r.sizes}
			}
		case strings.HasPrefix(s, "CLIENT_ERROR ") || strings.HasPrefix(s, "SERVER_ERROR "):
			refused = true
		case s == "EN":
		case s == "HD" || s == "OK" || strings.HasPrefix(s, "HD ") || strings.HasPrefix(s, "OK "):
			key, size, ok := "", -1, 0
			for _, tok := range strings.Fields(s[2:]) {
				if tok[0] == 's' && ok&1 != 0 || tok[0] == 'k' && ok&2 != 0 {
					ok = -100 // a flag twice
				}
				switch tok[0] {
				case 's':
					n, err := strconv.ParseUint(tok[1:], 10, 31)
					if err != nil {
						ok = -100
					}
					size, ok = int(n), ok|1
				case 'k':
					if len(tok) == 1 {
						ok = -100
					}
					key, ok = tok[1:], ok|2
				}
			}
			if ok != 3 {
				refused = true
				continue
			}
			i := slices.Index(keys[next:], key)
			if i < 0 {
				return ref{outcome: refBroken}
			}
			next += i + 1
			r.sizes[next-1] = size
		default:
			return ref{outcome: refBroken}
		}
	}
}

// check compares what the client made of a reply with what refReply
// read in it, and describes the difference ("" if none).
func (w ref) check(got fuzzResult) string {
	switch err := got.err; {
	case errors.Is(err, errProtocol):
		if w.outcome != refBroken {
			return fmt.Sprintf("client: %v; reference: outcome %d", err, w.outcome)
		}
		return ""
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		if w.outcome != refShort {
			return fmt.Sprintf("client: %v; reference: outcome %d", err, w.outcome)
		}
		return ""
	case w.outcome == refBroken || w.outcome == refShort:
		return fmt.Sprintf("client: %v, %d items; reference: outcome %d", err, len(got.items), w.outcome)
	case w.outcome == refRefuse:
		if err == nil || errors.Is(err, memcache.ErrCacheMiss) || errors.Is(err, ErrNoFit) {
			return fmt.Sprintf("client: %v, %d items; reference: the request refused", err, len(got.items))
		}
		return ""
	case w.sizes != nil:
		if err != nil || !slices.Equal(got.sizes, w.sizes) {
			return fmt.Sprintf("client: sizes %v, %v; reference: sizes %v", got.sizes, err, w.sizes)
		}
		return ""
	}
	// A whole reply: the client's result must be exactly what it says.
	var b strings.Builder
	if got.num != w.num {
		fmt.Fprintf(&b, "number %d, want %d\n", got.num, w.num)
	}
	wantErr := w.err
	if w.miss {
		wantErr = memcache.ErrCacheMiss
	}
	if !errors.Is(got.err, wantErr) || (wantErr == nil) != (got.err == nil) {
		fmt.Fprintf(&b, "error %v, want %v\n", got.err, wantErr)
	}
	if len(got.items) != len(w.items) {
		fmt.Fprintf(&b, "%d items, want %d\n", len(got.items), len(w.items))
	} else {
		for i, it := range got.items {
			wi := w.items[i]
			if it.Key != wi.Key || it.Flags != wi.Flags || it.CasID != wi.CasID || !bytes.Equal(it.Value, wi.Value) {
				fmt.Fprintf(&b, "item %d: %q %d %d %q, want %q %d %d %q\n", i, it.Key, it.Flags, it.CasID, it.Value, wi.Key, wi.Flags, wi.CasID, wi.Value)
			}
		}
	}
	if !slices.Equal(got.dropped, w.dropped) {
		fmt.Fprintf(&b, "dropped %q, want %q\n", got.dropped, w.dropped)
	}
	if !slices.Equal(got.nofit, w.nofit) {
		fmt.Fprintf(&b, "nofit %q, want %q\n", got.nofit, w.nofit)
	}
	return b.String()
}
