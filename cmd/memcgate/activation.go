package main

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"

	"github.com/memcgate/memcgate/cmd/memcgate/internal/sdlisten"
	"github.com/memcgate/memcgate/config"
	"github.com/memcgate/memcgate/gateway/listen"
)

// The names a socket unit gives the sockets it passes
// (FileDescriptorName=, deploy/systemd/memcgate.socket): what each is
// for.
const (
	fdData   = "data"   // MEMCGATE_LISTEN_ADDR
	fdSocket = "socket" // MEMCGATE_LISTEN_SOCKET
	fdAdmin  = "admin"  // MEMCGATE_ADMIN_ADDR
)

// openListeners opens the listeners cfg configures. A socket systemd
// passed (socket activation) is taken instead of binding its address,
// provided it is where cfg says that listener is: a socket at another
// address, or passed for a listener cfg does not have, stops the start,
// naming both. A listener no socket was passed for is bound as without
// systemd.
func openListeners(ctx context.Context, cfg config.Config, environ map[string]string) (listeners, error) {
	socks, err := sdlisten.Parse(environ, os.Getpid(), []string{fdData, fdSocket, fdAdmin})
	if err != nil {
		return listeners{}, fmt.Errorf("socket activation: %w", err)
	}
	passed, err := sdlisten.Listeners(socks)
	if err != nil {
		return listeners{}, fmt.Errorf("socket activation: %w", err)
	}
	var ls listeners
	fail := func(err error) (listeners, error) {
		ls.close()
		for _, ln := range passed {
			ln.Close()
		}
		return listeners{}, err
	}
	take := func(name string) net.Listener {
		ln := passed[name]
		if ln != nil {
			delete(passed, name)
			ls.inherited = append(ls.inherited, name)
		}
		return ln
	}
	if ls.data = take(fdData); ls.data != nil {
		err = inheritedTCP(ctx, ls.data, fdData, cfg.ListenAddr, cfg.SendBufferBytes)
	} else {
		ls.data, err = listen.TCP(ctx, cfg.ListenAddr, cfg.SendBufferBytes)
	}
	if err != nil {
		return fail(fmt.Errorf("%sLISTEN_ADDR: %w", config.Prefix, err))
	}
	if ls.admin = take(fdAdmin); ls.admin != nil {
		err = inheritedTCP(ctx, ls.admin, fdAdmin, cfg.AdminAddr, 0)
	} else {
		ls.admin, err = listen.TCP(ctx, cfg.AdminAddr, 0)
	}
	if err != nil {
		return fail(fmt.Errorf("%sADMIN_ADDR: %w", config.Prefix, err))
	}
	if ls.socket = take(fdSocket); ls.socket != nil {
		err = inheritedUnix(ls.socket, cfg.ListenSocket, cfg.SocketMode())
	} else if cfg.ListenSocket != "" {
		ls.socket, err = listenUnix(ctx, cfg.ListenSocket, cfg.SocketMode())
	}
	if err != nil {
		return fail(fmt.Errorf("%sLISTEN_SOCKET: %w", config.Prefix, err))
	}
	return ls, nil
}

// inheritedTCP checks that ln, passed as name, is a TCP socket at addr
// (checkTCP), and sets on it what listen.TCP sets on the sockets it
// opens.
func inheritedTCP(ctx context.Context, ln net.Listener, name, addr string, sndbuf int) error {
	if err := checkTCP(ctx, ln, name, addr); err != nil {
		return err
	}
	rc, err := ln.(*net.TCPListener).SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = listen.SetOptions(int(fd), sndbuf) }); err != nil {
		return err
	}
	return serr
}

// checkTCP checks that ln, passed as name, is a TCP socket listening on
// addr for every family addr takes.
func checkTCP(ctx context.Context, ln net.Listener, name, addr string) error {
	tl, ok := ln.(*net.TCPListener)
	if !ok {
		return fmt.Errorf("%q, but the socket unit passes %q as a %s socket at %s: make it ListenStream=%s", addr, name, ln.Addr().Network(), ln.Addr(), addr)
	}
	got := tl.Addr().(*net.TCPAddr)
	if !sameTCPAddr(ctx, addr, got) {
		return fmt.Errorf("%q, but the socket unit's %q socket listens on %s: make them the same address", addr, name, got)
	}
	if got.IP.To4() != nil || !got.IP.IsUnspecified() {
		return nil
	}
	// An unspecified host is every interface of both families, as Go
	// binds it (one socket, IPv4 mapped into IPv6); a socket systemd
	// bound for IPv6 alone would refuse every IPv4 client, 127.0.0.1's
	// included.
	rc, err := tl.SyscallConn()
	if err != nil {
		return err
	}
	var v6only bool
	var serr error
	if err := rc.Control(func(fd uintptr) { v6only, serr = listen.IPv6Only(int(fd)) }); err != nil {
		return err
	}
	if serr != nil {
		return serr
	}
	if v6only {
		return fmt.Errorf("%q, but the socket unit's %q socket listens on %s for IPv6 only (BindIPv6Only=ipv6-only, or net.ipv6.bindv6only=1) and would refuse IPv4 clients: set BindIPv6Only=both in the socket unit", addr, name, got)
	}
	return nil
}

