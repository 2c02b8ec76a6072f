package h1

import (
	"bufio"
	"bytes"
	"io"
	"math/rand/v2"
	"net/http"
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

// TestCLAndTE: a handler that declares a Content-Length and a
// Transfer-Encoding gets its Content-Length dropped and a chunked body,
// framed as net/http frames it, byte for byte: the body held before the
// head is sent must be no more than net/http's buffer holds, or it
// would go out unframed.
func TestCLAndTE(t *testing.T) {
	body := strings.Repeat("0123456789abcdef", 3000/16+1)[:3000]
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "3000")
		w.Header().Set("Transfer-Encoding", r.URL.Query().Get("te"))
		for _, p := range []string{body[:2500], body[2500:]} {
			if r.URL.Query().Has("s") {
				io.WriteString(w, p)
			} else {
				w.Write([]byte(p))
			}
		}
	})
	_, fast := startH1(t, h, nil)
	std := startNetHTTP(t, listen(t, "tcp"), h)
	var client streamClient
	for _, q := range []string{"te=chunked", "te=gzip", "te=chunked&s", "te=identity", "te=identity&s"} {
		raw := []byte("GET /?" + q + " HTTP/1.1\r\nHost: a\r\n\r\n")
		got, err := client.sendStream(fast, raw, 0)
		if err != nil {
			t.Fatalf("%s: h1: %v", q, err)
		}
		want, err := client.sendStream(std, raw, 0)
		if err != nil {
			t.Fatalf("%s: net/http: %v", q, err)
		}
		if got, want = normaliseDate(got), normaliseDate(want); !bytes.Equal(got, want) {
			i := diffAt(got, want)
			t.Errorf("%s: h1 and net/http differ at byte %d\nh1       %q\nnet/http %q", q, i, around(got, i), around(want, i))
		}
	}
}
