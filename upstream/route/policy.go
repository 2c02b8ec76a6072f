package route

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/upstream"
	"github.com/memcgate/memcgate/upstream/op"
)

// Pool policies that involve a second pool: warm-up (warm.go), where a
// miss in a pool is read from another pool and written back, and shadow
// (shadow.go), where a sample of a pool's keys is also sent to another
// pool and the answers compared. The other pool is named by
// PoolOptions.Warm and PoolOptions.Shadow; its own prefixes, if any, still
// route keys to it, and its own warm and shadow settings apply to those
// keys only, never to requests it serves for another pool (so policies
// never chain). The extra work runs in the background, under budgets of
// its own (Options.WarmBackground*, Options.ShadowBackground*): what does
// not fit is dropped and counted, never waited for.

// Defaults of the policies' options.
const (
	defaultWarmTTL       = 5 * time.Minute
	defaultShadowPercent = 100
	defaultPolicyBytes   = 16 << 20
	defaultPolicyOps     = 1024
)

// withPolicyDefaults fills the defaults of the warm-up and shadow options.
func (o *Options) withPolicyDefaults() {
	if o.WarmDefaultTTL <= 0 {
		o.WarmDefaultTTL = defaultWarmTTL
	}
	if o.WarmBackgroundBytes <= 0 {
		o.WarmBackgroundBytes = defaultPolicyBytes
	}
	if o.WarmBackgroundOps <= 0 {
		o.WarmBackgroundOps = defaultPolicyOps
	}
	if o.ShadowBackgroundBytes <= 0 {
		o.ShadowBackgroundBytes = defaultPolicyBytes
	}
	if o.ShadowBackgroundOps <= 0 {
		o.ShadowBackgroundOps = defaultPolicyOps
	}
	for i := range o.Pools {
		if p := &o.Pools[i]; p.Shadow != "" && p.ShadowPercent == 0 {
			p.ShadowPercent = defaultShadowPercent
		}
	}
}

// validatePolicies checks the pools' Warm and Shadow settings: each names
// another pool, not the same one for both.
func (o *Options) validatePolicies() []error {
	names := map[string]bool{}
	for _, p := range o.Pools {
		names[p.Name] = true
	}
	var errs []error
	for _, p := range o.Pools {
		for _, ref := range []struct{ what, name string }{{"warm", p.Warm}, {"shadow", p.Shadow}} {
			switch {
			case ref.name == "":
			case ref.name == p.Name:
				errs = append(errs, fmt.Errorf("route: pool %q names itself as its %s pool", p.Name, ref.what))
			case !names[ref.name]:
				errs = append(errs, fmt.Errorf("route: pool %q: %s pool %q is not a pool", p.Name, ref.what, ref.name))
			}
		}
		if p.Warm != "" && p.Warm == p.Shadow {
			errs = append(errs, fmt.Errorf("route: pool %q: pool %q cannot be both its warm and its shadow pool", p.Name, p.Warm))
		}
		if p.Shadow == "" && p.ShadowPercent != 0 {
			errs = append(errs, fmt.Errorf("route: pool %q: a shadow percent without a shadow pool", p.Name))
		}
		if p.ShadowPercent < 0 || p.ShadowPercent > 100 {
			errs = append(errs, fmt.Errorf("route: pool %q: shadow percent %g is not in (0, 100]", p.Name, p.ShadowPercent))
		}
	}
	return errs
}

// source reports whether some pool names name as its warm or shadow pool:
// such a pool is reached without a prefix of its own.
func (o *Options) source(name string) bool {
	for _, p := range o.Pools {
		if p.Warm == name || p.Shadow == name {
			return true
		}
	}
	return false
}

// policies are a view's warm-up and shadow settings, resolved to the
// views of the same table.
type policies struct {
	warm      *view
	shadow    *view
	shadowPct float64
	shadowCut uint64 // a key is shadowed if its sample hash is below it
	px        *policyState
	wm        warmMetrics
	sm        *shadowMetrics
}

// active reports whether the view has a warm or a shadow pool.
func (p *policies) active() bool { return p.warm != nil || p.shadow != nil }

// policyState is what the policies share across reconfigurations: their
// budgets, their metrics and the write-backs' default TTL.
type policyState struct {
	warmTTL int32 // seconds
	warmBG  *bound
	shadBG  *bound
	m       *pairMetrics
}

