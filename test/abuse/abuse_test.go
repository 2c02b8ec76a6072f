//go:build linux

// Package abuse runs the attacks of issue #16 against the real memcgate
// binary with default settings and a real memcached, a fresh gateway
// process per attack, and asserts what a gateway in front of a shared
// cache owes everyone else while one client misbehaves:
//
//	(a) a well-behaved client (the canary: a small GET every 20 ms on a
//	    keep-alive connection opened before the attack and on a new
//	    connection per request) gets 200 within 1 s, every time;
//	(b) the gateway's peak RSS (VmHWM) stays at or under 256 MiB, and so
//	    does its Go heap in use (sampled), which shows memory reserved
//	    and not yet written to;
//	(c) every write answered 202 is in memcached once the async queue
//	    is empty, memcached having stayed up;
//	(d) within 10 s of the attacker closing everything, /readyz is 200,
//	    the node is up, the canary is fast and the goroutines are back.
//
// Sizes are scaled so that the package takes about a minute;
// ABUSE_FULL=1 runs the sizes of the issue. With -v the test prints a
// markdown table of the figures. Linux only (it reads /proc).
package abuse

import (
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/gatewaytest"
)

var binary string

// canaryWindow is how long an attack is held at least once under way.
const canaryWindow = 3 * time.Second

// fdReserve is how many descriptors the test keeps for itself beyond an
// attack's connections (canary, scrapes, memcached clients, pipes).
const fdReserve = 500

// The binary is built without the race detector, so that its RSS is
// what a deployment would see.
func TestMain(m *testing.M) {
	raiseFDLimit()
	if os.Getenv("ABUSE_CHILD") == "pipeline" { // attack 7's flood, in a process of its own
		pipelineChild()
		return
	}
	gatewaytest.Main(m, false, &binary)
}

// raiseFDLimit raises the soft limit on open files to the hard limit,
// for this process and the gateway and memcached it starts (which
// inherit it): the floods hold thousands of connections.
func raiseFDLimit() {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		fmt.Fprintln(os.Stderr, "abuse: getrlimit:", err)
		return
	}
	if lim.Cur < lim.Max {
		lim.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			fmt.Fprintln(os.Stderr, "abuse: setrlimit:", err)
		}
	}
}

// fitFDs returns n, or as many connections as the open-file limit
// allows if that is fewer, saying so in the log: an attack that cannot
// run at its size runs smaller, never silently not at all.
func fitFDs(t *testing.T, n int) int {
	t.Helper()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatalf("getrlimit: %v", err)
	}
	if room := int(lim.Cur) - fdReserve; n > room {
		t.Logf("open-file limit %d: %d connections scaled down to %d", lim.Cur, n, room)
		return max(room, 1)
	}
	return n
}

