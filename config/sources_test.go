package config

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestFilesBounded: a file the configuration names that is far too large
// (here binary garbage) is refused without being read whole, with an
// error short enough to be logged and shown on the status page.
func TestFilesBounded(t *testing.T) {
	dir := t.TempDir()
	big := filepath.Join(dir, "big")
	garbage := bytes.Repeat([]byte("\x00\xff:x,\n"), 4<<20/6)
	if err := os.WriteFile(big, garbage, 0o600); err != nil {
		t.Fatal(err)
	}
	reads := map[string]func() error{
		"SERVERS_FILE":     func() error { _, err := ReadServersFile(big); return err },
		"POOLS_FILE":       func() error { _, err := ReadPoolsFile(big); return err },
		"CONFIG_FILE":      func() error { _, err := ReadEnvFile(big); return err },
		"AUTH_TOKENS_FILE": func() error { _, err := Config{AuthTokensFile: big}.Tokens(); return err },
	}
	for name, read := range reads {
		err := read()
		if err == nil {
			t.Errorf("%s of %d bytes: no error", name, len(garbage))
			continue
		}
		if !strings.Contains(err.Error(), "larger than") || len(err.Error()) > 500 {
			t.Errorf("%s of %d bytes: error of %d bytes, want a short one naming the size limit: %.300s", name, len(garbage), len(err.Error()), err)
		}
	}
}

// TestParseServersErrorsBounded: a servers list with many bad entries
// names a few of them, not all, and bad entries are quoted cut short.
func TestParseServersErrorsBounded(t *testing.T) {
	_, err := ParseServers(strings.Repeat("bad,", 10000) + strings.Repeat("x", 100000))
	if err == nil {
		t.Fatal("no error")
	}
	if len(err.Error()) > 1000 || !strings.Contains(err.Error(), "more") {
		t.Errorf("error of %d bytes, want a short one that says there are more: %.300s", len(err.Error()), err)
	}
}

// nodes returns n servers as SERVERS writes them, named prefix0:1 on.
func nodes(prefix string, n int) string {
	s := make([]string, n)
	for i := range s {
		s[i] = prefix + strconv.Itoa(i) + ":1"
	}
	return strings.Join(s, ",")
}

// TestMaxNodes: MAX_NODES bounds the nodes of the default pool and every
// pool together, whatever their source, and names the source over it.
func TestMaxNodes(t *testing.T) {
	servers := func(prefix string, n int) []Server {
		s, err := ParseServers(nodes(prefix, n))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	pools := func(ns ...int) Pools {
		var out Pools
		for i, n := range ns {
			out = append(out, Pool{Name: "p" + strconv.Itoa(i), Servers: servers("p"+strconv.Itoa(i)+"-", n), Prefixes: []string{strconv.Itoa(i) + ":"}})
		}
		return out
	}
	poolsVar := func(ns ...int) string { return pools(ns...).String() }
	// with is the default configuration with the nodes and bound given,
	// as loadConfig has it once the sources are read.
	with := func(maxNodes int, source string, s []Server) Config {
		c, err := Load(map[string]string{})
		if err != nil {
			t.Fatal(err)
		}
		c.MaxNodes, c.Servers = maxNodes, s
		switch source {
		case "file":
			c.ServersFile = "/s"
		case "dns":
			c.ServersDNS = "_mc._tcp.x"
		}
		return c
	}
	tests := []struct {
		name    string
		check   func() error
		wantErr string // the whole error; "" for none
	}{
		{"default", func() error { _, err := Load(map[string]string{"MEMCGATE_SERVERS": nodes("n", 256)}); return err }, ""},
		{"SERVERS over the default", func() error { _, err := Load(map[string]string{"MEMCGATE_SERVERS": nodes("n", 257)}); return err },
			"MEMCGATE_SERVERS: 257 nodes, more than MEMCGATE_MAX_NODES=256"},
		{"SERVERS at a bound set", func() error {
			_, err := Load(map[string]string{"MEMCGATE_SERVERS": nodes("n", 3), "MEMCGATE_MAX_NODES": "3"})
			return err
		}, ""},
		{"SERVERS and POOLS over", func() error {
			_, err := Load(map[string]string{"MEMCGATE_SERVERS": nodes("n", 2), "MEMCGATE_POOLS": poolsVar(1, 1), "MEMCGATE_MAX_NODES": "3"})
			return err
		}, "MEMCGATE_SERVERS: 2 nodes and 2 in MEMCGATE_POOLS make 4, more than MEMCGATE_MAX_NODES=3"},
		{"a node in two pools counts twice", func() error {
			_, err := Load(map[string]string{"MEMCGATE_SERVERS": "a:1", "MEMCGATE_POOLS": "x servers=a:1 prefixes=x:", "MEMCGATE_MAX_NODES": "1"})
			return err
		}, "MEMCGATE_SERVERS: 1 node and 1 in MEMCGATE_POOLS make 2, more than MEMCGATE_MAX_NODES=1"},
		{"POOLS over with SERVERS_DNS, not read yet", func() error {
			_, err := Load(map[string]string{"MEMCGATE_SERVERS_DNS": "_mc._tcp.x", "MEMCGATE_POOLS": poolsVar(2, 2), "MEMCGATE_MAX_NODES": "3"})
			return err
		}, "MEMCGATE_POOLS: 4 nodes, more than MEMCGATE_MAX_NODES=3"},
		{"zero", func() error { _, err := Load(map[string]string{"MEMCGATE_MAX_NODES": "0"}); return err },
			"MEMCGATE_MAX_NODES: must be at least 1, got 0"},
		{"negative", func() error { _, err := Load(map[string]string{"MEMCGATE_MAX_NODES": "-1"}); return err },
			"MEMCGATE_MAX_NODES: must be at least 1, got -1"},
		{"SERVERS_FILE over", func() error {
			return with(3, "file", servers("n", 4)).ValidateResolvedServers()
		}, "MEMCGATE_SERVERS_FILE /s: 4 nodes, more than MEMCGATE_MAX_NODES=3"},
		{"SERVERS_DNS at the bound", func() error {
			return with(3, "dns", servers("n", 3)).ValidateResolvedServers()
		}, ""},
		{"SERVERS_DNS over", func() error {
			return with(3, "dns", servers("n", 4)).ValidateResolvedServers()
		}, "MEMCGATE_SERVERS_DNS _mc._tcp.x: 4 nodes, more than MEMCGATE_MAX_NODES=3"},
		{"SERVERS_DNS over with POOLS", func() error {
			c := with(3, "dns", servers("n", 2))
			c.Pools = pools(2)
			return c.ValidateResolvedServers()
		}, "MEMCGATE_SERVERS_DNS _mc._tcp.x: 2 nodes and 2 in MEMCGATE_POOLS make 4, more than MEMCGATE_MAX_NODES=3"},
		{"POOLS_FILE over with SERVERS_DNS", func() error {
			return with(3, "dns", servers("n", 2)).ValidatePoolsFile(pools(1, 1))
		}, "MEMCGATE_SERVERS_DNS _mc._tcp.x: 2 nodes and 2 in MEMCGATE_POOLS_FILE make 4, more than MEMCGATE_MAX_NODES=3"},
		{"POOLS_FILE at the bound", func() error {
			return with(4, "", servers("n", 2)).ValidatePoolsFile(pools(1, 1))
		}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.check()
			if got := fmt.Sprint(err); tt.wantErr == "" && err != nil || tt.wantErr != "" && got != tt.wantErr {
				t.Errorf("error = %v, want %q", err, tt.wantErr)
			}
		})
	}
}
