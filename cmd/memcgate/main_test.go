package main

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/memcgate/memcgate/config"
	"github.com/memcgate/memcgate/gateway"
	"github.com/memcgate/memcgate/upstream"
	"github.com/memcgate/memcgate/upstream/hashring"
)

// TestDistributionsBuild keeps config's list of DISTRIBUTION values, which
// cannot import hashring, in step with the distributions hashring builds.
func TestDistributionsBuild(t *testing.T) {
	members := []hashring.Member{{Host: "10.0.0.1", Port: 11211, Weight: 1}, {Host: "10.0.0.2", Port: 11211, Weight: 2}}
	for _, d := range config.Distributions() {
		if _, err := hashring.New(hashring.Distribution(d), members); err != nil {
			t.Errorf("config accepts MEMCGATE_DISTRIBUTION=%s, but hashring.New: %v", d, err)
		}
	}
}

func TestPeclMemcacheOptions(t *testing.T) {
	tests := []struct {
		env  map[string]string
		want gateway.PeclMemcacheOptions
	}{
		{map[string]string{}, gateway.PeclMemcacheOptions{Threshold: 20000, MinSavings: 0.2}},
		{map[string]string{"MEMCGATE_PECL_COMPRESS_THRESHOLD": "0"}, gateway.PeclMemcacheOptions{Threshold: -1, MinSavings: 0.2}},
		{map[string]string{"MEMCGATE_PECL_COMPRESS_THRESHOLD": "100", "MEMCGATE_PECL_COMPRESS_MIN_SAVINGS": "0"}, gateway.PeclMemcacheOptions{Threshold: 100, MinSavings: -1}},
		{map[string]string{"MEMCGATE_PECL_COMPRESS_MIN_SAVINGS": "0.5"}, gateway.PeclMemcacheOptions{Threshold: 20000, MinSavings: 0.5}},
	}
	for _, tt := range tests {
		cfg, err := config.Load(tt.env)
		if err != nil {
			t.Fatalf("config.Load(%v): %v", tt.env, err)
		}
		if got := peclMemcacheOptions(cfg); got != tt.want {
			t.Errorf("peclMemcacheOptions(%v) = %+v, want %+v", tt.env, got, tt.want)
		}
	}
}

// TestDefaultsAgree: the binary's defaults (config's) are the packages'
// own, so that a default is one value wherever it is written down: the
// options made from an empty environment equal the zero options with the
// packages' defaults filled in, for every field both set.
func TestDefaultsAgree(t *testing.T) {
	cfg, err := config.Load(map[string]string{})
	if err != nil {
		t.Fatal(err)
	}
	up := upstreamOptions(cfg)
	zero := upstream.Options{Servers: up.Servers}.WithDefaults()
	// Fields whose zero value is itself the binary's default, or that the
	// binary sets from a switch rather than a default, are not compared.
	zero.PipelineConns, zero.BatchGets, zero.Health.PassiveFails, zero.FailoverTTL = up.PipelineConns, up.BatchGets, up.Health.PassiveFails, up.FailoverTTL
	zero.Dialer = up.Dialer
	zero.RequestSlots = up.RequestSlots // MAX_REQUESTS, the gateway's default (compared below)
	if !reflect.DeepEqual(up, zero) {
		t.Errorf("upstream options from the default configuration:\n%+v\nthe package's defaults:\n%+v", up, zero)
	}
	gw := gatewayOptions(cfg)
	gzero := gateway.Options{}.WithDefaults()
	gzero.AccessLog, gzero.Codec, gzero.PHP, gzero.PeclMemcache, gzero.MaxRequests = gw.AccessLog, gw.Codec, gw.PHP, gw.PeclMemcache, gw.MaxRequests
	gzero.BigValueGrace = gw.BigValueGrace // WRITE_TIMEOUT + REQUEST_TIMEOUT
	gzero.WriteTimeout = gw.WriteTimeout   // the server's, WRITE_TIMEOUT
	if !reflect.DeepEqual(gw, gzero) {
		t.Errorf("gateway options from the default configuration:\n%+v\nthe package's defaults:\n%+v", gw, gzero)
	}
}

