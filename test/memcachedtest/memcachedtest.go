// Package memcachedtest starts real memcached processes on free loopback
// ports for tests, and kills, pauses, resumes and restarts them for fault
// tests. It needs the memcached binary (Debian package memcached): without
// it tests are skipped, unless CI or MEMCGATE_TEST_REQUIRE_MEMCACHED is set,
// in which case they fail.
package memcachedtest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Server is one memcached process. Its methods are safe for concurrent use.
type Server struct {
	Addr    string // 127.0.0.1:port
	Port    int
	UDPPort int // 0 unless started with StartUDP

	t    testing.TB
	bin  string
	args []string

	mu      sync.Mutex // guards cmd, paused, resumed and watched
	cmd     *exec.Cmd
	paused  int  // the pid Pause stopped and no Resume or Kill has resumed; 0: none
	resumed bool // a process Pause stopped ran again before this package resumed it (checkPaused)
	watched bool // Pause registered the report of resumed with t
}

// Binary returns the path of memcached, or skips t (fails it when
// Required).
func Binary(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath("memcached")
	if err == nil {
		return p
	}
	if Required() {
		t.Fatalf("memcached is not installed (apt-get install memcached); CI or MEMCGATE_TEST_REQUIRE_MEMCACHED is set, so tests must not skip: %v", err)
	}
	t.Skipf("memcached is not installed (apt-get install memcached): %v", err)
	return ""
}

// Required reports whether a test must fail, not skip, when a tool it
// needs is missing: under CI, or with MEMCGATE_TEST_REQUIRE_MEMCACHED set
// (make test sets it, after installing every tool the tests use). A
// skipped check there would be a check silently not run.
// gatewaytest.Missing applies the same rule to the other tools.
func Required() bool {
	return os.Getenv("CI") != "" || os.Getenv("MEMCGATE_TEST_REQUIRE_MEMCACHED") != ""
}

// Start runs memcached on a free loopback port with extra args (for
// example "-m", "16") and waits until it accepts connections. The process
// is killed when the test ends.
func Start(t testing.TB, args ...string) *Server {
	t.Helper()
	return start(t, false, args)
}

// StartUDP is Start with memcached's UDP port open too (memcached -U, off
// by default since 1.5.6).
func StartUDP(t testing.TB, args ...string) *Server {
	t.Helper()
	return start(t, true, args)
}

func start(t testing.TB, udp bool, args []string) *Server {
	t.Helper()
	bin := Binary(t)
	var lastErr error
	for range 5 { // a free port may be taken before memcached binds it
		port, err := FreePort()
		if err != nil {
			t.Fatalf("free port: %v", err)
		}
		s := &Server{Addr: "127.0.0.1:" + strconv.Itoa(port), Port: port, t: t, bin: bin, args: args}
		if udp {
			if s.UDPPort, err = FreeUDPPort(); err != nil {
				t.Fatalf("free UDP port: %v", err)
			}
		}
		if lastErr = s.start(); lastErr == nil {
			t.Cleanup(s.Kill)
			return s
		}
	}
	t.Fatalf("starting memcached: %v", lastErr)
	return nil
}

// StartN starts n servers.
func StartN(t testing.TB, n int, args ...string) []*Server {
	t.Helper()
	out := make([]*Server, n)
	for i := range out {
		out[i] = Start(t, args...)
	}
	return out
}

// Addrs returns the servers' addresses, comma-separated, as
// MEMCGATE_SERVERS takes them.
func Addrs(servers []*Server) string {
	addrs := make([]string, len(servers))
	for i, s := range servers {
		addrs[i] = s.Addr
	}
	return strings.Join(addrs, ",")
}

