package e2e

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/gatewaytest"
	"github.com/memcgate/memcgate/test/memcachedtest"
)

// TestMemoryLimitOfANestedCgroup: a gateway started in a cgroup below the
// mount's root (as systemd's MemoryMax= or a pod's slice put it) derives
// its byte budget from that cgroup's memory limit, a quarter of it; the
// root's "no limit" does not hide it. The test makes the cgroup below its own, with a limit of
// 384 MiB (a budget of 96 MiB, not the default 64), and starts the
// gateway in it.
func TestMemoryLimitOfANestedCgroup(t *testing.T) {
	t.Parallel()
	const limit = 384 << 20
	dir := childMemoryCgroup(t, limit)
	script := filepath.Join(t.TempDir(), "in-cgroup")
	body := fmt.Sprintf("#!/bin/sh\necho $$ > %s/cgroup.procs || exit 1\nexec %s \"$@\"\n", dir, binary)
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	mc := memcachedtest.Start(t)
	g := gatewaytest.New(t, script, map[string]string{"MEMCGATE_SERVERS": mc.Addr})
	g.Start(t)
	want := []string{
		fmt.Sprintf(`"memory_limit":%d`, limit),
		`"memory_limit_from":"cgroup"`,
		fmt.Sprintf(`"max_buffered_bytes":%d`, limit/4),
	}
	var logs string
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		logs = g.Logs() // written in batches
		if strings.Contains(logs, "memcgate started") || time.Now().After(deadline) {
			break
		}
	}
	for _, w := range want {
		if !strings.Contains(logs, w) {
			t.Errorf("the start line has no %s:\n%s", w, gatewaytest.Tail(logs, 2000))
		}
	}
}

// childMemoryCgroup makes a cgroup below the test's own in the hierarchy
// that holds the memory controller (v1's memory mount, else v2's unified
// one), with a memory limit of limit bytes, and removes it at the end
// of the test (after the gateway in it is killed: cleanups run last
// first).
func childMemoryCgroup(t *testing.T, limit int64) string {
	t.Helper()
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	var v1, v2 string
	for _, line := range strings.Split(string(self), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[1] == "" {
			v2 = parts[2]
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == "memory" {
				v1 = parts[2]
			}
		}
	}
	name := fmt.Sprintf("memcgate-e2e-%d-%d", os.Getpid(), time.Now().UnixNano())
	var parent, file string
	switch {
	case v1 != "":
		parent, file = filepath.Join("/sys/fs/cgroup/memory", v1), "memory.limit_in_bytes"
	case v2 != "":
		parent, file = filepath.Join("/sys/fs/cgroup", v2), "memory.max"
		// A v2 child has the memory controller when its parent passes it.
		_ = os.WriteFile(filepath.Join(parent, "cgroup.subtree_control"), []byte("+memory"), 0)
	default:
		t.Fatalf("no memory cgroup in /proc/self/cgroup:\n%s", self)
	}
	dir := filepath.Join(parent, name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatalf("making a memory cgroup for the gateway (the test runs as root on a machine with cgroups): %v", err)
	}
	t.Cleanup(func() {
		// The killed gateway leaves the cgroup as it is reaped.
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			err := os.Remove(dir)
			if err == nil || errors.Is(err, os.ErrNotExist) || time.Now().After(deadline) {
				if err != nil && !errors.Is(err, os.ErrNotExist) {
					t.Errorf("removing cgroup %s: %v", dir, err)
				}
				return
			}
		}
	})
	if err := os.WriteFile(filepath.Join(dir, file), []byte(fmt.Sprint(limit)), 0); err != nil {
		t.Fatalf("setting the cgroup's memory limit: %v", err)
	}
	return dir
}
