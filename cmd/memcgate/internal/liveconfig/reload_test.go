package liveconfig

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/memcgate/memcgate/config"
	"github.com/memcgate/memcgate/test/dnstest"
	"github.com/memcgate/memcgate/upstream"
	"github.com/memcgate/memcgate/upstream/route"
)

// TestRepeatedRefusalsFolded: a DNS answer refused poll after poll (here
// one over MAX_NODES) is counted every time but logged once, then again
// only repeatLogEvery later with the number of refusals not logged, and
// takes one row of the history, which counts the repeats; a refusal on
// SIGHUP is logged and listed whatever came before.
func TestRepeatedRefusalsFolded(t *testing.T) {
	dns := dnstest.Start(t)
	dns.SetLocalhost(11211)
	environ := map[string]string{"MEMCGATE_SERVERS_DNS": "_memcache._tcp.memcached.test", "MEMCGATE_DNS_SERVER": dns.Addr(), "MEMCGATE_MAX_NODES": "1"}
	cfg, err := Load(t.Context(), environ)
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	reg := prometheus.NewRegistry()
	r := New(cfg, Options{Environ: environ, Log: slog.New(slog.NewJSONHandler(&logs, nil)), Registerer: reg})
	dns.SetLocalhost(11211, 11212)
	const refusal = "MEMCGATE_SERVERS_DNS _memcache._tcp.memcached.test: 2 nodes, more than MEMCGATE_MAX_NODES=1"
	logged := func() int { return strings.Count(logs.String(), refusal) }

	for range 5 {
		r.reload(t.Context(), "dns")
	}
	if n := testutil.ToFloat64(r.reloads.WithLabelValues("error")); n != 5 {
		t.Errorf("%v refused reloads counted, want 5", n)
	}
	if v := testutil.ToFloat64(r.lastOK); v != 0 {
		t.Errorf("memcgate_config_last_reload_successful = %v, want 0", v)
	}
	if n := logged(); n != 1 {
		t.Errorf("5 polls refused the same way logged %d lines, want 1:\n%s", n, logs.String())
	}
	h := r.History()
	if len(h) != 1 || h[0].Repeated != 4 || h[0].Error != refusal {
		t.Fatalf("history = %+v, want one refusal repeated 4 times", h)
	}
	if rows := r.StatusRows(); len(rows) != 1 || !strings.Contains(rows[0].Message, "refused the same on 4 more polls") {
		t.Errorf("status rows = %+v, want one that counts the repeats", rows)
	}

	r.mu.Lock()
	r.repeatLogged = r.repeatLogged.Add(-repeatLogEvery)
	r.mu.Unlock()
	r.reload(t.Context(), "dns")
	if n := logged(); n != 2 || !strings.Contains(logs.String(), `"unlogged_before":4`) {
		t.Errorf("a refusal repeatLogEvery after the last line: %d lines, want 2, the second counting 4 not logged:\n%s", n, logs.String())
	}
	r.reload(t.Context(), "sighup")
	if n := logged(); n != 3 {
		t.Errorf("a refusal on SIGHUP after the DNS polls': %d lines, want 3", n)
	}
	if h := r.History(); len(h) != 2 || h[0].Trigger != "sighup" || h[1].Repeated != 5 {
		t.Errorf("history = %+v, want the SIGHUP's refusal on its own after the DNS polls' one", h)
	}
}

