package memc

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/gateway"
	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream"
	"github.com/memcgate/memcgate/upstream/op"
)

// TestCrossSiteCommands: without tokens, a command that changes data or
// reaches every node, sent by a browser from another site's page (an
// <img src="http://gateway/memc?cmd=flush_all"> is enough), is refused
// before memcached sees it; gets and version are served, and so is every
// command from a program. The module has no such test; it is a
// deliberate difference (docs/migrating-from-nginx-memc.md).
func TestCrossSiteCommands(t *testing.T) {
	mc := memcachedtest.Start(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	c, err := upstream.New(upstream.Options{Servers: []upstream.Server{{Host: "127.0.0.1", Port: mc.Port}}, PipelineConns: 2, Timeout: time.Second}, log, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	access := new(gateway.Access)
	rt, _ := New(Options{Path: "/memc", KeyPath: "/key/", Store: c, Cluster: c, Access: access})
	h := gateway.NewHandler(c, log, prometheus.NewRegistry(), gateway.Options{Access: access, Routes: []gateway.Route{rt}})

	crossSite := []string{"Sec-Fetch-Site", "cross-site", "Sec-Fetch-Dest", "image"}
	tests := []struct {
		name, method, target string
		hdr                  []string
		want                 int
		changed              bool // k is no longer "original"
	}{
		{"cross-site flush_all", "GET", "/memc?cmd=flush_all", crossSite, 403, false},
		{"cross-site set", "GET", "/memc?cmd=set&key=k&val=changed", crossSite, 403, false},
		{"cross-site delete", "GET", "/memc?cmd=delete&key=k", crossSite, 403, false},
		{"cross-site path-style delete", "DELETE", "/key/k", crossSite, 403, false},
		{"cross-site stats", "GET", "/memc?cmd=stats", crossSite, 403, false},
		{"old browser's cross-origin set", "POST", "/memc?cmd=set&key=k&val=changed", []string{"Origin", "https://evil.example"}, 403, false},
		{"cross-site get", "GET", "/memc?cmd=get&key=k", crossSite, 200, false},
		{"cross-site version", "GET", "/memc?cmd=version", crossSite, 200, false},
		{"program's set", "GET", "/memc?cmd=set&key=k&val=changed", nil, 201, true},
		{"program's flush_all", "GET", "/memc?cmd=flush_all", nil, 200, true},
		{"typed in the address bar", "GET", "/memc?cmd=flush_all", []string{"Sec-Fetch-Site", "none"}, 200, true},
	}
	ctx := context.Background()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if res := c.Do(ctx, op.Op{Verb: op.Set, Item: op.Item{Key: "k", Value: []byte("original")}}); res.Err != nil {
				t.Fatalf("set k: %v", res.Err)
			}
			w := memcDo(h, tt.method, tt.target, nil, tt.hdr...)
			if w.Code != tt.want {
				t.Errorf("%s %s with %q = %d %q, want %d", tt.method, tt.target, tt.hdr, w.Code, w.Body, tt.want)
			}
			if w.Code == 403 && !strings.Contains(w.Body.String(), "another site") {
				t.Errorf("%s %s: 403 body %q does not say why", tt.method, tt.target, w.Body)
			}
			k := c.Do(ctx, op.Op{Verb: op.Get, Item: op.Item{Key: "k"}})
			if changed := k.Err != nil || string(k.Item.Value) != "original"; changed != tt.changed {
				t.Errorf("after %s %s: k = %q (%v); changed = %v, want %v", tt.method, tt.target, k.Item.Value, k.Err, changed, tt.changed)
			}
		})
	}
}
