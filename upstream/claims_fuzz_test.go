package upstream

import (
	"bufio"
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/memcgate/memcgate/gateway/budget"
)

// honestReplies is a stream of replies memcached could send gomemcache,
// drawn from r: get replies of up to four values (keys of up to 250
// bytes, any flags, lengths around the unheld claim, a CAS or none,
// values of any bytes, VALUE lines among them), and the one-line
// replies of the other commands. Each reply is one string; held is what
// each holds at most (the sum of its values that would take those read
// unheld, in its order, past unheld bytes).
func honestReplies(r *rand.Rand, unheld int) (replies []string, held []int64) {
	keyByte := func() byte { return byte(33 + r.IntN(94)) } // printable, no space
	lines := []string{"STORED\r\n", "NOT_STORED\r\n", "EXISTS\r\n", "NOT_FOUND\r\n", "DELETED\r\n", "TOUCHED\r\n",
		"OK\r\n", "ERROR\r\n", "CLIENT_ERROR bad data chunk\r\n", "SERVER_ERROR out of memory storing object\r\n",
		"VERSION 1.6.21\r\n", "STAT pid 1\r\n", "18446744073709551615\r\n", "0\r\n", "VALUE\r\n", "VALUES\r\n", "V\r\n"}
	for range 1 + r.IntN(6) {
		if r.IntN(3) == 0 {
			replies, held = append(replies, lines[r.IntN(len(lines))]), append(held, 0)
			continue
		}
		var b strings.Builder
		var h int64
		loose := 0
		for range r.IntN(5) {
			key := make([]byte, 1+r.IntN(250))
			for i := range key {
				key[i] = keyByte()
			}
			var size int
			switch r.IntN(4) {
			case 0:
				size = r.IntN(64)
			case 1:
				size = unheld - 2 + r.IntN(5) // around the bound
			default:
				size = r.IntN(3 * unheld)
			}
			b.WriteString("VALUE " + string(key) + " " + strconv.FormatUint(uint64(r.Uint32()), 10) + " " + strconv.Itoa(size))
			if r.IntN(2) == 0 {
				b.WriteString(" " + strconv.FormatUint(r.Uint64(), 10))
			}
			b.WriteString("\r\n")
			value := make([]byte, size)
			for i := range value {
				value[i] = byte(r.IntN(256))
			}
			if size > 24 && r.IntN(2) == 0 { // a VALUE line in the value
				copy(value[r.IntN(size-23):], "\r\nVALUE k 0 2000000000\r\n")
			}
			b.Write(value)
			b.WriteString("\r\n")
			if loose+size <= unheld { // read unheld, up to unheld bytes of the reply's values in all
				loose += size
			} else {
				h += int64(size)
			}
		}
		b.WriteString("END\r\n")
		replies, held = append(replies, b.String()), append(held, h)
	}
	return replies, held
}

// FuzzClaimScanHonest feeds claimConn.scan streams of honest replies
// (honestReplies, from seed) cut at read boundaries drawn from cuts: no
// read of an honest stream fails, each reply holds exactly its values
// that would take its values read unheld past the unheld claim, at its
// most, and once each reply is read nothing is held.
func FuzzClaimScanHonest(f *testing.F) {
	f.Add(uint64(1), []byte{0})
	f.Add(uint64(2), []byte{3, 255, 17})
	f.Add(uint64(3), []byte{200, 1, 1, 90})
	f.Fuzz(func(t *testing.T, seed uint64, cuts []byte) {
		const unheld = 512
		replies, held := honestReplies(rand.New(rand.NewPCG(seed, seed>>1)), unheld)
		claims := &peakClaims{Budget: budget.New(0)}
		c := &claimConn{claims: claims, unheld: unheld}
		next := 0
		cut := func() int { // a read's length: 1 to 256 bytes, or 4 KiB
			if len(cuts) == 0 {
				return 4096
			}
			b := cuts[next%len(cuts)]
			next++
			if b == 0 {
				return 4096
			}
			return int(b)
		}
		for i, reply := range replies {
			claims.peak = 0
			for b := []byte(reply); len(b) > 0; {
				chunk := b[:min(cut(), len(b))]
				b = b[len(chunk):]
				if err := c.scan(chunk); err != nil {
					t.Fatalf("reply %d (%.80q): a read failed: %v", i, reply, err)
				}
			}
			if claims.peak != held[i] || c.held != 0 || claims.Used() != 0 || c.state != lineStart {
				t.Fatalf("reply %d (%.80q): held %d at most, want %d; %d still held (%d in claims), in state %d",
					i, reply, claims.peak, held[i], c.held, claims.Used(), c.state)
			}
		}
	})
}

// refuseAll is Claims that refuses every claim.
type refuseAll struct{}

func (refuseAll) Acquire(int64) error { return errors.New("refused") }
func (refuseAll) Release(int64)       { panic("released what was never held") }

// FuzzClaimLineAgreesWithGomemcache hands gomemcache's pool, through a
// claimConn that holds every claim (unheld -1) in claims that refuse
// them all, a get reply of one line, "VALUE " and line, and then
// nothing: either gomemcache refuses the line, or the claimConn fails the
// read at the line's end (a claim it saw). Anything else (gomemcache
// waiting for a value's bytes until its timeout) is a line gomemcache
// took for a value's and the scanner did not: a claim allocated unchecked.
func FuzzClaimLineAgreesWithGomemcache(f *testing.F) {
	for _, s := range []string{"k 0 5", "k 0 0", "k 0 5 7", "k 0  5", "k  0 5", "k 0 5 ", " 0 5", "k 0 05", "k 0 +5",
		"k 0 5\r", "k\r 0 5", "k 0 4294967295", "k 0 1073741825", "k 1 5 9 9", "k 0 5\t", "k 00 5", "k 0 0x5", "k 0 5_0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		if strings.ContainsRune(line, '\n') || len(line) > 1000 {
			return // a line ends at its '\n'; gomemcache's reader holds 4 KiB
		}
		client, server := net.Pipe()
		defer client.Close()
		go func() {
			defer server.Close()
			br := bufio.NewReader(server)
			if _, err := br.ReadString('\n'); err != nil {
				return
			}
			if _, err := server.Write([]byte("VALUE " + line + "\r\n")); err != nil {
				return
			}
			br.ReadByte() // until the client closes it
		}()
		mc := memcache.New("127.0.0.1:1")
		mc.Timeout = 2 * time.Second
		mc.DialContext = func(context.Context, string, string) (net.Conn, error) {
			return &claimConn{Conn: client, claims: refuseAll{}, unheld: -1}, nil
		}
		_, err := mc.Get("k")
		switch {
		case errors.Is(err, errClaimNoFit), errors.Is(err, errClaimPastItem):
		case err != nil && strings.Contains(err.Error(), "unexpected line in get response"):
		default:
			t.Fatalf("VALUE %q: gomemcache read past the line unclaimed: %v", line, err)
		}
	})
}