// TestCheckInForce: a reload's configuration is checked as it would run,
// the settings that need a restart at their running values. A check that
// fails only on such a setting, which the reload names under
// needs_restart, does not refuse it, nor does one the configuration read
// fails too once its files are in it (POOLS_FILE's pools).
func TestCheckInForce(t *testing.T) {
	dir := t.TempDir()
	pools := filepath.Join(dir, "pools")
	if err := os.WriteFile(pools, []byte("sess servers=127.0.0.1:11213 prefixes=s:\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	load := func(environ map[string]string) config.Config {
		t.Helper()
		cfg, err := Load(t.Context(), environ)
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	base := map[string]string{
		"MEMCGATE_SERVERS":    "127.0.0.1:11211,127.0.0.1:11212",
		"MEMCGATE_UDP_PORTS":  "127.0.0.1:11212=11213",
		"MEMCGATE_POOLS_FILE": pools,
	}
	with := func(vars ...string) map[string]string {
		out := maps.Clone(base)
		for i := 0; i+1 < len(vars); i += 2 {
			if vars[i+1] == "" {
				delete(out, vars[i])
			} else {
				out[vars[i]] = vars[i+1]
			}
		}
		return out
	}
	started := load(base)
	tests := []struct {
		name    string
		environ map[string]string // the reloaded configuration
		want    string            // in the error; "": none
	}{
		{"nothing changed", base, ""},
		{"a live setting changed", with("MEMCGATE_MAX_REQUESTS", "5"), ""},
		{"budget below the running MAX_VALUE_BYTES", with("MEMCGATE_MAX_VALUE_BYTES", "100000", "MEMCGATE_MAX_BUFFERED_BYTES", "200000"),
			"MEMCGATE_MAX_BUFFERED_BYTES: 200000 is less than MAX_VALUE_BYTES 1048000"},
		{"a node with a UDP port removed, UDP_PORTS for the next start", with("MEMCGATE_SERVERS", "127.0.0.1:11211", "MEMCGATE_UDP_PORTS", ""), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			next := load(tt.environ)
			var restart []string
			for _, v := range config.Diff(started, next) {
				if !slices.Contains(liveNames(), v) {
					restart = append(restart, v)
				}
			}
			cur := started
			config.Copy(&cur, next, liveNames()...)
			err := checkInForce(cur, next, restart)
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("checkInForce = %v, want nil (needs restart: %v)", err, restart)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("checkInForce = %v, want an error saying %q", err, tt.want)
			}
		})
	}
}

// TestStatusRowsKeysBack: the status page's row of a reload that sent
// keys back to nodes that owned them before names those nodes and their
// pool, as the reload's warning does.
func TestStatusRowsKeysBack(t *testing.T) {
	r := &Reloader{history: []Reload{{Trigger: "sighup", Result: "ok", Pools: []route.Change{
		{Pool: "main", Servers: &upstream.Change{Removed: []string{"10.0.0.4:11211"}, KeysBack: []string{"10.0.0.1:11211", "10.0.0.2:11211"}}},
		{Pool: "sess", Policy: []string{"replicas"}},
	}}}}
	rows := r.StatusRows()
	want := "keys back on 10.0.0.1:11211, 10.0.0.2:11211 (pool main): may read stale until written again"
	if len(rows) != 1 || !slices.Contains(rows[0].Changed, want) {
		t.Errorf("status rows = %+v, want one whose changes hold %q", rows, want)
	}
}

