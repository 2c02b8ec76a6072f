package config

import (
	"reflect"
	"slices"
	"strings"
	"testing"
)

func TestEffective(t *testing.T) {
	const secret = "s3cr3t-s3cr3t-s3cr3t"
	env := map[string]string{
		"MEMCGATE_SERVERS":         "mc-0.mc:11211,mc-1.mc:11211:2,[::1]:11213",
		"MEMCGATE_FLAP_BACKOFF":    "90s",
		"MEMCGATE_READ_ONLY":       "true",
		"MEMCGATE_AUTH_TOKENS":     "read:" + secret + "1,read+write:" + secret + "2",
		"MEMCGATE_TLS_KEY_FILE":    "/etc/memcgate/key.pem",
		"MEMCGATE_TLS_CERT_FILE":   "/etc/memcgate/cert.pem",
		"MEMCGATE_MEMC_PATH":       "",
		"MEMCGATE_REQUEST_TIMEOUT": "900ms",
	}
	c, err := Load(env)
	if err != nil {
		t.Fatal(err)
	}
	e := c.Effective()
	for name, want := range map[string]string{
		"MEMCGATE_SERVERS":                "mc-0.mc:11211,mc-1.mc:11211:2,[::1]:11213",
		"MEMCGATE_FLAP_BACKOFF":           "1m30s",
		"MEMCGATE_FLAP_BACKOFF_MAX":       "2m",
		"MEMCGATE_TIMEOUT":                "500ms",
		"MEMCGATE_READ_ONLY":              "true",
		"MEMCGATE_AUTH_TOKENS":            "read:REDACTED,read+write:REDACTED",
		"MEMCGATE_TLS_KEY_FILE":           "/etc/memcgate/key.pem", // a path, not a secret
		"MEMCGATE_MEMC_PATH":              "",
		"MEMCGATE_PHP_COMPRESSION_FACTOR": "1.3",
		"MEMCGATE_KEY_PREFIX":             "",
	} {
		if got, ok := e.Values[name]; !ok || got != want {
			t.Errorf("Values[%s] = %q (present %v), want %q", name, got, ok, want)
		}
	}
	if len(e.Values) != len(Vars()) {
		t.Errorf("Values has %d variables, want all %d", len(e.Values), len(Vars()))
	}
	for name, v := range e.Values {
		if strings.Contains(v, secret) {
			t.Errorf("Values[%s] = %q shows a token", name, v)
		}
		if v == "?" {
			t.Errorf("Values[%s]: formatValue has no case for its type", name)
		}
	}
	wantChanged := []string{"MEMCGATE_SERVERS", "MEMCGATE_REQUEST_TIMEOUT", "MEMCGATE_FLAP_BACKOFF", "MEMCGATE_AUTH_TOKENS",
		"MEMCGATE_READ_ONLY", "MEMCGATE_TLS_CERT_FILE", "MEMCGATE_TLS_KEY_FILE", "MEMCGATE_MEMC_PATH"}
	if !slices.Equal(e.Changed, wantChanged) {
		t.Errorf("Changed = %v, want %v", e.Changed, wantChanged)
	}
	if len(e.Warnings) != 1 {
		t.Errorf("Warnings = %q, want the REQUEST_TIMEOUT one", e.Warnings)
	}
}

// TestEffectiveRoundTrips: the values Effective shows load back into the
// same configuration, so they can be copied into an environment file.
func TestEffectiveRoundTrips(t *testing.T) {
	for _, env := range []map[string]string{
		{},
		{"MEMCGATE_SERVERS": "a:1:3,[fe80::1%eth0]:2", "MEMCGATE_FLAP_BACKOFF_MAX": "1h", "MEMCGATE_DEFAULT_TTL": "3600s",
			"MEMCGATE_PECL_COMPRESS_MIN_SAVINGS": "0.25", "MEMCGATE_MEMC_CMDS_ALLOWED": "get set", "MEMCGATE_MEMC_PATH": "",
			"MEMCGATE_POOLS": "s servers=b:2,c:3:4 prefixes=s:,t: replicas=2 read=hedged\nu servers=d:1 prefixes=u: miss_fallback=false"},
	} {
		c, err := Load(env)
		if err != nil {
			t.Fatal(err)
		}
		again, err := Load(c.Effective().Values)
		if err != nil {
			t.Fatalf("Load(Effective().Values) of %v: %v", env, err)
		}
		if !reflect.DeepEqual(again, c) {
			t.Errorf("%v: Effective().Values load as\n%+v\nwant\n%+v", env, again, c)
		}
	}
}
