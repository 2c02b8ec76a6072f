package config

import (
	"fmt"
	"slices"
	"strings"
)

// Memc configures the endpoints compatible with nginx + HttpMemcModule
// (memc-nginx-module); see docs/migrating-from-nginx-memc.md.
type Memc struct {
	Path                string `env:"PATH" envDefault:"/memc" empty:"off" help:"query-style endpoint (?cmd=&key=&val=&flags=&exptime=) like HttpMemcModule's location = /memc; empty turns it off (the path is then an ordinary key)"`
	KeyPath             string `env:"KEY_PATH" help:"path-style prefix like the reference location ~ ^/key/(.+)$ (key from the path, value from the body, command from the method or ?cmd=), e.g. /key/; must start and end with /; empty = off"`
	CmdsAllowed         string `env:"CMDS_ALLOWED" help:"commands the compatible endpoints serve, separated by commas or spaces, like memc_cmds_allowed (others get 403); empty = all: get set add replace append prepend delete incr decr flush_all stats version"`
	FlagsToLastModified bool   `env:"FLAGS_TO_LAST_MODIFIED" envDefault:"false" help:"send a get hit's flags as Last-Modified (Unix seconds), like memc_flags_to_last_modified on"`
	FlagsHeader         string `env:"FLAGS_HEADER" help:"header that echoes $memc_flags on 2xx answers, like add_header X-Memc-Flags $memc_flags (set it to X-Memc-Flags for that); empty = none"`
	ContentType         string `env:"CONTENT_TYPE" envDefault:"text/plain" help:"Content-Type of the bodies the module writes itself (values, STORED, numbers, error lines), nginx's default_type"`
	MaxBodyBytes        int64  `env:"MAX_BODY_BYTES" envDefault:"1048576" help:"largest request body on the compatible endpoints, like client_max_body_size 1m (413 beyond, whatever the command)"`
}

// memcCommands are the commands HttpMemcModule 0.19 supports.
const memcCommands = "get set add replace append prepend delete incr decr flush_all stats version"

// Commands returns the names listed in CmdsAllowed; nil means all.
func (m Memc) Commands() []string {
	names := strings.FieldsFunc(m.CmdsAllowed, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' })
	if len(names) == 0 {
		return nil
	}
	return names
}

// validate checks the Memc settings; each error names its variable.
func (m Memc) validate() []error {
	var errs []error
	bad := func(name, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%sMEMC_%s: %s", Prefix, name, fmt.Sprintf(format, args...)))
	}
	if m.Path != "" && (!strings.HasPrefix(m.Path, "/") || strings.ContainsAny(m.Path, "?#%") || hasCTL(m.Path)) {
		bad("PATH", "%q must start with / and hold no ?, #, %% or control bytes", m.Path)
	}
	if m.KeyPath != "" && (!strings.HasPrefix(m.KeyPath, "/") || !strings.HasSuffix(m.KeyPath, "/") ||
		strings.ContainsAny(m.KeyPath, "?#%") || hasCTL(m.KeyPath)) {
		bad("KEY_PATH", "%q must start and end with / and hold no ?, #, %% or control bytes (e.g. /key/)", m.KeyPath)
	}
	known := strings.Fields(memcCommands)
	for _, c := range m.Commands() {
		if !slices.Contains(known, c) {
			bad("CMDS_ALLOWED", "%q is not a command HttpMemcModule supports (%s; names are case-sensitive)", c, memcCommands)
		}
	}
	if !isToken(m.FlagsHeader) && m.FlagsHeader != "" {
		bad("FLAGS_HEADER", "%q is not a valid header name", m.FlagsHeader)
	}
	if strings.TrimSpace(m.ContentType) == "" || hasCTL(m.ContentType) {
		bad("CONTENT_TYPE", "%q must be a media type such as text/plain", m.ContentType)
	}
	if m.MaxBodyBytes < 1 || m.MaxBodyBytes > 1<<30 {
		bad("MAX_BODY_BYTES", "must be from 1 to 1073741824, got %d", m.MaxBodyBytes)
	}
	return errs
}

func hasCTL(s string) bool {
	return strings.ContainsFunc(s, func(r rune) bool { return r < ' ' || r == 0x7f })
}

// isToken reports whether s is an HTTP token (RFC 9110 §5.6.2), which a
// header name must be.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		ok := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
		if !ok {
			return false
		}
	}
	return true
}
