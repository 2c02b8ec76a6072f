package config

import (
	"strings"
	"testing"
)

// TestListSeparators: every list-valued variable names the separator it
// takes when an entry holds another one (a space, a tab, a ';'), as
// MEMCGATE_SERVERS does, instead of reporting the second entry as part
// of the first (a port of "11211 10.0.0.2"); the variables that take one
// value (SERVERS_DNS, DNS_SERVER) say that they take no list. What each
// takes is what -help and docs/configuration.md say.
func TestListSeparators(t *testing.T) {
	const two = "10.0.0.1:11211,10.0.0.2:11211"
	tests := []struct {
		name    string
		env     map[string]string
		wantErr string // "" for none
	}{
		{name: "SERVERS, a space", env: map[string]string{"MEMCGATE_SERVERS": "10.0.0.1:11211 10.0.0.2:11211"},
			wantErr: `MEMCGATE_SERVERS: "10.0.0.1:11211 10.0.0.2:11211": has a space: one host:port[:weight] per entry, entries separated by commas`},
		{name: "SERVERS, a ';'", env: map[string]string{"MEMCGATE_SERVERS": "10.0.0.1:11211;10.0.0.2:11211"},
			wantErr: `MEMCGATE_SERVERS: "10.0.0.1:11211;10.0.0.2:11211": has a ';': one host:port[:weight] per entry, entries separated by commas`},
		{name: "SERVERS, commas", env: map[string]string{"MEMCGATE_SERVERS": "10.0.0.1:11211, 10.0.0.2:11211"}},

		{name: "SERVERS_DNS, two SRV names and a space", env: map[string]string{"MEMCGATE_SERVERS_DNS": "_mc._tcp.a.svc _mc._tcp.b.svc"},
			wantErr: `MEMCGATE_SERVERS_DNS: "_mc._tcp.a.svc _mc._tcp.b.svc": has a space: one _service._proto.name or name:port (the name's records give every node), not a list`},
		{name: "SERVERS_DNS, two SRV names and a comma", env: map[string]string{"MEMCGATE_SERVERS_DNS": "_mc._tcp.a.svc,_mc._tcp.b.svc"},
			wantErr: `MEMCGATE_SERVERS_DNS: "_mc._tcp.a.svc,_mc._tcp.b.svc": has a ',': one _service._proto.name or name:port`},
		{name: "SERVERS_DNS, two names and a space", env: map[string]string{"MEMCGATE_SERVERS_DNS": "mc-a:11211 mc-b:11211"},
			wantErr: `MEMCGATE_SERVERS_DNS: "mc-a:11211 mc-b:11211": has a space: one _service._proto.name or name:port`},
		{name: "SERVERS_DNS, two names and a comma", env: map[string]string{"MEMCGATE_SERVERS_DNS": "mc-a:11211,mc-b:11211"},
			wantErr: `MEMCGATE_SERVERS_DNS: "mc-a:11211,mc-b:11211": has a ',': one _service._proto.name or name:port`},
		{name: "SERVERS_DNS, an SRV name with a bad byte", env: map[string]string{"MEMCGATE_SERVERS_DNS": "_mc._tcp.a/b"},
			wantErr: `MEMCGATE_SERVERS_DNS: "_mc._tcp.a/b": character '/' is not allowed in an SRV name`},
		{name: "SERVERS_DNS, an SRV name", env: map[string]string{"MEMCGATE_SERVERS_DNS": "_memcache._tcp.mc.cache.svc.cluster.local"}},
		{name: "SERVERS_DNS, a name and port", env: map[string]string{"MEMCGATE_SERVERS_DNS": "mc.cache.svc:11211"}},

		{name: "DNS_SERVER, two and a space", env: map[string]string{"MEMCGATE_SERVERS_DNS": "_mc._tcp.a", "MEMCGATE_DNS_SERVER": "10.0.0.2:53 10.0.0.3:53"},
			wantErr: `MEMCGATE_DNS_SERVER: "10.0.0.2:53 10.0.0.3:53": has a space: one host:port (the resolver asks one server), not a list`},
		{name: "DNS_SERVER, two and a comma", env: map[string]string{"MEMCGATE_SERVERS_DNS": "_mc._tcp.a", "MEMCGATE_DNS_SERVER": "10.0.0.2:53,10.0.0.3:53"},
			wantErr: `MEMCGATE_DNS_SERVER: "10.0.0.2:53,10.0.0.3:53": has a ',': one host:port (the resolver asks one server), not a list`},
		{name: "DNS_SERVER, a weight", env: map[string]string{"MEMCGATE_SERVERS_DNS": "_mc._tcp.a", "MEMCGATE_DNS_SERVER": "10.0.0.2:53:3"},
			wantErr: `MEMCGATE_DNS_SERVER: "10.0.0.2:53:3": want host:port, without a weight`},
		{name: "DNS_SERVER, one", env: map[string]string{"MEMCGATE_SERVERS_DNS": "_mc._tcp.a", "MEMCGATE_DNS_SERVER": "[::1]:53"}},

		{name: "ALLOWED_HOSTS, a space", env: map[string]string{"MEMCGATE_ALLOWED_HOSTS": "a.example.com b.example.com"},
			wantErr: `MEMCGATE_ALLOWED_HOSTS: "a.example.com b.example.com": has a space: one host name per entry, entries separated by commas`},
		{name: "ALLOWED_HOSTS, a ';'", env: map[string]string{"MEMCGATE_ALLOWED_HOSTS": "a.example.com;.b.example.com"},
			wantErr: `MEMCGATE_ALLOWED_HOSTS: "a.example.com;.b.example.com": has a ';': one host name per entry, entries separated by commas`},
		{name: "ALLOWED_HOSTS, commas", env: map[string]string{"MEMCGATE_ALLOWED_HOSTS": "a.example.com, .b.example.com"}},

		{name: "UDP_PORTS, a space", env: map[string]string{"MEMCGATE_SERVERS": two, "MEMCGATE_UDP_PORTS": "10.0.0.1:11211=11213 10.0.0.2:11211=11213"},
			wantErr: `MEMCGATE_UDP_PORTS: "10.0.0.1:11211=11213 10.0.0.2:11211=11213": has a space: one server=port per entry, entries separated by commas`},
		{name: "UDP_PORTS, a ';'", env: map[string]string{"MEMCGATE_SERVERS": two, "MEMCGATE_UDP_PORTS": "10.0.0.1:11211=11213;10.0.0.2:11211=11213"},
			wantErr: `MEMCGATE_UDP_PORTS: "10.0.0.1:11211=11213;10.0.0.2:11211=11213": has a ';': one server=port per entry`},
		{name: "UDP_PORTS, commas", env: map[string]string{"MEMCGATE_SERVERS": two, "MEMCGATE_UDP_PORTS": "10.0.0.1:11211=11213, 10.0.0.2:11211=11213"}},

		{name: "POOLS, a space after a comma in servers=", env: map[string]string{"MEMCGATE_POOLS": "s servers=10.0.0.3:11211, 10.0.0.4:11211 prefixes=s:"},
			wantErr: `MEMCGATE_POOLS: pool s: "servers=10.0.0.3:11211," is followed by a space: a setting's list has its entries separated by commas alone (servers=HOST:PORT,HOST:PORT), spaces separate settings, and ';' or new lines separate pools`},
		{name: "POOLS, a space after a comma in prefixes=", env: map[string]string{"MEMCGATE_POOLS": "s servers=10.0.0.3:11211 prefixes=s:, c:"},
			wantErr: `MEMCGATE_POOLS: pool s: "prefixes=s:," is followed by a space`},
		{name: "POOLS, pools separated by a comma", env: map[string]string{"MEMCGATE_POOLS": "s servers=10.0.0.3:11211 prefixes=s:, t servers=10.0.0.4:11211 prefixes=t:"},
			wantErr: `MEMCGATE_POOLS: pool s: "prefixes=s:," is followed by a space: a setting's list has its entries separated by commas alone`},
		{name: "POOLS, a space in servers= without a comma", env: map[string]string{"MEMCGATE_POOLS": "s servers=10.0.0.3:11211 10.0.0.4:11211 prefixes=s:"},
			wantErr: `MEMCGATE_POOLS: pool s: "10.0.0.4:11211" is not key=value`},
		{name: "POOLS, two pools", env: map[string]string{"MEMCGATE_POOLS": "s servers=10.0.0.3:11211,10.0.0.4:11211 prefixes=s:,c:; t servers=10.0.0.5:11211 prefixes=t:"}},

		{name: "AUTH_TOKENS, a space", env: map[string]string{"MEMCGATE_AUTH_TOKENS": "read:aaaaaaaaaaaaaaaaaaaa read:bbbbbbbbbbbbbbbbbbbb"},
			wantErr: `MEMCGATE_AUTH_TOKENS: entry 1: the read token has " " at byte 21; a token is printable ASCII without spaces or ';', and entries are separated by ',' or new lines`},
		{name: "MEMC_CMDS_ALLOWED, commas or spaces", env: map[string]string{"MEMCGATE_MEMC_CMDS_ALLOWED": "get, version stats"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Load(tt.env)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("Load(%q) = %v, want nil", tt.env, err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("Load(%q) = %v, want an error containing %q", tt.env, err, tt.wantErr)
			}
		})
	}
}
