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
