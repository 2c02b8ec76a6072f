package main

import (
	"testing"

	"github.com/memcgate/memcgate/config"
	"github.com/memcgate/memcgate/gateway"
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