// TestHealthcheckAddress checks that the health check probes the admin
// address the server would listen on, whether the environment or
// CONFIG_FILE sets it, and fails on any answer but 200.
func TestHealthcheckAddress(t *testing.T) {
	ok := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" && r.URL.Path != "/readyz" {
			http.NotFound(w, r)
		}
	}))
	defer ok.Close()
	addr := ok.Listener.Addr().String()
	file := filepath.Join(t.TempDir(), "memcgate.env")
	if err := os.WriteFile(file, []byte("# the admin listener\nMEMCGATE_ADMIN_ADDR="+addr+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		environ map[string]string
		args    []string
		wantErr string
	}{
		{"from the environment", map[string]string{"MEMCGATE_ADMIN_ADDR": addr}, nil, ""},
		{"from CONFIG_FILE", map[string]string{"MEMCGATE_CONFIG_FILE": file}, nil, ""},
		{"CONFIG_FILE over the environment", map[string]string{"MEMCGATE_CONFIG_FILE": file, "MEMCGATE_ADMIN_ADDR": "127.0.0.1:1"}, nil, ""},
		{"another path", map[string]string{"MEMCGATE_ADMIN_ADDR": addr}, []string{"/readyz"}, ""},
		{"not 200", map[string]string{"MEMCGATE_ADMIN_ADDR": addr}, []string{"/nothing"}, "answered 404"},
		{"missing CONFIG_FILE", map[string]string{"MEMCGATE_CONFIG_FILE": file + ".gone"}, nil, "no such file"},
		// A mistyped command line is refused saying how to write it, not
		// with a URL parser's error or by checking one path of two.
		{"a path without its slash", map[string]string{"MEMCGATE_ADMIN_ADDR": addr}, []string{"readyz"}, `healthcheck: "readyz" is not a path: write /readyz`},
		{"two paths", map[string]string{"MEMCGATE_ADMIN_ADDR": addr}, []string{"/readyz", "/healthz"}, "healthcheck takes one PATH, got 2 arguments"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := healthcheck(t.Context(), tt.environ, tt.args)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("healthcheck = %v, want nil", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("healthcheck = %v, want an error with %q", err, tt.wantErr)
			}
		})
	}
}

// TestHelpNamesArguments: -help lists the arguments besides the variables:
// healthcheck, which configuration.md and the image use, and its default
// path are in the command's own output.
func TestHelpNamesArguments(t *testing.T) {
	var out bytes.Buffer
	if err := run(t.Context(), []string{"-help"}, nil, &out, io.Discard, nil); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"MEMCGATE_SERVERS (default", "-help, -version", "healthcheck [PATH]", "for PATH, /healthz by default"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("-help prints no %q:\n%s", want, out.String())
		}
	}
}

// TestCheck: memcgate check passes what a start takes, printing
// "configuration ok", and refuses what a start refuses with the same
// lines, listening on nothing.
func TestCheck(t *testing.T) {
	tests := []struct {
		name    string
		environ map[string]string
		args    []string
		wantOut string
		wantErr string
	}{
		{name: "good", environ: map[string]string{"MEMCGATE_SERVERS": "127.0.0.1:11211"}, wantOut: "configuration ok\n"},
		{name: "warning", environ: map[string]string{"MEMCGATE_REQUEST_TIMEOUT": "100ms"}, wantOut: "warning: MEMCGATE_REQUEST_TIMEOUT (100ms) is shorter than"},
		{name: "misspelt", environ: map[string]string{"MEMCGATE_TIMOUT": "1s"}, wantErr: "invalid configuration:\nMEMCGATE_TIMOUT is not a memcgate variable; did you mean MEMCGATE_TIMEOUT?"},
		{name: "missing file", environ: map[string]string{"MEMCGATE_POOLS_FILE": "/nonexistent/pools"}, wantErr: "MEMCGATE_POOLS_FILE"},
		{name: "an argument", args: []string{"/etc/memcgate/memcgate.env"}, wantErr: "check takes no argument"},
		{name: "FIT_PROCS beside GOMAXPROCS", environ: map[string]string{"MEMCGATE_FIT_PROCS": "true", "GOMAXPROCS": "4"},
			wantOut: "warning: MEMCGATE_FIT_PROCS=true is ignored: GOMAXPROCS=4 sets the processors"},
		// Refused by the router the start builds, past the configuration's
		// own checks: two nodes whose CAS tags (FNV-1a of host:port) clash.
		{name: "a CAS tag clash", environ: map[string]string{"MEMCGATE_SERVERS": "127.3.120.184:11211,127.3.156.24:11211"},
			wantErr: "share the CAS tag ee3207b6"},
		{name: "a token file with no token", environ: map[string]string{"MEMCGATE_AUTH_TOKENS_FILE": emptyFile(t)},
			wantOut: "warning: MEMCGATE_AUTH_TOKENS_FILE gives no token: every request that needs a scope would be refused (401)\nconfiguration ok\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			err := run(t.Context(), append([]string{"check"}, tt.args...), tt.environ, &out, io.Discard, nil)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("check = %v, want an error with %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("check = %v, want nil", err)
			}
			if !strings.Contains(out.String(), tt.wantOut) {
				t.Errorf("check printed %q, want %q in it", out.String(), tt.wantOut)
			}
		})
	}
}

// emptyFile returns the path of an empty file that lasts as long as t.
func emptyFile(t *testing.T) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(f, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}
