package mcpipe

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream/op"
)

// hostileNode listens on a loopback port and, on each connection it
// accepts, reads the first request line, sends reply and closes the
// connection: a server that lies, then hangs up, so that the client's
// read ends at once with what came (no timeout to wait for).
func hostileNode(t *testing.T, reply []byte) string {
	t.Helper()
	return memcachedtest.StartRaw(t, func(c net.Conn, br *bufio.Reader) {
		if _, err := br.ReadString('\n'); err == nil {
			c.Write(reply)
		}
	})
}

// TestLyingValueLength: a value's length is only what the server says.
// One that claims far more than it sends costs about what it sent (at
// most eight times, as a client's body), not what it claims: a single
// "VALUE k 0 268435456" line allocated 256 MiB before a byte of the
// value came. The read fails as the connection does, with what came.
func TestLyingValueLength(t *testing.T) {
	const claim = 256 << 20
	tests := []struct {
		name     string
		reply    []byte
		maxAlloc uint64
	}{
		{"claim, then nothing", []byte("VALUE k 0 268435456\r\n"), 1 << 20},
		{"claim, then 1 MiB", append([]byte("VALUE k 0 268435456\r\n"), bytes.Repeat([]byte("v"), 1<<20)...), 16 << 20},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newClient(hostileNode(t, tt.reply), 1, nil)
			defer c.Close()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			it, err := c.Get("k")
			runtime.ReadMemStats(&after)
			if it != nil || !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
				t.Errorf("get: %v, %v; want the connection's end", it, err)
			}
			if n := after.TotalAlloc - before.TotalAlloc; n > tt.maxAlloc {
				t.Errorf("the read allocated %d MiB for a claim of %d MiB; want at most %d MiB", n>>20, claim>>20, tt.maxAlloc>>20)
			}
		})
	}
}

// TestLongValueRead: a value past trustedValue, read in the pieces
// readValue grows by, comes out whole and exact, at every size around
// the points where it grows; and one whose CRLF is not there fails.
func TestLongValueRead(t *testing.T) {
	for _, size := range []int{trustedValue - 2, trustedValue - 1, trustedValue, 2*trustedValue - 2, 8*trustedValue - 2, 8*trustedValue - 1, 8 * trustedValue, 3<<20 + 7} {
		value := make([]byte, size)
		for i := range value {
			value[i] = byte(i*7 + i>>8)
		}
		stream := "VALUE k 0 " + strconv.Itoa(size) + "\r\n" + string(value) + "\r\n"
		got, err := readValue(bufio.NewReader(strings.NewReader(stream[strings.IndexByte(stream, '\n')+1:])), size, nil)
		if err != nil || !bytes.Equal(got, value) {
			t.Errorf("%d bytes: %d bytes back, %v", size, len(got), err)
		}
		cut := stream[strings.IndexByte(stream, '\n')+1:len(stream)-2] + "xx"
		if _, err := readValue(bufio.NewReader(strings.NewReader(cut)), size, nil); !errors.Is(err, errNoCRLF) {
			t.Errorf("%d bytes without their CRLF: %v, want errNoCRLF", size, err)
		}
	}
}

