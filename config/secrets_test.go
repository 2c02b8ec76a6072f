package config

import (
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// secretTok is the token the tests below write where it does not belong;
// no error may quote it, or any 8 bytes of it.
const secretTok = "Zq7s3cretTok3n0042xyW" // word bytes only: a line of its own is one word

// assertNoSecret fails if msg holds secretTok or any 8 bytes of it.
func assertNoSecret(t *testing.T, what, msg string) {
	t.Helper()
	for i := 0; i+8 <= len(secretTok); i++ {
		if strings.Contains(msg, secretTok[i:i+8]) {
			t.Errorf("%s: the error quotes the token (%q): %s", what, secretTok[i:i+8], msg)
			return
		}
	}
}

// TestTokenErrorsQuoteNoToken: a token entry written wrong is refused with
// an error that names the entry and never quotes it. An entry the wrong
// way round (token:read), a typo in the scopes or a separator that is not
// ':' put the token where the scopes are, and the error goes to the log
// and, on a reload, to the status page.
func TestTokenErrorsQuoteNoToken(t *testing.T) {
	tests := []struct {
		name, tokens string
		want         string // in the error
	}{
		{"token:scopes", secretTok + ":read", "entry 1: what comes before its first ':' is not scopes"},
		{"token:scopes, long enough", secretTok + ":read+write+admin-and-more", "entry 1: what comes before"},
		{"second entry reversed", "read:another-token-0123456789," + secretTok + ":write", "entry 2:"},
		{"comments and blanks not counted", "# c\n\nread:another-token-0123456789\n\n" + secretTok + ":admin\n", "entry 2:"},
		{"scope typo", "raed:" + secretTok, "entry 1: what comes before"},
		{"space for ':'", "read " + secretTok, "entry 1 is not scopes:token"},
		{"'=' for ':'", "read=" + secretTok, "entry 1 is not scopes:token"},
		{"token alone", secretTok, "entry 1 is not scopes:token"},
		{"scopes after a token with a colon", secretTok + ":x:read", "entry 1: what comes before"},
		{"short token names its scopes", "read+write:short", "entry 1: the read+write token has 5 characters"},
		{"';' between two entries", "read:" + secretTok + ";write:" + secretTok, `entry 1: the read token has ";" at byte 22`},
		{"space between two entries", "read:" + secretTok + " write:" + secretTok, `entry 1: the read token has " " at byte 22`},
		{"tab inside", "admin:" + secretTok[:10] + "\t" + secretTok[10:], `entry 1: the admin token has "\t" at byte 11`},
		{"not ASCII", "admin:" + secretTok[:10] + "é" + secretTok[10:], `entry 1: the admin token has "\xc3" at byte 11`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseTokens(tt.tokens)
			if err == nil {
				t.Fatalf("ParseTokens(%q): no error", tt.tokens)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("ParseTokens(%q) = %q, want it to contain %q", tt.tokens, err, tt.want)
			}
			assertNoSecret(t, "ParseTokens", err.Error())

			// The same through the file and through Load, as a start
			// and a reload report it.
			file := filepath.Join(t.TempDir(), "tokens")
			if err := os.WriteFile(file, []byte(tt.tokens), 0o600); err != nil {
				t.Fatal(err)
			}
			if _, err := (Config{AuthTokensFile: file}.Tokens()); err == nil {
				t.Errorf("AUTH_TOKENS_FILE: no error")
			} else {
				assertNoSecret(t, "AUTH_TOKENS_FILE", err.Error())
			}
			if _, err := Load(map[string]string{"MEMCGATE_AUTH_TOKENS": tt.tokens}); err == nil {
				t.Errorf("Load: no error")
			} else {
				assertNoSecret(t, "Load", err.Error())
			}
		})
	}
}

