package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// counters prints, as one line of key=value fields, counters of the -pids
// processes and of the machine, to be read before and after a run:
//
//	cpu_us   utime+stime of the processes, µs (10 ms ticks)
//	cs       context switches of every thread of the processes
//	         (voluntary and not), threads that ended left out
//	busy_us  time every CPU spent neither idle nor waiting (/proc/stat:
//	         user, nice, system, irq, softirq), µs
//
// Unlike sample it takes no samples: a run that needs only these reads
// them twice and subtracts.
func counters(args []string) error {
	fs := flag.NewFlagSet("counters", flag.ExitOnError)
	pidList := fs.String("pids", "", "comma-separated pids")
	_ = fs.Parse(args)
	pids, err := parsePids(*pidList)
	if err != nil {
		return err
	}
	busy, err := machineBusyTicks()
	if err != nil {
		return err
	}
	fmt.Printf("cpu_us=%d cs=%d busy_us=%d\n", cpuTicks(pids)*1e6/userHZ, contextSwitches(pids), busy*1e6/userHZ)
	return nil
}

// contextSwitches sums voluntary and involuntary context switches over
// every thread of pids.
func contextSwitches(pids []int) int64 {
	var n int64
	for _, p := range pids {
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", p))
		for _, t := range tasks {
			b, err := os.ReadFile(t)
			if err != nil {
				continue
			}
			for line := range strings.SplitSeq(string(b), "\n") {
				if v, ok := strings.CutPrefix(line, "voluntary_ctxt_switches:"); ok {
					n += atoi64(v)
				} else if v, ok := strings.CutPrefix(line, "nonvoluntary_ctxt_switches:"); ok {
					n += atoi64(v)
				}
			}
		}
	}
	return n
}

// machineBusyTicks is user+nice+system+irq+softirq of all CPUs.
func machineBusyTicks() (int64, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0, fmt.Errorf("counters: unexpected /proc/stat line %q", line)
	}
	var t int64
	for _, i := range []int{1, 2, 3, 6, 7} {
		t += atoi64(f[i])
	}
	return t, nil
}

func atoi64(s string) int64 {
	v, _ := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	return v
}
