package upstream

import (
	"bufio"
	"bytes"
	"net"
	"testing"
	"time"
)

// FuzzCommandReply has a node answer a raw command (stats, version,
// flush_all: Cluster.Stats and the others, /memc?cmd=stats) with any
// bytes, then hang up. roundTrip must not panic, must end by its
// deadline, and must keep at most about 1 MiB of a reply; and what it
// returns without an error is a whole reply: a multi-line one ends with
// END and holds no error line, and one that says errLine is that error
// line alone, so that callers that look at the start of a reply for an
// error line (memc's cluster, which fails the whole command on one) see
// it wherever the node put it.
func FuzzCommandReply(f *testing.F) {
	// memcached 1.6.18's own replies.
	for _, s := range []struct {
		reply     string
		multiline bool
	}{
		{"STAT pid 21913\r\nSTAT uptime 4\r\nSTAT version 1.6.18\r\nSTAT curr_items 0\r\nEND\r\n", true},
		{"VERSION 1.6.18\r\n", false},
		{"OK\r\n", false},
		{"ERROR\r\n", true},
		{"STAT pid 1\r\nSERVER_ERROR out of memory\r\n", true},
		{"CLIENT_ERROR bad command line format\r\n", false},
		{"STAT pid 1\r\nSTAT uptime", true},
	} {
		f.Add([]byte(s.reply), s.multiline)
	}
	f.Fuzz(func(t *testing.T, in []byte, multiline bool) {
		cc, nc := net.Pipe()
		done := make(chan struct{})
		go func() {
			defer close(done)
			defer nc.Close()
			if _, err := bufio.NewReader(nc).ReadSlice('\n'); err == nil {
				nc.Write(in)
			}
		}()
		defer func() { cc.Close(); <-done }()
		start := time.Now()
		reply, errLine, err := roundTrip(&idleConn{Conn: cc, br: bufio.NewReader(cc)}, "stats\r\n", multiline, start.Add(2*time.Second))
		if d := time.Since(start); d > 3*time.Second {
			t.Fatalf("roundTrip took %v, past its deadline", d)
		}
		if len(reply) > 1<<20+4096 {
			t.Fatalf("roundTrip kept %d bytes of a reply", len(reply))
		}
		if err != nil {
			return
		}
		lines := bytes.SplitAfter(reply, []byte("\n"))
		if len(lines) > 1 && len(lines[len(lines)-1]) == 0 {
			lines = lines[:len(lines)-1] // after the last line's LF
		}
		last := lines[len(lines)-1]
		switch {
		case !bytes.HasPrefix(in, reply) && !errLine:
			t.Fatalf("roundTrip of %q returned %q, not what the node sent", in, reply)
		case errLine && (len(lines) != 1 || !isErrorLine(last) || !bytes.Contains(in, reply)):
			t.Fatalf("roundTrip of %q returned %q as an error line", in, reply)
		case multiline && !errLine && !bytes.Equal(last, []byte("END\r\n")):
			t.Fatalf("roundTrip of %q returned %q as a whole reply", in, reply)
		case !multiline && len(lines) != 1:
			t.Fatalf("roundTrip of %q returned %q as one line", in, reply)
		}
		for _, l := range lines[:len(lines)-1] {
			if isErrorLine(l) {
				t.Fatalf("roundTrip of %q returned %q, with an error line inside", in, reply)
			}
		}
	})
}
