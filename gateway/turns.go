package gateway

import (
	"context"
	"fmt"
	"runtime"
)

// cpuTurns are the turns of the work on a request's bytes that costs
// many times what reading them does: decoding a batch's JSON (ten to
// twenty times), compressing a value for the PHP codecs (zlib forty
// times, FastLZ ten) and decompressing one. A job on turnBytes or more
// holds one of the turns while it works, so that such work, from any
// number of clients, keeps at most half the processors busy and leaves
// the rest to the other requests; a smaller one takes none, since it
// costs less than taking one would delay it. A nil cpuTurns takes no
// turns. Safe for concurrent use.
type cpuTurns chan struct{}

// turnBytes is the size from which work on a request's bytes takes a
// turn (cpuTurns). Bodies just below a bound of 256 KiB, a thousand
// values of \u00e9 escapes, cost 4 ms of decoding each: 32 clients
// looping them kept a canary's GETs waiting 124–184 ms at the median.
// Below 16 KiB a job costs at most a quarter of a millisecond, about
// what a few small requests do, and a batch of ten operations or a value
// PUT detached (detachedValueMax) never waits.
const turnBytes = 16 << 10

// newCPUTurns returns turns for half the processors Go runs on, one at
// least.
func newCPUTurns() cpuTurns { return make(cpuTurns, max(1, runtime.GOMAXPROCS(0)/2)) }

// take waits within ctx for a turn for work (such as "decode a batch
// of") on n bytes, and reports whether it took one, to give back with
// done: work on fewer than turnBytes takes none. Past ctx's end it
// takes none and fails with ctx's error, which answers 504 past the
// request's deadline. Waiting holds nothing but what the caller held
// already.
func (t cpuTurns) take(ctx context.Context, n int, work string) (bool, error) {
	if t == nil || n < turnBytes {
		return false, nil
	}
	select {
	case t <- struct{}{}:
		return true, nil
	default:
	}
	select {
	case t <- struct{}{}:
		return true, nil
	case <-ctx.Done():
		return false, fmt.Errorf("waiting for a turn to %s %d bytes: %w", work, n, ctx.Err())
	}
}

// done gives back a turn take took.
func (t cpuTurns) done() { <-t }
