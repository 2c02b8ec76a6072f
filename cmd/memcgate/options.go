package main

import (
	"context"
	"net"
	"strconv"

	"github.com/memcgate/memcgate/config"
	"github.com/memcgate/memcgate/gateway"
	"github.com/memcgate/memcgate/gateway/budget"
	"github.com/memcgate/memcgate/gateway/phpvalue"
	"github.com/memcgate/memcgate/upstream"
	"github.com/memcgate/memcgate/upstream/hashring"
	"github.com/memcgate/memcgate/upstream/route"
)

// upstreamOptions maps the configuration onto the upstream package; the
// only place that knows both.
func upstreamOptions(cfg config.Config) upstream.Options {
	udp, _ := cfg.UDPPortMap() // validated by config.Load
	servers := make([]upstream.Server, len(cfg.Servers))
	for i, s := range cfg.Servers {
		servers[i] = upstream.Server{Host: s.Host, Port: s.Port, Weight: s.Weight, UDPPort: udp[s.Addr()]}
	}
	return upstream.Options{
		Servers:        servers,
		Distribution:   hashring.Distribution(cfg.Distribution),
		KeyPrefix:      cfg.KeyPrefix,
		HashWithPrefix: cfg.HashWithPrefix,
		Timeout:        cfg.Timeout,
		MaxIdleConns:   cfg.MaxIdleConns,
		MaxConns:       cfg.MaxConns,
		PipelineConns:  cfg.PipelineConns,
		MaxInFlight:    cfg.MaxInFlight,
		RequestSlots:   cfg.MaxRequests,
		MaxAttempts:    cfg.MaxAttempts,
		BatchGets:      cfg.BatchGets,
		Failover:       upstream.FailoverPolicy(cfg.Failover),
		FailoverTTL:    cfg.FailoverTTL,
		Health: upstream.HealthOptions{
			Interval:          cfg.HealthInterval,
			Timeout:           cfg.HealthTimeout,
			Fall:              cfg.Fall,
			Rise:              cfg.Rise,
			PassiveFails:      cfg.PassiveFails,
			MaxEjectedPercent: cfg.MaxEjectedPercent,
			PanicPercent:      cfg.PanicPercent,
			ReadyMinUpPercent: cfg.ReadyMinUpPercent,
			FlapWindow:        cfg.FlapWindow,
			FlapBackoff:       cfg.FlapBackoff,
			FlapBackoffMax:    cfg.FlapBackoffMax,
			ReadmitFlush:      cfg.ReadmitFlush,
		},
	}
}

// routeOptions maps the configuration onto the pools: the default pool
// (SERVERS and the upstream settings, REPLICAS and the policies), then
// each pool of POOLS with the same upstream settings but its own nodes,
// and whatever it leaves out taken from the default pool's variables. The
// only place that knows both. dialer and claims (the byte budget, which
// holds what gomemcache's pool allocates for values past
// MAX_VALUE_BYTES) are the running process's: a reload passes nil, as
// its pools keep their own.
func routeOptions(cfg config.Config, dialer func(ctx context.Context, network, address string) (net.Conn, error), claims upstream.Claims) route.Options {
	uo := upstreamOptions(cfg)
	uo.Dialer, uo.Claims, uo.UnheldClaim = dialer, claims, int(cfg.MaxValueBytes)
	o := route.Options{
		HedgeMinDelay:   cfg.HedgeMinDelay,
		HedgeMaxDelay:   cfg.HedgeMaxDelay,
		HedgeMaxPercent: cfg.HedgeMaxPercent,
		BackgroundBytes: cfg.ReplicaBackgroundBytes,
		BackgroundOps:   cfg.ReplicaBackgroundOps,
		Pools: []route.PoolOptions{{
			Name: route.DefaultPool, Cluster: uo, Replicas: cfg.Replicas,
			Write: route.WritePolicy(cfg.WritePolicy), Read: route.ReadPolicy(cfg.ReadPolicy), MissFallback: cfg.MissFallback,
			Warm: cfg.WarmPool, Shadow: cfg.ShadowPool, ShadowPercent: shadowPercent(cfg.ShadowPool, 0, cfg.ShadowPercent),
		}},
		WarmDefaultTTL:        cfg.WarmDefaultTTL,
		WarmBackgroundBytes:   cfg.WarmBackgroundBytes,
		WarmBackgroundOps:     cfg.WarmBackgroundOps,
		ShadowBackgroundBytes: cfg.ShadowBackgroundBytes,
		ShadowBackgroundOps:   cfg.ShadowBackgroundOps,
	}
	or := func(v, def string) string {
		if v == "" {
			return def
		}
		return v
	}
	for _, p := range cfg.Pools {
		co := uo
		co.Servers = make([]upstream.Server, len(p.Servers))
		for i, s := range p.Servers {
			co.Servers[i] = upstream.Server{Host: s.Host, Port: s.Port, Weight: s.Weight}
		}
		co.Distribution = hashring.Distribution(or(p.Distribution, cfg.Distribution))
		co.Failover = upstream.FailoverPolicy(or(p.Failover, cfg.Failover))
		replicas := p.Replicas
		if replicas == 0 {
			replicas = cfg.Replicas
		}
		o.Pools = append(o.Pools, route.PoolOptions{
			Name: p.Name, Prefixes: p.Prefixes, Cluster: co, Replicas: replicas,
			Write:         route.WritePolicy(or(p.Write, cfg.WritePolicy)),
			Read:          route.ReadPolicy(or(p.Read, cfg.ReadPolicy)),
			MissFallback:  or(p.MissFallback, strconv.FormatBool(cfg.MissFallback)) == "true",
			Warm:          p.Warm,
			Shadow:        p.Shadow,
			ShadowPercent: shadowPercent(p.Shadow, p.ShadowPercent, cfg.ShadowPercent),
		})
	}
	return o
}

