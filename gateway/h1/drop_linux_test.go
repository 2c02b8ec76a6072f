package h1

import (
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestTryDrop: tryDrop drops what a TCP socket holds without copying it
// into the buffer, and on a Unix socket reads it into the buffer for the
// caller to discard; either way every byte sent is accounted for, an
// empty socket reports blocked, and the peer's close ends it with EOF.
func TestTryDrop(t *testing.T) {
	for _, network := range []string{"tcp", "unix"} {
		t.Run(network, func(t *testing.T) {
			ln := listen(t, network)
			defer ln.Close()
			acc := &accepted{}
			acc.wg.Add(1)
			go acc.accept(ln)
			client, err := net.Dial(network, ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			acc.wg.Wait()
			sk, server := acc.sk, acc.c
			defer server.Close()
			var b inbuf
			b.init(server, &countingPool{})
			b.uncopied = sk.dropsUncopied()
			if want := network == "tcp" && dropsTrunc; b.uncopied != want {
				t.Fatalf("dropsUncopied = %v, want %v", b.uncopied, want)
			}

			const size = 3 << 20
			go func() {
				client.Write([]byte(strings.Repeat("d", size)))
				client.Close()
			}()
			dropped, uncopied := 0, 0
			for eof := false; !eof; {
				n, blocked := b.tryDrop()
				dropped, uncopied = dropped+n, uncopied+n
				k := b.Buffered()
				b.Discard(k)
				dropped += k
				switch {
				case blocked:
					time.Sleep(time.Millisecond)
				case n == 0 && k == 0:
					if err := b.readErr(); err == nil || err.Error() != "EOF" {
						t.Fatalf("after %d bytes: stopped with %v, want EOF", dropped, err)
					}
					eof = true
				}
			}
			if dropped != size {
				t.Errorf("dropped %d bytes, want %d", dropped, size)
			}
			if b.uncopied != (uncopied == size) {
				t.Errorf("%d of %d bytes dropped uncopied (uncopied %v)", uncopied, size, b.uncopied)
			}
		})
	}
}

// accepted accepts one connection as the Server does (sock).
type accepted struct {
	wg sync.WaitGroup
	sk *sock
	c  net.Conn
}

func (a *accepted) accept(ln net.Listener) {
	defer a.wg.Done()
	acc := newAccepter(ln)
	c, sk, err := acc.accept()
	if err == nil {
		a.sk, a.c = sk, c
	}
}
