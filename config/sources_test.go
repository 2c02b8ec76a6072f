package config

import (
	"bytes"
	"os"
	"path/filepath"
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