// FreeUDPPort returns a loopback UDP port that was free a moment ago.
func FreeUDPPort() (int, error) {
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).Port, nil
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// FreePorts returns n distinct loopback TCP ports that were free a
// moment ago: each is held until all are picked, so two calls of
// FreePort in a row cannot return the same one.
func FreePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func (s *Server) start() error {
	args := append([]string{"-l", "127.0.0.1", "-p", strconv.Itoa(s.Port), "-U", strconv.Itoa(s.UDPPort)}, s.args...)
	if os.Geteuid() == 0 {
		args = append(args, "-u", "nobody")
	}
	cmd := exec.Command(s.bin, args...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			return fmt.Errorf("memcached on port %d exited: %v", s.Port, err)
		default:
		}
		c, err := net.DialTimeout("tcp", s.Addr, 100*time.Millisecond)
		if err == nil {
			// Whoever answers must be this process: a port found free
			// may have been taken by another test's memcached (another
			// package's, run in parallel), and ours then fails to bind
			// while the other answers for it, and is flushed, killed
			// and restarted by its own test.
			owns, err := answersAs(c, cmd.Process.Pid, slices.Contains(s.args, "-Z"))
			c.Close()
			if err == nil && !owns {
				err = errors.New("another memcached answers there")
			}
			if err != nil || !owns {
				_ = cmd.Process.Kill()
				return fmt.Errorf("port %d is not our memcached's (pid %d): %v", s.Port, cmd.Process.Pid, err)
			}
			s.mu.Lock()
			s.cmd = cmd
			s.mu.Unlock()
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	_ = cmd.Process.Kill()
	return fmt.Errorf("memcached on port %d did not accept connections within 5s", s.Port)
}

// answersAs reports whether the memcached that c reached is process pid,
// by the pid its stats give: a plain question on the connection already
// open, where Listens reads all of /proc/net/tcp (seconds under -race on
// a machine whose fuzzers left thousands of sockets in TIME_WAIT). A
// memcached speaking TLS (tls) is asked through /proc instead.
func answersAs(c net.Conn, pid int, tls bool) (bool, error) {
	if tls {
		return Listens(pid, c.RemoteAddr().(*net.TCPAddr).Port)
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "stats\r\n"); err != nil {
		return false, err
	}
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		line := strings.TrimSuffix(sc.Text(), "\r")
		if v, ok := strings.CutPrefix(line, "STAT pid "); ok {
			return v == strconv.Itoa(pid), nil
		}
		if line == "END" || strings.HasSuffix(line, "ERROR") {
			break
		}
	}
	if err := sc.Err(); err != nil {
		return false, err
	}
	return false, errors.New("its stats give no pid")
}

// Listens reports whether process pid has the socket listening on
// 127.0.0.1:port, from /proc (TLS or not, without talking to it): a
// server that answers on a port found free may be another test's, which
// took the port first. The error says why not, when it is not.
func Listens(pid, port int) (bool, error) {
	what := fmt.Sprintf("listens on 127.0.0.1:%d", port)
	ok, err := owns(pid, fmt.Sprintf("0100007F:%04X", port), "", "0A", what) // 0A: LISTEN
	if !ok && err == nil {
		err = fmt.Errorf("the socket that %s is another process's", what)
	}
	return ok, err
}

// Connects reports whether process pid has the socket connected from
// 127.0.0.1:port to 127.0.0.1:to: whether a connection a listener on
// port to accepted from port is this process's own, not another test's
// client (of any package running meanwhile) reaching for a server of its
// own, gone, whose port the listener took since. The remote port counts
// too: sockets connected to different addresses may share a local port.
// It is false with a nil error only when the socket is another
// process's; an error says it cannot tell (no /proc, the socket gone).
func Connects(pid, port, to int) (bool, error) {
	return owns(pid, fmt.Sprintf("0100007F:%04X", port), fmt.Sprintf("0100007F:%04X", to), "01", fmt.Sprintf("is connected from 127.0.0.1:%d to 127.0.0.1:%d", port, to)) // 01: ESTABLISHED
}

// owns reports whether process pid has a socket in /proc/net/tcp with
// the local address local, the remote address remote (any if empty) and
// TCP state state (hex, as the file shows them): false with a nil error
// if such sockets are all another process's; an error (what names the
// socket) if it cannot tell.
func owns(pid int, local, remote, state, what string) (bool, error) {
	tcp, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		return false, err
	}
	inodes := map[string]bool{}
	for _, line := range strings.Split(string(tcp), "\n") {
		if f := strings.Fields(line); len(f) > 9 && f[1] == local && (remote == "" || f[2] == remote) && f[3] == state {
			inodes["socket:["+f[9]+"]"] = true
		}
	}
	if len(inodes) == 0 {
		return false, fmt.Errorf("nothing %s", what)
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return false, err
	}
	for _, fd := range fds {
		if l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); err == nil && inodes[l] {
			return true, nil
		}
	}
	return false, nil
}

