package config

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
)

// Pools are the pools besides the default one (whose nodes are SERVERS
// and whose policy is REPLICAS, WRITE_POLICY…), as POOLS or POOLS_FILE
// write them: one pool per line or per ';', each its name and then
// key=value settings separated by spaces, # comments:
//
//	sessions servers=10.0.0.4:11211,10.0.0.5:11211,10.0.0.6:11211 prefixes=session:,cart: replicas=2 write=majority read=hedged
//
// servers and prefixes are required, but a pool that another one names as
// its warm or shadow pool needs no prefix; the other keys (distribution,
// replicas, write, read, miss_fallback, failover, shadow_percent) default
// to the default pool's variables (DISTRIBUTION, REPLICAS, WRITE_POLICY,
// READ_POLICY, MISS_FALLBACK, FAILOVER, SHADOW_PERCENT), while warm and
// shadow are the pool's own. docs/pools.md has the reference.
type Pools []Pool

// Pool is one pool of POOLS: its name, then a field per setting of the
// line (servers=, prefixes=, distribution=, replicas=, write=, read=,
// miss_fallback=, failover=, warm=, shadow=, shadow_percent=). An empty
// setting, or zero Replicas, is the default pool's.
type Pool struct {
	Name         string
	Servers      []Server
	Prefixes     []string
	Distribution string
	Replicas     int
	Write        string
	Read         string
	MissFallback string // "true", "false" or ""
	Failover     string
	// Warm and Shadow name the pool's warm and shadow pools (never the
	// default pool's WARM_POOL and SHADOW_POOL); empty for none.
	Warm, Shadow string
	// ShadowPercent is the pool's shadow sample; 0 is SHADOW_PERCENT's.
	ShadowPercent float64
}

// DefaultPoolName is the default pool's name, which no pool of POOLS may
// take.
const DefaultPoolName = "main"

// Policy values, shared by the variables and the pool settings.
var (
	writePolicies = []string{"all", "majority", "first"}
	readPolicies  = []string{"first", "hedged"}
)

var poolsType = reflect.TypeFor[Pools]()

// ParsePools reads pools as POOLS and POOLS_FILE write them. It checks
// each pool's syntax and values; checks that need the other variables
// (prefixes across pools, replicas against SERVERS) are Validate's.
func ParsePools(text string) (Pools, error) {
	var out Pools
	var errs []error
	for _, line := range strings.Split(text, "\n") {
		line, _, _ = strings.Cut(line, "#")
		for entry := range strings.SplitSeq(line, ";") {
			fields := strings.Fields(entry)
			if len(fields) == 0 {
				continue
			}
			p, err := parsePool(fields)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			out = append(out, p)
		}
	}
	if err := joinFew(errs); err != nil {
		return nil, err
	}
	return out, nil
}

func parsePool(fields []string) (Pool, error) {
	p := Pool{Name: fields[0]}
	if strings.Contains(p.Name, "=") {
		return p, fmt.Errorf("pool %q: a pool starts with its name, then key=value settings", short(p.Name))
	}
	if i := badPoolNameByte(p.Name); i >= 0 {
		return p, fmt.Errorf("pool %q: a name has letters, digits, '-' and '_' only", short(p.Name))
	}
	// A setting that ends in a comma, followed by a word that is no
	// setting: a space after a comma in a list (servers=a:1, b:1), or
	// pools separated by commas. Reported as that, not as an empty prefix
	// and a word that is not key=value.
	for i := 1; i+1 < len(fields); i++ {
		if strings.Contains(fields[i], "=") && strings.HasSuffix(fields[i], ",") && !strings.Contains(fields[i+1], "=") {
			return p, fmt.Errorf("pool %s: %q is followed by a space: a setting's list has its entries separated by commas alone (servers=HOST:PORT,HOST:PORT), spaces separate settings, and ';' or new lines separate pools", p.Name, short(fields[i]))
		}
	}
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("pool %s: %s", short(p.Name), fmt.Sprintf(format, args...)))
	}
	seen := map[string]bool{}
	for _, f := range fields[1:] {
		key, val, ok := strings.Cut(f, "=")
		if !ok || val == "" {
			bad("%q is not key=value", short(f))
			continue
		}
		if seen[key] {
			bad("%s is given twice", short(key))
		}
		seen[key] = true
		switch key {
		case "servers":
			servers, err := ParseServers(val)
			// A line per server refused, each naming the pool:
			// ParseServers joins its errors a line each.
			for _, e := range unjoin(err) {
				bad("servers: %v", e)
			}
			p.Servers = servers
		case "prefixes":
			for pre := range strings.SplitSeq(val, ",") {
				if pre == "" {
					bad("prefixes: an empty prefix would take every key")
					continue
				}
				if i := badKeyByte(pre); i >= 0 {
					bad("prefixes: %q has byte 0x%02x, which no memcached key holds", short(pre), pre[i])
					continue
				}
				p.Prefixes = append(p.Prefixes, pre)
			}
		case "distribution":
			if !slices.Contains(Distributions(), val) {
				bad("distribution %q is not one of %s", short(val), strings.Join(Distributions(), ", "))
			}
			p.Distribution = val
		case "replicas":
			n, err := strconv.Atoi(val)
			if err != nil || n < 1 {
				bad("replicas %q is not a whole number from 1", short(val))
			}
			p.Replicas = n
		case "write":
			if !slices.Contains(writePolicies, val) {
				bad("write %q is not %s", short(val), strings.Join(writePolicies, ", "))
			}
			p.Write = val
		case "read":
			if !slices.Contains(readPolicies, val) {
				bad("read %q is not %s", short(val), strings.Join(readPolicies, " or "))
			}
			p.Read = val
		case "miss_fallback":
			if val != "true" && val != "false" {
				bad("miss_fallback %q is not true or false", short(val))
			}
			p.MissFallback = val
		case "failover":
			if val != "rehash" && val != "fail" {
				bad("failover %q is not rehash or fail", short(val))
			}
			p.Failover = val
		case "warm":
			p.Warm = val
		case "shadow":
			p.Shadow = val
		case "shadow_percent":
			pct, err := strconv.ParseFloat(val, 64)
			if err != nil || !validPercent(pct) {
				bad("shadow_percent %q is not a percentage above 0, at most 100", short(val))
			}
			p.ShadowPercent = pct
		default:
			bad("unknown setting %q (servers, prefixes, distribution, replicas, write, read, miss_fallback, failover, warm, shadow, shadow_percent)", short(key))
		}
	}
	if len(p.Servers) == 0 && !seen["servers"] {
		bad("servers= is required")
	}
	return p, joinFew(errs)
}

