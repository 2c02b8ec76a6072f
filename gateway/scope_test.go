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

// TestWriteScopeAloneReadsNothing: a token with the write scope alone
// (an ingest worker's) writes, and reads no value by any route: not by
// GET, and not by the routes that need write and answer values too, get-
// and-touch (GET /k?touch=, GET /?key=k&touch=) and a batch's get or gat,
// which answered every value to it. A token with both scopes does all.
func TestWriteScopeAloneReadsNothing(t *testing.T) {
	g := newScopeRig(t)
	const writer, both = "writer-only-token-0123", "read-write-token-01234"
	h := g.handler(Options{Tokens: NewTokens(map[string]Scope{writer: ScopeWrite, both: ScopeRead | ScopeWrite})})
	w1 := []string{"Authorization", "Bearer " + writer}
	rw := []string{"Authorization", "Bearer " + both}
	tests := []struct {
		name, method, target, body string
		hdr                        []string
		want                       int
		touched                    bool // k's expiration changed
	}{
		{name: "write-only GET", method: "GET", target: "/k", hdr: w1, want: 403},
		{name: "write-only get-and-touch", method: "GET", target: "/k?touch=0", hdr: w1, want: 403},
		{name: "write-only multi-get and touch", method: "GET", target: "/?key=k&touch=0", hdr: w1, want: 403},
		{name: "write-only batch get", method: "POST", target: "/", body: `[{"op":"get","key":"k"}]`, hdr: w1, want: 403},
		{name: "write-only batch set then gat", method: "POST", target: "/", body: `[{"op":"set","key":"j","value":"x"},{"op":"gat","key":"k","exptime":0}]`, hdr: w1, want: 403},
		{name: "write-only batch of writes", method: "POST", target: "/", body: `[{"op":"touch","key":"k","exptime":0}]`, hdr: w1, want: 200, touched: true},
		{name: "write-only PUT", method: "PUT", target: "/j", body: "x", hdr: w1, want: 201},
		{name: "read+write get-and-touch", method: "GET", target: "/k?touch=0", hdr: rw, want: 200, touched: true},
		{name: "read+write batch get", method: "POST", target: "/", body: `[{"op":"get","key":"k"}]`, hdr: rw, want: 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g.set("k", "secret")
			w := do(h, tt.method, tt.target, tt.body, tt.hdr...)
			if w.Code != tt.want {
				t.Errorf("%s %s = %d %q, want %d", tt.method, tt.target, w.Code, w.Body, tt.want)
			}
			if w.Code == 403 && strings.Contains(w.Body.String(), "secret") {
				t.Errorf("%s %s refused with the value in its answer: %q", tt.method, tt.target, w.Body)
			}
			if touched := g.ttl("k") < 990; touched != tt.touched {
				t.Errorf("after %s %s, k expires in %d s; touched = %v, want %v", tt.method, tt.target, g.ttl("k"), touched, tt.touched)
			}
		})
	}
}
