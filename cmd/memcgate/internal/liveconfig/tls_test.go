package liveconfig

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/memcgate/memcgate/upstream/route"
)

// TestTLSFilesReloaded: the TLS files in force are watched, and a reload
// that finds their content changed applies it (Options.Apply loads them
// again) and names them under changed; a new path is named under
// needs_restart instead, the content at the running path staying the
// one loaded. Before, a certificate renewed in place changed nothing a
// reload said, and no poll noticed it.
func TestTLSFilesReloaded(t *testing.T) {
	dir := t.TempDir()
	file, cert, key, other := filepath.Join(dir, "memcgate.env"), filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem"), filepath.Join(dir, "other.pem")
	write := func(path, s string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	servers := "MEMCGATE_SERVERS=127.0.0.1:11211\nMEMCGATE_TLS_KEY_FILE=" + key + "\n"
	write(file, servers+"MEMCGATE_TLS_CERT_FILE="+cert+"\n")
	write(cert, "certificate 1\n")
	write(key, "key 1\n")
	write(other, "certificate 2\n")
	r, logs := configFileReloader(t, file)
	applied := 0
	r.applyTo = func(context.Context, Update) ([]route.Change, error) { applied++; return nil, nil }
	r.settle = func(context.Context) bool { return true }
	tests := []struct {
		name        string
		write       func()
		changed     bool     // the watch poll sees a change
		wantChanged []string // the reload's changed
		wantRestart []string // the reload's needs_restart
	}{
		{name: "nothing", write: func() {}},
		{name: "renewed", write: func() { write(cert, "certificate 2\n"); write(key, "key 2\n") }, changed: true,
			wantChanged: []string{"MEMCGATE_TLS_CERT_FILE", "MEMCGATE_TLS_KEY_FILE"}},
		{name: "another path", write: func() { write(file, servers+"MEMCGATE_TLS_CERT_FILE="+other+"\n") }, changed: true,
			wantRestart: []string{"MEMCGATE_TLS_CERT_FILE"}},
		{name: "renewed at the running path", write: func() { write(cert, "certificate 3\n") }, changed: true,
			wantChanged: []string{"MEMCGATE_TLS_CERT_FILE"}, wantRestart: []string{"MEMCGATE_TLS_CERT_FILE"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.write()
			if got := r.filesChanged(); got != tt.changed {
				t.Errorf("filesChanged() = %v, want %v", got, tt.changed)
			}
			before := applied
			r.reload(t.Context(), "file")
			h := r.History()[0]
			if h.Result != "ok" || applied != before+1 {
				t.Fatalf("reload %+v, applied %d times, want ok and applied once:\n%s", h, applied-before, logs.String())
			}
			if !slices.Equal(h.Changed, tt.wantChanged) || !slices.Equal(h.Restart, tt.wantRestart) {
				t.Errorf("reload changed %v, needs_restart %v; want %v, %v", h.Changed, h.Restart, tt.wantChanged, tt.wantRestart)
			}
			if r.filesChanged() {
				t.Errorf("filesChanged() after the reload = true, want false")
			}
		})
	}
}
