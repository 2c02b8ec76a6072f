package config

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
)

// maxErrorLine bounds one line of a configuration error: an entry is
// quoted cut (short), and the message around it is a sentence.
const maxErrorLine = 1500

// FuzzPools: whatever MEMCGATE_POOLS holds, ParsePools does not panic;
// each line of its error names the pool it is about (or counts the
// errors left out) and stays short whatever the entry's length; and
// pools it accepts are what their String, the form /debug/config shows,
// reads back as. Accepted by Load too (beside one server), the whole
// configuration reads back from what /debug/config shows of it.
func FuzzPools(f *testing.F) {
	for _, s := range []string{
		"sessions servers=10.0.0.4:11211,10.0.0.5:11211,10.0.0.6:11211 prefixes=session:,cart: replicas=2 write=majority read=hedged",
		"a servers=a:1 prefixes=x # comment\nb servers=[::1]:2:3 prefixes=y; c servers=c:1 prefixes=z warm=a shadow=b shadow_percent=12.5",
		"p servers=h:1 prefixes=q distribution=ketama miss_fallback=true failover=fail",
		"p servers=h:1,h:x,[::1 prefixes=,\x01 replicas=0",
		"p=1", "servers=a:1", "p prefixes=a", "p servers=a:1 servers=b:1 bogus=1 x",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		pools, err := ParsePools(text)
		if err != nil {
			checkErrorLines(t, "POOLS", err.Error(), `^(pool |and \d+ more$)`)
			return
		}
		again, err := ParsePools(pools.String())
		if err != nil || !reflect.DeepEqual(again, pools) {
			t.Fatalf("ParsePools(%q) = %+v, shown as %q, which reads back as %+v, %v", text, pools, pools.String(), again, err)
		}
		c, err := Load(map[string]string{Prefix + "SERVERS": "127.0.0.1:11211", Prefix + "POOLS": text})
		if err == nil {
			roundTrip(t, c)
		}
	})
}

// FuzzServersFile: SERVERS_FILE's contents (and SERVERS') never make
// ParseServers panic; each line of its error names the entry it is
// about, quoted and cut short; and servers it accepts read back from
// what /debug/config shows of them (joined by commas).
func FuzzServersFile(f *testing.F) {
	for _, s := range []string{
		"10.0.0.1:11211\n10.0.0.2:11211:2 # the big one\n[::1]:11211,[fe80::1%eth0]:2",
		"a:1, b:2\n\n#c:3", "a:1 b:2", "::1:11211", "[::1]11211", "a:0", "a:1:1001", "", "#", "a:b:c:d",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		servers, err := ParseServers(text)
		if err != nil {
			checkErrorLines(t, "SERVERS", err.Error(), `^("|and \d+ more$|no servers$|empty server$)`)
			return
		}
		shown := formatValue(reflect.ValueOf(servers))
		again, err := ParseServers(shown)
		if err != nil || !reflect.DeepEqual(again, servers) {
			t.Fatalf("ParseServers(%q) = %v, shown as %q, which reads back as %v, %v", text, servers, shown, again, err)
		}
	})
}

// FuzzConfigFile: whatever a CONFIG_FILE holds, ReadEnvFile does not
// panic; each line of its error names the file's line it is about and
// quotes no value (a value may be a token); the variables it accepts,
// written back one NAME="value" a line, read back the same; and what
// Load then accepts reads back from what /debug/config shows of it.
func FuzzConfigFile(f *testing.F) {
	for _, s := range []string{
		"# memcgate\nMEMCGATE_SERVERS=10.0.0.1:11211,10.0.0.2:11211\nexport MEMCGATE_LISTEN=':8080'\n; comment\nMEMCGATE_TIMEOUT=\"250ms\"\n",
		"\ufeffMEMCGATE_POOLS=s servers=a:1 prefixes=x; t servers=b:2 prefixes=y\nMEMCGATE_SERVERS=c:3",
		"MEMCGATE_AUTH_TOKENS=read:abcdefghijklmnopqrstuv\\\nwrite:zzzzzzzzzzzzzzzzzzzzzz=\n",
		"MEMCGATE_SERVERS=a:1 # not a comment\nGOMAXPROCS=2\n9X=1\nMEMCGATE_LISTEN=\"unterminated\nfoo\n",
		"MEMCGATE_MAX_VALUE_BYTES=1x\nMEMCGATE_SERVERS=a:1\nMEMCGATE_UNKNOWN_THING=1",
	} {
		f.Add(s)
	}
	path := filepath.Join(f.TempDir(), "memcgate.env")
	f.Fuzz(func(t *testing.T, text string) {
		if len(text) > MaxFileBytes {
			t.Skip("larger than a configuration file may be")
		}
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		vars, err := ReadEnvFile(path)
		if err != nil {
			msg := err.Error()
			checkErrorLines(t, "CONFIG_FILE", msg, `^(`+Prefix+`CONFIG_FILE \S+, line \d+: |and \d+ more$)`)
			for _, line := range strings.Split(text, "\n") {
				_, value, ok := strings.Cut(line, "=")
				if value = strings.Trim(strings.TrimSpace(value), `"'`); ok && len(value) >= 16 && strings.Contains(msg, value) {
					t.Fatalf("the error for %q quotes a value, %q:\n%s", text, value, msg)
				}
			}
			return
		}
		var b strings.Builder
		for name, value := range vars {
			b.WriteString(name + `="` + value + "\"\n")
		}
		if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
			t.Fatal(err)
		}
		again, err := ReadEnvFile(path)
		if err != nil || !reflect.DeepEqual(again, vars) && len(vars) > 0 {
			t.Fatalf("ReadEnvFile(%q) = %q, written back as %q, which reads as %q, %v", text, vars, b.String(), again, err)
		}
		if c, err := Load(vars); err == nil {
			roundTrip(t, c)
		}
	})
}

// checkErrorLines fails t unless every line of msg, an error of what
// reads variable name, matches the pattern that names what it is about,
// and is at most maxErrorLine bytes long.
func checkErrorLines(t *testing.T, name, msg, pattern string) {
	t.Helper()
	re := regexp.MustCompile(pattern)
	for _, line := range strings.Split(msg, "\n") {
		if !re.MatchString(line) {
			t.Fatalf("%s: the error line %.200q does not say what it is about (%s); the error:\n%.2000s", name, line, pattern, msg)
		}
		if len(line) > maxErrorLine {
			t.Fatalf("%s: an error line of %d bytes: %.300q...", name, len(line), line)
		}
	}
}

// roundTrip fails t unless c, a configuration Load accepted, is what
// Load makes of its variables as /debug/config shows them.
func roundTrip(t *testing.T, c Config) {
	t.Helper()
	shown := c.Effective().Values
	environ := make(map[string]string, len(shown))
	for _, v := range vars(reflect.TypeFor[Config](), Prefix) {
		environ[v.Name] = shown[v.Name]
		if v.secret != "" {
			// Shown redacted: taken from c as it is.
			environ[v.Name] = formatValue(reflect.ValueOf(c).FieldByIndex(v.index))
		}
	}
	back, err := Load(environ)
	if err != nil {
		t.Fatalf("the configuration as /debug/config shows it does not load: %v\n%q", err, environ)
	}
	if got := back.Effective().Values; !reflect.DeepEqual(got, shown) {
		for k, v := range shown {
			if got[k] != v {
				t.Errorf("%s: shown %q, reads back as %q", k, v, got[k])
			}
		}
	}
}