// restartWarnings returns, for a configuration next that a reload read,
// what a restart would stop at: a listener systemd passed whose address
// next changes to one the socket no longer matches (the socket unit,
// not the process, says where the next process listens). ls are the
// listeners p started with, cfg their configuration.
func (p *process) restartWarnings(ctx context.Context, next config.Config) []string {
	return inheritedWarnings(ctx, p.ls, p.cfg, next)
}

// inheritedWarnings is restartWarnings for listeners ls opened with cfg.
func inheritedWarnings(ctx context.Context, ls listeners, cfg, next config.Config) []string {
	var out []string
	warn := func(name string, err error) {
		if err != nil {
			out = append(out, fmt.Sprintf("%s%s: %v; a restart would stop there: change the socket unit first (docs/operations.md, restarts and upgrades on one host)", config.Prefix, name, err))
		}
	}
	inherited := func(name string) bool { return slices.Contains(ls.inherited, name) }
	if inherited(fdData) && next.ListenAddr != cfg.ListenAddr {
		warn("LISTEN_ADDR", checkTCP(ctx, ls.data, fdData, next.ListenAddr))
	}
	if inherited(fdAdmin) && next.AdminAddr != cfg.AdminAddr {
		warn("ADMIN_ADDR", checkTCP(ctx, ls.admin, fdAdmin, next.AdminAddr))
	}
	if inherited(fdSocket) && (next.ListenSocket != cfg.ListenSocket || next.SocketMode() != cfg.SocketMode()) {
		warn("LISTEN_SOCKET", inheritedUnix(ls.socket, next.ListenSocket, next.SocketMode()))
	}
	return out
}

// sameTCPAddr reports whether a socket bound at got is one listening on
// addr, host:port as the configuration has it: the same port, and every
// interface for a host that is empty or unspecified (0.0.0.0 and :: are
// taken as one: systemd's ListenStream=8080 listens on both families),
// else the host's address, or one of its name's.
func sameTCPAddr(ctx context.Context, addr string, got *net.TCPAddr) bool {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if p, err := strconv.Atoi(port); err != nil || p != got.Port {
		return false
	}
	if host == "" {
		return got.IP.IsUnspecified()
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		if ip.IsUnspecified() {
			return got.IP.IsUnspecified()
		}
		return got.IP.Equal(net.IP(ip.AsSlice()))
	}
	ips, err := net.DefaultResolver.LookupIPAddr(ctx, host)
	if err != nil {
		return false
	}
	for _, ip := range ips {
		if got.IP.Equal(ip.IP) {
			return true
		}
	}
	return false
}

// inheritedUnix checks that ln, passed as the "socket" socket, is a Unix
// socket at path whose file has mode. The socket unit created the file,
// and keeps it across restarts: memcgate neither sets its mode nor
// removes it.
func inheritedUnix(ln net.Listener, path string, mode os.FileMode) error {
	if _, ok := ln.(*net.UnixListener); !ok {
		return fmt.Errorf("the socket unit passes %q as a %s socket at %s, not a Unix socket", fdSocket, ln.Addr().Network(), ln.Addr())
	}
	got := ln.Addr().String()
	if path == "" {
		return fmt.Errorf("empty, but the socket unit passes a Unix socket at %s as %q: set it to that path", got, fdSocket)
	}
	if got != path {
		return fmt.Errorf("%q, but the socket unit's %q socket is at %s: make them the same path", path, fdSocket, got)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("the socket unit's %q socket: %w", fdSocket, err)
	}
	if fi.Mode().Perm() != mode {
		return fmt.Errorf("%s has mode %04o, but %sLISTEN_SOCKET_MODE is %04o: make SocketMode= in the socket unit and LISTEN_SOCKET_MODE the same", path, fi.Mode().Perm(), config.Prefix, mode)
	}
	return nil
}
