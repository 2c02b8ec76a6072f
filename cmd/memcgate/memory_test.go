package main

import (
	"io/fs"
	"testing"
)

// TestCgroupLimit: the memory limit is found in the process's own cgroup
// or the lowest of its ancestors', under the mount of the hierarchy that
// holds it, for cgroup v2, v1 and a hybrid of both; "max" and v1's
// unlimited count as none.
func TestCgroupLimit(t *testing.T) {
	const (
		v2Mount     = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
		v1Mount     = "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
		v1CPUMount  = "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
		unlimitedV1 = "9223372036854771712\n"
	)
	tests := []struct {
		name   string
		self   string
		mounts string
		files  map[string]string
		want   int64
	}{
		{"v2, a container at its mount's root", "0::/\n", v2Mount,
			map[string]string{"/sys/fs/cgroup/memory.max": "268435456\n"}, 268435456},
		{"v2, a systemd service's MemoryMax", "0::/system.slice/memcgate.service\n", v2Mount,
			map[string]string{
				"/sys/fs/cgroup/system.slice/memcgate.service/memory.max": "1073741824\n",
				"/sys/fs/cgroup/system.slice/memory.max":                  "max\n",
			}, 1073741824},
		{"v2, a lower limit on the slice", "0::/kubepods.slice/pod1/ctr\n", v2Mount,
			map[string]string{
				"/sys/fs/cgroup/kubepods.slice/pod1/ctr/memory.max": "max\n",
				"/sys/fs/cgroup/kubepods.slice/pod1/memory.max":     "536870912\n",
				"/sys/fs/cgroup/kubepods.slice/memory.max":          "4294967296\n",
			}, 536870912},
		{"v2, no limit anywhere", "0::/user.slice/session-1.scope\n", v2Mount,
			map[string]string{"/sys/fs/cgroup/user.slice/session-1.scope/memory.max": "max\n"}, 0},
		{"v1, a nested cgroup", "4:memory:/process_api/abc\n1:cpu:/\n", v1CPUMount + v1Mount,
			map[string]string{
				"/sys/fs/cgroup/memory/process_api/abc/memory.limit_in_bytes": "268435456\n",
				"/sys/fs/cgroup/memory/process_api/memory.limit_in_bytes":     unlimitedV1,
				"/sys/fs/cgroup/memory/memory.limit_in_bytes":                 unlimitedV1,
			}, 268435456},
		{"v1, controllers mounted together", "3:cpu,memory:/svc\n",
			"35 31 0:32 / /sys/fs/cgroup/cpu,memory rw - cgroup cgroup rw,cpu,memory\n",
			map[string]string{"/sys/fs/cgroup/cpu,memory/svc/memory.limit_in_bytes": "134217728\n"}, 134217728},
		{"v1, the mount's root is the process's cgroup", "4:memory:/docker/abc\n",
			"35 31 0:32 /docker/abc /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory\n",
			map[string]string{"/sys/fs/cgroup/memory/memory.limit_in_bytes": "67108864\n"}, 67108864},
		{"hybrid: the memory controller in v1", "0::/svc\n4:memory:/svc\n", v2Mount + v1Mount,
			map[string]string{"/sys/fs/cgroup/memory/svc/memory.limit_in_bytes": "268435456\n"}, 268435456},
		// A mount whose root is not the process's cgroup or one above it
		// (a sibling's, or one below: /proc/self/mountinfo shows it with
		// ".." from the reader's cgroup namespace) holds another cgroup's
		// limit, which does not bound this process.
		{"v2, a second mount of a sibling cgroup", "0::/\n",
			v2Mount + "41 30 0:26 /../other /mnt/other rw - cgroup2 cgroup2 rw\n",
			map[string]string{"/sys/fs/cgroup/memory.max": "1073741824\n", "/mnt/other/memory.max": "67108864\n"}, 1073741824},
		{"v2, a second mount of a cgroup below the process's", "0::/svc\n",
			v2Mount + "41 30 0:26 /svc/child /mnt/child rw - cgroup2 cgroup2 rw\n",
			map[string]string{"/sys/fs/cgroup/svc/memory.max": "1073741824\n", "/mnt/child/memory.max": "67108864\n"}, 1073741824},
		{"v1, a mount of another container's cgroup", "4:memory:/docker/abc\n",
			"35 31 0:32 /docker/xyz /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory\n",
			map[string]string{"/sys/fs/cgroup/memory/memory.limit_in_bytes": "67108864\n"}, 0},
		// A mount made outside the process's cgroup namespace, whose root
		// is above the namespace's (unshare -C, the host's cgroup file
		// system mounted into a container with a namespace of its own):
		// its top is an ancestor, the path from it down is not told.
		{"v2, a mount from above the namespace's root", "0::/\n",
			"30 23 0:26 /../.. /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
			map[string]string{"/sys/fs/cgroup/memory.max": "1073741824\n"}, 1073741824},
		// A process outside its cgroup namespace's root: its cgroup is not
		// under the mount, and nothing outside the mount is read.
		{"v2, a cgroup above the namespace's root", "0::/../sib\n", v2Mount,
			map[string]string{"/sys/fs/sib/memory.max": "67108864\n", "/sys/fs/cgroup/memory.max": "1073741824\n"}, 0},
		// mountinfo escapes a space, tab, newline and backslash as octal.
		{"v2, a mount point with a space", "0::/svc\n",
			"30 23 0:26 / /run/my\\040cgroup rw - cgroup2 cgroup2 rw\n",
			map[string]string{"/run/my cgroup/svc/memory.max": "268435456\n"}, 268435456},
		{"v1, a cgroup path with ':' and a space", "4:memory:/a:b c\n",
			"35 31 0:32 /a:b\\040c /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n",
			map[string]string{"/sys/fs/cgroup/memory/memory.limit_in_bytes": "134217728\n"}, 134217728},
		{"no cgroup mounted", "0::/\n", "22 1 0:21 / /proc rw - proc proc rw\n", nil, 0},
		{"a limit file that does not parse", "0::/\n", v2Mount,
			map[string]string{"/sys/fs/cgroup/memory.max": "lots\n"}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			read := func(name string) ([]byte, error) {
				if v, ok := tt.files[name]; ok {
					return []byte(v), nil
				}
				return nil, fs.ErrNotExist
			}
			if got := cgroupLimit(tt.self, tt.mounts, read); got != tt.want {
				t.Errorf("cgroupLimit = %d, want %d", got, tt.want)
			}
		})
	}
}
