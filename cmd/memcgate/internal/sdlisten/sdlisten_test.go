package sdlisten

import (
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

var names = []string{"data", "socket", "admin"}

func TestParse(t *testing.T) {
	const pid = 4242
	tests := []struct {
		name    string
		env     map[string]string
		want    []Socket
		wantErr string // a part of the error; "" for none
	}{
		{"no variables", map[string]string{}, nil, ""},
		{"LISTEN_PID unset", map[string]string{"LISTEN_FDS": "1", "LISTEN_FDNAMES": "data"}, nil, ""},
		{"another process's", map[string]string{"LISTEN_PID": "4243", "LISTEN_FDS": "1", "LISTEN_FDNAMES": "data"}, nil, ""},
		{"LISTEN_PID not a number", map[string]string{"LISTEN_PID": "self", "LISTEN_FDS": "1", "LISTEN_FDNAMES": "data"}, nil, ""},
		{"one", map[string]string{"LISTEN_PID": "4242", "LISTEN_FDS": "1", "LISTEN_FDNAMES": "data"}, []Socket{{"data", 3}}, ""},
		{"three in the unit's order", map[string]string{"LISTEN_PID": "4242", "LISTEN_FDS": "3", "LISTEN_FDNAMES": "socket:admin:data"},
			[]Socket{{"socket", 3}, {"admin", 4}, {"data", 5}}, ""},
		{"zero", map[string]string{"LISTEN_PID": "4242", "LISTEN_FDS": "0"}, nil, ""},
		{"count missing", map[string]string{"LISTEN_PID": "4242", "LISTEN_FDNAMES": "data"}, nil, `LISTEN_FDS="": not a number`},
		{"count not a number", map[string]string{"LISTEN_PID": "4242", "LISTEN_FDS": "two", "LISTEN_FDNAMES": "data:admin"}, nil, `LISTEN_FDS="two"`},
		{"count negative", map[string]string{"LISTEN_PID": "4242", "LISTEN_FDS": "-1"}, nil, `LISTEN_FDS="-1"`},
		{"count past the bound", map[string]string{"LISTEN_PID": "4242", "LISTEN_FDS": "65"}, nil, `LISTEN_FDS="65"`},
		{"names missing", map[string]string{"LISTEN_PID": "4242", "LISTEN_FDS": "1"}, nil, "without LISTEN_FDNAMES"},
		{"fewer names", map[string]string{"LISTEN_PID": "4242", "LISTEN_FDS": "2", "LISTEN_FDNAMES": "data"}, nil, "names 1"},
		{"more names", map[string]string{"LISTEN_PID": "4242", "LISTEN_FDS": "1", "LISTEN_FDNAMES": "data:admin"}, nil, "names 2"},
		{"systemd's default name", map[string]string{"LISTEN_PID": "4242", "LISTEN_FDS": "1", "LISTEN_FDNAMES": "memcgate.socket"}, nil, `fd 3 is named "memcgate.socket"`},
		{"unknown name", map[string]string{"LISTEN_PID": "4242", "LISTEN_FDS": "2", "LISTEN_FDNAMES": "data:metrics"}, nil, `fd 4 is named "metrics"`},
		{"empty name", map[string]string{"LISTEN_PID": "4242", "LISTEN_FDS": "2", "LISTEN_FDNAMES": "data:"}, nil, `fd 4 is named ""`},
		{"repeated name", map[string]string{"LISTEN_PID": "4242", "LISTEN_FDS": "3", "LISTEN_FDNAMES": "data:admin:data"}, nil, `fds 3 and 5 are both named "data"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse(tt.env, pid, names)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Parse = %v, %v; want an error with %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || !slices.Equal(got, tt.want) {
				t.Fatalf("Parse = %v, %v; want %v", got, err, tt.want)
			}
		})
	}
}

// dupFD returns a copy of the descriptor of f, which Listeners closes.
func dupFD(t *testing.T, f interface {
	SyscallConn() (syscall.RawConn, error)
}) int {
	t.Helper()
	rc, err := f.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	fd := -1
	var derr error
	if err := rc.Control(func(s uintptr) { fd, derr = syscall.Dup(int(s)) }); err != nil || derr != nil {
		t.Fatal(err, derr)
	}
	return fd
}

// TestListeners passes real descriptors of every kind: only a listening
// stream socket becomes a listener, and the error names the descriptor.
func TestListeners(t *testing.T) {
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()
	path := filepath.Join(t.TempDir(), "s.sock")
	unix, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close()
	udp, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer udp.Close()
	conn, err := net.Dial("tcp", tcp.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	file, err := os.Create(filepath.Join(t.TempDir(), "file"))
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()

	tests := []struct {
		name    string
		fd      func() int
		wantErr string
	}{
		{"TCP listener", func() int { return dupFD(t, tcp.(*net.TCPListener)) }, ""},
		{"Unix listener", func() int { return dupFD(t, unix.(*net.UnixListener)) }, ""},
		{"pipe", func() int { return dupFD(t, r) }, "is not a socket"},
		{"regular file", func() int { return dupFD(t, file) }, "is not a socket"},
		{"UDP socket", func() int { return dupFD(t, udp.(*net.UDPConn)) }, "not a stream socket"},
		{"connected socket", func() int { return dupFD(t, conn.(*net.TCPConn)) }, "does not listen"},
		{"closed descriptor", func() int { fd := dupFD(t, r); syscall.Close(fd); return fd }, "bad file descriptor"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fd := tt.fd()
			lns, err := Listeners([]Socket{{Name: "data", FD: fd}})
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), "(data)") {
					t.Fatalf("Listeners = %v, %v; want an error naming fd %d (data) with %q", lns, err, fd, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			ln := lns["data"]
			defer ln.Close()
			// The descriptor passed is closed: the listener has its own.
			if err := syscall.Close(fd); err != syscall.EBADF {
				t.Errorf("fd %d still open after Listeners (close: %v)", fd, err)
			}
			network := ln.Addr().Network()
			c, err := net.Dial(network, ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			c.Close()
		})
	}
}
