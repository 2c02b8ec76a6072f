package config

import (
	"reflect"
	"strings"
	"testing"
)

func TestParsePools(t *testing.T) {
	for _, tc := range []struct {
		name    string
		text    string
		want    Pools
		wantErr []string
	}{
		{
			name: "two pools, lines and semicolons, comments",
			text: "sessions servers=a:1,b:2,c:3:2 prefixes=session:,cart: replicas=2 write=majority read=hedged miss_fallback=false # sessions\n" +
				"; tmp servers=d:4 prefixes=tmp: distribution=modula failover=fail\n\n",
			want: Pools{
				{Name: "sessions", Servers: []Server{{"a", 1, 1}, {"b", 2, 1}, {"c", 3, 2}}, Prefixes: []string{"session:", "cart:"},
					Replicas: 2, Write: "majority", Read: "hedged", MissFallback: "false"},
				{Name: "tmp", Servers: []Server{{"d", 4, 1}}, Prefixes: []string{"tmp:"}, Distribution: "modula", Failover: "fail"},
			},
		},
		{name: "empty", text: " \n# nothing\n;", want: nil},
		{
			name:    "every mistake at once",
			text:    "a servers=x prefixes= replicas=0 write=some read=fast colour=blue; b=c",
			wantErr: []string{"pool a: servers:", `"prefixes=" is not key=value`, `replicas "0"`, `write "some"`, `read "fast"`, `unknown setting "colour"`, `pool "b=c"`},
		},
		{name: "required", text: "lonely", wantErr: []string{"servers= is required"}},
		{
			name: "warm and shadow",
			text: "new servers=a:1 prefixes=n: warm=old shadow=next shadow_percent=2.5; old servers=b:1; next servers=c:1",
			want: Pools{
				{Name: "new", Servers: []Server{{"a", 1, 1}}, Prefixes: []string{"n:"}, Warm: "old", Shadow: "next", ShadowPercent: 2.5},
				{Name: "old", Servers: []Server{{"b", 1, 1}}},
				{Name: "next", Servers: []Server{{"c", 1, 1}}},
			},
		},
		{name: "shadow percent", text: "a servers=x:1 prefixes=p shadow=b shadow_percent=0; c servers=x:1 prefixes=q shadow_percent=101",
			wantErr: []string{`pool a: shadow_percent "0"`, `pool c: shadow_percent "101"`}},
		{name: "prefix with a control byte", text: "a servers=x:1 prefixes=a\x01b", wantErr: []string{"byte 0x01"}},
		{name: "twice", text: "a servers=x:1 servers=y:2 prefixes=p", wantErr: []string{"servers is given twice"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParsePools(tc.text)
			if len(tc.wantErr) > 0 {
				if err == nil {
					t.Fatalf("ParsePools = %v, want errors %q", got, tc.wantErr)
				}
				for _, w := range tc.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not mention %q", err, w)
					}
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("ParsePools = %+v, %v; want %+v", got, err, tc.want)
			}
			again, err := ParsePools(got.String())
			if err != nil || !reflect.DeepEqual(again, got) {
				t.Errorf("String() %q parses as %+v, %v", got.String(), again, err)
			}
		})
	}
}

