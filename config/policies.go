package config

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// validPercent reports whether p is a sample share: above 0, at most 100.
func validPercent(p float64) bool { return p > 0 && p <= 100 }

// poolPolicyProblems checks the warm and shadow settings of pools (POOLS or
// POOLS_FILE) and which pools no key reaches: each names another pool, not
// the same one for both, and a pool without prefixes is some pool's warm
// or shadow pool (WARM_POOL and SHADOW_POOL included).
func (c Config) poolPolicyProblems(pools Pools) []string {
	var msgs []string
	names := []string{DefaultPoolName}
	for _, p := range pools {
		names = append(names, p.Name)
	}
	sources := map[string]bool{c.WarmPool: true, c.ShadowPool: true}
	for _, p := range pools {
		sources[p.Warm], sources[p.Shadow] = true, true
		for _, ref := range []struct{ what, name string }{{"warm", p.Warm}, {"shadow", p.Shadow}} {
			switch {
			case ref.name == "":
			case ref.name == p.Name:
				msgs = append(msgs, fmt.Sprintf("pool %s: %s=%s names the pool itself", short(p.Name), ref.what, short(ref.name)))
			case !slices.Contains(names, ref.name):
				msgs = append(msgs, fmt.Sprintf("pool %s: %s=%s is not a pool (%s)", short(p.Name), ref.what, short(ref.name), short(joinNames(names))))
			}
		}
		if p.Warm != "" && p.Warm == p.Shadow {
			msgs = append(msgs, fmt.Sprintf("pool %s: %s cannot be both its warm and its shadow pool", short(p.Name), short(p.Warm)))
		}
		if p.ShadowPercent != 0 && p.Shadow == "" {
			msgs = append(msgs, fmt.Sprintf("pool %s: shadow_percent without shadow=", short(p.Name)))
		}
	}
	for _, p := range pools {
		if len(p.Prefixes) == 0 && !sources[p.Name] {
			msgs = append(msgs, fmt.Sprintf("pool %s: prefixes= is required: the keys the pool takes (a pool named by warm= or shadow=, or by WARM_POOL or SHADOW_POOL, may have none)", short(p.Name)))
		}
	}
	return msgs
}

// validatePolicyVars checks the warm-up and shadow variables. The names
// WARM_POOL and SHADOW_POOL give are checked against pools only when they
// are known: POOLS_FILE is read apart (ValidatePoolsFile).
func (c Config) validatePolicyVars(pools Pools, known bool) []error {
	var errs []error
	bad := func(name, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s%s: %s", Prefix, name, fmt.Sprintf(format, args...)))
	}
	names := []string{}
	for _, p := range pools {
		names = append(names, p.Name)
	}
	for _, v := range []struct{ name, val string }{{"WARM_POOL", c.WarmPool}, {"SHADOW_POOL", c.ShadowPool}} {
		switch {
		case v.val == "":
		case v.val == DefaultPoolName:
			bad(v.name, "%q is the default pool itself; name a pool of %sPOOLS", v.val, Prefix)
		case known && !slices.Contains(names, v.val):
			bad(v.name, "%q is not a pool of %sPOOLS or %sPOOLS_FILE (%s)", v.val, Prefix, Prefix, joinNames(names))
		}
	}
	if c.WarmPool != "" && c.WarmPool == c.ShadowPool {
		bad("SHADOW_POOL", "%q is also WARM_POOL: a pool cannot be both", c.ShadowPool)
	}
	if !validPercent(c.ShadowPercent) {
		bad("SHADOW_PERCENT", "must be a percentage above 0, at most 100, got %g", c.ShadowPercent)
	}
	if c.WarmDefaultTTL < time.Second {
		bad("WARM_DEFAULT_TTL", "must be at least 1s, got %s", c.WarmDefaultTTL)
	}
	if c.WarmDefaultTTL > 30*24*time.Hour {
		bad("WARM_DEFAULT_TTL", "must be at most 720h (memcached reads longer TTLs as dates), got %s", c.WarmDefaultTTL)
	}
	for _, v := range []struct {
		name string
		val  int64
	}{{"WARM_BACKGROUND_BYTES", c.WarmBackgroundBytes}, {"WARM_BACKGROUND_OPS", int64(c.WarmBackgroundOps)},
		{"SHADOW_BACKGROUND_BYTES", c.ShadowBackgroundBytes}, {"SHADOW_BACKGROUND_OPS", int64(c.ShadowBackgroundOps)}} {
		if v.val < 1 {
			bad(v.name, "must be at least 1, got %d", v.val)
		}
	}
	return errs
}

func joinNames(names []string) string {
	if len(names) == 0 {
		return "there are none"
	}
	return "pools: " + strings.Join(names, ", ")
}