// TestTokenCharacters: a token is printable ASCII without spaces or ';':
// every such byte is taken, those RFC 6750's b64token has not too.
func TestTokenCharacters(t *testing.T) {
	for _, tok := range []string{
		"abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789-._~+/0123",
		"base64-token-with/slash+plus==", "aaaaaaaaaaaaaaaa=", "pa!ss@wo:rd#gen$%^&*()=x", `q"u'o<t>e\\|{}[]?`,
	} {
		got, err := ParseTokens("read:" + tok)
		if err != nil || len(got) != 1 || got[0].Secret != tok {
			t.Errorf("ParseTokens(read:%s) = %v, %v; want the token", tok, got, err)
		}
	}
}

// TestConfigFileErrorsQuoteNoSecret: a CONFIG_FILE line that is not
// NAME=value is refused by its number, quoting at most the variable it
// begins with: the rest of such a line is often a value, and a value
// continued on a line of its own is often a token.
func TestConfigFileErrorsQuoteNoSecret(t *testing.T) {
	tests := []struct {
		name, file string
		want       string
	}{
		{"value continued on the next line", "MEMCGATE_AUTH_TOKENS=\"read:another-token-0123456789,\n" + secretTok + "\"\n", "line 1: MEMCGATE_AUTH_TOKENS begins with a quote that does not end the line"},
		{"scopes:token continued", "MEMCGATE_AUTH_TOKENS=\"read:another-token-0123456789,\nread:" + secretTok + "\"\n", "line 1: MEMCGATE_AUTH_TOKENS begins with a quote that does not end the line"},
		{"value continued, unquoted", "MEMCGATE_AUTH_TOKENS=read:another-token-0123456789,\n" + secretTok + "\n", "line 2: want NAME=value, got a line (not shown"},
		{"':' for '='", "MEMCGATE_AUTH_TOKENS: read:" + secretTok + "\n", "line 1: want NAME=value, got a line that begins MEMCGATE_AUTH_TOKENS (not shown"},
		{"space for '='", "# tokens\nMEMCGATE_AUTH_TOKENS read:" + secretTok + "\n", "line 2: want NAME=value, got a line that begins MEMCGATE_AUTH_TOKENS (not shown"},
		{"token on a line of its own, word bytes only", "MEMCGATE_SERVERS=a:1\n" + secretTok + "\n", "line 2: want NAME=value, got a line (not shown"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "env")
			if err := os.WriteFile(file, []byte(tt.file), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := ReadEnvFile(file)
			if err == nil {
				t.Fatalf("no error for %q", tt.file)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q, want it to contain %q", err, tt.want)
			}
			assertNoSecret(t, "CONFIG_FILE", err.Error())
		})
	}
}