// TestReplyKeyNotAsked: memcached answers the keys asked, in order, and
// no others. A reply that answers a key not asked, out of order, or one
// key twice is a broken stream: the read fails (502 at the gateway), and
// no caller is handed a value under its key that the server sent for
// another. A GAT was answered with another key's value, and a shared
// line's callers with a miss.
func TestReplyKeyNotAsked(t *testing.T) {
	value := func(key, v string) string { return "VALUE " + key + " 0 " + strconv.Itoa(len(v)) + "\r\n" + v + "\r\n" }
	ctx := context.Background()
	tests := []struct {
		name  string
		reply string
		read  func(c *Client) (any, error)
	}{
		{"gat answered with another key", value("other", "secret") + "END\r\n", func(c *Client) (any, error) {
			it, _, err := c.Do(ctx, op.Op{Verb: op.GAT, Item: op.Item{Expiration: 10}}, "mine")
			return it, err
		}},
		{"get answered with another key", value("other", "secret") + "END\r\n", func(c *Client) (any, error) {
			return c.Get("mine")
		}},
		{"multi-get answered with a key not asked", value("a", "1") + value("z", "secret") + "END\r\n", func(c *Client) (any, error) {
			m, _, _, err := c.GetMultiLimit(ctx, []string{"a", "b"}, 0, nil, false)
			return m, err
		}},
		{"multi-get answered out of order", value("b", "2") + value("a", "1") + "END\r\n", func(c *Client) (any, error) {
			m, _, _, err := c.GetMultiLimit(ctx, []string{"a", "b"}, 0, nil, false)
			return m, err
		}},
		{"multi-get answered twice for one key", value("a", "1") + value("a", "secret") + "END\r\n", func(c *Client) (any, error) {
			m, _, _, err := c.GetMultiLimit(ctx, []string{"a", "b"}, 0, nil, false)
			return m, err
		}},
		{"multi-get with a room", value("z", "secret") + "END\r\n", func(c *Client) (any, error) {
			m, _, _, err := c.GetMultiLimit(ctx, []string{"a"}, 0, &testRoom{}, false)
			return m, err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr, _ := scriptedServer(t, tt.reply)
			c := newClient(addr, 1, nil)
			defer c.Close()
			got, err := tt.read(c)
			if !errors.Is(err, errProtocol) {
				t.Errorf("read: %v, %v; want errProtocol", got, err)
			}
			if it, ok := got.(*memcache.Item); ok && it != nil {
				t.Errorf("read handed out %q = %q", it.Key, it.Value)
			}
		})
	}
	// memcached's own answers, misses left out, still read.
	addr, _ := scriptedServer(t, value("a", "1")+value("c", "3")+"END\r\n")
	c := newClient(addr, 1, nil)
	defer c.Close()
	m, _, _, err := c.GetMultiLimit(ctx, []string{"a", "b", "c"}, 0, nil, false)
	if err != nil || len(m) != 2 || string(m["a"].Value) != "1" || string(m["c"].Value) != "3" {
		t.Errorf("multi-get with a miss: %v, %v", m, err)
	}
}

// TestLongLinesCutInErrors: a line may be as long as the reader's buffer
// (16 KiB) of anything, and the error that quotes it goes to log lines
// and the status page: what any error quotes of it is cut to maxShown
// bytes, its length said. Whole lines of 16 KiB were quoted, 64 KiB once
// escaped.
func TestLongLinesCutInErrors(t *testing.T) {
	long := strings.Repeat("\x01", 16000)
	tests := []struct {
		kind op.Reply
		verb string
		line string
	}{
		{op.Stored, "set", "SERVER_ERROR " + long},
		{op.Stored, "set", long},
		{op.Items, "gets", "SERVER_ERROR " + long},
		{op.Items, "gets", long},
		{op.Items, "gets", "VALUE k 0 " + long},
		{op.Number, "incr", "CLIENT_ERROR " + long},
		{op.Number, "incr", long},
		{op.Deleted, "delete", long},
		{op.Touched, "touch", long},
		{op.Meta, "mg", "HD " + long},
		{op.Meta, "mg", "CLIENT_ERROR " + long},
		{op.MetaStored, "ms", long},
	}
	for _, tt := range tests {
		br := bufio.NewReaderSize(strings.NewReader(tt.line+"\r\n"), 16<<10)
		r, err := readReply(br, tt.kind, tt.verb, nil, nil, replyLimit{}, nil, nil, nil, nil)
		if err == nil {
			err = r.err
		}
		if err == nil {
			t.Errorf("%s answered %.20q...: no error", tt.verb, tt.line)
			continue
		}
		if n := len(err.Error()); n > 4*maxShown+200 {
			t.Errorf("%s answered %.20q...: an error of %d bytes: %.300s", tt.verb, tt.line, n, err)
		}
	}
	if _, err := readProbe(bufio.NewReaderSize(strings.NewReader("HD "+long+"\r\nMN\r\n"), 16<<10), []string{"k"}); err != nil && len(err.Error()) > 4*maxShown+200 {
		t.Errorf("a probe's reply: an error of %d bytes", len(err.Error()))
	}
}

