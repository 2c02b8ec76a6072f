package config

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// TestEnvironErrors: the environment's own mistakes are errors that name
// the variable and say what to do, all reported at once.
func TestEnvironErrors(t *testing.T) {
	tests := []struct {
		name    string
		env     map[string]string
		wantErr []string // each must appear; none: Load must succeed
	}{
		{"transposed letters", map[string]string{"MEMCGATE_SERVRES": "a:1"},
			[]string{"MEMCGATE_SERVRES is not a memcgate variable; did you mean MEMCGATE_SERVERS?"}},
		{"missing underscore", map[string]string{"MEMCGATE_LOGLEVEL": "debug"}, []string{"did you mean MEMCGATE_LOG_LEVEL?"}},
		{"missing letter", map[string]string{"MEMCGATE_TIMOUT": "1s"}, []string{"did you mean MEMCGATE_TIMEOUT?"}},
		{"nested prefix", map[string]string{"MEMCGATE_MEMC_CMD_ALLOWED": "get"}, []string{"did you mean MEMCGATE_MEMC_CMDS_ALLOWED?"}},
		{"the Go field's name", map[string]string{"MEMCGATE_MAX_IDLE_CONNS": "8"}, []string{"did you mean MEMCGATE_KEEPALIVE?"}},
		{"nothing close", map[string]string{"MEMCGATE_COLOUR": "blue"}, []string{"MEMCGATE_COLOUR is not a memcgate variable (memcgate -help lists them)"}},
		// Names guessed from other servers' settings: a word left out, or
		// PORT where the variable is an address.
		{"a word left out", map[string]string{"MEMCGATE_TOKENS": "read:0123456789abcdef"}, []string{"MEMCGATE_TOKENS is not a memcgate variable; did you mean MEMCGATE_AUTH_TOKENS?"}},
		{"a word left out, two variables", map[string]string{"MEMCGATE_LISTEN": ":8080"}, []string{"did you mean MEMCGATE_LISTEN_ADDR or MEMCGATE_LISTEN_SOCKET?"}},
		{"a port for an address", map[string]string{"MEMCGATE_LISTEN_PORT": "8080"}, []string{"did you mean MEMCGATE_LISTEN_ADDR?"}},
		{"a port alone", map[string]string{"MEMCGATE_PORT": "8080"}, []string{"did you mean MEMCGATE_ADMIN_ADDR or MEMCGATE_LISTEN_ADDR?"}},
		{"a word shared by many is no guess", map[string]string{"MEMCGATE_MAX": "1"}, []string{"MEMCGATE_MAX is not a memcgate variable (memcgate -help lists them)"}},
		{"unknown and empty", map[string]string{"MEMCGATE_SERVRES": ""}, []string{"MEMCGATE_SERVRES is not a memcgate variable"}},
		{"test suite switches", map[string]string{"MEMCGATE_TEST_REQUIRE_MEMCACHED": "1"}, nil},
		{"kubernetes service links", map[string]string{"MEMCGATE_PORT": "tcp://10.0.0.1:80", "MEMCGATE_SERVICE_HOST": "10.0.0.1",
			"MEMCGATE_SERVICE_PORT": "80", "MEMCGATE_SERVICE_PORT_HTTP": "80", "MEMCGATE_PORT_80_TCP": "tcp://10.0.0.1:80",
			"MEMCGATE_PORT_80_TCP_ADDR": "10.0.0.1", "MEMCGATE_PORT_80_TCP_PORT": "80", "MEMCGATE_PORT_80_TCP_PROTO": "tcp",
			"MEMCGATE_ADMIN_SERVICE_HOST": "10.0.0.2", "MEMCGATE_ADMIN_PORT_9090_TCP_ADDR": "10.0.0.2"}, nil},
		{"ipv6 service links", map[string]string{"MEMCGATE_PORT": "tcp://[fd00::1]:80", "MEMCGATE_SERVICE_HOST": "fd00::1"}, nil},
		{"a service link's name with a setting's value", map[string]string{"MEMCGATE_ADMIN_PORT": "9091"},
			[]string{"MEMCGATE_ADMIN_PORT is not a memcgate variable; did you mean MEMCGATE_ADMIN_ADDR?"}},
		{"a service host that is no address", map[string]string{"MEMCGATE_LISTEN_SERVICE_HOST": "localhost"},
			[]string{"MEMCGATE_LISTEN_SERVICE_HOST is not a memcgate variable"}},
		{"a service port out of range", map[string]string{"MEMCGATE_SERVICE_PORT": "99999"},
			[]string{"MEMCGATE_SERVICE_PORT is not a memcgate variable"}},
		{"other prefixes are not ours", map[string]string{"MEMCACHED_SERVERS": "x", "GOMEMLIMIT": "1GiB"}, nil},
		{"empty servers", map[string]string{"MEMCGATE_SERVERS": ""},
			[]string{"MEMCGATE_SERVERS: is set but empty; unset it to get the default (127.0.0.1:11211), or give a value"}},
		{"empty listen address", map[string]string{"MEMCGATE_LISTEN_ADDR": "", "MEMCGATE_ADMIN_ADDR": ""},
			[]string{"MEMCGATE_LISTEN_ADDR: is set but empty", "MEMCGATE_ADMIN_ADDR: is set but empty"}},
		{"empty duration and bool", map[string]string{"MEMCGATE_TIMEOUT": "", "MEMCGATE_READ_ONLY": ""},
			[]string{"MEMCGATE_TIMEOUT: is set but empty; unset it to get the default (500ms)", "MEMCGATE_READ_ONLY: is set but empty"}},
		{"empty without a default is a value", map[string]string{"MEMCGATE_KEY_PREFIX": "", "MEMCGATE_AUTH_TOKENS": "", "MEMCGATE_UDP_PORTS": ""}, nil},
		{"all at once", map[string]string{"MEMCGATE_SERVRES": "a:1", "MEMCGATE_SERVERS": "", "MEMCGATE_TIMEOUT": "soon", "MEMCGATE_LISTEN_ADDR": "foo"},
			[]string{"MEMCGATE_SERVRES", "MEMCGATE_SERVERS: is set but empty", "MEMCGATE_TIMEOUT: \"soon\"", "MEMCGATE_LISTEN_ADDR: \"foo\""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Load(tt.env)
			if len(tt.wantErr) == 0 {
				if err != nil {
					t.Fatalf("Load(%v) = %v, want nil", tt.env, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Load(%v) = nil, want an error mentioning %q", tt.env, tt.wantErr)
			}
			for _, w := range tt.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Load(%v) =\n%v\nwant it to mention %q", tt.env, err, w)
				}
			}
		})
	}
}