// TestUnchangedAgain: a reload that changes nothing is folded into the
// row before it only if that one changed nothing either, by the same
// trigger, with the same settings needing a restart; a reload that
// changes something, or follows a refusal or a change, has a row of its
// own.
func TestUnchangedAgain(t *testing.T) {
	noop := Reload{Trigger: "sighup", Result: "ok"}
	tests := []struct {
		name       string
		last, next Reload
		fold       bool
	}{
		{"nothing after nothing", noop, noop, true},
		{"nothing after nothing, both needing the same restart",
			Reload{Trigger: "sighup", Result: "ok", Restart: []string{"MEMCGATE_LISTEN_ADDR"}},
			Reload{Trigger: "sighup", Result: "ok", Restart: []string{"MEMCGATE_LISTEN_ADDR"}}, true},
		{"nothing after a change", Reload{Trigger: "sighup", Result: "ok", Changed: []string{"MEMCGATE_LOG_LEVEL"}}, noop, false},
		{"nothing after pools changed", Reload{Trigger: "sighup", Result: "ok", Pools: []route.Change{{Pool: "b", Policy: []string{"replicas"}}}}, noop, false},
		{"nothing after a refusal", Reload{Trigger: "sighup", Result: "error", Error: "bad"}, noop, false},
		{"nothing after nothing by another trigger", Reload{Trigger: "file", Result: "ok"}, noop, false},
		{"nothing needing another restart", noop, Reload{Trigger: "sighup", Result: "ok", Restart: []string{"MEMCGATE_LISTEN_ADDR"}}, false},
		{"a change after nothing", noop, Reload{Trigger: "sighup", Result: "ok", Changed: []string{"MEMCGATE_LOG_LEVEL"}}, false},
		{"nodes changed after nothing", noop, Reload{Trigger: "sighup", Result: "ok", Servers: &upstream.Change{Added: []string{"a:1"}}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var logs bytes.Buffer
			r := &Reloader{log: slog.New(slog.NewJSONHandler(&logs, nil)), history: []Reload{tt.last}}
			if got := r.unchangedAgain(t.Context(), tt.next); got != tt.fold {
				t.Fatalf("unchangedAgain = %v, want %v", got, tt.fold)
			}
			if tt.fold && r.history[0].Repeated != 1 {
				t.Errorf("the row folded into counts %d repeats, want 1", r.history[0].Repeated)
			}
			if !tt.fold && r.history[0].Repeated != 0 {
				t.Errorf("a row not folded into counts %d repeats, want 0", r.history[0].Repeated)
			}
		})
	}
}

// TestReadSettled: a reload reads the files of its configuration once
// they have stopped changing, and what it applies is what it read twice:
// a file caught half written (here CONFIG_FILE, cut at a line, as lines
// appended one by one leave it) is read again until two reads agree; a
// file that keeps changing is refused; a file written in place cut in
// the middle of a line is refused however long it stays so, unless the
// file in force had no newline at its end either or it was renamed in
// place. Files whose content is in force are read without a wait.
func TestReadSettled(t *testing.T) {
	const full = "MEMCGATE_SERVERS=127.0.0.1:11211\nMEMCGATE_READ_ONLY=true\nMEMCGATE_MAX_REQUESTS=100\n"
	const half = "MEMCGATE_SERVERS=127.0.0.1:11211\nMEMCGATE_READ_ONLY=true\n"
	rename := func(t *testing.T, path, body string) {
		t.Helper()
		if err := os.WriteFile(path+".tmp", []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".tmp", path); err != nil {
			t.Fatal(err)
		}
	}
	inPlace := func(t *testing.T, path, body string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name    string
		initial string
		write   func(t *testing.T, path string)
		// during writes the file at each wait (its argument counts them
		// from 1); nil leaves it
		during  func(t *testing.T, path string, wait int)
		waits   int    // settle waits
		want    int    // MAX_REQUESTS read
		wantErr string // or what the refusal says
	}{
		{name: "unchanged", initial: full, write: func(*testing.T, string) {}, waits: 0, want: 100},
		{name: "renamed over with the same content", initial: full, write: func(t *testing.T, p string) { rename(t, p, full) }, waits: 0, want: 100},
		{name: "changed whole", initial: half, write: func(t *testing.T, p string) { rename(t, p, full) }, waits: 1, want: 100},
		{name: "read half written, finished during the wait", initial: "MEMCGATE_SERVERS=127.0.0.1:11211\n",
			write: func(t *testing.T, p string) { inPlace(t, p, half) },
			during: func(t *testing.T, p string, wait int) {
				if wait == 1 {
					inPlace(t, p, full)
				}
			},
			waits: 2, want: 100},
		{name: "changing at every read", initial: full, write: func(t *testing.T, p string) { inPlace(t, p, half) },
			during: func(t *testing.T, p string, wait int) { inPlace(t, p, half+fmt.Sprintf("# %d\n", wait)) },
			waits:  settleRounds, wantErr: "changed on every read for 5s: it is being written"},
		{name: "cut in the middle of a line", initial: half, write: func(t *testing.T, p string) { inPlace(t, p, full[:len(full)-2]) },
			waits: 1, wantErr: "ends in the middle of a line"},
		{name: "cut, the file in force had no newline at its end", initial: strings.TrimSuffix(half, "\n"),
			write: func(t *testing.T, p string) { inPlace(t, p, full[:len(full)-2]) }, waits: 1, want: 10},
		{name: "no newline at its end, renamed in place", initial: half,
			write: func(t *testing.T, p string) { rename(t, p, strings.TrimSuffix(full, "\n")) }, waits: 1, want: 100},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "memcgate.env")
			inPlace(t, file, tt.initial)
			environ := map[string]string{"MEMCGATE_CONFIG_FILE": file}
			cfg, err := Load(t.Context(), environ)
			if err != nil {
				t.Fatal(err)
			}
			r := New(cfg, Options{Environ: environ, Log: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry()})
			waits := 0
			r.settle = func(context.Context) bool {
				waits++
				if tt.during != nil {
					tt.during(t, file, waits)
				}
				return true
			}
			tt.write(t, file)
			read, err := r.readSettled(t.Context())
			next := read.next
			if waits != tt.waits {
				t.Errorf("%d settle waits, want %d", waits, tt.waits)
			}
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("readSettled = %v, want an error saying %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if next.MaxRequests != tt.want || !next.ReadOnly {
				t.Errorf("read MAX_REQUESTS=%d READ_ONLY=%v, want %d and true", next.MaxRequests, next.ReadOnly, tt.want)
			}
		})
	}
}

