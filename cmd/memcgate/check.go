package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/memcgate/memcgate/cmd/memcgate/internal/liveconfig"
	"github.com/memcgate/memcgate/config"
	"github.com/memcgate/memcgate/gateway/budget"
	"github.com/memcgate/memcgate/upstream/route"
	"github.com/prometheus/client_golang/prometheus"
)

// check reads the configuration as a start reads it (the environment,
// MEMCGATE_CONFIG_FILE over it, the nodes from their source, the token
// and TLS files) and returns the problems a start would stop at; it
// opens no listener and sends nothing to memcached. Run before the
// reload signal (the systemd unit's ExecReload=), it makes
// "systemctl reload" fail, printing why, on an edit the running gateway
// would refuse, where the signal alone succeeds whatever the gateway
// does with it (docs/decisions/0081). What it passes is printed to out,
// with the configuration's warnings.
func check(ctx context.Context, environ map[string]string, args []string, out io.Writer) error {
	if len(args) > 0 {
		return fmt.Errorf("check takes no argument, got %q (it reads the configuration from the environment and %sCONFIG_FILE)", args[0], config.Prefix)
	}
	cfg, err := liveconfig.Load(ctx, environ)
	if err != nil {
		return fmt.Errorf("invalid configuration:\n%w", err)
	}
	sec, err := newSecurity(cfg)
	if err != nil {
		return fmt.Errorf("invalid configuration:\n%w", err)
	}
	if err := checkRoutes(cfg, sec); err != nil {
		return fmt.Errorf("invalid configuration:\n%w", err)
	}
	for _, w := range append(cfg.Warnings(), processWarnings(cfg, environ)...) {
		fmt.Fprintln(out, "warning:", w)
	}
	if sec.noToken {
		fmt.Fprintf(out, "warning: %sAUTH_TOKENS_FILE gives no token: every request that needs a scope would be refused (401)\n", config.Prefix)
	}
	fmt.Fprintln(out, "configuration ok")
	return nil
}

// checkRoutes builds the pools' router as a start does (process.upstream)
// and lets it go, for what it refuses beyond the configuration's own
// checks: two nodes whose CAS tags clash, a pool's policies. route.New
// opens no connection and starts no goroutine.
func checkRoutes(cfg config.Config, sec *security) error {
	r, err := route.New(routeOptions(cfg, sec.dialer, budget.New(0)), slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		return err
	}
	return r.Close()
}