// shadowPercent is a pool's shadow sample: its own, else SHADOW_PERCENT;
// 0 without a shadow pool.
func shadowPercent(shadow string, own, def float64) float64 {
	switch {
	case shadow == "":
		return 0
	case own != 0:
		return own
	}
	return def
}

// gatewayOptions maps the configuration onto the gateway's options but
// for what serve makes at run time (routes, tokens, budget, log writer,
// the Store's capabilities); the only place that knows both.
func gatewayOptions(cfg config.Config) gateway.Options {
	return gateway.Options{
		MaxKeyLen:             gateway.MaxKeyLen - len(cfg.KeyPrefix),
		MaxValueBytes:         cfg.MaxValueBytes,
		BigValueMaxBytes:      cfg.BigValueMaxBytes,
		BigValueGrace:         cfg.WriteTimeout + cfg.RequestTimeout, // the longest a response may take, and its last chunk
		WriteTimeout:          cfg.WriteTimeout,
		DefaultTTL:            cfg.DefaultTTL,
		RequestTimeout:        cfg.RequestTimeout,
		AccessLog:             cfg.AccessLog,
		ReadOnly:              cfg.ReadOnly,
		MaxRequests:           cfg.MaxRequests,
		BatchMaxOps:           cfg.BatchMaxOps,
		BatchMaxBytes:         cfg.BatchMaxBytes,
		AsyncQueue:            cfg.AsyncQueue,
		AsyncWorkers:          cfg.AsyncWorkers,
		BatchMaxResponseBytes: cfg.BatchMaxResponseBytes,
		AsyncQueueBytes:       cfg.AsyncQueueBytes,
		Codec:                 gateway.ValueCodec(cfg.ValueCodec),
		PHP:                   phpOptions(cfg),
		PeclMemcache:          peclMemcacheOptions(cfg),
	}
}

// phpOptions maps the PHP_COMPRESSION* settings onto the codec.
func phpOptions(cfg config.Config) gateway.PHPOptions {
	o := gateway.PHPOptions{Threshold: cfg.PHPCompressionThreshold, Factor: cfg.PHPCompressionFactor}
	switch cfg.PHPCompression {
	case "zlib":
		o.Compression = phpvalue.CompressZlib
	case "none":
		o.Compression = phpvalue.CompressNone
	default:
		o.Compression = phpvalue.CompressFastLZ
	}
	return o
}

// peclMemcacheOptions maps the PECL_COMPRESS_* settings onto the codec,
// whose zero values mean "default": a threshold of 0 (never compress) and
// savings of 0 (keep any compressed form that fits) become negative.
func peclMemcacheOptions(cfg config.Config) gateway.PeclMemcacheOptions {
	o := gateway.PeclMemcacheOptions{Threshold: cfg.PeclCompressThreshold, MinSavings: cfg.PeclCompressMinSavings}
	if o.Threshold == 0 {
		o.Threshold = -1
	}
	if o.MinSavings == 0 {
		o.MinSavings = -1
	}
	return o
}

// statusInfo maps the pools' node states, ring shares and policies onto
// the admin status page; the only place that knows both. The ring and
// failover settings are cfg's (the configuration in force).
func statusInfo(r *route.Router, cfg config.Config) gateway.StatusInfo {
	st := gateway.StatusInfo{Distribution: cfg.Distribution, Failover: cfg.Failover}
	pools := r.Status()
	for _, p := range pools {
		pi := gateway.PoolInfo{Name: p.Name, Prefixes: p.Prefixes, Replicas: p.Replicas, Write: string(p.Write),
			Read: string(p.Read), MissFallback: p.MissFallback, HedgeDelay: p.HedgeDelay, Nodes: len(p.Nodes),
			Warm: p.Warm, Shadow: p.Shadow, ShadowPercent: p.ShadowPercent}
		for _, n := range p.Nodes {
			if n.Up {
				pi.Up++
			}
			st.Nodes = append(st.Nodes, gateway.NodeInfo{
				Pool: n.Pool, Name: n.Node, Up: n.Up, Since: n.Since, Reason: n.Reason, Share: p.Shares[n.Node],
				InFlight: n.InFlight, Connections: n.Connections, Flaps: n.Flaps, HoldUntil: n.HoldUntil,
				Restarted: n.Restarted,
			})
		}
		st.Pools = append(st.Pools, pi)
	}
	return st
}

// debugConfig is what /debug/config shows: the binary, the configuration
// in force (config.Effective: every variable, secrets redacted, which ones
// differ from the defaults, the warnings; after a reload, the reloaded
// one, with the nodes its source gave) and what was derived from it.
type debugConfig struct {
	Build buildInfo `json:"build"`
	config.Effective
	Derived struct {
		MaxBufferedBytes int64 `json:"max_buffered_bytes"` // the byte budget in force (MEMCGATE_MAX_BUFFERED_BYTES=0 derives it)
	} `json:"derived"`
}

func newDebugConfig(b buildInfo, cfg config.Config, buffered *budget.Budget) debugConfig {
	d := debugConfig{Build: b, Effective: cfg.Effective()}
	d.Derived.MaxBufferedBytes = buffered.Limit()
	return d
}
