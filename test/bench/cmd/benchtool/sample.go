package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// userHZ is the unit of utime and stime in /proc/<pid>/stat (USER_HZ, 100
// on every Linux architecture this runs on).
const userHZ = 100

// sample measures the server side of one load-generator run. It reads the
// CPU time of the -target and -memcached processes when it starts and when
// it gets SIGTERM or SIGINT, samples VmRSS of the -rss processes (summed)
// and memcached's curr_connections every -interval, and then prints one
// line of key=value fields:
//
//	target_cpu_us   utime+stime delta of the -target processes, µs
//	memc_cpu_us     the same for memcached
//	rss_max_kb      highest sampled sum of VmRSS over the -rss processes
//	hwm_kb          sum of VmHWM over the -rss processes at the end
//	conn_min/avg/max memcached curr_connections over the samples
//	conn_opened     memcached total_connections delta (connections accepted)
//	own_avg/own_max established connections from the -target processes to
//	                -upstream-port (memcached's curr_connections also counts
//	                the other target's idle pool)
//	timewait        TCP sockets in TIME_WAIT on the machine at the end
//	wall_us         time between the first and the last reading
//	srv_busy_us     user+nice+system time of the -server-cpus (/proc/stat)
//	srv_foreign_us  srv_busy_us minus the -target and -memcached CPU time:
//	                other processes on the servers' CPUs (interference)
//	load_busy_us    user+nice+system time of the -load-cpus
//	sampler_cpu_us  this sampler's own CPU time
//	samples         number of samples
func sample(args []string) error {
	fs := flag.NewFlagSet("sample", flag.ExitOnError)
	memc := fs.String("memc", "", "memcached host:port for stats")
	target := fs.String("target", "", "comma-separated pids whose CPU time is the target's")
	rss := fs.String("rss", "", "comma-separated pids whose VmRSS is summed (default: -target)")
	mpid := fs.String("memcached", "", "memcached pid")
	interval := fs.Duration("interval", 200*time.Millisecond, "sampling interval")
	ready := fs.String("ready", "", "file created once the first sample is taken")
	srvCPUs := fs.String("server-cpus", "", "CPU list of the servers (e.g. 0 or 0-1), for srv_busy_us")
	loadCPUs := fs.String("load-cpus", "", "CPU list of the load generator, for load_busy_us")
	upPort := fs.Int("upstream-port", 0, "count the -target processes' established connections to this port")
	_ = fs.Parse(args)
	tpids, err := parsePids(*target)
	if err != nil {
		return err
	}
	rpids := tpids
	if *rss != "" {
		if rpids, err = parsePids(*rss); err != nil {
			return err
		}
	}
	mpids, err := parsePids(*mpid)
	if err != nil {
		return err
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)

	var st *statsConn
	if *memc != "" {
		if st, err = dialStats(*memc); err != nil {
			return err
		}
		defer st.c.Close()
	}
	srvSet, err := parseCPUList(*srvCPUs)
	if err != nil {
		return err
	}
	loadSet, err := parseCPUList(*loadCPUs)
	if err != nil {
		return err
	}
	w0 := time.Now()
	t0, m0 := cpuTicks(tpids), cpuTicks(mpids)
	s0, l0 := busyTicks(srvSet), busyTicks(loadSet)
	var opened0 int64 = -1
	var rssMax int64
	var conns, own []int64
	n := 0
	take := func() {
		// Matching sockets to processes reads every fd and all of
		// /proc/net/tcp (thousands of lines at 2048 clients): once a second.
		if *upPort > 0 && n%5 == 0 {
			own = append(own, int64(ownConns(tpids, *upPort)))
		}
		n++
		if r := sumStatus(rpids, "VmRSS:"); r > rssMax {
			rssMax = r
		}
		if st == nil {
			return
		}
		s, err := st.stats()
		if err != nil {
			return
		}
		conns = append(conns, s["curr_connections"])
		if opened0 < 0 {
			opened0 = s["total_connections"]
		}
	}
	take()
	if *ready != "" {
		if err := os.WriteFile(*ready, nil, 0o644); err != nil {
			return err
		}
	}
	tick := time.NewTicker(*interval)
	defer tick.Stop()
loop:
	for {
		select {
		case <-tick.C:
			take()
		case <-sig:
			break loop
		}
	}
	t1, m1 := cpuTicks(tpids), cpuTicks(mpids)
	s1, l1 := busyTicks(srvSet), busyTicks(loadSet)
	wall := time.Since(w0)
	take()
	var opened int64
	if st != nil && opened0 >= 0 {
		if s, err := st.stats(); err == nil {
			opened = s["total_connections"] - opened0
		}
	}
	cmin, cavg, cmax := minAvgMax(conns)
	_, oavg, omax := minAvgMax(own)
	fmt.Printf("target_cpu_us=%d memc_cpu_us=%d rss_max_kb=%d hwm_kb=%d conn_min=%d conn_avg=%.0f conn_max=%d conn_opened=%d own_avg=%.0f own_max=%d timewait=%d wall_us=%d srv_busy_us=%d srv_foreign_us=%d load_busy_us=%d sampler_cpu_us=%d samples=%d\n",
		(t1-t0)*1e6/userHZ, (m1-m0)*1e6/userHZ, rssMax, sumStatus(rpids, "VmHWM:"),
		cmin, cavg, cmax, opened, oavg, omax, timeWait(), wall.Microseconds(),
		(s1-s0)*1e6/userHZ, max(0, (s1-s0)-(t1-t0)-(m1-m0))*1e6/userHZ, (l1-l0)*1e6/userHZ, cpuTicks([]int{os.Getpid()})*1e6/userHZ, len(conns))
	return nil
}

