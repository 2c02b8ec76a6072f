package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/memcgate/memcgate/test/memcachedtest"
)

// poolNodes returns the nodes of /debug/nodes as "pool/node", sorted
// (the default pool's are "main/…").
func poolNodes(t *testing.T, g *gateway) []string {
	t.Helper()
	resp, err := http.Get(g.Admin + "/debug/nodes")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var ns []struct{ Node, Pool string }
	if err := json.NewDecoder(resp.Body).Decode(&ns); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, n := range ns {
		pool := n.Pool
		if pool == "" {
			pool = "main"
		}
		out = append(out, pool+"/"+n.Node)
	}
	slices.Sort(out)
	return out
}

// configNodes returns the nodes that /debug/config says are in force as
// "pool/node", sorted: MEMCGATE_SERVERS's in the default pool, and each
// pool's of MEMCGATE_POOLS (which holds POOLS_FILE's pools).
func configNodes(t *testing.T, g *gateway) []string {
	t.Helper()
	resp, err := http.Get(g.Admin + "/debug/config")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var dc struct{ Values map[string]string }
	if err := json.NewDecoder(resp.Body).Decode(&dc); err != nil {
		t.Fatal(err)
	}
	var out []string
	for s := range strings.SplitSeq(dc.Values["MEMCGATE_SERVERS"], ",") {
		out = append(out, "main/"+s)
	}
	for entry := range strings.SplitSeq(dc.Values["MEMCGATE_POOLS"], ";") {
		fields := strings.Fields(entry)
		for _, f := range fields {
			if servers, ok := strings.CutPrefix(f, "servers="); ok {
				for s := range strings.SplitSeq(servers, ",") {
					out = append(out, fields[0]+"/"+s)
				}
			}
		}
	}
	slices.Sort(out)
	return out
}

// TestReloadChangesEveryPoolOrNone: a reload of POOLS_FILE that changes
// two pools, one of whose server lists is refused (none of its nodes
// answers while the pool's running nodes are up), changes neither pool:
// both run their nodes as before, /debug/config and /debug/nodes agree,
// the reload counts as refused and the log names the pool refused. A
// reload both pools take changes both.
func TestReloadChangesEveryPoolOrNone(t *testing.T) {
	mcs := memcachedtest.StartN(t, 4)
	dead := []string{"127.0.0.1:" + strconv.Itoa(memcachedtest.DeadPort(t)), "127.0.0.1:" + strconv.Itoa(memcachedtest.DeadPort(t))}
	file := filepath.Join(t.TempDir(), "pools")
	pools := func(a, b []string) string {
		return "a servers=" + strings.Join(a, ",") + " prefixes=a:\n" + "b servers=" + strings.Join(b, ",") + " prefixes=b:\n"
	}
	writeAtomic(t, file, pools([]string{mcs[1].Addr}, []string{mcs[2].Addr}))
	// Reloads on SIGHUP only: one per step.
	g := startGateway(t, map[string]string{"MEMCGATE_SERVERS": mcs[0].Addr, "MEMCGATE_POOLS_FILE": file, "MEMCGATE_WATCH_INTERVAL": "0s"})
	running := []string{"a/" + mcs[1].Addr, "b/" + mcs[2].Addr, "main/" + mcs[0].Addr}
	slices.Sort(running)
	if got := poolNodes(t, g); !slices.Equal(got, running) {
		t.Fatalf("nodes at start = %v, want %v", got, running)
	}

	errs := metric(t, g, "memcgate_config_reloads_total", `{result="error"}`)
	oks := metric(t, g, "memcgate_config_reloads_total", `{result="ok"}`)
	// a gains a node that answers; b's list is nodes that do not.
	writeAtomic(t, file, pools([]string{mcs[1].Addr, mcs[3].Addr}, dead))
	g.Signal(syscall.SIGHUP)
	waitCounted(t, g, "error", errs)
	waitLog(t, g, `pool \"b\": upstream: the new server list refused: no node of it would be up`)
	if strings.Contains(g.Logs(), `pool \"a\": upstream`) {
		t.Errorf("the log names pool a as refused:\n%s", g.Logs())
	}
	if got := poolNodes(t, g); !slices.Equal(got, running) {
		t.Errorf("/debug/nodes after the refused reload = %v, want the running %v", got, running)
	}
	if got := configNodes(t, g); !slices.Equal(got, running) {
		t.Errorf("/debug/config after the refused reload = %v, want the running %v", got, running)
	}
	for _, key := range []string{"/a:k", "/b:k", "/k"} {
		if s := g.do("PUT", key, []byte("v")).status; s != http.StatusCreated {
			t.Errorf("PUT %s after the refused reload = %d, want 201", key, s)
		}
	}
	if v := metric(t, g, "memcgate_config_reloads_total", `{result="ok"}`); v != oks {
		t.Errorf("ok reloads = %v after the refusal, want %v", v, oks)
	}
	waitLog(t, g, "no pool changed")

	// A node that answers beside b's dead ones: both pools change.
	writeAtomic(t, file, pools([]string{mcs[1].Addr, mcs[3].Addr}, append([]string{mcs[2].Addr}, dead...)))
	g.Signal(syscall.SIGHUP)
	waitCounted(t, g, "ok", oks)
	want := []string{"a/" + mcs[1].Addr, "a/" + mcs[3].Addr, "b/" + mcs[2].Addr, "b/" + dead[0], "b/" + dead[1], "main/" + mcs[0].Addr}
	slices.Sort(want)
	if got := poolNodes(t, g); !slices.Equal(got, want) {
		t.Errorf("/debug/nodes after the reload taken = %v, want %v", got, want)
	}
	if got := configNodes(t, g); !slices.Equal(got, want) {
		t.Errorf("/debug/config after the reload taken = %v, want %v", got, want)
	}
}

