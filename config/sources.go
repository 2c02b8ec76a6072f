package config

import (
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"slices"
	"strings"
)

// MaxFileBytes is the size limit of the files the configuration names
// (CONFIG_FILE, SERVERS_FILE, POOLS_FILE, AUTH_TOKENS_FILE). They are read
// at start and at every reload, and polled for changes, so a file written
// there by mistake (a dump, a device) must not be read whole; a MiB holds
// tens of thousands of nodes or tokens.
const MaxFileBytes = 1 << 20

// ReadFile reads a file the configuration names; one larger than
// MaxFileBytes is refused, and so is anything but a regular file (a
// symbolic link is followed): opening a named pipe waits for a writer,
// which would hold the start, or the reload and every one after it, with
// nothing said, and a device or a directory holds no configuration.
func ReadFile(path string) ([]byte, error) {
	f, err := openRegular(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return nil, err // *PathError: names the file
	}
	if len(b) > MaxFileBytes {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, MaxFileBytes)
	}
	return b, nil
}

// openRegular opens path for reading if it is a regular file. The open
// does not wait (openNoWait): the file is checked once open, so that it
// cannot be swapped for a pipe between a check and the open.
func openRegular(path string) (*os.File, error) {
	f, err := openNoWait(path)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%s is not a regular file (%s)", path, fileKind(fi.Mode()))
	}
	return f, nil
}

// fileKind names the kind of file m is, for an error.
func fileKind(m os.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&os.ModeNamedPipe != 0:
		return "a named pipe"
	case m&os.ModeSocket != 0:
		return "a socket"
	case m&os.ModeDevice != 0:
		return "a device"
	}
	return "mode " + m.String()
}

// maxErrors is how many errors a list of entries reports; the others are
// counted, so that a file of garbage gives a message that can be logged.
const maxErrors = 10

// joinFew joins the first maxErrors of errs and counts the rest.
func joinFew(errs []error) error {
	if len(errs) > maxErrors {
		errs = append(errs[:maxErrors:maxErrors], fmt.Errorf("and %d more", len(errs)-maxErrors))
	}
	return errors.Join(errs...)
}

// separatorIn names the first byte of s among seps that separates list
// entries ("a space" for a space or a tab, "a ','", "a ';'"), or returns
// "" when s has none.
func separatorIn(s, seps string) string {
	i := strings.IndexAny(s, seps)
	switch {
	case i < 0:
		return ""
	case s[i] == ' ' || s[i] == '\t':
		return "a space"
	}
	return fmt.Sprintf("a '%c'", s[i])
}

// listEntry refuses an entry of a list whose entries are separated by
// commas when it holds a space, a tab or a ';': no entry of such a list
// holds one, and most often it separates two entries written where a
// comma was meant, which the entry's own parse would report as something
// else (a port of "11211 10.0.0.2"). form is one entry's form.
func listEntry(entry, form string) error {
	if sep := separatorIn(entry, " \t;"); sep != "" {
		return fmt.Errorf("%q: has %s: one %s per entry, entries separated by commas", short(entry), sep, form)
	}
	return nil
}

// oneValue refuses a value that takes one entry when it holds a space, a
// tab, a ',' or a ';': a list where one value is expected. form is the
// value's form.
func oneValue(v, form string) error {
	if sep := separatorIn(v, " \t,;"); sep != "" {
		return fmt.Errorf("%q: has %s: one %s, not a list", short(v), sep, form)
	}
	return nil
}

// short is s cut to a length an error message can quote.
func short(s string) string {
	const most = 80
	if len(s) <= most {
		return s
	}
	return s[:most] + "…"
}

