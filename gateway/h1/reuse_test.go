//go:build unix

package h1

import (
	"io"
	"net/http"
	"net/url"
	"reflect"
	"strings"
	"sync"
	"testing"
)

// TestRequestReuse (issue #20): a request whose handler gives it back
// (ReleaseRequest) is reused for a later one, with its URL and header
// map; one that is not given back is never reused, and a handler that
// keeps it after returning reads its own fields, however many requests
// follow.
func TestRequestReuse(t *testing.T) {
	tests := []struct {
		name     string
		release  bool
		declined bool // Detached gives it back but declines it, against its contract
	}{{"released", true, false}, {"kept", false, false}, {"kept after a Detached declined it", false, true}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var mu sync.Mutex
			seen := map[*http.Request]int{}
			var kept []*http.Request // never released: read again after their requests ended
			var paths []string
			_, addr := startH1(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if tt.release {
					w.(interface{ ReleaseRequest() }).ReleaseRequest()
				}
				mu.Lock()
				seen[r]++
				if !tt.release {
					kept, paths = append(kept, r), append(paths, r.URL.Path)
				}
				mu.Unlock()
				w.Write([]byte(r.URL.Path + " " + r.Header.Get("X-N")))
			}), func(s *Server) {
				if tt.declined {
					s.Detached = func(_ http.ResponseWriter, _ *http.Request, d interface {
						Detach() (finish func())
						Block()
						WaitIfRefused()
						ReleaseRequest()
					}) bool {
						d.ReleaseRequest()
						return false
					}
				}
			})
			c, br := dial(t, addr)
			const n = 40
			for i := range n {
				path := "/k" + strings.Repeat("x", i%7) + "/" + string(rune('a'+i%26))
				x := strings.Repeat("n", i+1)
				if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: h\r\nX-N: "+x+"\r\n\r\n"); err != nil {
					t.Fatal(err)
				}
				resp, err := readWireResponse(br, "GET")
				if err != nil {
					t.Fatal(err)
				}
				if got, want := string(resp.body), path+" "+x; got != want {
					t.Fatalf("request %d answered %q, want %q", i, got, want)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			reused := 0
			for _, k := range seen {
				reused += k - 1
			}
			switch {
			case tt.release && reused == 0:
				t.Errorf("%d requests given back made %d distinct requests, want some reused", n, len(seen))
			case !tt.release && reused > 0:
				t.Errorf("%d requests kept by their handler were served with %d reused", n, reused)
			}
			for i, r := range kept {
				if r.URL.Path != paths[i] {
					t.Errorf("kept request %d reads path %q after the requests that followed, want %q", i, r.URL.Path, paths[i])
				}
			}
		})
	}
}

// TestParseTarget: the fast path's target parse gives what
// url.ParseRequestURI gives, for targets it parses itself and for the
// ones it leaves to it.
func TestParseTarget(t *testing.T) {
	for _, target := range []string{
		"/", "/k", "/v1/kv/abc-def_1.2~3", "/a:b;c=d@e$f&g+h,i", "/k?", "/k??", "/k?a=1&b=2", "/k?a?b", "/k?#x",
		"/k#frag", "/%41b", "/a%2Fb", "/a b", "/caf%C3%A9", "/k!*()'", "//host/path", "/k\"q", "/%zz", "/k?x=%zz",
	} {
		var got url.URL
		ok := parseTarget(target, &got)
		want, err := url.ParseRequestURI(target)
		if ok != (err == nil) {
			t.Errorf("parseTarget(%q) ok = %v, url.ParseRequestURI error %v", target, ok, err)
			continue
		}
		if ok && !reflect.DeepEqual(&got, want) {
			t.Errorf("parseTarget(%q) = %#v, want %#v", target, got, *want)
		}
	}
}

// FuzzParseTarget checks parseTarget against url.ParseRequestURI on the
// targets a request line can carry.
func FuzzParseTarget(f *testing.F) {
	for _, s := range []string{"/k", "/k?a", "/k?", "/a%20b", "/a:b@c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, target string) {
		if !strings.HasPrefix(target, "/") || !validRequestLine([]byte("GET "+target+" HTTP/1.1")) {
			return
		}
		var got url.URL
		ok := parseTarget(target, &got)
		want, err := url.ParseRequestURI(target)
		if ok != (err == nil) || ok && !reflect.DeepEqual(&got, want) {
			t.Errorf("parseTarget(%q) = %#v, %v; url.ParseRequestURI = %#v, %v", target, got, ok, want, err)
		}
	})
}