// TestOutOfStepBreaks: a reply to a one-line request that is no answer
// to it, or a CLIENT_ERROR to a storage command (sent whole: memcached
// refusing it means the bytes changed on the way, and it may read the
// data block as a command and answer that too), breaks the connection.
// Taken as the request's own error, it left the connection one reply
// behind: here memcached answers a set it could not frame with
// "CLIENT_ERROR bad data chunk" and then "ERROR" for its data, and of
// the two incrs pipelined behind it, the second took the first's reply,
// the number of another key's counter.
func TestOutOfStepBreaks(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	read := make(chan string, 3) // the commands the node has read
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		br := bufio.NewReader(c)
		for range 3 {
			line, err := br.ReadString('\n')
			if err != nil {
				return
			}
			if strings.HasPrefix(line, "set ") {
				br.ReadString('\n') // the data block
			}
			read <- strings.Fields(line)[0] + " " + strings.Fields(line)[1]
		}
		// Every request is in flight: answer them, and the data block.
		c.Write([]byte("CLIENT_ERROR bad data chunk\r\nERROR\r\n42\r\n7\r\n"))
		io.Copy(io.Discard, c)
	}()
	c := newClient(ln.Addr().String(), 1, nil)
	defer c.Close()
	var setErr, errB, errC error
	var b, n uint64
	var wg sync.WaitGroup
	wg.Go(func() { setErr = c.Set(&memcache.Item{Key: "a", Value: []byte("v")}) })
	if got := <-read; got != "set a" {
		t.Fatalf("the node read %q first", got)
	}
	wg.Go(func() { b, errB = c.Increment("b", 1) })
	<-read
	wg.Go(func() { n, errC = c.Increment("c", 1) })
	wg.Wait()
	if !errors.Is(setErr, errProtocol) {
		t.Errorf("set answered CLIENT_ERROR bad data chunk: %v, want errProtocol", setErr)
	}
	if n == 42 || b == 7 || errB == nil || errC == nil {
		t.Errorf("incr b, incr c behind it: %d, %v; %d, %v; want both failed with the connection, never the other's number", b, errB, n, errC)
	}
	// Lines out of step break the connection; memcached's own answers and
	// refusals (breaks false) keep it.
	for _, tt := range []struct {
		kind   op.Reply
		verb   string
		line   string
		breaks bool
	}{
		{op.Stored, "set", "VALUE k 0 1", true},
		{op.Stored, "set", "42", true},
		{op.Deleted, "delete", "STORED", true},
		{op.Touched, "touch", "DELETED", true},
		{op.Number, "incr", "STORED", true},
		{op.Meta, "mg", "STORED", true},
		{op.MetaStored, "ms", "CLIENT_ERROR bad data chunk", true},
		{op.Stored, "set", "NOT_STORED", false},
		{op.Stored, "set", "SERVER_ERROR object too large for cache", false},
		{op.Stored, "set", "SERVER_ERROR out of memory storing object", false},
		{op.Number, "incr", "CLIENT_ERROR cannot increment or decrement non-numeric value", false},
		{op.Number, "incr", "NOT_FOUND", false},
		{op.Deleted, "delete", "NOT_FOUND", false},
		{op.Touched, "touch", "ERROR", false},
		{op.Meta, "mg", "EN", false},
		{op.Meta, "mg", "CLIENT_ERROR bad command line format", false},
		{op.Meta, "mg", "HD s1", false},
		{op.MetaStored, "ms", "NS", false},
	} {
		_, err := readReply(bufio.NewReader(strings.NewReader(tt.line+"\r\n")), tt.kind, tt.verb, nil, nil, replyLimit{}, nil, nil, nil, nil)
		switch {
		case tt.breaks && !errors.Is(err, errProtocol):
			t.Errorf("%s answered %q: %v, want errProtocol", tt.verb, tt.line, err)
		case !tt.breaks && err != nil:
			t.Errorf("%s answered %q: %v, want the connection kept", tt.verb, tt.line, err)
		}
	}
}
