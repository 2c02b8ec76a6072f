package config

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestLoadDefaults(t *testing.T) {
	c, err := Load(map[string]string{})
	if err != nil {
		t.Fatalf("Load(empty) = %v, want nil", err)
	}
	if got, want := c.ListenAddr, ":8080"; got != want {
		t.Errorf("ListenAddr = %q, want %q", got, want)
	}
	if got, want := c.MaxConns, 64; got != want {
		t.Errorf("MaxConnsPerNode = %d, want %d", got, want)
	}
	if got, want := c.Servers, []Server{{"127.0.0.1", 11211, 1}}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Servers = %v, want %v", got, want)
	}
	if got, want := c.Timeout, 500*time.Millisecond; got != want {
		t.Errorf("Timeout = %v, want %v", got, want)
	}
}

func TestLoad(t *testing.T) {
	tests := []struct {
		name    string
		env     map[string]string
		wantErr []string // each must appear in the error
		wantNot []string // none may appear in it
		check   func(Config) error
	}{
		{
			name: "servers with weights and ipv6",
			env:  map[string]string{"MEMCGATE_SERVERS": "mc1:11211, 10.0.0.2:11212:3,[::1]:11213:2"},
			check: func(c Config) error {
				want := "[mc1:11211 10.0.0.2:11212:3 [::1]:11213:2]"
				if got := fmt.Sprint(c.Servers); got != want {
					return fmt.Errorf("Servers = %s, want %s", got, want)
				}
				return nil
			},
		},
		{
			name:    "every bad variable at once",
			env:     map[string]string{"MEMCGATE_SERVERS": "nope", "MEMCGATE_TIMEOUT": "soon", "MEMCGATE_MAX_CONNS_PER_NODE": "0", "MEMCGATE_DISTRIBUTION": "random"},
			wantErr: []string{"MEMCGATE_SERVERS", "MEMCGATE_TIMEOUT", "MEMCGATE_MAX_CONNS_PER_NODE", "MEMCGATE_DISTRIBUTION"},
		},
		{
			// Each is read in one mode of the data connections only:
			// set in the other, it would look like a cap it is not.
			name: "pipelining with gomemcache's pool's settings",
			env:  map[string]string{"MEMCGATE_KEEPALIVE": "32", "MEMCGATE_MAX_CONNS_PER_NODE": "8"},
			wantErr: []string{
				"MEMCGATE_KEEPALIVE: is 32 while MEMCGATE_PIPELINE_CONNS is 2: it sizes the idle connections of gomemcache's pool, used only with PIPELINE_CONNS=0",
				"MEMCGATE_MAX_CONNS_PER_NODE: is 8 while MEMCGATE_PIPELINE_CONNS is 2: it caps the connections of gomemcache's pool",
				"unset MEMCGATE_MAX_CONNS_PER_NODE, or set MEMCGATE_PIPELINE_CONNS=0",
			},
		},
		{
			name:    "gomemcache's pool with pipelining's setting",
			env:     map[string]string{"MEMCGATE_PIPELINE_CONNS": "0", "MEMCGATE_MAX_IN_FLIGHT_PER_NODE": "100"},
			wantErr: []string{"MEMCGATE_MAX_IN_FLIGHT_PER_NODE: is 100 while MEMCGATE_PIPELINE_CONNS is 0: it caps the operations of pipelined connections", "or set MEMCGATE_PIPELINE_CONNS above 0"},
		},
		{
			name:    "a bad PIPELINE_CONNS named alone",
			env:     map[string]string{"MEMCGATE_PIPELINE_CONNS": "many", "MEMCGATE_MAX_IN_FLIGHT_PER_NODE": "100"},
			wantErr: []string{"MEMCGATE_PIPELINE_CONNS"},
			wantNot: []string{"MEMCGATE_MAX_IN_FLIGHT_PER_NODE"},
		},
		{
			name: "each mode with its own settings",
			env:  map[string]string{"MEMCGATE_PIPELINE_CONNS": "0", "MEMCGATE_KEEPALIVE": "8", "MEMCGATE_MAX_CONNS_PER_NODE": "16"},
			check: func(c Config) error {
				if c.MaxIdleConns != 8 || c.MaxConns != 16 {
					return fmt.Errorf("KEEPALIVE, MAX_CONNS_PER_NODE = %d, %d; want 8, 16", c.MaxIdleConns, c.MaxConns)
				}
				return nil
			},
		},
		{
			name:    "bad port and weight",
			env:     map[string]string{"MEMCGATE_SERVERS": "a:0,b:1:x"},
			wantErr: []string{"MEMCGATE_SERVERS", `port "0"`},
		},
		{
			// Named by the variable missing, with what to do, not by the
			// one set as if it were the wrong one.
			name: "a certificate without its key, and a key without its certificate",
			env:  map[string]string{"MEMCGATE_TLS_CERT_FILE": "/etc/memcgate/cert.pem", "MEMCGATE_ADMIN_TLS_KEY_FILE": "/etc/memcgate/key.pem"},
			wantErr: []string{
				"MEMCGATE_TLS_KEY_FILE: is not set while MEMCGATE_TLS_CERT_FILE is: a certificate needs its key; set both or neither",
				"MEMCGATE_ADMIN_TLS_CERT_FILE: is not set while MEMCGATE_ADMIN_TLS_KEY_FILE is: a key needs its certificate; set both or neither",
			},
		},
		{
			name:    "servers separated by spaces",
			env:     map[string]string{"MEMCGATE_SERVERS": "10.0.0.1:11211 10.0.0.2:11211"},
			wantErr: []string{`MEMCGATE_SERVERS: "10.0.0.1:11211 10.0.0.2:11211": has a space: one host:port[:weight] per entry, entries separated by commas`},
		},
		{
			name:    "duplicate server",
			env:     map[string]string{"MEMCGATE_SERVERS": "a:1,a:1"},
			wantErr: []string{"a:1 is listed twice"},
		},
		{
			name:    "negative ttl and fractional",
			env:     map[string]string{"MEMCGATE_DEFAULT_TTL": "1500ms"},
			wantErr: []string{"MEMCGATE_DEFAULT_TTL", "whole seconds"},
		},
		{
			name:    "prefix with space",
			env:     map[string]string{"MEMCGATE_KEY_PREFIX": "a b"},
			wantErr: []string{"MEMCGATE_KEY_PREFIX", "0x20"},
		},
		{
			name: "big values",
			env:  map[string]string{"MEMCGATE_BIG_VALUE_MAX_BYTES": "104857600"},
			check: func(c Config) error {
				if c.BigValueMaxBytes != 100<<20 {
					return fmt.Errorf("BigValueMaxBytes = %d", c.BigValueMaxBytes)
				}
				return nil
			},
		},
		{
			name:    "big values not over the item size",
			env:     map[string]string{"MEMCGATE_BIG_VALUE_MAX_BYTES": "1048000"},
			wantErr: []string{"MEMCGATE_BIG_VALUE_MAX_BYTES: 1048000 is not more than MAX_VALUE_BYTES"},
		},
		{
			name:    "big values negative",
			env:     map[string]string{"MEMCGATE_BIG_VALUE_MAX_BYTES": "-1"},
			wantErr: []string{"MEMCGATE_BIG_VALUE_MAX_BYTES: must not be negative"},
		},
		{
			name: "big values: too many chunks, chunks too large, prefix too long, budget under two chunks",
			env: map[string]string{"MEMCGATE_BIG_VALUE_MAX_BYTES": "1099511627776", "MEMCGATE_MAX_VALUE_BYTES": "1000",
				"MEMCGATE_KEY_PREFIX": strings.Repeat("p", 191), "MEMCGATE_MAX_BUFFERED_BYTES": "1999"},
			wantErr: []string{"MEMCGATE_BIG_VALUE_MAX_BYTES: 1099511627776 would take 16777216 or more chunks", "MEMCGATE_KEY_PREFIX: is 191 bytes; with BIG_VALUE_MAX_BYTES",
				"MEMCGATE_MAX_BUFFERED_BYTES: 1999 is less than two chunks"},
		},
		{
			name:    "big values: chunk size",
			env:     map[string]string{"MEMCGATE_BIG_VALUE_MAX_BYTES": "1073741824", "MEMCGATE_MAX_VALUE_BYTES": "67108865"},
			wantErr: []string{"MEMCGATE_MAX_VALUE_BYTES: 67108865 is the chunk size of values in chunks"},
		},
		{
			name:    "log level",
			env:     map[string]string{"MEMCGATE_LOG_LEVEL": "loud"},
			wantErr: []string{"MEMCGATE_LOG_LEVEL"},
		},
		{
			name: "pecl/memcache modes",
			env: map[string]string{"MEMCGATE_DISTRIBUTION": "pecl-session-consistent-fnv", "MEMCGATE_VALUE_CODEC": "pecl-memcache",
				"MEMCGATE_PECL_COMPRESS_THRESHOLD": "0", "MEMCGATE_PECL_COMPRESS_MIN_SAVINGS": "1"},
			check: func(c Config) error {
				if c.Distribution != "pecl-session-consistent-fnv" || c.ValueCodec != "pecl-memcache" || c.PeclCompressThreshold != 0 || c.PeclCompressMinSavings != 1 {
					return fmt.Errorf("got %q %q %d %v", c.Distribution, c.ValueCodec, c.PeclCompressThreshold, c.PeclCompressMinSavings)
				}
				return nil
			},
		},
		{
			name: "pecl/memcache defaults",
			env:  map[string]string{"MEMCGATE_DISTRIBUTION": "consistent"},
			check: func(c Config) error {
				if c.PeclCompressThreshold != 20000 || c.PeclCompressMinSavings != 0.2 {
					return fmt.Errorf("PECL_COMPRESS_THRESHOLD, _MIN_SAVINGS = %d, %v; want 20000, 0.2", c.PeclCompressThreshold, c.PeclCompressMinSavings)
				}
				return nil
			},
		},
		{
			name:    "unknown distribution lists the known ones",
			env:     map[string]string{"MEMCGATE_DISTRIBUTION": "pecl-consistent-md5"},
			wantErr: []string{"MEMCGATE_DISTRIBUTION", `"pecl-consistent-md5" is not one of ketama, modula, consistent, nginx, pecl-standard-crc32`},
		},
		{
			// Read only for TLS to memcached: set without it, the traffic
			// looks encrypted and is not.
			name: "upstream TLS settings without UPSTREAM_TLS",
			env: map[string]string{"MEMCGATE_UPSTREAM_TLS_CA_FILE": "/etc/memcgate/ca.pem", "MEMCGATE_UPSTREAM_TLS_SERVER_NAME": "memcached",
				"MEMCGATE_UPSTREAM_TLS_INSECURE_SKIP_VERIFY": "true", "MEMCGATE_UPSTREAM_TLS_CERT_FILE": "c.pem", "MEMCGATE_UPSTREAM_TLS_KEY_FILE": "k.pem"},
			wantErr: []string{
				"MEMCGATE_UPSTREAM_TLS_CA_FILE: is set while MEMCGATE_UPSTREAM_TLS is false: memcached is spoken to in plain text",
				"MEMCGATE_UPSTREAM_TLS_SERVER_NAME: is set while MEMCGATE_UPSTREAM_TLS is false",
				"MEMCGATE_UPSTREAM_TLS_INSECURE_SKIP_VERIFY: is set while MEMCGATE_UPSTREAM_TLS is false",
				"MEMCGATE_UPSTREAM_TLS_CERT_FILE: is set while MEMCGATE_UPSTREAM_TLS is false",
				"MEMCGATE_UPSTREAM_TLS_KEY_FILE: is set while MEMCGATE_UPSTREAM_TLS is false",
			},
		},
		{
			name: "upstream TLS settings with UPSTREAM_TLS",
			env:  map[string]string{"MEMCGATE_UPSTREAM_TLS": "true", "MEMCGATE_UPSTREAM_TLS_SERVER_NAME": "memcached", "MEMCGATE_UPSTREAM_TLS_INSECURE_SKIP_VERIFY": "false"},
			check: func(c Config) error {
				if !c.UpstreamTLS || c.UpstreamTLSName != "memcached" {
					return fmt.Errorf("UpstreamTLS, UpstreamTLSName = %v, %q, want true, memcached", c.UpstreamTLS, c.UpstreamTLSName)
				}
				return nil
			},
		},
		{
			// SERVERS' names are resolved by the system's resolver at
			// each dial: a DNS_SERVER beside them is asked by nobody.
			name:    "DNS_SERVER without SERVERS_DNS",
			env:     map[string]string{"MEMCGATE_SERVERS": "memcached-0.memcached:11211", "MEMCGATE_DNS_SERVER": "10.0.0.2:53"},
			wantErr: []string{"MEMCGATE_DNS_SERVER: is set while MEMCGATE_SERVERS_DNS is not: it is the DNS server SERVERS_DNS asks, and nothing else asks it"},
		},
		{
			name: "bad pecl/memcache settings",
			env: map[string]string{"MEMCGATE_VALUE_CODEC": "memcache", "MEMCGATE_PECL_COMPRESS_THRESHOLD": "-1",
				"MEMCGATE_PECL_COMPRESS_MIN_SAVINGS": "1.5"},
			wantErr: []string{`"memcache" is not raw, php or pecl-memcache`, "MEMCGATE_PECL_COMPRESS_THRESHOLD", "MEMCGATE_PECL_COMPRESS_MIN_SAVINGS: must be from 0 to 1"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Load(tt.env)
			if len(tt.wantErr) == 0 {
				if err != nil {
					t.Fatalf("Load(%v) = %v, want nil", tt.env, err)
				}
				if err := tt.check(c); err != nil {
					t.Error(err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Load(%v) = nil, want error mentioning %v", tt.env, tt.wantErr)
			}
			for _, w := range tt.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Load(%v) = %q, want it to mention %q", tt.env, err, w)
				}
			}
			for _, w := range tt.wantNot {
				if strings.Contains(err.Error(), w) {
					t.Errorf("Load(%v) = %q, want it not to mention %q", tt.env, err, w)
				}
			}
			if strings.Contains(err.Error(), "parse error on field") {
				t.Errorf("Load(%v) = %q, want variable names, not Go field names", tt.env, err)
			}
		})
	}
}

