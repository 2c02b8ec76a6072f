// Package sdlisten takes the listening sockets that systemd passes to a
// service it starts through a socket unit (socket activation, the
// protocol of sd_listen_fds(3)): descriptors from 3 on, LISTEN_FDS of
// them, for the process LISTEN_PID, named in LISTEN_FDNAMES. systemd
// keeps its own copy of each socket across a restart of the service, so
// connections wait in the socket's queue while no process accepts them
// instead of being refused.
package sdlisten

import (
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// firstFD is the descriptor of the first socket passed (SD_LISTEN_FDS_START).
const firstFD = 3

// maxFDs bounds LISTEN_FDS: a number past it is a mistake, not sockets.
const maxFDs = 64

// Socket is one descriptor passed, and the name its socket unit gives it
// (FileDescriptorName=).
type Socket struct {
	Name string
	FD   int
}

// Parse returns the sockets environ passes to the process pid, fd 3
// first, each named by LISTEN_FDNAMES with one of names. It returns none
// when LISTEN_PID is unset or names another process: as sd_listen_fds
// does, the variables were then meant for another program (a parent that
// did not clear them). A name missing, unknown or repeated, or a count
// that is not a number or differs from the names', is an error: a socket
// that cannot be placed must not be served as something else.
func Parse(environ map[string]string, pid int, names []string) ([]Socket, error) {
	p, ok := environ["LISTEN_PID"]
	if !ok {
		return nil, nil
	}
	if n, err := strconv.Atoi(p); err != nil || n != pid {
		return nil, nil
	}
	count, err := strconv.Atoi(environ["LISTEN_FDS"])
	if err != nil || count < 0 || count > maxFDs {
		return nil, fmt.Errorf("LISTEN_FDS=%q: not a number of sockets from 0 to %d", environ["LISTEN_FDS"], maxFDs)
	}
	if count == 0 {
		return nil, nil
	}
	fdNames, ok := environ["LISTEN_FDNAMES"]
	if !ok {
		return nil, fmt.Errorf("LISTEN_FDS=%d without LISTEN_FDNAMES: name each socket with FileDescriptorName= (%s) in the socket unit", count, strings.Join(names, ", "))
	}
	given := strings.Split(fdNames, ":")
	if len(given) != count {
		return nil, fmt.Errorf("LISTEN_FDS=%d but LISTEN_FDNAMES=%q names %d", count, fdNames, len(given))
	}
	socks := make([]Socket, count)
	for i, name := range given {
		fd := firstFD + i
		if !slices.Contains(names, name) {
			return nil, fmt.Errorf("fd %d is named %q (LISTEN_FDNAMES=%q): name it with FileDescriptorName= one of %s", fd, name, fdNames, strings.Join(names, ", "))
		}
		if j := slices.Index(given[:i], name); j >= 0 {
			return nil, fmt.Errorf("fds %d and %d are both named %q (LISTEN_FDNAMES=%q)", firstFD+j, fd, name, fdNames)
		}
		socks[i] = Socket{Name: name, FD: fd}
	}
	return socks, nil
}

// Listeners returns a listener for each socket, by name. A descriptor
// that is not a listening stream socket is an error. Each descriptor is
// closed once its listener holds a copy (close-on-exec), and all of them
// on an error.
func Listeners(socks []Socket) (map[string]net.Listener, error) {
	lns := make(map[string]net.Listener, len(socks))
	var errs []error
	for _, s := range socks {
		ln, err := listener(s)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		lns[s.Name] = ln
	}
	if err := errors.Join(errs...); err != nil {
		for _, ln := range lns {
			ln.Close()
		}
		return nil, err
	}
	return lns, nil
}

// listener makes s's descriptor a listener and closes the descriptor.
func listener(s Socket) (net.Listener, error) {
	f := os.NewFile(uintptr(s.FD), s.Name)
	if f == nil {
		return nil, fmt.Errorf("fd %d (%s): not a valid descriptor", s.FD, s.Name)
	}
	defer f.Close()
	var st syscall.Stat_t
	if err := syscall.Fstat(s.FD, &st); err != nil {
		return nil, fmt.Errorf("fd %d (%s): %w", s.FD, s.Name, err)
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFSOCK {
		return nil, fmt.Errorf("fd %d (%s) is not a socket", s.FD, s.Name)
	}
	if err := listening(s.FD); err != nil {
		return nil, fmt.Errorf("fd %d (%s): %w", s.FD, s.Name, err)
	}
	ln, err := net.FileListener(f)
	if err != nil {
		return nil, fmt.Errorf("fd %d (%s): %w", s.FD, s.Name, err)
	}
	return ln, nil
}
