package memcachedtest

import (
	"bufio"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
)

// Scripted is a server on a free loopback port that answers each command
// line with what its script says, for the replies no memcached at hand
// gives (an older version's, a proxy's). It runs until the test ends.
type Scripted struct {
	Addr  string       // 127.0.0.1:port
	Port  int          //
	Conns atomic.Int64 // connections accepted
}

// StartScripted starts a Scripted server whose script answers each line
// read (CRLF included) with reply; br reads what follows the line on the
// connection (a data block). ok false closes the connection.
func StartScripted(t testing.TB, script func(line string, br *bufio.Reader) (reply string, ok bool)) *Scripted {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Scripted{Addr: ln.Addr().String(), Port: ln.Addr().(*net.TCPAddr).Port}
	var mu sync.Mutex // guards open
	var open []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, nc := range open {
			nc.Close()
		}
	})
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			s.Conns.Add(1)
			mu.Lock()
			open = append(open, nc)
			mu.Unlock()
			go func() {
				defer nc.Close()
				br := bufio.NewReader(nc)
				for {
					line, err := br.ReadString('\n')
					if err != nil {
						return
					}
					reply, ok := script(line, br)
					if !ok {
						return
					}
					if _, err := nc.Write([]byte(reply)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return s
}

// Value is the reply to a get of key holding value with flags and CAS:
// its VALUE block, without the END that closes the reply.
func Value(key, value string, flags uint32, cas uint64) string {
	return "VALUE " + key + " " + strconv.FormatUint(uint64(flags), 10) + " " + strconv.Itoa(len(value)) + " " +
		strconv.FormatUint(cas, 10) + "\r\n" + value + "\r\n"
}
