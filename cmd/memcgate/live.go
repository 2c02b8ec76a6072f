package main

import (
	"context"
	"fmt"
	"log/slog"
	"slices"

	"github.com/memcgate/memcgate/cmd/memcgate/internal/liveconfig"
	"github.com/memcgate/memcgate/config"
	"github.com/memcgate/memcgate/gateway"
	"github.com/memcgate/memcgate/gateway/budget"
	"github.com/memcgate/memcgate/gateway/bufpool"
	"github.com/memcgate/memcgate/gateway/h1"
	"github.com/memcgate/memcgate/gateway/listen"
	"github.com/memcgate/memcgate/upstream/route"
)

// liveParts are the parts of the running gateway a reload changes
// (liveconfig.Options.Apply); the only place that maps the live settings
// onto them.
type liveParts struct {
	log       *slog.Logger
	level     *slog.LevelVar
	router    *route.Router
	handler   *gateway.Handler
	access    *gateway.Access
	budget    *budget.Budget
	budgetDef int64              // MAX_BUFFERED_BYTES when unset (derived at start)
	bodies    *bufpool.Pool      // keeps as many bytes of body buffers as the budget
	conns     *connTracker       // sets the cap on client connections
	fast      *h1.Server         // the fast path, nil without it: its bodies wait for room up to REQUEST_TIMEOUT
	hosts     *gateway.HostCheck // ALLOWED_HOSTS of both listeners
	nofile    uint64             // the open-file limit MAX_CLIENT_CONNS=0 derives the cap from
	sec       *security          // the TLS files in force, loaded again at each reload
	started   config.Config      // the configuration at start: which TLS files those are
}

// checkTLS refuses a configuration whose TLS files do not load.
func checkTLS(cfg config.Config) error {
	_, err := newSecurity(cfg)
	return err
}

// apply makes u's live settings take effect. It changes nothing if it
// fails.
func (p *liveParts) apply(ctx context.Context, u liveconfig.Update) ([]route.Change, error) {
	next := u.Config
	allowed, err := config.ParseAllowedHosts(next.AllowedHosts)
	if err != nil {
		return nil, fmt.Errorf("%sALLOWED_HOSTS: %w", config.Prefix, err)
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(next.LogLevel)); err != nil {
		return nil, fmt.Errorf("%sLOG_LEVEL: %w", config.Prefix, err)
	}
	// The TLS files as they are now, the same files: a certificate renewed
	// in place is served from this reload on (docs/decisions/0094). Put
	// in force before the pools change, so that the nodes a reload adds
	// are probed with the CA bundle and client certificate of the files
	// read with their list; put back if the pools' change is refused.
	undoTLS, err := p.sec.reloadTLS(p.started)
	if err != nil {
		return nil, err
	}
	var changes []route.Change
	if u.Routes != nil {
		if changes, err = p.router.Reconfigure(ctx, routeOptions(*u.Routes, nil, nil)); err != nil {
			undoTLS()
			return nil, err
		}
	}
	p.access.Set(gatewayTokens(u.Tokens, next.AuthTokensFile), next.ReadOnly)
	p.hosts.Set(gateway.NewAllowedHosts(allowed))
	p.level.Set(level)
	p.handler.SetLimits(next.MaxRequests, next.RequestTimeout, next.AccessLog)
	if p.fast != nil {
		p.fast.SetBudgetWait(next.RequestTimeout)
	}
	p.router.SetRequestSlots(next.MaxRequests)
	limit := p.budgetDef
	if next.MaxBufferedBytes > 0 {
		limit = next.MaxBufferedBytes
	}
	p.budget.SetLimit(limit)
	p.bodies.SetMax(int(limit))
	connMax := listen.ConnCap(next.MaxClientConns, p.nofile)
	p.conns.setMax(connMax)
	if slices.Contains(u.Changed, config.Prefix+"MAX_CLIENT_CONNS") {
		warnConnCap(p.log, connMax, p.nofile) // as at start
	}
	return changes, nil
}