// TestConfigFileContinuedValues: a value written over several lines of a
// CONFIG_FILE, or with a comment after it, is refused, by line number and
// without quoting a value, wherever the lines would otherwise be read as
// something else: a continued line holding a '=' (a token's base64
// padding) would be taken for a variable of another program and dropped,
// the file loading without that token.
func TestConfigFileContinuedValues(t *testing.T) {
	const first = "MEMCGATE_AUTH_TOKENS=read:another-token-0123456789,"
	tests := []struct {
		name, file string
		want       string
	}{
		{"continued line with '='", first + "\nwrite:" + secretTok + "==\n", "line 2: want NAME=value, got a line (not shown"},
		{"continued line indented, with '='", first + "\n    write:" + secretTok + "=\n", "line 2: want NAME=value, got a line (not shown"},
		{"continued pool", "MEMCGATE_POOLS=a servers=10.0.0.1:11211 prefixes=a:;\nb servers=10.0.0.2:11211 prefixes=b:\n", "line 2: want NAME=value, got a line (not shown"},
		{"backslash", first + "\\\nwrite:" + secretTok + "\n", "line 1: MEMCGATE_AUTH_TOKENS ends with '\\'"},
		{"backslash, continued line with '='", first + "\\\nwrite:" + secretTok + "==\n", "line 1: MEMCGATE_AUTH_TOKENS ends with '\\'"},
		{"backslash, CRLF", first + "\\\r\nwrite:" + secretTok + "\r\n", "line 1: MEMCGATE_AUTH_TOKENS ends with '\\'"},
		{"backslash, servers", "MEMCGATE_SERVERS=10.0.0.1:11211,\\\n10.0.0.2:11211\n", "line 1: MEMCGATE_SERVERS ends with '\\'"},
		{"single quotes over lines, with '='", "MEMCGATE_AUTH_TOKENS='read:another-token-0123456789,\nwrite:" + secretTok + "='\n", "line 1: MEMCGATE_AUTH_TOKENS begins with a quote that does not end the line"},
		{"text after the closing quote", "MEMCGATE_AUTH_TOKENS=\"read:" + secretTok + "\" # ci\n", "line 1: MEMCGATE_AUTH_TOKENS begins with a quote that does not end the line"},
		{"comment after a token", "# tokens\nMEMCGATE_AUTH_TOKENS=read:" + secretTok + " # ci\n", "line 2: MEMCGATE_AUTH_TOKENS has a '#' after a space"},
		{"comment after a server name", "MEMCGATE_UPSTREAM_TLS_SERVER_NAME=mc.example.com\t# the CA's name\n", "line 1: MEMCGATE_UPSTREAM_TLS_SERVER_NAME has a '#' after a space"},
		{"comment after a socket path", "MEMCGATE_LISTEN_SOCKET=/run/memcgate/memcgate.sock # for PHP\n", "line 1: MEMCGATE_LISTEN_SOCKET has a '#' after a space"},
		// The Go runtime reads its variables from the environment
		// alone: in the file they were ignored unsaid.
		{"GOMEMLIMIT", "MEMCGATE_SERVERS=10.0.0.1:11211\nGOMEMLIMIT=900MiB\n", "line 2: GOMEMLIMIT is the Go runtime's, which reads it from the process environment"},
		{"export GOMAXPROCS", "export GOMAXPROCS=1\n", "line 1: GOMAXPROCS is the Go runtime's"},
		{"GOGC", "GOGC=off\n", "line 1: GOGC is the Go runtime's"},
		{"GODEBUG", "GODEBUG=madvdontneed=1\n", "line 1: GODEBUG is the Go runtime's"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "env")
			if err := os.WriteFile(file, []byte(tt.file), 0o600); err != nil {
				t.Fatal(err)
			}
			got, err := ReadEnvFile(file)
			if err == nil {
				t.Fatalf("%q read as %q, want an error", tt.file, got)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q, want it to contain %q", err, tt.want)
			}
			assertNoSecret(t, "CONFIG_FILE", err.Error())
		})
	}
}