// DeadPort returns a loopback TCP port that refuses connections for the
// rest of the test: a socket bound to it and never listening holds it,
// so no other test's server (of any package running meanwhile) can take
// it, as it could a port merely found free.
func DeadPort(t testing.TB) int {
	t.Helper()
	// Close-on-exec set apart from socket(2), as SOCK_CLOEXEC is Linux's
	// alone; ForkLock keeps a memcached started meanwhile (os/exec takes
	// it to fork) from inheriting the socket between the two calls.
	syscall.ForkLock.RLock()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err == nil {
		syscall.CloseOnExec(fd)
	}
	syscall.ForkLock.RUnlock()
	if err != nil {
		t.Fatalf("dead port: %v", err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatalf("dead port: %v", err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatalf("dead port: %v", err)
	}
	return sa.(*syscall.SockaddrInet4).Port
}

func (s *Server) signal(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Signal(sig)
	}
}

// Kill sends SIGKILL and waits until the port refuses connections.
func (s *Server) Kill() {
	s.unpause()
	s.signal(syscall.SIGCONT) // a stopped process dies only once resumed on some kernels
	s.signal(syscall.SIGKILL)
	s.mu.Lock()
	s.cmd = nil
	s.mu.Unlock()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		c, err := net.DialTimeout("tcp", s.Addr, 50*time.Millisecond)
		if err != nil {
			return
		}
		c.Close()
		time.Sleep(10 * time.Millisecond)
	}
}

// Pause stops the process (SIGSTOP): connections stay open, nothing
// answers. It returns once every thread of memcached is stopped: the
// kernel stops a process's threads one by one, after kill returns, and
// on a busy machine a worker thread answered a request sent after it
// (seen in CI).
//
// A stopped memcached can run again with no Resume: any process may send
// it SIGCONT, and another test run's stale "kill -CONT" of a pid since
// reused did (a test that held a node stopped failed 2 runs in 1,895).
// So Resume and Kill first check that it is still stopped, as does the
// end of the test, and a test that failed is told, after its failure,
// when it was not: "memcached ... was resumed by someone else". Tests
// that assert while it is paused say so in their own failure message
// with ResumedByOthers.
func (s *Server) Pause() {
	s.signal(syscall.SIGSTOP)
	s.mu.Lock()
	pid := 0
	if s.cmd != nil && s.cmd.Process != nil {
		pid = s.cmd.Process.Pid
	}
	watch := !s.watched && pid != 0
	s.watched = s.watched || watch
	s.mu.Unlock()
	if pid == 0 {
		return
	}
	if watch {
		s.t.Cleanup(s.reportResumed)
	}
	WaitStopped(s.t, "memcached", pid)
	s.mu.Lock()
	s.paused = pid
	s.mu.Unlock()
}

// ResumedByOthers reports whether memcached, stopped by Pause, ran again
// before Resume or Kill resumed it: a SIGCONT this test did not send. A
// test whose assertion fails while memcached is paused adds it to its
// failure message, which then says whether the failure is the test's or
// the resumption's.
func (s *Server) ResumedByOthers() bool {
	s.checkPaused()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.resumed
}

// ResumedNote is "" unless ResumedByOthers, and then a sentence for a
// failure message that says so, with a leading "; ".
func (s *Server) ResumedNote() string {
	if !s.ResumedByOthers() {
		return ""
	}
	return "; memcached (" + s.Addr + ") was resumed by someone else while the test held it stopped (a SIGCONT the test did not send): the failure may be that"
}

// checkPaused records, in resumed, that the process Pause stopped is
// running again while no Resume or Kill has resumed it.
func (s *Server) checkPaused() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.paused != 0 && anyRunning(s.paused) {
		s.resumed = true
	}
}

// unpause is checkPaused before this package resumes the process itself.
func (s *Server) unpause() {
	s.checkPaused()
	s.mu.Lock()
	s.paused = 0
	s.mu.Unlock()
}

// reportResumed tells a test that failed whether memcached was resumed
// by someone else while it was paused (see Pause).
func (s *Server) reportResumed() {
	s.checkPaused()
	s.mu.Lock()
	resumed := s.resumed
	s.mu.Unlock()
	if resumed && s.t.Failed() {
		s.t.Log(strings.TrimPrefix(s.ResumedNote(), "; "))
	}
}

