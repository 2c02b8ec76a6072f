package gateway

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream"
	"github.com/memcgate/memcgate/upstream/op"
)

// TestCrossSiteWrites: without tokens, a write a browser sends from a page
// of another site (an <img>, a form, a no-cors fetch with a text/plain
// body: none needs a CORS preflight) is refused before memcached sees it,
// so that any web page a user inside the network opens cannot change the
// cache; reads, and requests from programs (which send neither
// Sec-Fetch-Site nor Origin), are served as before. With tokens, the token
// is what a write needs, and a page cannot send one it does not have.
func TestCrossSiteWrites(t *testing.T) {
	mc := memcachedtest.Start(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	c, err := upstream.New(upstream.Options{Servers: []upstream.Server{{Host: "127.0.0.1", Port: mc.Port}}, PipelineConns: 2, Timeout: time.Second}, log, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	const token = "writer-token-0123456789"
	open := NewHandler(c, log, prometheus.NewRegistry(), Options{MaxValueBytes: 1 << 10})
	guarded := NewHandler(c, log, prometheus.NewRegistry(), Options{MaxValueBytes: 1 << 10, Tokens: NewTokens(map[string]Scope{token: ScopeRead | ScopeWrite})})

	crossSite := []string{"Sec-Fetch-Site", "cross-site", "Origin", "https://evil.example"}
	sameSite := []string{"Sec-Fetch-Site", "same-site", "Origin", "https://other.example.com"}
	oldBrowser := []string{"Origin", "https://evil.example"} // no Sec-Fetch-Site
	batch := `{"ops":[{"op":"set","key":"k","value":"changed"}]}`
	tests := []struct {
		name                 string
		h                    http.Handler
		method, target, body string
		hdr                  []string
		want                 int
		changed              bool // the request reached memcached and changed k
	}{
		{name: "cross-site PUT", h: open, method: "PUT", target: "/k", body: "changed", hdr: crossSite, want: 403},
		{name: "cross-site DELETE", h: open, method: "DELETE", target: "/k", hdr: crossSite, want: 403},
		{name: "cross-site text/plain batch", h: open, method: "POST", target: "/", body: batch, hdr: append([]string{"Content-Type", "text/plain"}, crossSite...), want: 403},
		{name: "cross-site incr", h: open, method: "POST", target: "/n?op=incr", hdr: crossSite, want: 403},
		{name: "cross-site get-and-touch", h: open, method: "GET", target: "/k?touch=1", hdr: crossSite, want: 403},
		{name: "same-site PUT", h: open, method: "PUT", target: "/k", body: "changed", hdr: sameSite, want: 403},
		{name: "old browser's cross-origin PUT", h: open, method: "PUT", target: "/k", body: "changed", hdr: oldBrowser, want: 403},
		{name: "cross-site GET is a read", h: open, method: "GET", target: "/k", hdr: crossSite, want: 200},
		{name: "cross-site multi-get is a read", h: open, method: "GET", target: "/?key=k", hdr: crossSite, want: 200},
		{name: "program's PUT", h: open, method: "PUT", target: "/k", body: "changed", want: 201, changed: true},
		{name: "typed in the address bar", h: open, method: "GET", target: "/k?touch=1", hdr: []string{"Sec-Fetch-Site", "none"}, want: 200},
		{name: "same-origin PUT", h: open, method: "PUT", target: "/k", body: "changed", hdr: []string{"Sec-Fetch-Site", "same-origin"}, want: 201, changed: true},
		{name: "Origin of the gateway itself", h: open, method: "PUT", target: "/k", body: "changed", hdr: []string{"Origin", "http://example.com"}, want: 201, changed: true},
		{name: "tokens: cross-site PUT without one", h: guarded, method: "PUT", target: "/k", body: "changed", hdr: crossSite, want: 401},
		{name: "tokens: cross-site PUT with one", h: guarded, method: "PUT", target: "/k", body: "changed", hdr: append([]string{"Authorization", "Bearer " + token}, crossSite...), want: 201, changed: true},
	}
	ctx := context.Background()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, it := range []op.Item{{Key: "k", Value: []byte("original")}, {Key: "n", Value: []byte("1")}} {
				if res := c.Do(ctx, op.Op{Verb: op.Set, Item: it}); res.Err != nil {
					t.Fatalf("set %s: %v", it.Key, res.Err)
				}
			}
			w := do(tt.h, tt.method, tt.target, tt.body, tt.hdr...)
			if w.Code != tt.want {
				t.Errorf("%s %s with %q = %d %q, want %d", tt.method, tt.target, tt.hdr, w.Code, w.Body, tt.want)
			}
			k := c.Do(ctx, op.Op{Verb: op.Get, Item: op.Item{Key: "k"}})
			n := c.Do(ctx, op.Op{Verb: op.Get, Item: op.Item{Key: "n"}})
			if changed := k.Err != nil || string(k.Item.Value) != "original" || n.Err != nil || string(n.Item.Value) != "1"; changed != tt.changed {
				t.Errorf("after %s %s: k = %q (%v), n = %q (%v); changed = %v, want %v", tt.method, tt.target, k.Item.Value, k.Err, n.Item.Value, n.Err, changed, tt.changed)
			}
		})
	}
}
