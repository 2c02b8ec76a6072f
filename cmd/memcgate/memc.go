package main

import (
	"github.com/memcgate/memcgate/config"
	"github.com/memcgate/memcgate/gateway"
)

// memcOptions maps the MEMCGATE_MEMC_* settings onto the gateway; nil when
// every compatible endpoint is off.
func memcOptions(m config.Memc, c gateway.MemcCluster) *gateway.MemcOptions {
	if m.Path == "" && m.KeyPath == "" {
		return nil
	}
	return &gateway.MemcOptions{
		Path:                m.Path,
		KeyPath:             m.KeyPath,
		CmdsAllowed:         m.Commands(),
		FlagsToLastModified: m.FlagsToLastModified,
		FlagsHeader:         m.FlagsHeader,
		ContentType:         m.ContentType,
		MaxBodyBytes:        m.MaxBodyBytes,
		Cluster:             c,
	}
}