func minAvgMax(v []int64) (lo int64, avg float64, hi int64) {
	if len(v) == 0 {
		return 0, 0, 0
	}
	lo, hi = v[0], v[0]
	var sum int64
	for _, x := range v {
		lo, hi = min(lo, x), max(hi, x)
		sum += x
	}
	return lo, float64(sum) / float64(len(v)), hi
}

// ownConns counts the ESTABLISHED TCP sockets held by pids whose remote
// port is port: socket inodes from /proc/<pid>/fd, matched against
// /proc/net/tcp{,6}.
func ownConns(pids []int, port int) int {
	inodes := map[string]bool{}
	for _, p := range pids {
		dir := fmt.Sprintf("/proc/%d/fd", p)
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range ents {
			l, err := os.Readlink(dir + "/" + e.Name())
			if err != nil {
				continue
			}
			if ino, ok := strings.CutPrefix(l, "socket:["); ok {
				inodes[strings.TrimSuffix(ino, "]")] = true
			}
		}
	}
	want := fmt.Sprintf(":%04X", port)
	n := 0
	for _, path := range []string{"/proc/net/tcp"} { // memcached listens on 127.0.0.1
		f, err := os.Open(path)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			// sl local rem st tx:rx tr:when retrnsmt uid timeout inode
			fl := strings.Fields(sc.Text())
			if len(fl) > 9 && fl[3] == "01" && strings.HasSuffix(fl[2], want) && inodes[fl[9]] {
				n++
			}
		}
		f.Close()
	}
	return n
}

// parseCPUList parses a taskset-style list: 0, 0,2, 0-3.
func parseCPUList(s string) (map[int]bool, error) {
	set := map[int]bool{}
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		b := a
		if err == nil && isRange {
			b, err = strconv.Atoi(hi)
		}
		if err != nil || b < a {
			return nil, fmt.Errorf("bad CPU list %q", s)
		}
		for c := a; c <= b; c++ {
			set[c] = true
		}
	}
	return set, nil
}

// busyTicks sums user, nice and system time of the CPUs in set from
// /proc/stat (irq, softirq and steal are left out: process CPU time does
// not include them either).
func busyTicks(set map[int]bool) int64 {
	if len(set) == 0 {
		return 0
	}
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	var sum int64
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 4 || !strings.HasPrefix(f[0], "cpu") || f[0] == "cpu" {
			continue
		}
		c, err := strconv.Atoi(f[0][3:])
		if err != nil || !set[c] {
			continue
		}
		for _, v := range f[1:4] {
			n, _ := strconv.ParseInt(v, 10, 64)
			sum += n
		}
	}
	return sum
}

func parsePids(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		p, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("bad pid %q", f)
		}
		out = append(out, p)
	}
	return out, nil
}

// cpuTicks sums utime+stime (fields 14 and 15 of /proc/<pid>/stat, all
// threads of the process) over pids.
func cpuTicks(pids []int) int64 {
	var sum int64
	for _, p := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p))
		if err != nil {
			continue
		}
		// The command name is in parentheses and may contain spaces.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:]) // f[0] is field 3 (state)
		if len(f) < 13 {
			continue
		}
		u, _ := strconv.ParseInt(f[11], 10, 64)
		k, _ := strconv.ParseInt(f[12], 10, 64)
		sum += u + k
	}
	return sum
}

// sumStatus sums a "Name:   N kB" line of /proc/<pid>/status over pids.
func sumStatus(pids []int, name string) int64 {
	var sum int64
	for _, p := range pids {
		f, err := os.Open(fmt.Sprintf("/proc/%d/status", p))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), name); ok {
				v, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
				sum += v
				break
			}
		}
		f.Close()
	}
	return sum
}

// timeWait counts sockets in state 06 (TIME_WAIT) in /proc/net/tcp{,6}.
func timeWait() int {
	n := 0
	for _, p := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(p)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) > 3 && f[3] == "06" {
				n++
			}
		}
		f.Close()
	}
	return n
}

type statsConn struct {
	c net.Conn
	r *bufio.Reader
}

func dialStats(addr string) (*statsConn, error) {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return nil, err
	}
	return &statsConn{c: c, r: bufio.NewReader(c)}, nil
}

// stats runs memcached's "stats" and returns the numeric values.
func (s *statsConn) stats() (map[string]int64, error) {
	_ = s.c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := s.c.Write([]byte("stats\r\n")); err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for {
		line, err := s.r.ReadString('\n')
		if err != nil {
			return nil, err
		}
		line = strings.TrimRight(line, "\r\n")
		if line == "END" {
			return out, nil
		}
		f := strings.Fields(line)
		if len(f) != 3 || f[0] != "STAT" {
			return nil, errors.New("stats: unexpected line " + strconv.Quote(line))
		}
		if v, err := strconv.ParseInt(f[2], 10, 64); err == nil {
			out[f[1]] = v
		}
	}
}