// badLine describes a configuration file line that is not NAME=value
// without quoting it, but for the name of a variable it begins with: any
// other text may be a secret (a token on a line of its own, as when a
// value was continued on the next line).
func badLine(line string) string {
	const hidden = "(not shown, as it may hold a secret)"
	i := strings.IndexFunc(line, func(r rune) bool {
		return !(r == '_' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9')
	})
	if i < 0 {
		i = len(line)
	}
	for _, v := range vars(reflect.TypeFor[Config](), Prefix) {
		if v.Name == line[:i] {
			return "a line that begins " + v.Name + " " + hidden
		}
	}
	return "a line " + hidden
}

// ReadEnvFile reads a file of variables, NAME=value one per line, as
// systemd's EnvironmentFile does: blank lines and lines starting with #
// or ; are skipped, a byte order mark before the first is dropped, a value may be quoted with ' or " (a backslash in a value
// is kept as written, where systemd reads shell escapes). It refuses a
// line that is most likely part of a value written over several lines,
// and a value it would take otherwise than it was most likely meant,
// naming every such line (up to maxErrors) by its number and quoting no
// value (one may hold a token), nor a name unless it is a MEMCGATE_ one:
//   - a line whose name is not one (letters, digits and '_', not starting
//     with a digit), such as the rest of a value continued on a line of
//     its own, which taken for a variable of another program would be
//     dropped unsaid where it holds a '=' (a token's base64 padding);
//   - a MEMCGATE_ value that ends in '\' (systemd joins the next line to
//     it, docker's --env-file does not, and neither does this reader);
//   - a MEMCGATE_ value that begins with a quote that does not end it
//     (systemd reads a quoted value on over the lines that follow);
//   - an unquoted MEMCGATE_ value with a '#' after a space or a tab:
//     systemd and docker keep such a comment as part of the value, where
//     it would be taken into a socket path, a content type or a server
//     name unsaid;
//   - a variable of the Go runtime (GOMEMLIMIT, GOMAXPROCS, GOGC,
//     GODEBUG, GOTRACEBACK), which the runtime reads from the process
//     environment at start and never from this file: it would be
//     ignored unsaid, where a file given to systemd's EnvironmentFile
//     (as the shipped unit did) applied it.
func ReadEnvFile(path string) (map[string]string, error) {
	b, err := ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%sCONFIG_FILE: %w", Prefix, err)
	}
	out := map[string]string{}
	var errs []error // every line refused, so that one run names them all
	// A byte order mark is no part of the first name (docker's
	// --env-file drops it too).
	text := strings.TrimPrefix(string(b), "\ufeff")
	for i, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		name, value, ok := strings.Cut(line, "=")
		if rest, found := strings.CutPrefix(name, "export"); found && rest != "" && (rest[0] == ' ' || rest[0] == '\t') {
			name = rest
		}
		name = strings.TrimSpace(name)
		if !ok {
			errs = append(errs, fmt.Errorf("%sCONFIG_FILE %s, line %d: want NAME=value, got %s", Prefix, path, i+1, badLine(line)))
			continue
		}
		if !envName(name) {
			errs = append(errs, fmt.Errorf("%sCONFIG_FILE %s, line %d: want NAME=value, got %s whose text before its first '=' "+
				"is not a name (letters, digits and '_', not starting with a digit): the rest of a value continued from "+
				"the line before, or another program's variable whose name systemd ignores; write a value on one line, "+
				"and keep such variables out of this file", Prefix, path, i+1, badLine(line)))
			continue
		}
		if slices.Contains(goRuntimeVars, name) {
			errs = append(errs, fmt.Errorf("%sCONFIG_FILE %s, line %d: %s is the Go runtime's, which reads it from the process "+
				"environment when memcgate starts, never from this file, so it would be ignored: set it in the environment "+
				"(systemd: an Environment= line of the unit; Kubernetes: the container's env)", Prefix, path, i+1, name))
			continue
		}
		value = strings.TrimSpace(value)
		if why := unreadValue(value); why != "" && strings.HasPrefix(name, Prefix) {
			errs = append(errs, fmt.Errorf("%sCONFIG_FILE %s, line %d: %s %s", Prefix, path, i+1, name, why))
			continue
		}
		if len(value) >= 2 && (value[0] == '"' || value[0] == '\'') && value[len(value)-1] == value[0] {
			value = value[1 : len(value)-1]
		}
		out[name] = value
	}
	if err := joinFew(errs); err != nil {
		return nil, err
	}
	return out, nil
}

// goRuntimeVars are the variables the Go runtime reads from the process
// environment (ReadEnvFile refuses them).
var goRuntimeVars = []string{"GOMEMLIMIT", "GOMAXPROCS", "GOGC", "GODEBUG", "GOTRACEBACK"}

// envName reports whether name is a variable's name as systemd takes one:
// letters, digits and '_', not starting with a digit.
func envName(name string) bool {
	for i := range len(name) {
		c := name[i]
		if !(c == '_' || 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || i > 0 && '0' <= c && c <= '9') {
			return false
		}
	}
	return name != ""
}

