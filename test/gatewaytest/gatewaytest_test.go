package gatewaytest

import (
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/memcgate/memcgate/test/memcachedtest"
)

var binary string

func TestMain(m *testing.M) { Main(m, false, &binary) }

// occupy holds addr for the rest of the test with a listener that
// accepts nothing: as another process's server that took the port
// between New finding it free and the binary binding it.
func occupy(t *testing.T, addr string) {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("occupying %s: %v", addr, err)
	}
	t.Cleanup(func() { ln.Close() })
}

// impostor holds addr for the rest of the test with an HTTP server that
// answers 200 to every request: another gateway's admin listener that
// took the port, which answers the readiness probe for the gateway that
// could not bind it.
func impostor(t *testing.T, addr string) {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("occupying %s: %v", addr, err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
}

// TestStartTakesFreshPorts takes one of the ports New picked before the
// gateway starts, as another process may: Start runs the binary again on
// fresh ports and returns a gateway that serves on both of its own, and
// the taker keeps its port.
func TestStartTakesFreshPorts(t *testing.T) {
	mc := memcachedtest.Start(t)
	for _, tt := range []struct {
		name string
		take func(t *testing.T, g *Gateway) (addr string)
	}{
		{"data port", func(t *testing.T, g *Gateway) string { occupy(t, g.DataAddr); return g.DataAddr }},
		{"admin port", func(t *testing.T, g *Gateway) string { occupy(t, g.AdminAddr); return g.AdminAddr }},
		// The probe's 200 comes from the taker: Start must not take it
		// for the gateway's.
		{"admin port, answering", func(t *testing.T, g *Gateway) string { impostor(t, g.AdminAddr); return g.AdminAddr }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			g := New(t, binary, map[string]string{"MEMCGATE_SERVERS": mc.Addr, "MEMCGATE_DRAIN_DELAY": "0s"})
			taken := tt.take(t, g)
			g.Start(t)
			if g.attempts < 2 {
				t.Errorf("Start ran the binary %d times, want a second run after the first lost %s", g.attempts, taken)
			}
			if g.DataAddr == taken || g.AdminAddr == taken {
				t.Errorf("the gateway kept the taken address %s (data %s, admin %s)", taken, g.DataAddr, g.AdminAddr)
			}
			for _, port := range []int{g.DataPort, g.AdminPort} {
				if owns, err := memcachedtest.Listens(g.Pid(), port); !owns {
					t.Errorf("the started gateway (pid %d) does not listen on port %d: %v", g.Pid(), port, err)
				}
			}
			if _, err := g.Metrics(t.Context()); err != nil {
				t.Errorf("metrics of the started gateway: %v", err)
			}
			if c, err := net.Dial("tcp", taken); err != nil {
				t.Errorf("the taker lost %s: %v", taken, err)
			} else {
				c.Close()
			}
		})
	}
}

// TestStartFailsAtOnce: a gateway that cannot start for a reason of its
// own (a bad setting) is run once, and the error is its own.
func TestStartFailsAtOnce(t *testing.T) {
	mc := memcachedtest.Start(t)
	g := New(t, binary, map[string]string{"MEMCGATE_SERVERS": mc.Addr, "MEMCGATE_TIMEOUT": "soon"})
	data := g.DataAddr
	err := g.start(t, "/readyz")
	var taken *portTakenError
	switch {
	case err == nil:
		t.Fatal("a gateway with MEMCGATE_TIMEOUT=soon started")
	case errors.As(err, &taken):
		t.Fatalf("a bad setting was taken for a lost port: %v", err)
	case !strings.Contains(err.Error(), "invalid configuration") || !strings.Contains(err.Error(), "MEMCGATE_TIMEOUT"):
		t.Errorf("error = %v, want the binary's complaint about MEMCGATE_TIMEOUT", err)
	}
	if g.attempts != 1 || g.DataAddr != data {
		t.Errorf("ran the binary %d times, data address %s → %s; want once, on the address New picked", g.attempts, data, g.DataAddr)
	}
}

// TestRestartKeepsAddresses: once a gateway has served at its addresses
// (a balancer in front may know them), a restart whose port was taken
// meanwhile fails, saying so, rather than move elsewhere.
func TestRestartKeepsAddresses(t *testing.T) {
	mc := memcachedtest.Start(t)
	g := New(t, binary, map[string]string{"MEMCGATE_SERVERS": mc.Addr, "MEMCGATE_DRAIN_DELAY": "0s"})
	g.Start(t)
	data, admin, runs := g.DataAddr, g.AdminAddr, g.attempts
	g.Kill()
	occupy(t, data)
	err := g.start(t, "/readyz")
	var taken *portTakenError
	if !errors.As(err, &taken) {
		t.Fatalf("restart on a taken port: %v, want a lost port", err)
	}
	if g.DataAddr != data || g.AdminAddr != admin || g.attempts != runs+1 {
		t.Errorf("restart moved from %s/%s to %s/%s after %d runs; want one run at the same addresses",
			data, admin, g.DataAddr, g.AdminAddr, g.attempts-runs)
	}
}
