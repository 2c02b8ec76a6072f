package main

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/memcgate/memcgate/config"
)

// TestSameTCPAddr checks which configured addresses a socket that
// systemd bound is taken for.
func TestSameTCPAddr(t *testing.T) {
	tests := []struct {
		addr string
		got  string // the socket's address
		want bool
	}{
		{":8080", "[::]:8080", true}, // ListenStream=8080
		{":8080", "0.0.0.0:8080", true},
		{"0.0.0.0:8080", "[::]:8080", true},
		{"[::]:8080", "0.0.0.0:8080", true},
		{":8080", "[::]:8081", false},
		{":8080", "127.0.0.1:8080", false}, // loopback only: not every interface
		{"127.0.0.1:9090", "127.0.0.1:9090", true},
		{"127.0.0.1:9090", "[::]:9090", false},
		{"127.0.0.1:9090", "127.0.0.2:9090", false},
		{"[::1]:9090", "[::1]:9090", true},
		{"localhost:9090", "127.0.0.1:9090", true},
		{"localhost:9091", "127.0.0.1:9090", false},
		{"127.0.0.1:http", "127.0.0.1:80", false}, // the configuration takes numbers only
	}
	for _, tt := range tests {
		got, err := net.ResolveTCPAddr("tcp", tt.got)
		if err != nil {
			t.Fatal(err)
		}
		if same := sameTCPAddr(t.Context(), tt.addr, got); same != tt.want {
			t.Errorf("sameTCPAddr(%q, %s) = %v, want %v", tt.addr, tt.got, same, tt.want)
		}
	}
}

// testSockets returns a TCP listener on loopback and a Unix one at path,
// mode 0666, as a socket unit would pass them; both close when t ends.
func testSockets(t *testing.T) (tcp, unix net.Listener, path string) {
	t.Helper()
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tcp.Close() })
	path = filepath.Join(t.TempDir(), "s.sock")
	if unix, err = net.Listen("unix", path); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close() })
	if err := os.Chmod(path, 0o666); err != nil {
		t.Fatal(err)
	}
	return tcp, unix, path
}

// TestInheritedMismatch checks that a socket passed for a listener the
// configuration puts elsewhere, or has not, stops the start with both
// named, and that one where the configuration says is taken.
func TestInheritedMismatch(t *testing.T) {
	tcp, unix, path := testSockets(t)
	port := tcp.Addr().(*net.TCPAddr).Port
	tests := []struct {
		name    string
		check   func() error
		wantErr string
	}{
		{"data where configured", func() error { return inheritedTCP(t.Context(), tcp, fdData, tcp.Addr().String(), 0) }, ""},
		{"data elsewhere", func() error { return inheritedTCP(t.Context(), tcp, fdData, ":8080", 0) }, `":8080", but the socket unit's "data" socket listens on ` + tcp.Addr().String()},
		{"data on another port", func() error {
			return inheritedTCP(t.Context(), tcp, fdData, "127.0.0.1:"+strconv.Itoa(port+1), 0)
		}, "make them the same address"},
		{"data a Unix socket", func() error { return inheritedTCP(t.Context(), unix, fdData, ":8080", 0) }, `passes "data" as a unix socket at ` + path},
		{"socket where configured", func() error { return inheritedUnix(unix, path, 0o666) }, ""},
		{"socket not configured", func() error { return inheritedUnix(unix, "", 0o660) }, "empty, but the socket unit passes a Unix socket at " + path},
		{"socket elsewhere", func() error { return inheritedUnix(unix, "/run/memcgate/memcgate.sock", 0o666) }, "make them the same path"},
		{"socket mode differs", func() error { return inheritedUnix(unix, path, 0o660) }, "has mode 0666, but MEMCGATE_LISTEN_SOCKET_MODE is 0660"},
		{"socket a TCP socket", func() error { return inheritedUnix(tcp, path, 0o666) }, "not a Unix socket"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.check()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error %v, want one with %q", err, tt.wantErr)
			}
		})
	}
}

// TestInheritedWarnings checks what a reload is told a restart would
// stop at: a listener systemd passed that the configuration read moves
// elsewhere, and nothing for one it leaves, moves to a name of the same
// address, or that the gateway bound itself.
func TestInheritedWarnings(t *testing.T) {
	tcp, unix, path := testSockets(t)
	admin, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	port := strconv.Itoa(tcp.Addr().(*net.TCPAddr).Port)
	cfg := config.Config{ListenAddr: tcp.Addr().String(), AdminAddr: admin.Addr().String(), ListenSocket: path, ListenSocketMode: "0666"}
	all := listeners{data: tcp, admin: admin, socket: unix, inherited: []string{fdData, fdAdmin, fdSocket}}
	bound := listeners{data: tcp, admin: admin, socket: unix}
	tests := []struct {
		name string
		ls   listeners
		edit func(*config.Config)
		want []string // one part of each warning, in order
	}{
		{"nothing moved", all, func(*config.Config) {}, nil},
		{"data moved", all, func(c *config.Config) { c.ListenAddr = "127.0.0.1:1" }, []string{`MEMCGATE_LISTEN_ADDR: "127.0.0.1:1", but the socket unit's "data" socket listens on ` + tcp.Addr().String()}},
		{"data named by its host", all, func(c *config.Config) { c.ListenAddr = "localhost:" + port }, nil},
		{"admin moved", all, func(c *config.Config) { c.AdminAddr = "127.0.0.1:1" }, []string{`MEMCGATE_ADMIN_ADDR: "127.0.0.1:1"`}},
		{"socket moved", all, func(c *config.Config) { c.ListenSocket = path + ".new" }, []string{"MEMCGATE_LISTEN_SOCKET: " + strconv.Quote(path+".new")}},
		{"socket mode changed", all, func(c *config.Config) { c.ListenSocketMode = "0660" }, []string{"MEMCGATE_LISTEN_SOCKET: " + path + " has mode 0666, but MEMCGATE_LISTEN_SOCKET_MODE is 0660"}},
		{"every one moved", all, func(c *config.Config) { c.ListenAddr, c.AdminAddr, c.ListenSocket = "127.0.0.1:1", "127.0.0.1:2", "" },
			[]string{"MEMCGATE_LISTEN_ADDR: ", "MEMCGATE_ADMIN_ADDR: ", "MEMCGATE_LISTEN_SOCKET: empty"}},
		{"bound by the gateway", bound, func(c *config.Config) { c.ListenAddr, c.AdminAddr, c.ListenSocket = "127.0.0.1:1", "127.0.0.1:2", "" }, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			next := cfg
			tt.edit(&next)
			got := inheritedWarnings(t.Context(), tt.ls, cfg, next)
			ok := len(got) == len(tt.want)
			for i := 0; ok && i < len(got); i++ {
				ok = strings.HasPrefix(got[i], tt.want[i]) && strings.Contains(got[i], "a restart would stop there")
			}
			if !ok {
				t.Errorf("inheritedWarnings = %q, want one warning starting with each of %q", got, tt.want)
			}
		})
	}
}