func TestVarsDocumented(t *testing.T) {
	for _, v := range Vars() {
		if v.Help == "" {
			t.Errorf("%s has no help text", v.Name)
		}
		if !strings.Contains(Usage(), v.Name) {
			t.Errorf("Usage() does not list %s", v.Name)
		}
	}
}

func TestParseServerHost(t *testing.T) {
	tests := []struct {
		in      string
		want    string // String() of the result; "" for an error
		wantErr string
	}{
		{in: "mc-0.mc_svc:11211", want: "mc-0.mc_svc:11211"},
		{in: "10.0.0.2:1:3", want: "10.0.0.2:1:3"},
		{in: "[::1]:2", want: "[::1]:2"},
		{in: "[fe80::1%eth0]:2", want: "[fe80::1%eth0]:2"},
		{in: "[ ]:1", wantErr: "not an IPv6 address"}, // found by FuzzParseServer
		{in: "[]:1", wantErr: "empty host"},
		{in: "[fe80::1%a b]:1", wantErr: "not an IPv6 address"},
		{in: "[10.0.0.1]:1", wantErr: "not an IPv6 address"},
		{in: "[mc1]:1", wantErr: "not an IPv6 address"},
		{in: "mc 1:1", wantErr: `"mc 1:1": has a space`},
		{in: "10.0.0.1:11211 10.0.0.2:11211", wantErr: "has a space: one host:port[:weight] per entry, entries separated by commas"},
		{in: "10.0.0.1:11211\t10.0.0.2:11211", wantErr: "has a space"},
		{in: "::1:11211", wantErr: "an IPv6 address goes in brackets, as in [::1]:11211"},
		{in: "2001:db8::1:11211:2", wantErr: "an IPv6 address goes in brackets"},
		{in: ":11211", wantErr: "empty host"},
		{in: "[::1]:11211 [::2]:11211", wantErr: "has a space"},
		{in: "mc]:1", wantErr: "not allowed in a host name"},
		{in: "m/c:1", wantErr: "not allowed in a host name"},
	}
	for _, tt := range tests {
		srv, err := ParseServer(tt.in)
		switch {
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("ParseServer(%q) = %v, %v; want an error containing %q", tt.in, srv, err, tt.wantErr)
		case tt.wantErr == "" && (err != nil || srv.String() != tt.want):
			t.Errorf("ParseServer(%q) = %v, %v; want %s", tt.in, srv, err, tt.want)
		}
	}
}

