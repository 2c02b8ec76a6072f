package main

import (
	"math"
	"os"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/memcgate/memcgate/config"
)

// defaultBudget is the byte budget when MEMCGATE_MAX_BUFFERED_BYTES is
// not set and no memory limit is known.
const defaultBudget = 64 << 20

// memoryPlan is how much the gateway may hold for clients
// (MEMCGATE_MAX_BUFFERED_BYTES, else a quarter of the memory limit), and
// the soft memory limit to give the Go runtime, if any.
type memoryPlan struct {
	budget   int64
	limit    int64  // the memory limit the budget came from; 0: none known
	source   string // where limit came from: "GOMEMLIMIT", "cgroup" or ""
	runtime  int64  // soft limit to set with debug.SetMemoryLimit; 0: leave it
	explicit bool   // the budget was configured
}

// planMemory reads the limits: GOMEMLIMIT (as the runtime has it) first,
// then the cgroup's memory limit, which it also makes the runtime's soft
// limit (90 % of it) so that the collector works harder before the
// container is killed. A quarter of the limit leaves room for the
// copies a buffered byte can have on its way (a body read ahead and the
// value made of it) and for the collector's garbage.
func planMemory(cfg config.Config, cgroupLimit int64) memoryPlan {
	p := memoryPlan{budget: cfg.MaxBufferedBytes, explicit: cfg.MaxBufferedBytes > 0}
	if goLimit := debug.SetMemoryLimit(-1); goLimit < math.MaxInt64 {
		p.limit, p.source = goLimit, "GOMEMLIMIT"
	} else if cgroupLimit > 0 {
		p.limit, p.source = cgroupLimit, "cgroup"
		p.runtime = cgroupLimit / 10 * 9
	}
	if !p.explicit {
		p.budget = defaultBudget
		if p.limit > 0 {
			p.budget = max(p.limit/4, cfg.MaxValueBytes)
		}
	}
	return p
}

// cgroupMemoryLimit is the memory limit of this process's cgroup (v2's
// memory.max, else v1's memory.limit_in_bytes), or 0 if there is none.
func cgroupMemoryLimit() int64 {
	for _, f := range []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil || v <= 0 || v >= 1<<60 { // "max", or v1's "unlimited"
			return 0
		}
		return v
	}
	return 0
}
