package memcachedtest

import (
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
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

// TestResumedByOthers: a memcached Pause stopped and that runs again
// with no Resume (a SIGCONT from elsewhere, as another run's stale
// kill -CONT of a reused pid) is reported resumed by someone else, at
// once and after a Resume or a Kill; one this package resumed is not.
func TestResumedByOthers(t *testing.T) {
	tests := []struct {
		name     string
		stranger bool // a SIGCONT not sent by Resume, while paused
		then     func(*Server)
		want     bool
	}{
		{name: "paused", then: func(*Server) {}},
		{name: "resumed", then: (*Server).Resume},
		{name: "killed", then: (*Server).Kill},
		{name: "resumed by a stranger", stranger: true, then: func(*Server) {}, want: true},
		{name: "resumed by a stranger, then resumed", stranger: true, then: (*Server).Resume, want: true},
		{name: "resumed by a stranger, then killed", stranger: true, then: (*Server).Kill, want: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mc := Start(t)
			mc.Pause()
			if tt.stranger {
				pid := mc.cmd.Process.Pid
				if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
					t.Fatal(err)
				}
				deadline := time.Now().Add(5 * time.Second)
				for !anyRunning(pid) && time.Now().Before(deadline) {
					time.Sleep(time.Millisecond)
				}
			}
			tt.then(mc)
			if got := mc.ResumedByOthers(); got != tt.want {
				t.Errorf("ResumedByOthers() = %v, want %v", got, tt.want)
			}
			if note := mc.ResumedNote(); (note != "") != tt.want || tt.want && !strings.Contains(note, "resumed by someone else") {
				t.Errorf("ResumedNote() = %q", note)
			}
			mc.Resume()
		})
	}
}
