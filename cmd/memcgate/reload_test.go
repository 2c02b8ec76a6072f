package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestConfigFileNamesNoOther: CONFIG_FILE cannot name another file from
// inside itself: that file would be neither read nor watched, while the
// configuration in force showed it. Naming itself is harmless.
func TestConfigFileNamesNoOther(t *testing.T) {
	dir := t.TempDir()
	file, other := filepath.Join(dir, "memcgate.env"), filepath.Join(dir, "other.env")
	if err := os.WriteFile(other, []byte("MEMCGATE_READ_ONLY=true\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	environ := map[string]string{"MEMCGATE_CONFIG_FILE": file, "MEMCGATE_SERVERS": "127.0.0.1:11211"}
	if err := os.WriteFile(file, []byte("MEMCGATE_CONFIG_FILE="+file+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := loadConfig(t.Context(), environ); err != nil {
		t.Errorf("a CONFIG_FILE that names itself: %v", err)
	}
	if err := os.WriteFile(file, []byte("MEMCGATE_CONFIG_FILE="+other+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := loadConfig(t.Context(), environ)
	if err == nil || !strings.Contains(err.Error(), "CONFIG_FILE") {
		t.Errorf("a CONFIG_FILE that names another: err = %v, want it refused (CONFIG_FILE in force: %s, READ_ONLY %v)", err, cfg.ConfigFile, cfg.ReadOnly)
	}
}

// TestServersFileDuplicate: SERVERS_FILE is checked as SERVERS is: a node
// listed twice is refused, not given two places on the ring (and, with
// REPLICAS=2, both copies of its keys).
func TestServersFileDuplicate(t *testing.T) {
	file := filepath.Join(t.TempDir(), "servers")
	if err := os.WriteFile(file, []byte("127.0.0.1:11211\n127.0.0.1:11211\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := loadConfig(t.Context(), map[string]string{"MEMCGATE_SERVERS_FILE": file, "MEMCGATE_REPLICAS": "2"})
	if err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("a SERVERS_FILE with a node twice: err = %v, want it refused", err)
	}
}