// TestConfigFileValues: what a CONFIG_FILE line gives, as systemd's
// EnvironmentFile reads it: a '#' that does not follow a space is part of
// the value, a quoted value keeps what is inside the quotes, and a line of
// another program's variable is read whatever its value, and not checked.
func TestConfigFileValues(t *testing.T) {
	file := filepath.Join(t.TempDir(), "env")
	text := strings.Join([]string{
		"# a comment",
		"  # an indented comment",
		"MEMCGATE_AUTH_TOKENS=read:pa!ss@wo:rd#gen$%^&*()=x,write:" + secretTok + "==",
		`MEMCGATE_MEMC_CONTENT_TYPE="text/plain # not a comment"`,
		"MEMCGATE_KEY_PREFIX='app:'",
		"export MEMCGATE_SERVERS = 10.0.0.1:11211,10.0.0.2:11211",
		"MEMCGATE_POOLS=a servers=10.0.0.3:11211 prefixes=a:;b servers=10.0.0.4:11211 prefixes=b:",
		`OTHER_PROGRAM=a value \`,
		"http_proxy=http://proxy:3128 # another program's",
		"",
	}, "\r\n")
	if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := ReadEnvFile(file)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"MEMCGATE_AUTH_TOKENS":       "read:pa!ss@wo:rd#gen$%^&*()=x,write:" + secretTok + "==",
		"MEMCGATE_MEMC_CONTENT_TYPE": "text/plain # not a comment",
		"MEMCGATE_KEY_PREFIX":        "app:",
		"MEMCGATE_SERVERS":           "10.0.0.1:11211,10.0.0.2:11211",
		"MEMCGATE_POOLS":             "a servers=10.0.0.3:11211 prefixes=a:;b servers=10.0.0.4:11211 prefixes=b:",
		"OTHER_PROGRAM":              `a value \`,
		"http_proxy":                 "http://proxy:3128 # another program's",
	}
	if !maps.Equal(got, want) {
		t.Errorf("read %q\nwant %q", got, want)
	}
	toks, err := ParseTokens(got["MEMCGATE_AUTH_TOKENS"])
	if err != nil || len(toks) != 2 {
		t.Errorf("the file's tokens: %d, %v; want both", len(toks), err)
	}
}

// TestConfigFileOtherWriters: files as systemd, docker and editors write
// them load: systemd's ';' comment lines are skipped, a UTF-8 byte order
// mark before the first line (an editor on Windows; docker's --env-file
// drops it) is not part of the first name, and "export" may be followed
// by a tab. A line whose name is not one (another program's dotted
// name, which docker passes on and systemd ignores) is refused, and the
// refusal says what is wrong with it, without quoting it.
func TestConfigFileOtherWriters(t *testing.T) {
	file := filepath.Join(t.TempDir(), "env")
	text := "\ufeffMEMCGATE_SERVERS=10.0.0.1:11211\n; a systemd comment\n; MEMCGATE_KEY_PREFIX=old: (a value put aside)\nexport\tMEMCGATE_KEY_PREFIX=app:\n"
	if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := ReadEnvFile(file)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"MEMCGATE_SERVERS": "10.0.0.1:11211", "MEMCGATE_KEY_PREFIX": "app:"}
	if !maps.Equal(got, want) {
		t.Errorf("read %q\nwant %q", got, want)
	}

	if err := os.WriteFile(file, []byte("MEMCGATE_SERVERS=10.0.0.1:11211\nspring.profiles.active="+secretTok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = ReadEnvFile(file)
	if err == nil || !strings.Contains(err.Error(), "line 2: want NAME=value, got a line (not shown, as it may hold a secret) whose text before its first '=' is not a name") {
		t.Errorf("a dotted name: %v, want it refused for its name", err)
	}
	if err != nil {
		assertNoSecret(t, "CONFIG_FILE", err.Error())
	}
}

// TestConfigFileNamesEveryBadLine: a CONFIG_FILE with several refused
// lines names them all in one error, as the checks of the variables do,
// rather than the first alone, one fix and restart at a time.
func TestConfigFileNamesEveryBadLine(t *testing.T) {
	file := filepath.Join(t.TempDir(), "env")
	text := "MEMCGATE_SERVERS=10.0.0.1:11211 # the old cluster\nGOMEMLIMIT=1GiB\nMEMCGATE_KEY_PREFIX=app:\n" + secretTok + "\n"
	if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := ReadEnvFile(file)
	if err == nil {
		t.Fatalf("%q read, want an error", text)
	}
	for _, want := range []string{
		"line 1: MEMCGATE_SERVERS has a '#' after a space",
		"line 2: GOMEMLIMIT is the Go runtime's",
		"line 4: want NAME=value, got a line (not shown",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q, want it to contain %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "line 3") {
		t.Errorf("error %q names line 3, which is good", err)
	}
	assertNoSecret(t, "CONFIG_FILE", err.Error())
}

// TestTokensSetToNothing: AUTH_TOKENS set to separators, blanks or
// comments alone is refused, not taken as no authentication, which the
// empty string alone means.
func TestTokensSetToNothing(t *testing.T) {
	for _, tc := range []struct {
		tokens string
		ok     bool
	}{
		{"", true},
		{",", false},
		{" ", false},
		{",,\n", false},
		{"# read:none-yet", false},
		{"read:" + secretTok + ",", true},
	} {
		_, err := Load(map[string]string{"MEMCGATE_AUTH_TOKENS": tc.tokens})
		if got := err == nil; got != tc.ok {
			t.Errorf("Load with AUTH_TOKENS=%q: %v, want ok=%v", tc.tokens, err, tc.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "MEMCGATE_AUTH_TOKENS is set but holds no token") {
			t.Errorf("Load with AUTH_TOKENS=%q: %v, want it to say it holds no token", tc.tokens, err)
		}
	}
}
