package memc_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/memcgate/memcgate/config"
)

// TestMemcConfig checks the MEMCGATE_MEMC_* variables: defaults, parsing,
// and that every error names its variable.
func TestMemcConfig(t *testing.T) {
	c, err := config.Load(map[string]string{})
	if err != nil {
		t.Fatalf("Load(defaults) = %v", err)
	}
	want := config.Memc{Path: "/memc", ContentType: "text/plain", MaxBodyBytes: 1 << 20}
	if c.Memc != want {
		t.Errorf("default Memc = %+v, want %+v", c.Memc, want)
	}
	if got := c.Memc.Commands(); got != nil {
		t.Errorf("default Commands() = %q, want nil (all)", got)
	}
	if got := (config.Memc{CmdsAllowed: "get, version  stats"}).Commands(); !slices.Equal(got, []string{"get", "version", "stats"}) {
		t.Errorf("Commands() = %q, want [get version stats]", got)
	}
	tests := []struct {
		name    string
		env     map[string]string
		wantErr string // prefix of one error line; "" = valid
	}{
		{"key path", map[string]string{"MEMCGATE_MEMC_KEY_PATH": "/key/"}, ""},
		{"both off", map[string]string{"MEMCGATE_MEMC_PATH": ""}, ""},
		{"commands", map[string]string{"MEMCGATE_MEMC_CMDS_ALLOWED": "get version stats"}, ""},
		{"flags header", map[string]string{"MEMCGATE_MEMC_FLAGS_HEADER": "X-Memc-Flags"}, ""},
		{"path without /", map[string]string{"MEMCGATE_MEMC_PATH": "memc"}, "MEMCGATE_MEMC_PATH: "},
		{"path with ?", map[string]string{"MEMCGATE_MEMC_PATH": "/memc?x"}, "MEMCGATE_MEMC_PATH: "},
		{"key path without trailing /", map[string]string{"MEMCGATE_MEMC_KEY_PATH": "/key"}, "MEMCGATE_MEMC_KEY_PATH: "},
		{"unknown command", map[string]string{"MEMCGATE_MEMC_CMDS_ALLOWED": "get gets"}, "MEMCGATE_MEMC_CMDS_ALLOWED: "},
		{"command case", map[string]string{"MEMCGATE_MEMC_CMDS_ALLOWED": "GET"}, "MEMCGATE_MEMC_CMDS_ALLOWED: "},
		{"bad header name", map[string]string{"MEMCGATE_MEMC_FLAGS_HEADER": "X Memc"}, "MEMCGATE_MEMC_FLAGS_HEADER: "},
		{"empty content type", map[string]string{"MEMCGATE_MEMC_CONTENT_TYPE": " "}, "MEMCGATE_MEMC_CONTENT_TYPE: "},
		{"zero body cap", map[string]string{"MEMCGATE_MEMC_MAX_BODY_BYTES": "0"}, "MEMCGATE_MEMC_MAX_BODY_BYTES: "},
		{"body cap not a number", map[string]string{"MEMCGATE_MEMC_MAX_BODY_BYTES": "1m"}, "MEMCGATE_MEMC_MAX_BODY_BYTES: "},
		{"bool", map[string]string{"MEMCGATE_MEMC_FLAGS_TO_LAST_MODIFIED": "yes"}, "MEMCGATE_MEMC_FLAGS_TO_LAST_MODIFIED: "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := config.Load(tt.env)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Load(%v) = %v, want no error", tt.env, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Load(%v) = nil, want an error starting %q", tt.env, tt.wantErr)
			}
			found := false
			for line := range strings.SplitSeq(err.Error(), "\n") {
				found = found || strings.HasPrefix(line, tt.wantErr)
			}
			if !found {
				t.Errorf("Load(%v) = %q, want a line starting %q", tt.env, err, tt.wantErr)
			}
		})
	}
}