// unjoin is the errors err joins (errors.Join), err alone if it joins
// none, or none if err is nil.
func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	if err == nil {
		return nil
	}
	return []error{err}
}

// String writes the pool as POOLS takes it.
func (p Pool) String() string {
	var b strings.Builder
	b.WriteString(p.Name)
	add := func(key, val string) {
		if val != "" {
			b.WriteString(" " + key + "=" + val)
		}
	}
	servers := make([]string, len(p.Servers))
	for i, s := range p.Servers {
		servers[i] = s.String()
	}
	add("servers", strings.Join(servers, ","))
	add("prefixes", strings.Join(p.Prefixes, ","))
	add("distribution", p.Distribution)
	if p.Replicas > 0 {
		add("replicas", strconv.Itoa(p.Replicas))
	}
	add("write", p.Write)
	add("read", p.Read)
	add("miss_fallback", p.MissFallback)
	add("failover", p.Failover)
	add("warm", p.Warm)
	add("shadow", p.Shadow)
	if p.ShadowPercent != 0 {
		add("shadow_percent", strconv.FormatFloat(p.ShadowPercent, 'g', -1, 64))
	}
	return b.String()
}

// String writes the pools as POOLS takes them, separated by "; ".
func (ps Pools) String() string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, "; ")
}

// validatePools checks what one pool alone cannot: names and prefixes
// unique, replicas against the nodes. name is the variable the pools came
// from (POOLS or POOLS_FILE). Its errors quote names, prefixes and
// servers cut short, as ParsePools' do.
func (c Config) validatePools(name string, pools Pools) []error {
	var msgs []string // one error for the variable, naming every problem (Load keeps one per variable)
	bad := func(format string, args ...any) { msgs = append(msgs, fmt.Sprintf(format, args...)) }
	names := map[string]bool{DefaultPoolName: true}
	prefixes := map[string]string{}
	for _, p := range pools {
		if names[p.Name] {
			if p.Name == DefaultPoolName {
				bad("pool %s: %q is the default pool's name (SERVERS)", short(p.Name), DefaultPoolName)
			} else {
				bad("pool %s is defined twice", short(p.Name))
			}
		}
		names[p.Name] = true
		for _, pre := range p.Prefixes {
			if other, ok := prefixes[pre]; ok {
				bad("prefix %q goes to pools %s and %s", short(pre), short(other), short(p.Name))
			}
			prefixes[pre] = p.Name
		}
		own := map[string]bool{}
		for _, s := range p.Servers {
			if own[s.Addr()] {
				bad("pool %s lists %s twice", short(p.Name), short(s.Addr()))
			}
			own[s.Addr()] = true
		}
		replicas := p.Replicas
		if replicas == 0 {
			replicas = c.Replicas
		}
		if replicas > len(p.Servers) && len(p.Servers) > 0 {
			bad("pool %s: %d replicas need at least %d servers, it has %d", short(p.Name), replicas, replicas, len(p.Servers))
		}
	}
	msgs = append(msgs, c.poolPolicyProblems(pools)...)
	if len(msgs) == 0 {
		return nil
	}
	return []error{fmt.Errorf("%s%s: %s", Prefix, name, strings.Join(msgs, "; "))}
}