// TestHoldMissing: a running node missing from a SERVERS_DNS answer is
// kept until dnsMissLimit answers in a row miss it, a node new in an
// answer is taken at once; an answer that keeps no running node, one of
// another name, or one the nodes kept would take over MAX_NODES, is
// taken as it is.
func TestHoldMissing(t *testing.T) {
	const name = "_memcache._tcp.memcached.test"
	nodes := func(list string) []config.Server {
		s, err := config.ParseServers(list)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	tests := []struct {
		name     string
		running  string
		dnsName  string
		maxNodes int
		answers  []string // in a row
		want     []string // the nodes each answer gives
		held     float64  // memcgate_dns_held_nodes after the last
	}{
		{name: "a node missing from every other answer stays", running: "a:1,b:1,c:1",
			answers: []string{"a:1,b:1", "a:1,b:1,c:1", "a:1,b:1", "a:1,b:1,c:1", "a:1,b:1"},
			want:    []string{"a:1,b:1,c:1", "a:1,b:1,c:1", "a:1,b:1,c:1", "a:1,b:1,c:1", "a:1,b:1,c:1"}, held: 1},
		{name: "a node gone is removed at the third answer without it", running: "a:1,b:1,c:1",
			answers: []string{"a:1,b:1", "a:1,b:1", "a:1,b:1"},
			want:    []string{"a:1,b:1,c:1", "a:1,b:1,c:1", "a:1,b:1"}},
		{name: "a new node in every answer, the one before gone: at most two held", running: "a:1,n1:1",
			answers: []string{"a:1,n2:1", "a:1,n3:1", "a:1,n4:1", "a:1,n5:1"},
			want:    []string{"a:1,n1:1,n2:1", "a:1,n1:1,n2:1,n3:1", "a:1,n2:1,n3:1,n4:1", "a:1,n3:1,n4:1,n5:1"}, held: 2},
		{name: "a new node in every answer, over MAX_NODES with the nodes kept", running: "a:1,n1:1", maxNodes: 3,
			answers: []string{"a:1,n2:1", "a:1,n3:1", "a:1,n4:1"},
			want:    []string{"a:1,n1:1,n2:1", "a:1,n3:1", "a:1,n3:1,n4:1"}, held: 1},
		{name: "a new node at once", running: "a:1,b:1",
			answers: []string{"a:1,b:1,c:1"}, want: []string{"a:1,b:1,c:1"}},
		{name: "an answer that keeps no running node", running: "a:1,b:1",
			answers: []string{"c:1,d:1"}, want: []string{"c:1,d:1"}},
		{name: "another name", running: "a:1,b:1", dnsName: "_other._tcp.memcached.test",
			answers: []string{"a:1"}, want: []string{"a:1"}},
		{name: "over MAX_NODES with the nodes kept", running: "a:1,b:1", maxNodes: 2,
			answers: []string{"a:1,c:1"}, want: []string{"a:1,c:1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := config.Config{ServersDNS: name, Servers: nodes(tt.running), MaxNodes: 256}
			if tt.maxNodes > 0 {
				cfg.MaxNodes = tt.maxNodes
			}
			r := New(cfg, Options{Environ: map[string]string{}, Log: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry()})
			for i, a := range tt.answers {
				next := cfg
				next.Servers = nodes(a)
				if tt.dnsName != "" {
					next.ServersDNS = tt.dnsName
				}
				r.holdMissing(&next)
				if got := serverList(next.Servers); got != tt.want[i] {
					t.Fatalf("answer %d (%s): nodes %s, want %s", i+1, a, got, tt.want[i])
				}
				r.cur.Servers = next.Servers // as the reload applies them
			}
			if v := testutil.ToFloat64(r.dnsHeld); v != tt.held {
				t.Errorf("memcgate_dns_held_nodes = %v, want %v", v, tt.held)
			}
		})
	}
}

// TestStillWrittenFolded: a file that a writer keeps changing is
// refused by every watch poll that finds it changed; the refusals are
// counted each time but logged and listed once, as a DNS poll's are,
// so that a writer that never stops does not fill the log and the
// status page's rows. A SIGHUP's refusal is logged and listed whatever
// came before.
func TestStillWrittenFolded(t *testing.T) {
	const servers = "MEMCGATE_SERVERS=127.0.0.1:11211\n"
	file := filepath.Join(t.TempDir(), "memcgate.env")
	write := func(n int) {
		t.Helper()
		if err := os.WriteFile(file, []byte(servers+fmt.Sprintf("MEMCGATE_MAX_REQUESTS=%d\n", 100+n)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(0)
	r, logs := configFileReloader(t, file)
	writes := 0
	r.settle = func(context.Context) bool { // the writer changes the file at every wait
		writes++
		write(writes)
		return true
	}
	write(-1)
	logged := func() int { return strings.Count(logs.String(), "it is being written") }

	for range 3 {
		r.reload(t.Context(), "file")
	}
	if n := testutil.ToFloat64(r.reloads.WithLabelValues("error")); n != 3 {
		t.Errorf("%v refused reloads counted, want 3", n)
	}
	if n := logged(); n != 1 {
		t.Errorf("3 watch polls refusing a file still written logged %d lines, want 1:\n%s", n, logs.String())
	}
	if h := r.History(); len(h) != 1 || h[0].Repeated != 2 {
		t.Errorf("history = %+v, want one refusal repeated twice", h)
	}
	r.reload(t.Context(), "sighup")
	if n := logged(); n != 2 {
		t.Errorf("a SIGHUP's refusal after the polls': %d lines, want 2", n)
	}
}

// TestReloadStoppedRecordsNothing: a reload cut short because the
// gateway is stopping (here in its wait for a file being written to
// settle) is no refusal: nothing is logged, counted or listed, and
// memcgate_config_last_reload_successful stays 1.
func TestReloadStoppedRecordsNothing(t *testing.T) {
	file := filepath.Join(t.TempDir(), "memcgate.env")
	if err := os.WriteFile(file, []byte("MEMCGATE_SERVERS=127.0.0.1:11211\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r, logs := configFileReloader(t, file)
	ctx, stop := context.WithCancel(t.Context())
	r.settle = func(context.Context) bool { // SIGTERM during the wait
		stop()
		return false
	}
	if err := os.WriteFile(file, []byte("MEMCGATE_SERVERS=127.0.0.1:11211\nMEMCGATE_READ_ONLY=true\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r.reload(ctx, "sighup")
	if logs.Len() != 0 {
		t.Errorf("a reload cut short by the gateway stopping logged:\n%s", logs.String())
	}
	if n := testutil.ToFloat64(r.reloads.WithLabelValues("error")); n != 0 {
		t.Errorf("%v refused reloads counted, want 0", n)
	}
	if v := testutil.ToFloat64(r.lastOK); v != 1 {
		t.Errorf("memcgate_config_last_reload_successful = %v, want 1", v)
	}
	if h := r.History(); len(h) != 0 {
		t.Errorf("history = %+v, want none", h)
	}
}

// configFileReloader is a reloader started from the CONFIG_FILE file,
// and the buffer it logs into.
func configFileReloader(t *testing.T, file string) (*Reloader, *bytes.Buffer) {
	t.Helper()
	environ := map[string]string{"MEMCGATE_CONFIG_FILE": file}
	cfg, err := Load(t.Context(), environ)
	if err != nil {
		t.Fatal(err)
	}
	logs := new(bytes.Buffer)
	return New(cfg, Options{Environ: environ, Log: slog.New(slog.NewJSONHandler(logs, nil)), Registerer: prometheus.NewRegistry()}), logs
}

// TestReloadWarns: a reload that reads a setting needing a restart asks
// Options.Warn what a restart with the configuration read would stop at,
// and logs each answer as a configuration warning; one that changes
// only live settings does not ask.
func TestReloadWarns(t *testing.T) {
	const servers = "MEMCGATE_SERVERS=127.0.0.1:11211\n"
	file := filepath.Join(t.TempDir(), "memcgate.env")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(file, []byte(servers+s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("MEMCGATE_LISTEN_ADDR=:8080\n")
	environ := map[string]string{"MEMCGATE_CONFIG_FILE": file}
	cfg, err := Load(t.Context(), environ)
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	var asked []string // the LISTEN_ADDR of each configuration Warn was given
	r := New(cfg, Options{
		Environ: environ, Log: slog.New(slog.NewJSONHandler(&logs, nil)), Registerer: prometheus.NewRegistry(),
		Warn: func(_ context.Context, next config.Config) []string {
			asked = append(asked, next.ListenAddr)
			return []string{"the socket is elsewhere: " + next.ListenAddr}
		},
		Apply: func(context.Context, Update) ([]route.Change, error) { return nil, nil },
	})
	r.settle = func(context.Context) bool { return true }

	tests := []struct {
		name      string
		file      string
		wantAsked []string
		wantLog   string // "" for no warning
	}{
		{"live settings only", "MEMCGATE_LISTEN_ADDR=:8080\nMEMCGATE_MAX_REQUESTS=7\n", nil, ""},
		{"a listener moved", "MEMCGATE_LISTEN_ADDR=:8081\n", []string{":8081"}, "the socket is elsewhere: :8081"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			asked = nil
			logs.Reset()
			write(tt.file)
			r.reload(t.Context(), "sighup")
			if h := r.History(); len(h) == 0 || h[0].Result != "ok" {
				t.Fatalf("history = %+v, want the reload applied:\n%s", h, logs.String())
			}
			if !slices.Equal(asked, tt.wantAsked) {
				t.Errorf("Warn asked about LISTEN_ADDR %q, want %q", asked, tt.wantAsked)
			}
			warned := strings.Contains(logs.String(), `"msg":"configuration warning"`)
			if tt.wantLog == "" && warned {
				t.Errorf("a reload of live settings logged a warning:\n%s", logs.String())
			}
			if tt.wantLog != "" && (!warned || !strings.Contains(logs.String(), tt.wantLog)) {
				t.Errorf("log has no configuration warning %q:\n%s", tt.wantLog, logs.String())
			}
		})
	}
}

// TestRestartPendingGauge: a reload that reads a setting only a restart
// applies logs it once, and memcgate_config_restart_pending_settings
// keeps saying so (the file and the process disagree) until a reload
// reads the running value again; a refused reload leaves it as it was.
func TestRestartPendingGauge(t *testing.T) {
	const servers = "MEMCGATE_SERVERS=127.0.0.1:11211\n"
	file := filepath.Join(t.TempDir(), "memcgate.env")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(file, []byte(servers+s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("")
	r, logs := configFileReloader(t, file)
	r.applyTo = func(context.Context, Update) ([]route.Change, error) { return nil, nil }
	r.settle = func(context.Context) bool { return true }
	tests := []struct {
		name string
		file string // "": no reload
		want float64
	}{
		{"at start", "", 0},
		{"a timeout changed", "MEMCGATE_TIMEOUT=1s\n", 1},
		{"and a listener", "MEMCGATE_TIMEOUT=1s\nMEMCGATE_LISTEN_ADDR=:8081\n", 2},
		{"refused", "MEMCGATE_TIMOUT=1s\n", 2},
		{"a live setting only", "MEMCGATE_TIMEOUT=1s\nMEMCGATE_LISTEN_ADDR=:8081\nMEMCGATE_MAX_REQUESTS=7\n", 2},
		{"back to the running values", "MEMCGATE_MAX_REQUESTS=7\n", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.file != "" {
				write(tt.file)
				r.reload(t.Context(), "sighup")
			}
			if v := testutil.ToFloat64(r.pending); v != tt.want {
				t.Errorf("memcgate_config_restart_pending_settings = %v, want %v\n%s", v, tt.want, logs.String())
			}
		})
	}
}

// TestLastSuccessTimestamp: memcgate_config_last_reload_success_timestamp_seconds
// is the start until a reload is applied, then that reload's time; a
// refused reload leaves it, so that "applied how long ago" is one query.
func TestLastSuccessTimestamp(t *testing.T) {
	const servers = "MEMCGATE_SERVERS=127.0.0.1:11211\n"
	file := filepath.Join(t.TempDir(), "memcgate.env")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(file, []byte(servers+s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("")
	before := float64(time.Now().Add(-time.Second).Unix())
	r, _ := configFileReloader(t, file)
	r.applyTo = func(context.Context, Update) ([]route.Change, error) { return nil, nil }
	r.settle = func(context.Context) bool { return true }
	at := func() float64 { return testutil.ToFloat64(r.lastOKAt) }
	start := at()
	if start < before || start > float64(time.Now().Unix()+1) {
		t.Fatalf("at start: %v, want the start's time (about %v)", start, before+1)
	}
	tests := []struct {
		name    string
		file    string
		applied bool
	}{
		{"refused", "MEMCGATE_TIMOUT=1s\n", false},
		{"applied", "MEMCGATE_MAX_REQUESTS=7\n", true},
		{"refused again", "MEMCGATE_MAX_REQUESTS=x\n", false},
	}
	last := start
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			write(tt.file)
			r.reload(t.Context(), "sighup")
			h := r.History()
			if got := h[0].Result == "ok"; got != tt.applied {
				t.Fatalf("reload applied = %v, want %v: %+v", got, tt.applied, h[0])
			}
			want := last
			if tt.applied {
				want = float64(h[0].Time.UnixNano()) / 1e9
			}
			if v := at(); v != want {
				t.Errorf("memcgate_config_last_reload_success_timestamp_seconds = %v, want %v", v, want)
			}
			last = want
		})
	}
}