// WaitStopped waits until every thread of the process pid, sent SIGSTOP,
// has stopped (the kernel stops them one by one after kill returns), or
// fails t after 5s; what names the process in the failure.
func WaitStopped(t testing.TB, what string, pid int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !allStopped(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("%s (pid %d) not stopped 5s after SIGSTOP", what, pid)
		}
		time.Sleep(time.Millisecond)
	}
}

// allStopped reports whether every thread of pid is in the stopped state
// (T in /proc/<pid>/task/<tid>/stat), or whether the process is gone.
func allStopped(pid int) bool {
	return everyThread(pid, func(state byte) bool { return state == 'T' })
}

// anyRunning reports whether a thread of pid is neither stopped nor
// dead (a zombie's threads are not running either): it was resumed.
// A process gone, or no /proc, is not running.
func anyRunning(pid int) bool {
	return !everyThread(pid, func(state byte) bool { return strings.IndexByte("TtZX", state) >= 0 })
}

// everyThread reports whether the state of every thread of pid (its
// letter in /proc/<pid>/task/<tid>/stat) satisfies ok; true when the
// process is gone or there is no /proc.
func everyThread(pid int, ok func(state byte) bool) bool {
	dir := "/proc/" + strconv.Itoa(pid) + "/task"
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return true // gone, or no /proc: nothing to wait for
	}
	for _, task := range tasks {
		b, err := os.ReadFile(dir + "/" + task.Name() + "/stat")
		if err != nil {
			continue // the thread ended
		}
		// The state follows the command name in parentheses, which may
		// itself hold spaces and parentheses.
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 || i+2 >= len(b) || !ok(b[i+2]) {
			return false
		}
	}
	return true
}

// Resume continues a paused process (SIGCONT).
func (s *Server) Resume() {
	s.unpause()
	s.signal(syscall.SIGCONT)
}

// Restart starts a killed server again on the same port (empty cache).
func (s *Server) Restart() {
	s.t.Helper()
	var err error
	for range 50 { // the port may linger for a moment
		if err = s.start(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	s.t.Fatalf("restarting memcached on %s: %v", s.Addr, err)
}

// Stats returns the server's "stats" answer as a map.
func (s *Server) Stats() (map[string]string, error) {
	return Stats(s.Addr)
}

// SumStat is the sum of the numeric statistic name (bytes_written,
// cmd_get, …) over servers; it fails t if one cannot be read.
func SumStat(t testing.TB, name string, servers ...*Server) int {
	t.Helper()
	n := 0
	for _, s := range servers {
		st, err := s.Stats()
		if err != nil {
			t.Fatal(err)
		}
		v, err := strconv.Atoi(st[name])
		if err != nil {
			t.Fatalf("memcached %s: %s %q: %v", s.Addr, name, st[name], err)
		}
		n += v
	}
	return n
}

// Stats asks memcached at addr for its general statistics.
func Stats(addr string) (map[string]string, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte("stats\r\n")); err != nil {
		return nil, err
	}
	out := map[string]string{}
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		line := sc.Text()
		if line == "END" {
			return out, nil
		}
		f := strings.Fields(line)
		if len(f) == 3 && f[0] == "STAT" {
			out[f[1]] = f[2]
		}
	}
	return nil, fmt.Errorf("stats from %s: %v", addr, sc.Err())
}

// CurrConnections returns memcached's curr_connections, which counts the
// connection that asks, so the result has it subtracted.
func CurrConnections(addr string) (int, error) {
	st, err := Stats(addr)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(st["curr_connections"])
	if err != nil {
		return 0, fmt.Errorf("curr_connections %q: %w", st["curr_connections"], err)
	}
	return n - 1, nil
}

// FillBacklog connects to the server, stopped by Pause, until a
// connection is no longer accepted within 100 ms: its listen backlog is
// full (start it with a small one, "-b", "1"), and every dial from then
// on times out, as dials to a hung memcached whose backlog filled do,
// until it runs again. The connections are closed when the test ends.
func (s *Server) FillBacklog() {
	s.t.Helper()
	for range 64 {
		nc, err := net.DialTimeout("tcp", s.Addr, 100*time.Millisecond)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return
			}
			s.t.Fatalf("filling the backlog of memcached %s: %v", s.Addr, err)
		}
		s.t.Cleanup(func() { nc.Close() })
	}
	s.t.Fatalf("memcached %s accepted 64 connections while stopped: its backlog does not fill (start it with -b 1)", s.Addr)
}