// TestEmptyOff: a variable whose empty value has a meaning of its own
// takes it, instead of its default.
func TestEmptyOff(t *testing.T) {
	c, err := Load(map[string]string{"MEMCGATE_MEMC_PATH": ""})
	if err != nil {
		t.Fatal(err)
	}
	if c.Memc.Path != "" {
		t.Errorf("MEMCGATE_MEMC_PATH= gives Path %q, want \"\" (the endpoint off)", c.Memc.Path)
	}
	if c, _ := Load(map[string]string{}); c.Memc.Path != "/memc" {
		t.Errorf("unset MEMCGATE_MEMC_PATH gives Path %q, want the default /memc", c.Memc.Path)
	}
}

// TestPlainParseErrors: a value that does not parse is explained without
// Go's package names and error texts.
func TestPlainParseErrors(t *testing.T) {
	tests := []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"MEMCGATE_READ_ONLY": "yes"}, `MEMCGATE_READ_ONLY: "yes" is not true or false`},
		{map[string]string{"MEMCGATE_TIMEOUT": "soon"}, `MEMCGATE_TIMEOUT: "soon" is not a duration such as 500ms, 2s, 1m30s or 1h`},
		{map[string]string{"MEMCGATE_TIMEOUT": "5"}, `MEMCGATE_TIMEOUT: "5" has no unit; write e.g. 5s or 5ms`},
		{map[string]string{"MEMCGATE_KEEPALIVE": "many"}, `MEMCGATE_KEEPALIVE: "many" is not a whole number`},
		{map[string]string{"MEMCGATE_MAX_VALUE_BYTES": "1.5"}, `MEMCGATE_MAX_VALUE_BYTES: "1.5" is not a whole number of bytes (a unit such as MiB is not read)`},
		// A size with a binary unit gets its number of bytes written out.
		{map[string]string{"MEMCGATE_MAX_BUFFERED_BYTES": "64MiB"}, `MEMCGATE_MAX_BUFFERED_BYTES: "64MiB" is not a whole number of bytes: a unit is not read; write 67108864`},
		{map[string]string{"MEMCGATE_BIG_VALUE_MAX_BYTES": "1Gi"}, `MEMCGATE_BIG_VALUE_MAX_BYTES: "1Gi" is not a whole number of bytes: a unit is not read; write 1073741824`},
		{map[string]string{"MEMCGATE_KEEPALIVE": "99999999999999999999"}, `MEMCGATE_KEEPALIVE: "99999999999999999999" is out of range`},
		{map[string]string{"MEMCGATE_PHP_COMPRESSION_FACTOR": "x"}, `MEMCGATE_PHP_COMPRESSION_FACTOR: "x" is not a number`},
		{map[string]string{"MEMCGATE_MEMC_MAX_BODY_BYTES": "1m"}, `MEMCGATE_MEMC_MAX_BODY_BYTES: "1m" is not a whole number of bytes (a unit such as MiB is not read)`},
		{map[string]string{"MEMCGATE_SERVERS": "nope"}, `MEMCGATE_SERVERS: "nope": want host:port[:weight]`},
	}
	for _, tt := range tests {
		_, err := Load(tt.env)
		if err == nil || err.Error() != tt.want {
			t.Errorf("Load(%v) = %v, want exactly %q", tt.env, err, tt.want)
		}
		if err != nil && (strings.Contains(err.Error(), "strconv") || strings.Contains(err.Error(), "time:")) {
			t.Errorf("Load(%v) = %q leaks Go's wording", tt.env, err)
		}
	}
}