func FuzzParseServer(f *testing.F) {
	for _, s := range []string{"a:1", "[::1]:2:3", "a:b:c", ":1", "[", "a:65536", "[ ]:1", "[fe80::1%eth0]:2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		srv, err := ParseServer(s)
		if err != nil {
			return
		}
		if srv.Port < 1 || srv.Port > 65535 || srv.Weight < 1 || srv.Host == "" {
			t.Fatalf("ParseServer(%q) = %+v, want a valid server or an error", s, srv)
		}
		again, err := ParseServer(srv.String())
		if err != nil || again != srv {
			t.Fatalf("ParseServer(%q).String() = %q does not round-trip: %+v, %v", s, srv.String(), again, err)
		}
	})
}

func ExampleLoad() {
	c, err := Load(map[string]string{
		"MEMCGATE_SERVERS":            "mc-0.mc:11211,mc-1.mc:11211,mc-2.mc:11211:2",
		"MEMCGATE_PIPELINE_CONNS":     "0",
		"MEMCGATE_MAX_CONNS_PER_NODE": "32",
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(c.Servers, c.MaxConns, c.Distribution)
	// Output: [mc-0.mc:11211 mc-1.mc:11211 mc-2.mc:11211:2] 32 ketama
}

// TestParseAllowedHosts: names, .domains, IPs and * pass; what would
// never match a Host compared without its port (a port, a scheme, a
// wildcard other than *) is refused at start, naming the entry.
func TestParseAllowedHosts(t *testing.T) {
	tests := []struct {
		in      string
		want    []string
		wantErr string
	}{
		{"", nil, ""},
		{" , ", nil, ""},
		{"memcgate.internal", []string{"memcgate.internal"}, ""},
		{"a.example, .b.example ,*", []string{"a.example", ".b.example", "*"}, ""},
		{"Cache-1.Internal.,my_host", []string{"Cache-1.Internal.", "my_host"}, ""},
		{"10.0.0.5,::1,[::1]", []string{"10.0.0.5", "::1", "[::1]"}, ""},
		{"memcgate.internal:8080", nil, "without scheme, port or path"},
		{"http://memcgate.internal", nil, "without scheme, port or path"},
		{"*.example.com", nil, "write .example.com"},
		{"..example.com", nil, "is not a host name"},
		{".", nil, "is not a host name"},
		{"a b", nil, "has a space: one host name per entry, entries separated by commas"},
	}
	for _, tt := range tests {
		got, err := ParseAllowedHosts(tt.in)
		switch {
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("ParseAllowedHosts(%q) = %q, %v; want an error mentioning %q", tt.in, got, err, tt.wantErr)
		case tt.wantErr == "" && (err != nil || fmt.Sprint(got) != fmt.Sprint(tt.want)):
			t.Errorf("ParseAllowedHosts(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
	if _, err := Load(map[string]string{"MEMCGATE_ALLOWED_HOSTS": "cache:8080"}); err == nil || !strings.Contains(err.Error(), "MEMCGATE_ALLOWED_HOSTS") {
		t.Errorf("Load with ALLOWED_HOSTS=cache:8080 = %v, want an error naming the variable", err)
	}
}

// TestHeadTimeout: a head gets READ_HEADER_TIMEOUT, never more than
// READ_TIMEOUT, which counts the whole request: net/http alone would give
// it the longer header timeout.
func TestHeadTimeout(t *testing.T) {
	tests := []struct {
		header, read, want time.Duration
	}{
		{5 * time.Second, 30 * time.Second, 5 * time.Second},
		{10 * time.Second, time.Second, time.Second},
		{time.Second, time.Second, time.Second},
	}
	for _, tt := range tests {
		c := Config{ReadHeaderTimeout: tt.header, ReadTimeout: tt.read}
		if got := c.HeadTimeout(); got != tt.want {
			t.Errorf("HeadTimeout(header %s, read %s) = %s, want %s", tt.header, tt.read, got, tt.want)
		}
	}
}