func newPolicyState(o Options, reg prometheus.Registerer) *policyState {
	px := &policyState{
		warmTTL: int32(max(o.WarmDefaultTTL/time.Second, 1)),
		warmBG:  &bound{maxBytes: o.WarmBackgroundBytes, maxOps: int64(o.WarmBackgroundOps)},
		shadBG:  &bound{maxBytes: o.ShadowBackgroundBytes, maxOps: int64(o.ShadowBackgroundOps)},
	}
	px.m = newPairMetrics(reg, px.warmBG, px.shadBG)
	return px
}

// linkPolicies resolves each view's warm and shadow pool names in t.
func (t *table) linkPolicies(pools []PoolOptions, px *policyState) {
	byName := map[string]*view{}
	for _, v := range t.views {
		byName[v.name] = v
	}
	for i, po := range pools {
		v := t.views[i]
		v.pol = policies{px: px}
		if po.Warm != "" {
			v.pol.warm = byName[po.Warm]
			v.pol.wm = px.m.forWarm(v.name, po.Warm)
		}
		if po.Shadow != "" {
			v.pol.shadow = byName[po.Shadow]
			v.pol.shadowPct = po.ShadowPercent
			v.pol.shadowCut = uint64(po.ShadowPercent / 100 * float64(sampleSpace))
			v.pol.sm = px.m.forShadow(v.name, po.Shadow)
		}
	}
}

// sampleSpace is the range of sample hashes: percents down to 0.0001 mean
// something.
const sampleSpace = 1_000_000

// sampleHash places key in [0, sampleSpace): FNV-1a, the same in every
// gateway and every run, so that a key is shadowed everywhere or nowhere.
func sampleHash(key string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(key))
	return h.Sum64() % sampleSpace
}

// sampled reports whether key is in the view's shadow sample.
func (p *policies) sampled(key string) bool {
	return p.shadow != nil && sampleHash(key) < p.shadowCut
}

// own runs o in the view's pool under its replication policy only.
func (v *view) own(ctx context.Context, o op.Op) op.Result {
	if v.replicas == 1 {
		return v.c.Do(ctx, o)
	}
	return v.do(ctx, o)
}

// doPolicies runs o on a view with a warm or a shadow pool.
func (v *view) doPolicies(ctx context.Context, o op.Op) op.Result {
	var res op.Result
	if v.pol.warm != nil {
		res = v.warmDo(ctx, o)
	} else {
		res = v.own(ctx, o)
	}
	if v.pol.sampled(routeKey(&o)) {
		v.shadowDo(o, res)
	}
	return res
}

// background returns a context for work that outlives its request: a
// deadline of its own, and none of the request's values or cancellation.
func background(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}

// ownKeys returns o with copies of its keys. Work that outlives its
// request counts only the bytes of its values against its budget; a key
// is a slice of the request's target, which a long query string makes
// kilobytes long, and a context of the request's holds it too (hence
// background's and detach's contexts carry none of its values: nothing
// below reads them).
func ownKeys(o op.Op) op.Op {
	o.Item.Key, o.HashKey = strings.Clone(o.Item.Key), strings.Clone(o.HashKey)
	return o
}

// outcomeClass sorts an operation's answer for comparing two pools'
// answers: 0 for success, a protocol outcome's own number, or -1 for
// anything else (a failure; callers sort those out first).
func outcomeClass(err error) int {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, upstream.ErrNotFound):
		return 1
	case errors.Is(err, upstream.ErrExists):
		return 2
	case errors.Is(err, upstream.ErrCASConflict):
		return 3
	case errors.Is(err, upstream.ErrNotNumeric):
		return 4
	case errors.Is(err, upstream.ErrBadKey):
		return 5
	case errors.Is(err, upstream.ErrTooLarge):
		return 6
	case errors.Is(err, upstream.ErrNoMemory):
		return 7
	}
	return -1
}

// policyChanges lists the warm-up and shadow settings that differ between
// two views of one pool, as Change.Policy names them.
func policyChanges(old *view, po PoolOptions) []string {
	var out []string
	name := func(v *view) string {
		if v == nil {
			return ""
		}
		return v.name
	}
	if name(old.pol.warm) != po.Warm {
		out = append(out, "warm")
	}
	if name(old.pol.shadow) != po.Shadow {
		out = append(out, "shadow")
	}
	if old.pol.shadowPct != po.ShadowPercent {
		out = append(out, "shadow_percent")
	}
	return out
}
