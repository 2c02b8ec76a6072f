package logbuf

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/gatewaytest"
)

// gate is a log destination that blocks every write until opened, as a
// pipe nobody reads does.
type gate struct {
	open    chan struct{}
	entered chan struct{} // if not nil, told when a Write waits
	mu      sync.Mutex
	got     bytes.Buffer
}

func (g *gate) Write(p []byte) (int, error) {
	if g.entered != nil {
		select {
		case g.entered <- struct{}{}:
		default:
		}
	}
	<-g.open
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.got.Write(p)
}

func (g *gate) String() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.got.String()
}

// TestLogBufferNeverBlocks writes lines to a Buffer whose destination
// blocks: every Write returns at once, access lines past the backlog are
// dropped and counted while other lines still have their reserve, and
// when the destination takes lines again the rest come out in order,
// followed by the notice of what was dropped. The tick is stopped, so
// what Run takes and when is the test's to say.
func TestLogBufferNeverBlocks(t *testing.T) {
	g := &gate{open: make(chan struct{}), entered: make(chan struct{}, 1)}
	const backlog = 1000
	b := New(g, backlog, nil)
	b.every = time.Hour
	var notices []int
	var nmu sync.Mutex
	b.notice = func(w io.Writer, n int, _ error) {
		nmu.Lock()
		notices = append(notices, n)
		nmu.Unlock()
		fmt.Fprintf(w, "dropped %d\n", n)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { b.Run(ctx); close(done) }()

	var want strings.Builder
	want.WriteString("first\n")
	b.Write([]byte("first\n"))
	b.kick <- struct{}{}
	<-g.entered // Run is stuck writing "first"
	start := time.Now()
	access := b.Access()
	for i := range 500 { // 10 bytes each: 100 fit the backlog
		line := fmt.Sprintf("line %04d\n", i)
		if n, err := access.Write([]byte(line)); n != len(line) || err != nil {
			t.Fatalf("Write = %d, %v", n, err)
		}
		if i < backlog/len(line) {
			want.WriteString(line)
		}
	}
	b.Write([]byte("an error\n")) // not an access line: the reserve takes it
	want.WriteString("an error\n")
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("501 writes to a blocked destination took %v", took)
	}
	if d := b.Dropped(); d != 400 {
		t.Fatalf("Dropped = %d, want 400", d)
	}
	close(g.open)
	cancel()
	<-done

	want.WriteString("dropped 400\n")
	if got := g.String(); got != want.String() {
		t.Fatalf("log:\n%s\nwant:\n%s", got, want.String())
	}
	nmu.Lock()
	defer nmu.Unlock()
	if len(notices) != 1 || notices[0] != 400 {
		t.Fatalf("notices %v, want [400]", notices)
	}
}

// slowDest takes every write, each after delay: a destination that
// keeps up with fewer lines than come.
type slowDest struct {
	delay time.Duration
	out   gatewaytest.SyncBuffer
}

func (s *slowDest) Write(p []byte) (int, error) {
	time.Sleep(s.delay)
	return s.out.Write(p)
}

// failingDest refuses every write, as a full disk does.
type failingDest struct{}

func (failingDest) Write([]byte) (int, error) { return 0, errors.New("no space left on device") }

// TestLogBufferCountsEveryLoss floods a destination slower than the
// lines, and one that fails every write: in the first, the notices in
// the log add up to every line dropped, whatever the flood; in the
// second, every line refused is counted.
func TestLogBufferCountsEveryLoss(t *testing.T) {
	t.Run("slow", func(t *testing.T) {
		d := &slowDest{delay: 20 * time.Millisecond}
		b := New(d, 64<<10, nil)
		b.every = 10 * time.Millisecond
		b.notice = func(w io.Writer, n int, _ error) { fmt.Fprintf(w, "dropped %d\n", n) }
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { b.Run(ctx); close(done) }()
		line := []byte(strings.Repeat("x", 199) + "\n")
		for range 50 {
			for range 500 {
				b.Access().Write(line)
			}
			time.Sleep(time.Millisecond)
		}
		cancel()
		<-done
		reported := 0
		for l := range strings.Lines(d.out.String()) {
			if n, ok := strings.CutPrefix(strings.TrimSpace(l), "dropped "); ok {
				k, err := strconv.Atoi(n)
				if err != nil {
					t.Fatal(err)
				}
				reported += k
			}
		}
		if b.Dropped() == 0 || uint64(reported) != b.Dropped() {
			t.Fatalf("notices report %d dropped lines, Dropped = %d; want them equal and not 0", reported, b.Dropped())
		}
	})
	t.Run("failing", func(t *testing.T) {
		b := New(failingDest{}, Backlog, nil)
		for range 100 {
			b.Write([]byte("a line\n"))
		}
		b.flush()
		if d := b.Dropped(); d != 100 {
			t.Fatalf("Dropped = %d after 100 lines refused by the destination", d)
		}
	})
}

