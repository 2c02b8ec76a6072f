package liveconfig

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/dnstest"
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
	if _, err := Load(t.Context(), environ); err != nil {
		t.Errorf("a CONFIG_FILE that names itself: %v", err)
	}
	if err := os.WriteFile(file, []byte("MEMCGATE_CONFIG_FILE="+other+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(t.Context(), environ)
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
	_, err := Load(t.Context(), map[string]string{"MEMCGATE_SERVERS_FILE": file, "MEMCGATE_REPLICAS": "2"})
	if err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("a SERVERS_FILE with a node twice: err = %v, want it refused", err)
	}
}

// TestServersDNSAnswers: what a DNS answer makes of the nodes, through
// Load as at start and on every poll: each node once, sorted; an
// SRV target of "." is no node; a record that would reach this host
// (port 0, an unspecified address), no node at all, or more nodes than
// MAX_NODES refuse the answer, naming why.
func TestServersDNSAnswers(t *testing.T) {
	const srvName, aName = "_memcache._tcp.memcached.test", "memcached.test:11211"
	rec := func(target string, port int) dnstest.SRV { return dnstest.SRV{Target: target, Port: port} }
	tests := []struct {
		name    string
		dnsName string
		srv     []dnstest.SRV
		a       []string
		want    string // the nodes, or with wantErr what the error says
		wantErr bool
	}{
		{name: "SRV, duplicates once, sorted", dnsName: srvName,
			srv:  []dnstest.SRV{rec("b.test.", 11211), rec("a.test.", 11211), rec("b.test.", 11211), rec("a.test.", 11212)},
			want: "a.test:11211,a.test:11212,b.test:11211"},
		{name: "SRV at MAX_NODES", dnsName: srvName,
			srv:  []dnstest.SRV{rec("a.test.", 1), rec("b.test.", 1), rec("c.test.", 1)},
			want: "a.test:1,b.test:1,c.test:1"},
		{name: "SRV over MAX_NODES", dnsName: srvName,
			srv:  []dnstest.SRV{rec("a.test.", 1), rec("b.test.", 1), rec("c.test.", 1), rec("d.test.", 1)},
			want: "MEMCGATE_SERVERS_DNS " + srvName + ": 4 nodes, more than MEMCGATE_MAX_NODES=3", wantErr: true},
		{name: "SRV duplicates do not count", dnsName: srvName,
			srv:  []dnstest.SRV{rec("a.test.", 1), rec("a.test.", 1), rec("a.test.", 1), rec("a.test.", 1)},
			want: "a.test:1"},
		{name: "SRV no records", dnsName: srvName, want: "MEMCGATE_SERVERS_DNS " + srvName + ": lookup", wantErr: true},
		{name: "SRV target . only", dnsName: srvName, srv: []dnstest.SRV{rec(".", 11211)},
			want: "MEMCGATE_SERVERS_DNS " + srvName + ": no records name a node", wantErr: true},
		{name: "SRV target . beside a node", dnsName: srvName, srv: []dnstest.SRV{rec(".", 11211), rec("a.test.", 11211)},
			want: "a.test:11211"},
		{name: "SRV port 0", dnsName: srvName, srv: []dnstest.SRV{rec("a.test.", 11211), rec("b.test.", 0)},
			want: "MEMCGATE_SERVERS_DNS " + srvName + ": the record for b.test has port 0", wantErr: true},
		{name: "A, duplicates once", dnsName: aName, a: []string{"10.0.0.2", "10.0.0.1", "10.0.0.2"},
			want: "10.0.0.1:11211,10.0.0.2:11211"},
		{name: "A over MAX_NODES", dnsName: aName, a: []string{"10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"},
			want: "MEMCGATE_SERVERS_DNS " + aName + ": 4 nodes, more than MEMCGATE_MAX_NODES=3", wantErr: true},
		{name: "A unspecified", dnsName: aName, a: []string{"10.0.0.1", "0.0.0.0"},
			want: "MEMCGATE_SERVERS_DNS memcached.test: 0.0.0.0 is no node's address", wantErr: true},
		{name: "A no records", dnsName: aName, want: "MEMCGATE_SERVERS_DNS memcached.test: lookup", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dns := dnstest.Start(t)
			dns.SetSRV(tt.srv...)
			dns.SetA(tt.a...)
			cfg, err := Load(t.Context(), map[string]string{
				"MEMCGATE_SERVERS_DNS": tt.dnsName, "MEMCGATE_DNS_SERVER": dns.Addr(), "MEMCGATE_MAX_NODES": "3",
			})
			if tt.wantErr {
				if err == nil || !strings.HasPrefix(err.Error(), tt.want) {
					t.Fatalf("Load = %v, want an error starting %q", err, tt.want)
				}
				// A failed lookup names the server asked, not the one
				// of /etc/resolv.conf.
				if strings.HasSuffix(tt.want, ": lookup") && !strings.Contains(err.Error(), " on "+dns.Addr()+": ") {
					t.Errorf("Load = %v, want the error to name the DNS server asked, %s", err, dns.Addr())
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, s := range cfg.Servers {
				got = append(got, s.String())
			}
			if strings.Join(got, ",") != tt.want {
				t.Errorf("nodes = %s, want %s", strings.Join(got, ","), tt.want)
			}
		})
	}
}

// TestServersDNSLookupCutByContext: a SERVERS_DNS lookup whose server
// does not answer ends when its context does (a SIGTERM during a
// reload), not at its 5 s timeout: Go's resolver sets the context's
// deadline on its connection but does not watch the context, and a
// gateway asked to stop during such a lookup stopped 5 s later.
func TestServersDNSLookupCutByContext(t *testing.T) {
	for _, name := range []string{"_memcache._tcp.memcached.test", "memcached.test:11211"} {
		t.Run(name, func(t *testing.T) {
			dns := dnstest.Start(t)
			dns.Hang(true)
			ctx, cancel := context.WithCancel(t.Context())
			time.AfterFunc(100*time.Millisecond, cancel)
			start := time.Now()
			_, err := Load(ctx, map[string]string{"MEMCGATE_SERVERS_DNS": name, "MEMCGATE_DNS_SERVER": dns.Addr()})
			if took := time.Since(start); err == nil || took > time.Second {
				t.Errorf("Load cancelled after 100ms = %v after %v, want an error within 1s", err, took)
			}
		})
	}
}
