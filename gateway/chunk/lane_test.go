package chunk

import (
	"bufio"
	"errors"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream"
	"github.com/memcgate/memcgate/upstream/op"
)

// heldChunks is a memcached of a script that never answers the set of a
// chunk (it holds it: a link that takes a chunk slower than anything
// else) and answers everything else at once: every key is missing, and
// every other write is stored.
func heldChunks(t *testing.T) (addr string, held <-chan struct{}) {
	t.Helper()
	h := make(chan struct{}, 64)
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	s := memcachedtest.StartScripted(t, func(line string, br *bufio.Reader) (string, bool) {
		f := strings.Fields(line)
		if len(f) == 0 {
			return "ERROR\r\n", true
		}
		switch f[0] {
		case "set", "add", "cas", "replace":
			n, err := strconv.Atoi(f[4])
			if err != nil {
				return "", false
			}
			if _, err := io.CopyN(io.Discard, br, int64(n)+2); err != nil {
				return "", false
			}
			if Reserved(f[1]) {
				h <- struct{}{}
				<-stop
				return "", false
			}
			return "STORED\r\n", true
		case "mg":
			return "EN\r\n", true
		case "get", "gets":
			return "END\r\n", true
		case "delete", "touch":
			return "NOT_FOUND\r\n", true
		case "version":
			return "VERSION 1.6.18\r\n", true
		}
		return "ERROR\r\n", true
	})
	return s.Addr, h
}

// heldValues are Values over a cluster of one pipelined connection per
// node to addr, with timeout as its memcached timeout and passive
// ejection after 3 timeouts in a row.
func heldValues(t *testing.T, addr string, timeout time.Duration) (*Values, *upstream.Cluster) {
	t.Helper()
	host, port, _ := strings.Cut(addr, ":")
	p, _ := strconv.Atoi(port)
	c, err := upstream.New(upstream.Options{Servers: []upstream.Server{{Host: host, Port: p}}, PipelineConns: 1, Timeout: timeout,
		Health: upstream.HealthOptions{Interval: time.Hour, Timeout: time.Hour, PassiveFails: 3}},
		slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return New(c, Options{ChunkSize: raceChunk, Grace: time.Hour, Timeout: time.Hour}, prometheus.NewRegistry()), c
}

// TestSmallWaitsForNoChunk: while a chunk's write is on its way (held by
// memcached), a small request to the same node is answered at once: chunks
// go on connections of their own. Before, with one connection per node,
// the small request queued behind the chunk until the connection timed
// out, as it waited behind megabytes of chunks on a slow link.
func TestSmallWaitsForNoChunk(t *testing.T) {
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait) // after the script's connections are closed, which ends the PUT
	addr, held := heldChunks(t)
	// The timeout only ends a failure: the small requests are answered
	// at once, or behind the chunk when it times out.
	v, _ := heldValues(t, addr, 5*time.Second)
	wg.Go(func() { put(t.Context(), v, "big", bigValue(2, 1)) }) // the chunk times out
	<-held
	sctx := t.Context()
	if res := v.Do(sctx, op.Op{Verb: op.Set, Item: op.Item{Key: "small", Value: []byte("x")}}); res.Err != nil {
		t.Fatalf("a small set while a chunk is held: %v", res.Err)
	}
	if res := v.Do(sctx, op.Op{Verb: op.Get, Item: op.Item{Key: "small"}}); !errors.Is(res.Err, upstream.ErrNotFound) {
		t.Fatalf("a small get while a chunk is held: %v, want the script's miss", res.Err)
	}
}

// TestChunkStallsEjectNoNode: chunks whose writes time out together
// (memcached holds them: four PUTs at once on one connection) fail their
// PUTs but do not eject the node, which answers small requests at once: a
// chunk's write shows its progress only as far as the kernel's socket,
// and on a slow link, or through a proxy that buffers, a healthy node was
// ejected for chunks it was still reading.
func TestChunkStallsEjectNoNode(t *testing.T) {
	addr, _ := heldChunks(t)
	v, c := heldValues(t, addr, 100*time.Millisecond)
	errs := make(chan error, 4)
	for i := range cap(errs) {
		go func() { errs <- put(t.Context(), v, "big"+strconv.Itoa(i), bigValue(2, 1)) }()
	}
	for range cap(errs) {
		err := <-errs
		var ne *upstream.NodeError
		if !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("a PUT with its chunk held: %v, want a timeout", err)
		}
	}
	if !c.Up("big") {
		t.Fatal("the node was ejected for chunks that timed out")
	}
	if res := v.Do(t.Context(), op.Op{Verb: op.Set, Item: op.Item{Key: "small", Value: []byte("x")}}); res.Err != nil {
		t.Fatalf("a small set after the chunks' timeouts: %v", res.Err)
	}
}
