package h1

import (
	"bufio"
	"io"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
)

// TestWaiting checks waiting, the count of body bytes a handler's panic
// loses, against the bufio.Writer net/http puts in front of its
// chunkWriter, over random sequences of Write and WriteString calls of
// sizes around its buffer's.
func TestWaiting(t *testing.T) {
	sizes := []int{1, 15, chunkingThreshold - 1, chunkingThreshold, chunkingThreshold + 1, 3000, 2 * chunkingThreshold, 2*chunkingThreshold + 1, 10000}
	rng := rand.New(rand.NewPCG(1, 2))
	for run := range 2000 {
		bw := bufio.NewWriterSize(writerOnly{io.Discard}, chunkingThreshold) // as the chunkWriter, no WriteString
		pend := 0
		var ops []string
		for range 1 + run%8 {
			n := sizes[rng.IntN(len(sizes))]
			if rng.IntN(2) == 0 {
				bw.Write(make([]byte, n))
				pend = waiting(pend, n, 0)
				ops = append(ops, "Write("+strconv.Itoa(n)+")")
			} else {
				bw.WriteString(strings.Repeat("x", n))
				pend = waiting(pend, 0, n)
				ops = append(ops, "WriteString("+strconv.Itoa(n)+")")
			}
			if pend != bw.Buffered() {
				t.Fatalf("after %s: waiting says %d bytes wait, bufio.Writer holds %d", strings.Join(ops, ", "), pend, bw.Buffered())
			}
		}
	}
}