// ReadPoolsFile reads POOLS_FILE.
func ReadPoolsFile(path string) (Pools, error) {
	b, err := ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%sPOOLS_FILE: %w", Prefix, err)
	}
	p, err := ParsePools(string(b))
	if err != nil {
		return nil, fmt.Errorf("%sPOOLS_FILE %s: %w", Prefix, path, err)
	}
	return p, nil
}

// ValidateResolvedServers checks the nodes read from SERVERS_FILE or
// resolved from SERVERS_DNS (in c.Servers) as Load checks SERVERS: none
// listed twice, enough for REPLICAS, and with POOLS' no more than
// MAX_NODES. The error names the source.
func (c Config) ValidateResolvedServers() error {
	source := c.serversSource()
	if err := c.checkNodes(c.Servers, "POOLS", c.Pools); err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, s := range c.Servers {
		if seen[s.Addr()] {
			return fmt.Errorf("%s%s: %s is listed twice", Prefix, source, s.Addr())
		}
		seen[s.Addr()] = true
	}
	if c.Replicas > 1 && c.Replicas > len(c.Servers) {
		return fmt.Errorf("%sREPLICAS: %d copies need at least %d servers, %s has %d", Prefix, c.Replicas, c.Replicas, source, len(c.Servers))
	}
	return nil
}

// ValidatePoolsFile checks pools read from POOLS_FILE as Load checks
// POOLS, their nodes counted with the default pool's (c.Servers, read
// from their source) against MAX_NODES.
func (c Config) ValidatePoolsFile(pools Pools) error {
	errs := append(c.validatePools("POOLS_FILE", pools), c.validatePolicyVars(pools, true)...)
	if err := c.checkNodes(c.Servers, "POOLS_FILE", pools); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func badPoolNameByte(s string) int {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return i
		}
	}
	return -1
}

// badKeyByte returns the index of the first byte of s no memcached text
// protocol key holds (space, control), or -1.
func badKeyByte(s string) int {
	for i := 0; i < len(s); i++ {
		if b := s[i]; b <= ' ' || b == 0x7f {
			return i
		}
	}
	return -1
}

// validateReplication checks the default pool's replication, the hedging
// and background bounds, and POOLS.
func (c Config) validateReplication() []error {
	var errs []error
	bad := func(name, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s%s: %s", Prefix, name, fmt.Sprintf(format, args...)))
	}
	if c.Replicas < 1 {
		bad("REPLICAS", "must be at least 1, got %d", c.Replicas)
	} else if c.ServersFile == "" && c.ServersDNS == "" && c.Replicas > len(c.Servers) && len(c.Servers) > 0 {
		bad("REPLICAS", "%d copies need at least %d servers, SERVERS has %d", c.Replicas, c.Replicas, len(c.Servers))
	}
	if !slices.Contains(writePolicies, c.WritePolicy) {
		bad("WRITE_POLICY", "%q is not %s", c.WritePolicy, strings.Join(writePolicies, ", "))
	}
	if !slices.Contains(readPolicies, c.ReadPolicy) {
		bad("READ_POLICY", "%q is not %s", c.ReadPolicy, strings.Join(readPolicies, " or "))
	}
	if c.HedgeMinDelay <= 0 {
		bad("HEDGE_MIN_DELAY", "must be positive, got %s", c.HedgeMinDelay)
	}
	if c.HedgeMaxDelay < c.HedgeMinDelay {
		bad("HEDGE_MAX_DELAY", "%s is shorter than HEDGE_MIN_DELAY %s", c.HedgeMaxDelay, c.HedgeMinDelay)
	}
	if c.HedgeMaxPercent < 1 || c.HedgeMaxPercent > 100 {
		bad("HEDGE_MAX_PERCENT", "must be a percentage from 1 to 100, got %d", c.HedgeMaxPercent)
	}
	if c.ReplicaBackgroundBytes < 1 {
		bad("REPLICA_BACKGROUND_BYTES", "must be at least 1, got %d", c.ReplicaBackgroundBytes)
	}
	if c.ReplicaBackgroundOps < 1 {
		bad("REPLICA_BACKGROUND_OPS", "must be at least 1, got %d", c.ReplicaBackgroundOps)
	}
	if len(c.Pools) > 0 && c.PoolsFile != "" {
		bad("POOLS_FILE", "and %sPOOLS are set together: the pools come from one of them", Prefix)
	}
	errs = append(errs, c.validatePolicyVars(c.Pools, c.PoolsFile == "")...)
	return append(errs, c.validatePools("POOLS", c.Pools)...)
}