func TestListenAddr(t *testing.T) {
	tests := []struct {
		listen, admin string
		wantErr       string // "" = valid
	}{
		{":8080", "127.0.0.1:9090", ""},
		{"0.0.0.0:80", "[::1]:9090", ""},
		{"localhost:8080", "gw-0.internal:9090", ""},
		{"[fe80::1%eth0]:8080", ":9090", ""},
		{"foo", ":9090", `MEMCGATE_LISTEN_ADDR: "foo" is not host:port or :port`},
		{"8080", ":9090", `MEMCGATE_LISTEN_ADDR: "8080" is not host:port or :port`},
		{":http", ":9090", `MEMCGATE_LISTEN_ADDR: ":http": port "http" is not a number from 1 to 65535`},
		{":65536", ":9090", `port "65536" is not a number from 1 to 65535`},
		{":0", ":9090", `MEMCGATE_LISTEN_ADDR: ":0": port 0 would listen on a random port`},
		{":8080", "a b:9090", `MEMCGATE_ADMIN_ADDR: "a b:9090": host "a b"`},
		{":8080", "::1:9090", `MEMCGATE_ADMIN_ADDR: "::1:9090" is not host:port`},
		{":8080", ":8080", `MEMCGATE_ADMIN_ADDR: ":8080" and MEMCGATE_LISTEN_ADDR ":8080" would listen on the same port`},
		{"127.0.0.1:8080", "0.0.0.0:8080", "would listen on the same port"},
		{"127.0.0.1:8080", "127.0.0.2:8080", ""},
	}
	for _, tt := range tests {
		_, err := Load(map[string]string{"MEMCGATE_LISTEN_ADDR": tt.listen, "MEMCGATE_ADMIN_ADDR": tt.admin})
		switch {
		case tt.wantErr == "" && err != nil:
			t.Errorf("LISTEN_ADDR=%q ADMIN_ADDR=%q: %v, want valid", tt.listen, tt.admin, err)
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("LISTEN_ADDR=%q ADMIN_ADDR=%q: %v, want an error containing %q", tt.listen, tt.admin, err, tt.wantErr)
		}
	}
}

