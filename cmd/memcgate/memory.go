package main

import (
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
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

// cgroupMemoryLimit is the memory limit of this process's cgroup, or 0
// if there is none: the lowest of its own and its ancestors' limits (v2's
// memory.max, v1's memory.limit_in_bytes), so that a limit set on the
// cgroup a service manager made (systemd's MemoryMax=, a pod's slice) is
// found as well as a container's that is the root of its mount.
func cgroupMemoryLimit() int64 {
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return 0
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return 0
	}
	return cgroupLimit(string(self), string(mounts), os.ReadFile)
}

// cgroupLimit is cgroupMemoryLimit read from the text of
// /proc/self/cgroup and /proc/self/mountinfo, with read for the limits'
// files. Where both hierarchies hold the process (a hybrid system) the
// lower limit counts.
func cgroupLimit(self, mountinfo string, read func(string) ([]byte, error)) int64 {
	var lowest int64
	for _, line := range strings.Split(mountinfo, "\n") {
		// id parent major:minor root mountpoint options [optional...] - fstype source super
		pre, post, ok := strings.Cut(line, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 5 || len(g) < 3 {
			continue
		}
		var path, file string
		switch {
		case g[0] == "cgroup2":
			path, file = cgroupPath(self, func(ctrls string) bool { return ctrls == "" }), "memory.max"
		case g[0] == "cgroup" && slices.Contains(strings.Split(g[2], ","), "memory"):
			path, file = cgroupPath(self, func(ctrls string) bool {
				return slices.Contains(strings.Split(ctrls, ","), "memory")
			}), "memory.limit_in_bytes"
		default:
			continue
		}
		if path == "" {
			continue
		}
		root, mount := unescapeMountinfo(f[3]), filepath.Clean(unescapeMountinfo(f[4]))
		var rel string
		switch {
		case root == "/":
			rel = path
		case path == root || strings.HasPrefix(path, root+"/"):
			rel = path[len(root):] // the mount's root is the process's cgroup or one above it
		case onlyUp(root) && !strings.HasPrefix(path, "/.."):
			// Above the process's cgroup namespace's root ("/../..": a
			// mount made outside the namespace): an ancestor, whose
			// path down to the process's cgroup is not told. Its own
			// limit bounds the process.
			rel = ""
		default:
			// Another cgroup's (a sibling's, one below the process's, or
			// one outside its cgroup namespace, shown with ".."): its
			// limit does not bound this process.
			continue
		}
		start := filepath.Join(mount, rel)
		if start != mount && !strings.HasPrefix(start, mount+"/") {
			continue // a cgroup outside the namespace's root ("/../x"): not under the mount
		}
		for dir := start; ; dir = filepath.Dir(dir) {
			if v := cgroupLimitIn(read, filepath.Join(dir, file)); v > 0 && (lowest == 0 || v < lowest) {
				lowest = v
			}
			if dir == mount || !strings.HasPrefix(dir, mount+"/") {
				break
			}
		}
	}
	return lowest
}

// onlyUp reports whether path, as /proc/self/mountinfo shows a cgroup
// mount's root, is made of ".." alone: a cgroup above the reader's
// cgroup namespace's root.
func onlyUp(path string) bool {
	for _, e := range strings.Split(strings.TrimPrefix(path, "/"), "/") {
		if e != ".." {
			return false
		}
	}
	return path != "/"
}

// unescapeMountinfo undoes /proc/self/mountinfo's escapes of a path
// field: a space, tab, newline or backslash is written as a backslash
// and three octal digits.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && isOctal(s[i+1]) && isOctal(s[i+2]) && isOctal(s[i+3]) {
			b.WriteByte((s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0'))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// isOctal reports whether c is an octal digit.
func isOctal(c byte) bool { return c >= '0' && c <= '7' }

// cgroupPath is the path of the process's cgroup in the hierarchy whose
// controllers field in /proc/self/cgroup (hierarchy-ID:controllers:path)
// match says, or "".
func cgroupPath(self string, match func(ctrls string) bool) string {
	for _, line := range strings.Split(self, "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 && match(parts[1]) && strings.HasPrefix(parts[2], "/") {
			return parts[2]
		}
	}
	return ""
}

// cgroupLimitIn is the limit in file, or 0 if it cannot be read or says
// none ("max", or v1's page-rounded largest number).
func cgroupLimitIn(read func(string) ([]byte, error), file string) int64 {
	b, err := read(file)
	if err != nil {
		return 0
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || v <= 0 || v >= 1<<60 {
		return 0
	}
	return v
}
