package main

import (
	"github.com/memcgate/memcgate/config"
	"github.com/memcgate/memcgate/gateway"
	"github.com/memcgate/memcgate/gateway/memc"
	"github.com/memcgate/memcgate/upstream/route"
)

// memcRoutes maps the MEMCGATE_MEMC_* settings onto the compatible
// endpoints, whose keyed commands run on store; none when both are off.
func memcRoutes(cfg config.Config, store memc.Store, c *route.Router, access *gateway.Access) []gateway.Route {
	m := cfg.Memc
	rt, ok := memc.New(memc.Options{
		Path:                m.Path,
		KeyPath:             m.KeyPath,
		CmdsAllowed:         m.Commands(),
		FlagsToLastModified: m.FlagsToLastModified,
		FlagsHeader:         m.FlagsHeader,
		ContentType:         m.ContentType,
		MaxBodyBytes:        m.MaxBodyBytes,
		MaxKeyLen:           gateway.MaxKeyLen - len(cfg.KeyPrefix),
		Access:              access,
		Store:               store,
		Cluster:             c,
	})
	if !ok {
		return nil
	}
	return []gateway.Route{rt}
}