// unreadValue says why value, as a CONFIG_FILE line has it after its
// '=', is not read as written (see ReadEnvFile), without quoting it; ""
// if it is.
func unreadValue(value string) string {
	const oneLine = "; write the value on one line (a list's entries separated by ',', pools by ';')"
	switch {
	case strings.HasSuffix(value, "\\"):
		return "ends with '\\': a value continued on the next line is not read as one (systemd's EnvironmentFile joins the lines, docker's --env-file does not)" + oneLine
	case value != "" && (value[0] == '"' || value[0] == '\''):
		if len(value) < 2 || value[len(value)-1] != value[0] {
			return "begins with a quote that does not end the line: a quoted value over several lines, or text after the closing quote, is not read" + oneLine
		}
	case strings.Contains(value, " #") || strings.Contains(value, "\t#"):
		return "has a '#' after a space: a comment after a value is part of the value, as systemd's EnvironmentFile and docker's --env-file read it; put the comment on a line of its own, or quote the value if the '#' belongs to it"
	}
	return ""
}

// Overlay returns base with the variables of over set on top.
func Overlay(base, over map[string]string) map[string]string {
	out := make(map[string]string, len(base)+len(over))
	for k, v := range base {
		out[k] = v
	}
	for k, v := range over {
		out[k] = v
	}
	return out
}

// ParseServers parses a list of servers as SERVERS and SERVERS_FILE write
// it: host:port[:weight] separated by commas or new lines, # comments.
func ParseServers(text string) ([]Server, error) {
	var out []Server
	var errs []error
	for _, line := range strings.Split(text, "\n") {
		line, _, _ = strings.Cut(line, "#")
		for _, f := range strings.Split(line, ",") {
			if f = strings.TrimSpace(f); f == "" {
				continue
			}
			s, err := ParseServer(f)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			out = append(out, s)
		}
	}
	if err := joinFew(errs); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, errors.New("no servers")
	}
	return out, nil
}

// ReadServersFile reads SERVERS_FILE.
func ReadServersFile(path string) ([]Server, error) {
	b, err := ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%sSERVERS_FILE: %w", Prefix, err)
	}
	s, err := ParseServers(string(b))
	if err != nil {
		return nil, fmt.Errorf("%sSERVERS_FILE %s: %w", Prefix, path, err)
	}
	return s, nil
}

// SplitDNS reads SERVERS_DNS: an SRV name (_service._proto.name), or a
// name and port for A/AAAA records. It is one name: the SRV records, or
// the addresses, give every node.
func SplitDNS(v string) (srv bool, host string, port int, err error) {
	if err := oneValue(v, "_service._proto.name or name:port (the name's records give every node)"); err != nil {
		return false, "", 0, err
	}
	if strings.HasPrefix(v, "_") {
		if i := badNameByte(v); i >= 0 {
			return false, "", 0, fmt.Errorf("%q: character %q is not allowed in an SRV name", short(v), v[i])
		}
		return true, v, 0, nil
	}
	s, err := ParseServer(v)
	if err != nil {
		return false, "", 0, fmt.Errorf("%q is neither _service._proto.name (SRV) nor name:port: %w", v, err)
	}
	if s.Weight != 1 {
		return false, "", 0, fmt.Errorf("%q: name:port takes no weight", v)
	}
	return false, s.Host, s.Port, nil
}

// checkDNSServer accepts DNS_SERVER: one host:port, without a weight.
func checkDNSServer(v string) error {
	if err := oneValue(v, "host:port (the resolver asks one server)"); err != nil {
		return err
	}
	s, err := ParseServer(v)
	if err != nil {
		return fmt.Errorf("want host:port: %w", err)
	}
	if s.Weight != 1 {
		return fmt.Errorf("%q: want host:port, without a weight", short(v))
	}
	return nil
}

// Diff lists the variables whose values differ between a and b, in
// declaration order.
func Diff(a, b Config) []string {
	var out []string
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	for _, fv := range vars(reflect.TypeFor[Config](), Prefix) {
		fa, fb := va.FieldByIndex(fv.index), vb.FieldByIndex(fv.index)
		if !reflect.DeepEqual(fa.Interface(), fb.Interface()) {
			out = append(out, fv.Name)
		}
	}
	return out
}