// reloadRows returns the rows of the status page's reload table, newest
// first, each its cells' text joined by " | ".
func reloadRows(t *testing.T, g *gateway) []string {
	t.Helper()
	resp, err := http.Get(g.Admin + "/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(b), `<table id="reloads">`)
	if !ok {
		return nil
	}
	table, _, _ = strings.Cut(table, "</table>")
	_, body, _ := strings.Cut(table, "<tbody>")
	var out []string
	for row := range strings.SplitSeq(body, "<tr>") {
		if strings.TrimSpace(row) == "" {
			continue
		}
		out = append(out, row)
	}
	return out
}

// TestUnchangedReloadsFolded: SIGHUPs that change nothing, one after the
// other, take one row of the status page's reload history, which counts
// them, and one log line: a row each, a storm of them would push the
// rows of the reloads that changed something out of the history's 20. A
// reload that changes something after them gets its own row.
func TestUnchangedReloadsFolded(t *testing.T) {
	t.Parallel() // its own gateway and memcached; it mostly waits for reloads
	mcs := memcachedtest.StartN(t, 2)
	file := filepath.Join(t.TempDir(), "servers")
	writeAtomic(t, file, mcs[0].Addr)
	g := startGateway(t, map[string]string{"MEMCGATE_SERVERS_FILE": file, "MEMCGATE_WATCH_INTERVAL": "0s"})
	oks := metric(t, g, "memcgate_config_reloads_total", `{result="ok"}`)
	reload := func() {
		t.Helper()
		g.Signal(syscall.SIGHUP)
		oks = waitCounted(t, g, "ok", oks) // one at a time: SIGHUPs sent together coalesce
	}

	writeAtomic(t, file, mcs[0].Addr+"\n"+mcs[1].Addr)
	reload()
	const unchanged = 30 // more than the history's 20 rows
	for range unchanged {
		reload()
	}
	rows := reloadRows(t, g)
	if len(rows) != 2 || !strings.Contains(rows[0], "changed nothing on 29 more reloads") || !strings.Contains(rows[1], "added "+mcs[1].Addr) {
		t.Fatalf("reload rows after %d SIGHUPs that change nothing = %d:\n%s\nwant the folded one and the one that added %s",
			unchanged, len(rows), strings.Join(rows, "\n"), mcs[1].Addr)
	}
	waitLog(t, g, `"added":["`+mcs[1].Addr+`"]`)
	if n := strings.Count(g.Logs(), `"msg":"configuration reloaded"`); n != 2 {
		t.Errorf("%d lines \"configuration reloaded\" for a reload that changed something and %d that changed nothing, want 2:\n%s", n, unchanged, g.Logs())
	}

	writeAtomic(t, file, mcs[1].Addr)
	reload()
	rows = reloadRows(t, g)
	if len(rows) != 3 || !strings.Contains(rows[0], "removed "+mcs[0].Addr) || !strings.Contains(rows[1], "changed nothing on 29 more reloads") {
		t.Errorf("reload rows after a reload that changes something = %d:\n%s\nwant it on its own row above the folded one", len(rows), strings.Join(rows, "\n"))
	}
}
