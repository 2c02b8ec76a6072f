package memcachedtest

import (
	"net"
	"os"
	"strconv"
	"testing"
)

// TestAnswersAs: a memcached answering on a port is ours only if its
// stats give our process's pid; another's (a port taken by another
// test's memcached) is not, and neither is a server that is no memcached.
func TestAnswersAs(t *testing.T) {
	mc := Start(t)
	st, err := mc.Stats()
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(st["pid"])
	if err != nil {
		t.Fatalf("stats pid %q: %v", st["pid"], err)
	}
	notMemcached, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer notMemcached.Close()
	go func() {
		for {
			c, err := notMemcached.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("hello\r\n"))
			c.Close()
		}
	}()
	tests := []struct {
		name    string
		addr    string
		pid     int
		owns    bool
		wantErr bool
	}{
		{"its own pid", mc.Addr, pid, true, false},
		{"another process's", mc.Addr, os.Getpid(), false, false},
		{"no memcached", notMemcached.Addr().String(), pid, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := net.Dial("tcp", tt.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			owns, err := answersAs(c, tt.pid, false)
			if owns != tt.owns || (err != nil) != tt.wantErr {
				t.Errorf("answersAs = %v, %v; want %v, error %v", owns, err, tt.owns, tt.wantErr)
			}
		})
	}
}
