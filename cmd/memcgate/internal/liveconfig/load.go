package liveconfig

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/memcgate/memcgate/config"
)

// Load reads the configuration from environ and CONFIG_FILE, with the
// nodes from their source (SERVERS, SERVERS_FILE or SERVERS_DNS). Its
// errors say which variable or file is wrong.
func Load(ctx context.Context, environ map[string]string) (config.Config, error) {
	environ, err := withConfigFile(environ)
	if err != nil {
		return config.Config{}, err
	}
	return loadEnviron(ctx, environ)
}

// withConfigFile is environ with the variables of its CONFIG_FILE, if it
// names one, over it.
func withConfigFile(environ map[string]string) (map[string]string, error) {
	f := environ[config.Prefix+"CONFIG_FILE"]
	if f == "" {
		return environ, nil
	}
	over, err := config.ReadEnvFile(f)
	if err != nil {
		return nil, err
	}
	// The file read is the environment's: one named inside it would be
	// neither read nor watched.
	if v, ok := over[config.Prefix+"CONFIG_FILE"]; ok && v != f {
		return nil, fmt.Errorf("%sCONFIG_FILE %s names %s: set %sCONFIG_FILE in the environment", config.Prefix, f, v, config.Prefix)
	}
	return config.Overlay(environ, over), nil
}

// loadEnviron reads the configuration from environ, CONFIG_FILE's
// variables already in it, with the nodes from their source.
func loadEnviron(ctx context.Context, environ map[string]string) (config.Config, error) {
	cfg, err := config.Load(environ)
	if err != nil {
		return cfg, err
	}
	servers, err := resolveServers(ctx, cfg)
	if err != nil {
		return cfg, err
	}
	cfg.Servers = servers
	if err := cfg.ValidateResolvedServers(); err != nil {
		return cfg, err
	}
	if cfg.PoolsFile != "" {
		pools, err := config.ReadPoolsFile(cfg.PoolsFile)
		if err != nil {
			return cfg, err
		}
		if err := cfg.ValidatePoolsFile(pools); err != nil {
			return cfg, err
		}
		cfg.Pools = pools
	}
	if _, err := cfg.Tokens(); err != nil {
		return cfg, err
	}
	return cfg, nil
}

// resolveServers returns the nodes of cfg's source.
func resolveServers(ctx context.Context, cfg config.Config) ([]config.Server, error) {
	switch {
	case cfg.ServersFile != "":
		return config.ReadServersFile(cfg.ServersFile)
	case cfg.ServersDNS != "":
		return lookupServers(ctx, cfg)
	}
	return cfg.Servers, nil
}

// lookupServers resolves SERVERS_DNS: the targets of its SRV records (by
// name, which the ring hashes), or the addresses of its name; sorted, so
// that the order does not follow the DNS server's, and each node once.
// An SRV record whose target is "." says the service is not available
// (RFC 2782) and gives no node. A record with port 0, or an unspecified
// address (0.0.0.0, ::: what some DNS filters answer for a blocked name,
// and a dial to it reaches this host), refuses the answer, as does an
// answer that leaves no node.
func lookupServers(ctx context.Context, cfg config.Config) ([]config.Server, error) {
	srv, host, port, err := config.SplitDNS(cfg.ServersDNS)
	if err != nil {
		return nil, err
	}
	r := &net.Resolver{Dial: dialCut(&net.Dialer{}, "")}
	if cfg.DNSServer != "" {
		r = &net.Resolver{PreferGo: true, Dial: dialCut(&net.Dialer{Timeout: 2 * time.Second}, cfg.DNSServer)}
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var out []config.Server
	if srv {
		_, recs, err := r.LookupSRV(ctx, "", "", host)
		if err != nil {
			return nil, lookupError(cfg, host, err)
		}
		for _, rec := range recs {
			target := strings.TrimSuffix(rec.Target, ".")
			switch {
			case target == "":
				continue
			case rec.Port == 0:
				return nil, fmt.Errorf("%sSERVERS_DNS %s: the record for %s has port 0", config.Prefix, host, target)
			}
			out = append(out, config.Server{Host: target, Port: int(rec.Port), Weight: 1})
		}
	} else {
		addrs, err := r.LookupHost(ctx, host)
		if err != nil {
			return nil, lookupError(cfg, host, err)
		}
		for _, a := range addrs {
			if ip, err := netip.ParseAddr(a); err != nil || ip.IsUnspecified() {
				return nil, fmt.Errorf("%sSERVERS_DNS %s: %s is no node's address", config.Prefix, host, a)
			}
			out = append(out, config.Server{Host: a, Port: port, Weight: 1})
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%sSERVERS_DNS %s: no records name a node", config.Prefix, cfg.ServersDNS)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Addr() < out[j].Addr() })
	return slices.CompactFunc(out, func(a, b config.Server) bool { return a.Addr() == b.Addr() }), nil
}

// dialCut is a resolver's Dial: it dials with d (server, if not empty,
// instead of the server the resolver asks) and closes the connection
// when the lookup's context ends. Go's resolver sets the context's
// deadline on its connection but does not watch the context, so a
// lookup whose server does not answer ran on to its timeout (5 s) after
// its context was cancelled: a SIGTERM during a reload waited for it.
func dialCut(d *net.Dialer, server string) func(ctx context.Context, network, address string) (net.Conn, error) {
	return func(ctx context.Context, network, address string) (net.Conn, error) {
		if server != "" {
			address = server
		}
		c, err := d.DialContext(ctx, network, address)
		if err != nil {
			return nil, err
		}
		context.AfterFunc(ctx, func() { c.Close() })
		return c, nil
	}
}

// lookupError is err, the failed lookup of SERVERS_DNS's host, naming
// the DNS server asked. With DNS_SERVER set, Go's resolver still names
// the server of /etc/resolv.conf it passed to Dial, which asked
// DNS_SERVER instead.
func lookupError(cfg config.Config, host string, err error) error {
	var de *net.DNSError
	if cfg.DNSServer != "" && errors.As(err, &de) {
		asked := *de
		asked.Server = cfg.DNSServer
		err = &asked
	}
	return fmt.Errorf("%sSERVERS_DNS %s: %w", config.Prefix, host, err)
}