// TestAbuse runs the attacks of issue #16, and others that share a node's
// connections, the gateway's goroutines or memcached's work unfairly, or
// take its memory through Go's net/http, each against a fresh gateway
// with default settings, and reports a row per attack.
func TestAbuse(t *testing.T) {
	full := os.Getenv("ABUSE_FULL") == "1"
	pick := func(fullSize, scaled int) int {
		if full {
			return fullSize
		}
		return scaled
	}
	silent := fitFDs(t, pick(12000, 6000))
	// MAX_REQUESTS is 10,000 by default: fewer heads would not exhaust
	// the slots, so this one is not scaled.
	heads := fitFDs(t, 10050)
	declared := fitFDs(t, pick(1000, 500))
	// 4b sends its bodies for real: 1,000 of them are a gigabyte on
	// loopback, whose kernel buffers alone make TCP retransmit (about
	// 1,200 segments in a quiet run, the canary's among them). Scaled,
	// it sends a fifth, so that what make test measures is the gateway.
	nearly := fitFDs(t, pick(1000, 200))
	repeats := pick(1000, 100)
	gets := pick(200, 100)
	floodFor := time.Duration(pick(10, 5)) * time.Second
	// 6: two GETs each; kept under the kernel's TCP memory pressure
	// (each never-read answer sits in a socket's send buffer).
	readers := pick(1000, 600)
	pipelining := 100
	fanOut := 128
	handed := pick(256, 128)
	chunked := fitFDs(t, pick(12000, 6000))
	multiReaders := pick(600, 200)
	memcReaders := pick(1000, 600)
	resetters := 4

	attacks := []attack{
		{name: "1 silent connections", size: thousands(silent) + " conns sending nothing", run: silentConns(silent)},
		{name: "2a multi-get amplification", size: thousands(repeats) + " × a 1 MB key in one GET", prepare: storeBig, run: multiGet(repeats)},
		{name: "2b batch amplification", size: thousands(gets) + " gets of a 1 MB key in one POST", prepare: storeBig, run: batchGets(gets)},
		{name: "3 body-less PUT heads", size: thousands(heads) + " × Content-Length: 1, no body", run: putHeads(heads)},
		{name: "4 declared bodies", size: thousands(declared) + " × Content-Length: 1048000, no body", run: declaredBodies(declared)},
		{name: "4b declared bodies, all but 1 byte sent", size: thousands(nearly) + " × Content-Length: 1048000, 1047999 sent", run: nearlyBodies(nearly)},
		{name: "5 async flood", size: fmt.Sprintf("%v × %d conns pipelining 256 KiB async PUTs", floodFor, floodConns),
			window: floodFor, mcMB: 16384, run: asyncFlood},
		{name: "6 slow readers of a large value", size: thousands(readers) + " conns × 2 pipelined GETs of a 1 MB key, never read",
			prepare: storeBig, run: slowBigReaders(readers, 2)},
		{name: "7 pipelined flood", size: thousands(pipelining) + " conns pipelining 400s, never read", run: pipelinedFlood(pipelining, badKeyGet)},
		{name: "8 batch fan-out", size: thousands(fanOut) + " conns × one batch of 1000 deletes, never read", run: batchFanOut(fanOut)},
		{name: "9 pipelined flood, handed to net/http", size: thousands(handed) + " conns pipelining 400s that net/http parses, never read",
			run: pipelinedFlood(handed, handedGet)},
		{name: "10 chunked uploads", size: thousands(chunked) + " conns × a chunked PUT with a 15 KB head, 1 byte of body", run: chunkedUploads(chunked)},
		{name: "11 slow readers of multi-gets", size: thousands(multiReaders) + " conns × a multi-get of ten 1 MB keys, never read",
			prepare: storeManyBig, run: slowMultiGets(multiReaders)},
		{name: "12 slow readers of /memc", size: thousands(memcReaders) + " conns × 2 pipelined /memc gets of a 1 MB key, never read",
			prepare: storeBig, run: slowMemcReaders(memcReaders, 2)},
		{name: "13 compressed bombs", size: fmt.Sprintf("a batch of %d gets of values that inflate %s → %s (VALUE_CODEC=php)", bombs, size(int64(len(bombPayload()))), size(bombSize)),
			env: map[string]string{"MEMCGATE_VALUE_CODEC": "php"}, prepare: storeBombs, run: batchBombs(bombs)},
		{name: "14 GETs reset before their answers", size: fmt.Sprintf("%d conns at a time × a GET of one of ten 1 MB keys, reset at once", resetters),
			prepare: storeManyBigRead, run: resetGets(resetters)},
		{name: "14b GETs reset before their answers, PIPELINE_CONNS=0", size: fmt.Sprintf("%d conns at a time × a GET of one of ten 1 MB keys, reset at once; gomemcache's pool", resetters),
			env: map[string]string{"MEMCGATE_PIPELINE_CONNS": "0"}, prepare: storeManyBigRead, run: resetGets(resetters)},
		{name: "15 multi-gets reset before their answers", size: fmt.Sprintf("%d conns at a time × a multi-get of ten 1 MB keys, reset at once", resetters),
			prepare: storeManyBigRead, run: resetMultiGets(resetters)},
		{name: "16 GETs with touch reset before their answers", size: fmt.Sprintf("%d conns at a time × a GET ?touch=60 of one of ten 1 MB keys, reset at once", resetters),
			prepare: storeManyBigRead, run: resetTouches(resetters)},
	}
	var rows []row
	start := time.Now()
	for _, a := range attacks {
		t.Run(a.name, func(t *testing.T) {
			rows = append(rows, runAttack(t, a))
		})
	}
	scale := "scaled"
	if full {
		scale = "full (ABUSE_FULL=1)"
	}
	t.Logf("issue #16 abuse suite, %s sizes, %s:\n\n%s", scale, dur(time.Since(start)), table(rows))
}