// validateSources checks the server sources: at most one of SERVERS (set
// explicitly), SERVERS_FILE and SERVERS_DNS, each well formed.
func (c Config) validateSources(serversSet bool) []error {
	var errs []error
	bad := func(name, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s%s: %s", Prefix, name, fmt.Sprintf(format, args...)))
	}
	var given []string
	if serversSet {
		given = append(given, Prefix+"SERVERS")
	}
	if c.ServersFile != "" {
		given = append(given, Prefix+"SERVERS_FILE")
	}
	if c.ServersDNS != "" {
		given = append(given, Prefix+"SERVERS_DNS")
		if _, _, _, err := SplitDNS(c.ServersDNS); err != nil {
			bad("SERVERS_DNS", "%v", err)
		}
	}
	if len(given) > 1 {
		errs = append(errs, fmt.Errorf("%s are set together: the nodes come from one of them", strings.Join(given, " and ")))
	}
	if c.DNSServer != "" {
		if err := checkDNSServer(c.DNSServer); err != nil {
			bad("DNS_SERVER", "%v", err)
		} else if c.ServersDNS == "" {
			// It is SERVERS_DNS' resolver alone: names in SERVERS,
			// SERVERS_FILE and the pools are resolved by the system's at
			// each dial, whatever it says.
			bad("DNS_SERVER", "is set while %sSERVERS_DNS is not: it is the DNS server SERVERS_DNS asks, and nothing else asks it "+
				"(names in SERVERS, SERVERS_FILE and the pools are resolved by the system's resolver); unset it, or set %sSERVERS_DNS", Prefix, Prefix)
		}
	}
	if c.DNSInterval <= 0 {
		bad("DNS_INTERVAL", "must be positive, got %s", c.DNSInterval)
	}
	// The nodes of SERVERS_FILE and SERVERS_DNS, and of POOLS_FILE, are
	// counted once read (ValidateResolvedServers, ValidatePoolsFile).
	var servers []Server
	if c.ServersFile == "" && c.ServersDNS == "" {
		servers = c.Servers
	}
	if err := c.checkNodes(servers, "POOLS", c.Pools); err != nil {
		errs = append(errs, err)
	}
	if c.Watch < 0 {
		bad("WATCH_INTERVAL", "must not be negative, got %s", c.Watch)
	}
	return errs
}

// Copy sets the variables names (with the prefix) of dst to their values
// in src; it panics on a name that is not a variable.
func Copy(dst *Config, src Config, names ...string) {
	d, sv := reflect.ValueOf(dst).Elem(), reflect.ValueOf(src)
	// One walk of the struct's tags for all names: a reload copies some
	// 30, and two walks per name were most of a reload's CPU time.
	vs := vars(reflect.TypeFor[Config](), Prefix)
	for _, name := range names {
		i := slices.IndexFunc(vs, func(fv fieldVar) bool { return fv.Name == name })
		if i < 0 {
			panic("config.Copy: no variable " + name)
		}
		d.FieldByIndex(vs[i].index).Set(sv.FieldByIndex(vs[i].index))
	}
}

// serversSource is the variable the default pool's nodes come from:
// SERVERS, or SERVERS_FILE or SERVERS_DNS with the file or the name
// read, as the errors of reading them say: an answer a DNS server
// changes between two polls is refused naming what was asked.
func (c Config) serversSource() string {
	switch {
	case c.ServersFile != "":
		return "SERVERS_FILE " + c.ServersFile
	case c.ServersDNS != "":
		return "SERVERS_DNS " + c.ServersDNS
	}
	return "SERVERS"
}

// checkNodes refuses more nodes than MAX_NODES: servers, the default
// pool's (from serversSource), and those of pools (from the variable
// poolsVar), a node counted once per pool that lists it, as each pool
// opens its own connections to it, probes it and exports its series. A
// source not read yet is passed empty; a MAX_NODES below 1 is Validate's
// to report.
func (c Config) checkNodes(servers []Server, poolsVar string, pools Pools) error {
	inPools := 0
	for _, p := range pools {
		inPools += len(p.Servers)
	}
	total := len(servers) + inPools
	if c.MaxNodes < 1 || total <= c.MaxNodes {
		return nil
	}
	switch {
	case inPools == 0:
		return fmt.Errorf("%s%s: %s, more than %sMAX_NODES=%d", Prefix, c.serversSource(), nodeCount(total), Prefix, c.MaxNodes)
	case len(servers) == 0:
		return fmt.Errorf("%s%s: %s, more than %sMAX_NODES=%d", Prefix, poolsVar, nodeCount(total), Prefix, c.MaxNodes)
	}
	return fmt.Errorf("%s%s: %s and %d in %s%s make %d, more than %sMAX_NODES=%d",
		Prefix, c.serversSource(), nodeCount(len(servers)), inPools, Prefix, poolsVar, total, Prefix, c.MaxNodes)
}

// nodeCount is "1 node" or "n nodes".
func nodeCount(n int) string {
	if n == 1 {
		return "1 node"
	}
	return fmt.Sprintf("%d nodes", n)
}