func TestLoadPools(t *testing.T) {
	for _, tc := range []struct {
		name    string
		env     map[string]string
		wantErr []string
		most    int // if not 0, the longest the error may be
	}{
		{name: "replicated default pool and a pool", env: map[string]string{
			"MEMCGATE_SERVERS": "a:1,b:1,c:1", "MEMCGATE_REPLICAS": "2", "MEMCGATE_WRITE_POLICY": "first", "MEMCGATE_READ_POLICY": "hedged",
			"MEMCGATE_POOLS": "s servers=d:1,e:1 prefixes=s: replicas=2",
		}},
		{name: "pools across", env: map[string]string{
			"MEMCGATE_POOLS": "main servers=d:1 prefixes=x:; s servers=d:1,d:1 prefixes=s: replicas=3; t servers=e:1 prefixes=s:; s servers=f:1 prefixes=y:",
		}, wantErr: []string{"the default pool's name", "lists d:1 twice", "3 replicas need at least 3 servers", `prefix "s:" goes to pools s and t`, "pool s is defined twice"}},
		{name: "bad replication", env: map[string]string{
			"MEMCGATE_SERVERS": "a:1", "MEMCGATE_REPLICAS": "2", "MEMCGATE_WRITE_POLICY": "quorum", "MEMCGATE_READ_POLICY": "fastest",
			"MEMCGATE_HEDGE_MIN_DELAY": "10ms", "MEMCGATE_HEDGE_MAX_DELAY": "5ms", "MEMCGATE_HEDGE_MAX_PERCENT": "0",
			"MEMCGATE_REPLICA_BACKGROUND_OPS": "0", "MEMCGATE_POOLS": "x servers=b:1 prefixes=x", "MEMCGATE_POOLS_FILE": "/p",
		}, wantErr: []string{"MEMCGATE_REPLICAS: 2 copies need at least 2 servers", "MEMCGATE_WRITE_POLICY", "MEMCGATE_READ_POLICY",
			"MEMCGATE_HEDGE_MAX_DELAY", "MEMCGATE_HEDGE_MAX_PERCENT", "MEMCGATE_REPLICA_BACKGROUND_OPS", "MEMCGATE_POOLS_FILE: and MEMCGATE_POOLS"}},
		{name: "warm-up and shadow", env: map[string]string{
			"MEMCGATE_SERVERS": "a:1", "MEMCGATE_WARM_POOL": "old", "MEMCGATE_SHADOW_POOL": "next", "MEMCGATE_SHADOW_PERCENT": "0.5",
			"MEMCGATE_POOLS": "old servers=b:1; next servers=c:1; s servers=d:1 prefixes=s: warm=old",
		}},
		{name: "warm-up and shadow mistakes", env: map[string]string{
			"MEMCGATE_WARM_POOL": "gone", "MEMCGATE_SHADOW_POOL": "main", "MEMCGATE_SHADOW_PERCENT": "0",
			"MEMCGATE_WARM_DEFAULT_TTL": "0s", "MEMCGATE_WARM_BACKGROUND_OPS": "0", "MEMCGATE_SHADOW_BACKGROUND_BYTES": "0",
			"MEMCGATE_POOLS": "a servers=b:1 prefixes=a: warm=a; b servers=c:1 prefixes=b: warm=x shadow=x; lost servers=d:1; p servers=e:1 prefixes=p: shadow_percent=3",
		}, wantErr: []string{`MEMCGATE_WARM_POOL: "gone" is not a pool`, `MEMCGATE_SHADOW_POOL: "main" is the default pool`,
			"MEMCGATE_SHADOW_PERCENT", "MEMCGATE_WARM_DEFAULT_TTL", "MEMCGATE_WARM_BACKGROUND_OPS", "MEMCGATE_SHADOW_BACKGROUND_BYTES",
			"pool a: warm=a names the pool itself", "pool b: warm=x is not a pool", "pool b: x cannot be both",
			"pool lost: prefixes= is required", "pool p: shadow_percent without shadow="}},
		{name: "a pool that does not parse names its variable", env: map[string]string{"MEMCGATE_POOLS": "x servers=b prefixes=x"},
			wantErr: []string{"MEMCGATE_POOLS: pool x: servers:"}},
		{name: "an empty pool", env: map[string]string{"MEMCGATE_POOLS": "empty prefixes=e:; blank servers= prefixes=b:"},
			wantErr: []string{"MEMCGATE_POOLS", "pool empty: servers= is required", `pool blank: "servers=" is not key=value`}},
		{name: "long names quoted cut short", env: map[string]string{
			"MEMCGATE_POOLS": "p" + strings.Repeat("n", 3000) + " servers=b:1 prefixes=a: warm=w" + strings.Repeat("w", 3000) + "; p" + strings.Repeat("n", 3000) + " servers=c:1 prefixes=c:",
		}, wantErr: []string{"pool p" + strings.Repeat("n", 79) + "… is defined twice", "warm=w" + strings.Repeat("w", 79) + "… is not a pool"}, most: 1000},
		{name: "replicas above a pool's nodes, from REPLICAS", env: map[string]string{
			"MEMCGATE_SERVERS": "a:1,b:1", "MEMCGATE_REPLICAS": "2", "MEMCGATE_POOLS": "one servers=c:1 prefixes=o:",
		}, wantErr: []string{"MEMCGATE_POOLS: pool one: 2 replicas need at least 2 servers, it has 1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(tc.env)
			if len(tc.wantErr) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Load = nil, want %q", tc.wantErr)
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if tc.most > 0 && len(err.Error()) > tc.most {
				t.Errorf("error of %d bytes, want at most %d: %.300q…", len(err.Error()), tc.most, err)
			}
		})
	}
}

func TestValidateResolvedServers(t *testing.T) {
	two := []Server{{"a", 1, 1}, {"b", 1, 1}}
	for _, tc := range []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{name: "enough", cfg: Config{Replicas: 2, ServersFile: "/s", Servers: two}},
		{name: "no replication, no nodes yet", cfg: Config{Replicas: 1, ServersDNS: "_mc._tcp.x"}},
		{name: "file too short", cfg: Config{Replicas: 3, ServersFile: "/s", Servers: two},
			wantErr: "MEMCGATE_REPLICAS: 3 copies need at least 3 servers, SERVERS_FILE /s has 2"},
		{name: "dns too short", cfg: Config{Replicas: 2, ServersDNS: "_mc._tcp.x", Servers: two[:1]},
			wantErr: "MEMCGATE_REPLICAS: 2 copies need at least 2 servers, SERVERS_DNS _mc._tcp.x has 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.ValidateResolvedServers()
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || err.Error() != tc.wantErr) {
				t.Errorf("ValidateResolvedServers() = %v, want %q", err, tc.wantErr)
			}
		})
	}
}
