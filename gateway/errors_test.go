package gateway

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/memcgate/memcgate/upstream"
	"github.com/memcgate/memcgate/upstream/op"
)

// TestRequestKindStatus pins the status and headers of every kind of
// requestError: the checks name a kind, and this mapping is the only
// place a kind becomes a status, so a change here changes answers.
func TestRequestKindStatus(t *testing.T) {
	tests := []struct {
		name    string
		kind    requestKind
		status  int
		header  string // a header the kind's answer carries
		value   string
		allowed string // requestError.allow
	}{
		{name: "invalid", kind: kindInvalid, status: http.StatusBadRequest},
		{name: "too large", kind: kindTooLarge, status: http.StatusRequestEntityTooLarge, header: "Connection", value: "close"},
		{name: "body too slow", kind: kindBodyTooSlow, status: http.StatusRequestTimeout},
		{name: "method", kind: kindMethod, status: http.StatusMethodNotAllowed, header: "Allow", value: "GET, POST", allowed: "GET, POST"},
		{name: "misdirected", kind: kindMisdirected, status: http.StatusMisdirectedRequest},
		{name: "no token", kind: kindNoToken, status: http.StatusUnauthorized, header: "WWW-Authenticate", value: `Bearer realm="memcgate"`},
		{name: "no scope", kind: kindNoScope, status: http.StatusForbidden},
		{name: "read-only", kind: kindReadOnly, status: http.StatusForbidden},
		{name: "other site", kind: kindOtherSite, status: http.StatusForbidden},
		{name: "range", kind: kindRange, status: http.StatusRequestedRangeNotSatisfiable},
		{name: "HTTP version", kind: kindHTTPVersion, status: http.StatusHTTPVersionNotSupported},
	}
	pinned := make(map[requestKind]bool)
	for _, tt := range tests {
		pinned[tt.kind] = true
		t.Run(tt.name, func(t *testing.T) {
			re := &requestError{kind: tt.kind, msg: "why it was refused", allow: tt.allowed}
			// Wrapped, as a caller adding context would: the kind still
			// decides the status, and errors.Is finds it.
			err := fmt.Errorf("serving: %w", re)
			if !errors.Is(err, tt.kind) {
				t.Errorf("errors.Is(%v, %v) = false, want true", err, tt.kind)
			}
			for k := kindInvalid; k < kindEnd; k++ {
				if k != tt.kind && errors.Is(err, k) {
					t.Errorf("errors.Is(error of kind %v, %v) = true, want false", tt.kind, k)
				}
			}
			status, msg, retry := errorStatus(err)
			if status != tt.status || msg != re.msg || retry {
				t.Errorf("errorStatus(%v) = %d, %q, %v; want %d, %q, false", tt.kind, status, msg, retry, tt.status, re.msg)
			}

			w := httptest.NewRecorder()
			writeError(w, err)
			if w.Code != tt.status || w.Body.String() != re.msg+"\n" {
				t.Errorf("writeError(%v) = %d %q, want %d %q", tt.kind, w.Code, w.Body.String(), tt.status, re.msg+"\n")
			}
			want := map[string]string{
				"Content-Type":           "text/plain; charset=utf-8",
				"X-Content-Type-Options": "nosniff",
			}
			if tt.header != "" {
				want[tt.header] = tt.value
			}
			for _, h := range []string{"Allow", "WWW-Authenticate", "Connection", "Retry-After"} {
				if _, ok := want[h]; !ok {
					want[h] = ""
				}
			}
			for h, v := range want {
				if got := w.Header().Get(h); got != v {
					t.Errorf("writeError(%v): %s = %q, want %q", tt.kind, h, got, v)
				}
			}
		})
	}
	for k := kindInvalid; k < kindEnd; k++ {
		if !pinned[k] {
			t.Errorf("kind %d (%v) has no row here: pin its status", k, k)
		}
	}
	if got := kindStatus(kindEnd); got != http.StatusInternalServerError {
		t.Errorf("kindStatus(kindEnd) = %d, want %d: only kinds have a status", got, http.StatusInternalServerError)
	}
}

// TestCASNodeOutcome: a conditional write whose CAS names a node that
// does not hold the key is a 412 that says so in words true of every
// pool: a pool of one copy after a failover, a replicated pool, a warm-up
// hit; not a change of the item, and not a message about replicas alone.
func TestCASNodeOutcome(t *testing.T) {
	const want = "the ETag (or cas) names a node that does not hold the key for this gateway"
	for _, v := range []op.Verb{op.CAS, op.DeleteCAS, op.AppendCAS, op.PrependCAS} {
		t.Run(v.String(), func(t *testing.T) {
			err := fmt.Errorf("node 127.0.0.1:11211: %w", upstream.ErrCASNode)
			status, msg, retry := outcome(v, err)
			if status != http.StatusPreconditionFailed || retry {
				t.Errorf("outcome = %d (retry %v), want 412, no retry", status, retry)
			}
			if !strings.HasPrefix(msg, want) || !strings.Contains(msg, "read the key again") {
				t.Errorf("412 body = %q, want it to start %q and say to read the key again", msg, want)
			}
		})
	}
}
