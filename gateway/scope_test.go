package gateway

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/test/memcachedtest"
	"github.com/memcgate/memcgate/upstream"
	"github.com/memcgate/memcgate/upstream/op"
)

// scopeRig is a real memcached behind a gateway's upstream, for the tests
// of what a token of a narrow scope (or none, or read-only mode) can make
// memcached do.
type scopeRig struct {
	t  *testing.T
	mc *memcachedtest.Server
	c  *upstream.Cluster
}

func newScopeRig(t *testing.T) *scopeRig {
	mc := memcachedtest.Start(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	c, err := upstream.New(upstream.Options{Servers: []upstream.Server{{Host: "127.0.0.1", Port: mc.Port}}, PipelineConns: 2, Timeout: time.Second}, log, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &scopeRig{t: t, mc: mc, c: c}
}

// handler is a gateway over the rig's memcached with opts.
func (g *scopeRig) handler(opts Options) *Handler {
	opts.MaxValueBytes = 1 << 10
	return NewHandler(g.c, slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry(), opts)
}

// set stores key with value and an expiration of 1000 s.
func (g *scopeRig) set(key, value string) {
	g.t.Helper()
	if res := g.c.Do(context.Background(), op.Op{Verb: op.Set, Item: op.Item{Key: key, Value: []byte(value), Expiration: 1000}}); res.Err != nil {
		g.t.Fatalf("set %s: %v", key, res.Err)
	}
}

// ttl is what memcached's meta get says of key: its remaining seconds
// (-1: never expires), or -2 if memcached does not have it.
func (g *scopeRig) ttl(key string) int {
	g.t.Helper()
	c, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(g.mc.Port))
	if err != nil {
		g.t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "mg %s t\r\n", key)
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		g.t.Fatal(err)
	}
	s, ok := strings.CutPrefix(strings.TrimSpace(line), "HD t")
	if !ok {
		return -2
	}
	n, _ := strconv.Atoi(s)
	return n
}

// TestEncodedTouchIsNotAGat: get-and-touch needs the write scope, and is
// refused in read-only mode and from another site's page, because it
// sets the item's expiration. The scope is decided by the query's raw
// names, so a multi-get must decide gat by them too: with a name that
// decodes to "touch" (%74ouch), it took the read scope's path and then
// touched every key with expiration 0, making items that were to expire
// permanent, for a read token, in read-only mode, and for an <img> of
// any page.
func TestEncodedTouchIsNotAGat(t *testing.T) {
	g := newScopeRig(t)
	const reader = "reader-token-0123456789"
	guarded := g.handler(Options{Tokens: NewTokens(map[string]Scope{reader: ScopeRead})})
	readOnly := g.handler(Options{ReadOnly: true})
	open := g.handler(Options{})
	readTok := []string{"Authorization", "Bearer " + reader}
	crossSite := []string{"Sec-Fetch-Site", "cross-site"}
	tests := []struct {
		name   string
		h      *Handler
		target string
		hdr    []string
		want   int
	}{
		{"read token, multi-get ?touch=", guarded, "/?key=k&touch=0", readTok, 403},
		{"read token, multi-get ?%74ouch=", guarded, "/?key=k&%74ouch=0", readTok, 200},
		{"read token, multi-get ?tou%63h=", guarded, "/?key=k&tou%63h=0", readTok, 200},
		{"read token, GET /k?%74ouch=", guarded, "/k?%74ouch=0", readTok, 200},
		{"read-only, multi-get ?touch=", readOnly, "/?key=k&touch=0", nil, 403},
		{"read-only, multi-get ?%74ouch=", readOnly, "/?key=k&%74ouch=0", nil, 200},
		{"another site's page, multi-get ?touch=", open, "/?key=k&touch=0", crossSite, 403},
		{"another site's page, multi-get ?%74ouch=", open, "/?key=k&%74ouch=0", crossSite, 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g.set("k", "v")
			w := do(tt.h, "GET", tt.target, "", tt.hdr...)
			if w.Code != tt.want {
				t.Errorf("GET %s = %d %q, want %d", tt.target, w.Code, w.Body, tt.want)
			}
			if ttl := g.ttl("k"); ttl < 990 {
				t.Errorf("after GET %s, k expires in %d s (-1: never), want about 1000: the read touched it", tt.target, ttl)
			}
		})
	}
}
