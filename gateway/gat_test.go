package gateway

import (
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/upstream/op"
)

// TestGAT: GET /{key}?touch=S, GET /?key=…&touch=S and the batch op "gat"
// read items and set their expiration in one operation, need the write
// scope, and are refused in read-only mode.
func TestGAT(t *testing.T) {
	s := newFake()
	s.Put(op.Item{Key: "a", Value: []byte("1"), Expiration: 10})
	s.Put(op.Item{Key: "b", Value: []byte("2"), Expiration: 10})
	h := newTestHandler(t, s)
	exp := func(k string) int32 {
		s.Mu.Lock()
		defer s.Mu.Unlock()
		return s.Items[k].Expiration
	}

	w := do(h, "GET", "/a?touch=300", "")
	if w.Code != 200 || w.Body.String() != "1" || w.Header().Get("ETag") == "" {
		t.Fatalf("GET /a?touch=300 = %d %q, want 200 with the value and its ETag", w.Code, w.Body.String())
	}
	if got := exp("a"); got != 300 {
		t.Errorf("expiration after gat = %d, want 300", got)
	}
	if w := do(h, "GET", "/nope?touch=300", ""); w.Code != 404 {
		t.Errorf("gat of a missing key = %d, want 404", w.Code)
	}
	if w := do(h, "GET", "/a?touch=soon", ""); w.Code != 400 || !strings.Contains(w.Body.String(), "touch") {
		t.Errorf("gat with a bad exptime = %d %q, want 400 naming touch", w.Code, w.Body.String())
	}

	w = do(h, "GET", "/?key=a&key=b&key=nope&touch=77", "")
	res := decodeResults(t, w.Body.String())
	if w.Code != 200 || len(res) != 3 || res[0].Status != 200 || *res[1].Value != "2" || res[2].Status != 404 {
		t.Fatalf("multi-get with touch = %d %s", w.Code, w.Body.String())
	}
	if exp("a") != 77 || exp("b") != 77 {
		t.Errorf("expirations after a multi-get with touch = %d, %d; want 77", exp("a"), exp("b"))
	}

	w = do(h, "POST", "/", `[{"op":"gat","key":"a","exptime":5},{"op":"gat","key":"a","value":"x","exptime":5}]`)
	res = decodeResults(t, w.Body.String())
	if len(res) != 2 || res[0].Status != 200 || *res[0].Value != "1" || res[1].Status != 400 || exp("a") != 5 {
		t.Errorf("batch gat = %s", w.Body.String())
	}

	tokens := NewTokens(map[string]Scope{"reader-token-000000": ScopeRead})
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	guarded := NewHandler(s, log, prometheus.NewRegistry(), Options{Tokens: tokens})
	auth := []string{"Authorization", "Bearer reader-token-000000"}
	if w := do(guarded, "GET", "/a", "", auth...); w.Code != 200 {
		t.Errorf("read token GET = %d, want 200", w.Code)
	}
	for _, target := range []string{"/a?touch=1", "/?key=a&touch=1"} {
		if w := do(guarded, "GET", target, "", auth...); w.Code != http.StatusForbidden {
			t.Errorf("read token GET %s = %d, want 403: gat sets the expiration", target, w.Code)
		}
	}
	readOnly := NewHandler(s, log, prometheus.NewRegistry(), Options{ReadOnly: true})
	if w := do(readOnly, "GET", "/a?touch=1", ""); w.Code != http.StatusForbidden {
		t.Errorf("read-only GET ?touch = %d, want 403", w.Code)
	}
}