func TestWarnings(t *testing.T) {
	tests := []struct {
		env  map[string]string
		want string // "" = no warning
	}{
		{map[string]string{}, ""},
		{map[string]string{"MEMCGATE_REQUEST_TIMEOUT": "1s"}, ""}, // 2 × 500ms
		{map[string]string{"MEMCGATE_REQUEST_TIMEOUT": "900ms"}, "MEMCGATE_REQUEST_TIMEOUT (900ms) is shorter than MEMCGATE_MAX_ATTEMPTS × MEMCGATE_TIMEOUT (2 × 500ms = 1s)"},
		{map[string]string{"MEMCGATE_TIMEOUT": "1s", "MEMCGATE_MAX_ATTEMPTS": "3"}, "(3 × 1s = 3s)"},
		{map[string]string{"MEMCGATE_TIMEOUT": "5s", "MEMCGATE_MAX_ATTEMPTS": "1"}, ""}, // no retry to starve
		{map[string]string{"MEMCGATE_SERVERS": "a:11211", "MEMCGATE_UDP_PORTS": "a:11211=11213"}, ""},
		{map[string]string{"MEMCGATE_SERVERS": "a:11211,b:11211", "MEMCGATE_UDP_PORTS": "a:11211=11213", "MEMCGATE_REPLICAS": "2"}, "MEMCGATE_UDP_PORTS is set but MEMCGATE_REPLICAS is 2"},
		{map[string]string{"MEMCGATE_MAX_BUFFERED_BYTES": "2096000"}, ""}, // two values of 1,048,000
		{map[string]string{"MEMCGATE_MAX_BUFFERED_BYTES": "1500000"}, "MEMCGATE_MAX_BUFFERED_BYTES (1500000) is less than two values of MEMCGATE_MAX_VALUE_BYTES (1048000)"},
		{map[string]string{"MEMCGATE_HEALTH_INTERVAL": "200ms", "MEMCGATE_HEALTH_TIMEOUT": "199ms"}, ""},
		{map[string]string{"MEMCGATE_HEALTH_INTERVAL": "200ms", "MEMCGATE_HEALTH_TIMEOUT": "500ms"}, "MEMCGATE_HEALTH_TIMEOUT (500ms) is not shorter than MEMCGATE_HEALTH_INTERVAL (200ms): a probe round waits for its slowest probe, so while a node does not answer each round runs past the next one's start, which is skipped, and every node is probed every 600ms, not 200ms"},
		{map[string]string{"MEMCGATE_HEALTH_TIMEOUT": "1s"}, "every node is probed every 2s, not 1s"},
	}
	for _, tt := range tests {
		c, err := Load(tt.env)
		if err != nil {
			t.Fatalf("Load(%v): %v", tt.env, err)
		}
		got := strings.Join(c.Warnings(), "\n")
		if tt.want == "" && got != "" || !strings.Contains(got, tt.want) {
			t.Errorf("Warnings() with %v = %q, want %q", tt.env, got, tt.want)
		}
	}
}

func TestEditDistance(t *testing.T) {
	for _, tt := range []struct {
		a, b string
		want int
	}{
		{"", "", 0}, {"SERVERS", "SERVERS", 0}, {"SERVRES", "SERVERS", 1}, {"TIMOUT", "TIMEOUT", 1},
		{"LOGLEVEL", "LOG_LEVEL", 1}, {"ab", "", 2}, {"kitten", "sitting", 3},
	} {
		if got := editDistance(tt.a, tt.b); got != tt.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tt.a, tt.b, got, tt.want)
		}
	}
}

func TestListenSocket(t *testing.T) {
	long := "/" + strings.Repeat("s", maxSocketPath)
	tests := []struct {
		name, path, mode string
		wantMode         os.FileMode
		wantErr          string // "" = valid
	}{
		{"none", "", "", 0o660, ""},
		{"path and default mode", "/run/memcgate/memcgate.sock", "", 0o660, ""},
		{"any local user", "/run/memcgate.sock", "0666", 0o666, ""},
		{"without the leading zero", "/run/memcgate.sock", "600", 0o600, ""},
		{"relative", "memcgate.sock", "", 0, `MEMCGATE_LISTEN_SOCKET: "memcgate.sock" is not an absolute path`},
		{"abstract", "@memcgate", "", 0, `MEMCGATE_LISTEN_SOCKET: "@memcgate" is not an absolute path`},
		{"too long", long, "", 0, fmt.Sprintf("is %d bytes long; a Unix socket path has at most %d", len(long), maxSocketPath)},
		{"decimal", "/run/memcgate.sock", "0668", 0, `MEMCGATE_LISTEN_SOCKET_MODE: "0668" is not an octal file mode from 0000 to 0777`},
		{"too wide", "/run/memcgate.sock", "01777", 0, `MEMCGATE_LISTEN_SOCKET_MODE: "01777" is not an octal file mode`},
		{"words", "/run/memcgate.sock", "rw-rw----", 0, `MEMCGATE_LISTEN_SOCKET_MODE: "rw-rw----" is not an octal file mode`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			environ := map[string]string{}
			if tt.path != "" {
				environ["MEMCGATE_LISTEN_SOCKET"] = tt.path
			}
			if tt.mode != "" {
				environ["MEMCGATE_LISTEN_SOCKET_MODE"] = tt.mode
			}
			c, err := Load(environ)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("Load(%v) = %v, want valid", environ, err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("Load(%v) = %v, want an error containing %q", environ, err, tt.wantErr)
			case tt.wantErr != "":
				return
			}
			if c.ListenSocket != tt.path || c.SocketMode() != tt.wantMode {
				t.Errorf("Load(%v): ListenSocket %q, SocketMode %o; want %q, %o", environ, c.ListenSocket, c.SocketMode(), tt.path, tt.wantMode)
			}
		})
	}
}
