package main

import (
	"reflect"
	"testing"

	"github.com/memcgate/memcgate/config"
	"github.com/memcgate/memcgate/gateway"
	"github.com/memcgate/memcgate/upstream"
	"github.com/memcgate/memcgate/upstream/hashring"
)

// TestDistributionsBuild keeps config's list of DISTRIBUTION values, which
// cannot import hashring, in step with the distributions hashring builds.
func TestDistributionsBuild(t *testing.T) {
	members := []hashring.Member{{Host: "10.0.0.1", Port: 11211, Weight: 1}, {Host: "10.0.0.2", Port: 11211, Weight: 2}}
	for _, d := range config.Distributions() {
		if _, err := hashring.New(hashring.Distribution(d), members); err != nil {
			t.Errorf("config accepts MEMCGATE_DISTRIBUTION=%s, but hashring.New: %v", d, err)
		}
	}
}

func TestPeclMemcacheOptions(t *testing.T) {
	tests := []struct {
		env  map[string]string
		want gateway.PeclMemcacheOptions
	}{
		{map[string]string{}, gateway.PeclMemcacheOptions{Threshold: 20000, MinSavings: 0.2}},
		{map[string]string{"MEMCGATE_PECL_COMPRESS_THRESHOLD": "0"}, gateway.PeclMemcacheOptions{Threshold: -1, MinSavings: 0.2}},
		{map[string]string{"MEMCGATE_PECL_COMPRESS_THRESHOLD": "100", "MEMCGATE_PECL_COMPRESS_MIN_SAVINGS": "0"}, gateway.PeclMemcacheOptions{Threshold: 100, MinSavings: -1}},
		{map[string]string{"MEMCGATE_PECL_COMPRESS_MIN_SAVINGS": "0.5"}, gateway.PeclMemcacheOptions{Threshold: 20000, MinSavings: 0.5}},
	}
	for _, tt := range tests {
		cfg, err := config.Load(tt.env)
		if err != nil {
			t.Fatalf("config.Load(%v): %v", tt.env, err)
		}
		if got := peclMemcacheOptions(cfg); got != tt.want {
			t.Errorf("peclMemcacheOptions(%v) = %+v, want %+v", tt.env, got, tt.want)
		}
	}
}

// TestDefaultsAgree: the binary's defaults (config's) are the packages'
// own, so that a default is one value wherever it is written down: the
// options made from an empty environment equal the zero options with the
// packages' defaults filled in, for every field both set.
func TestDefaultsAgree(t *testing.T) {
	cfg, err := config.Load(map[string]string{})
	if err != nil {
		t.Fatal(err)
	}
	up := upstreamOptions(cfg)
	zero := upstream.Options{Servers: up.Servers}.WithDefaults()
	// Fields whose zero value is itself the binary's default, or that the
	// binary sets from a switch rather than a default, are not compared.
	zero.PipelineConns, zero.BatchGets, zero.Health.PassiveFails, zero.FailoverTTL = up.PipelineConns, up.BatchGets, up.Health.PassiveFails, up.FailoverTTL
	zero.Dialer = up.Dialer
	if !reflect.DeepEqual(up, zero) {
		t.Errorf("upstream options from the default configuration:\n%+v\nthe package's defaults:\n%+v", up, zero)
	}
	gw := gatewayOptions(cfg)
	gzero := gateway.Options{}.WithDefaults()
	gzero.AccessLog, gzero.Codec, gzero.PHP, gzero.PeclMemcache, gzero.MaxRequests = gw.AccessLog, gw.Codec, gw.PHP, gw.PeclMemcache, gw.MaxRequests
	if !reflect.DeepEqual(gw, gzero) {
		t.Errorf("gateway options from the default configuration:\n%+v\nthe package's defaults:\n%+v", gw, gzero)
	}
}