// TestLogBufferBlocks checks that lines come out in blocks: nothing before
// flushAt bytes or the tick, everything, in order, by the end.
func TestLogBufferBlocks(t *testing.T) {
	var out gatewaytest.SyncBuffer
	b := New(&out, Backlog, nil)
	b.every = time.Hour // what is written before the end, the kick wrote
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { b.Run(ctx); close(done) }()
	line := strings.Repeat("x", 99) + "\n"
	for range flushAt / len(line) {
		b.Write([]byte(line))
	}
	if n := len(out.String()); n != 0 {
		t.Fatalf("%d bytes written before a block filled", n)
	}
	var want strings.Builder
	want.WriteString(strings.Repeat(line, flushAt/len(line)))
	for range 10 {
		b.Write([]byte(line)) // past flushAt: Run is kicked
		want.WriteString(line)
	}
	deadline := time.Now().Add(10 * time.Second) // a loaded machine's bound, not the kick's
	for len(out.String()) == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if len(out.String()) == 0 {
		t.Fatalf("nothing written 10 s after %d bytes piled up", flushAt)
	}
	b.Write([]byte("last\n"))
	want.WriteString("last\n")
	cancel()
	<-done
	if got := out.String(); got != want.String() || b.Dropped() != 0 {
		t.Fatalf("wrote %d bytes, dropped %d; want %d bytes in order, none dropped", len(got), b.Dropped(), want.Len())
	}
}

// fullDisk refuses its first writes, as a full disk does until room is
// made, and takes the ones after them.
type fullDisk struct {
	refuse int // writes still to refuse
	out    bytes.Buffer
}

func (d *fullDisk) Write(p []byte) (int, error) {
	if d.refuse > 0 {
		d.refuse--
		return 0, errors.New("write /var/log/memcgate.log: no space left on device")
	}
	return d.out.Write(p)
}

// TestLogBufferTellsRefusedLines has a destination refuse blocks, then
// take them again: the first block it takes ends with a notice of every
// line it refused, the one before a notice it refused included, naming
// its error, and Dropped counts those lines alone.
func TestLogBufferTellsRefusedLines(t *testing.T) {
	tests := []struct {
		name    string
		refuse  int // blocks refused, each of 3 lines
		want    int // lines the notice reports
		dropped uint64
	}{
		{name: "one block refused", refuse: 1, want: 3, dropped: 3},
		{name: "its notice refused too", refuse: 2, want: 6, dropped: 6},
		{name: "nothing refused", refuse: 0, want: 0, dropped: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := &fullDisk{refuse: tt.refuse}
			b := New(d, Backlog, func(w io.Writer, n int, err error) {
				fmt.Fprintf(w, "dropped %d: %v\n", n, err)
			})
			for range tt.refuse {
				for range 3 {
					b.Write([]byte("a line\n"))
				}
				b.flush()
			}
			b.Write([]byte("taken\n"))
			b.flush()
			want := "taken\n"
			if tt.want > 0 {
				want += fmt.Sprintf("dropped %d: write /var/log/memcgate.log: no space left on device\n", tt.want)
			}
			if got := d.out.String(); got != want {
				t.Errorf("written %q, want %q", got, want)
			}
			if got := b.Dropped(); got != tt.dropped {
				t.Errorf("Dropped() = %d, want %d", got, tt.dropped)
			}
		})
	}
}
