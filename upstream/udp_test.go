package upstream

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/memcgate/memcgate/test/gatewaytest"
	"github.com/memcgate/memcgate/test/memcachedtest"
)

// newUDPCluster is a cluster of one node: TCP on tcp's port, UDP on
// udpPort. Probe rounds run only when the test calls checkAll. The log
// goes to the returned buffer.
func newUDPCluster(t *testing.T, tcp *memcachedtest.Server, udpPort int) (*Cluster, *node, *gatewaytest.SyncBuffer) {
	t.Helper()
	logs := &gatewaytest.SyncBuffer{}
	c, err := New(Options{
		Servers:       []Server{{Host: "127.0.0.1", Port: tcp.Port, UDPPort: udpPort}},
		Timeout:       time.Second,
		PipelineConns: *pipelineConns,
		Health:        HealthOptions{Interval: time.Hour, Timeout: 200 * time.Millisecond, Fall: 2, Rise: 1},
	}, slog.New(slog.NewTextHandler(logs, nil)), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, c.topo.Load().nodes[0], logs
}

// setQuietN sets n keys prefix0… through SetQuiet and returns how many
// left as datagrams.
func setQuietN(t *testing.T, c *Cluster, prefix string, n int) (udp int) {
	t.Helper()
	for i := range n {
		sent, err := c.SetQuiet(t.Context(), Item{Key: fmt.Sprint(prefix, i), Value: []byte(fmt.Sprint(i))})
		if err != nil {
			t.Fatalf("SetQuiet(%s%d) = %v", prefix, i, err)
		}
		if sent {
			udp++
		}
	}
	return udp
}

// waitCmdSet waits until mc has counted want sets, or fails after 2s.
func waitCmdSet(t *testing.T, mc *memcachedtest.Server, want int) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for {
		st, err := mc.Stats()
		if err == nil && st["cmd_set"] == fmt.Sprint(want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("memcached on %s counted cmd_set = %s, want %d (%v)", mc.Addr, st["cmd_set"], want, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestSetQuietUDPHealth: sets go out as datagrams only once a UDP probe
// got memcached's answer; a UDP port nothing listens on (memcached
// without -U) stays down, and every set goes over TCP, none lost.
func TestSetQuietUDPHealth(t *testing.T) {
	tests := []struct {
		name    string
		udp     bool // memcached listens on its UDP port
		wantUDP int  // of 101 small sets after the probe round
		wantLog string
	}{
		{"listening", true, 101, "memcached UDP port up"},
		{"nothing listens", false, 0, "UDP probe refused"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var mc *memcachedtest.Server
			udpPort := 0
			if tt.udp {
				mc = memcachedtest.StartUDP(t)
				udpPort = mc.UDPPort
			} else {
				mc = memcachedtest.Start(t)
				p, err := memcachedtest.FreeUDPPort()
				if err != nil {
					t.Fatal(err)
				}
				udpPort = p
			}
			c, n, logs := newUDPCluster(t, mc, udpPort)
			if got := setQuietN(t, c, "before_", 3); got != 0 {
				t.Errorf("%d of 3 sets before the first probe went out as datagrams; want none (the port is down until proven)", got)
			}
			c.checkAll(t.Context())
			if got := setQuietN(t, c, "udp_", 101); got != tt.wantUDP {
				t.Errorf("%d of 101 sets went out as datagrams, want %d", got, tt.wantUDP)
			}
			if udp, err := c.SetQuiet(t.Context(), Item{Key: "udp_big", Value: make([]byte, 4000)}); err != nil || udp {
				t.Errorf("SetQuiet of a value that needs TCP = %v, %v; want TCP", udp, err)
			}
			waitCmdSet(t, mc, 3+101+1)
			for i := range 101 {
				if it, err := c.Get(t.Context(), fmt.Sprint("udp_", i)); err != nil || string(it.Value) != fmt.Sprint(i) {
					t.Fatalf("udp_%d = %v, %v; want it stored", i, it, err)
				}
			}
			if got := testutil.ToFloat64(n.m.ops[opSetUDP][resOK]); got != float64(tt.wantUDP) {
				t.Errorf("set_udp ok = %v, want %d", got, tt.wantUDP)
			}
			if got := testutil.ToFloat64(n.m.ops[opSetUDP][resError]); got != 0 {
				t.Errorf("set_udp error = %v, want 0: no datagram went to a port that refuses them", got)
			}
			wantUp := 0.0
			if tt.udp {
				wantUp = 1
			}
			if got := testutil.ToFloat64(n.m.udpUp); got != wantUp {
				t.Errorf("memcgate_upstream_node_udp_up = %v, want %v", got, wantUp)
			}
			st := c.Nodes()[0].UDP
			if st == nil || st.Up != tt.udp || st.Addr != fmt.Sprint("127.0.0.1:", udpPort) {
				t.Errorf("NodeStatus.UDP = %+v, want up=%v at port %d", st, tt.udp, udpPort)
			}
			if !strings.Contains(logs.String(), tt.wantLog) {
				t.Errorf("log lacks %q:\n%s", tt.wantLog, logs)
			}
		})
	}
}

// TestSetQuietUDPRefusedWhileUp: memcached's UDP port goes away while it
// is up (here a second memcached serves UDP only, and is killed). The
// first datagram after that is lost without a word; the next set's write
// fails with the refusal, which takes the port down at once: that set and
// every later one go over TCP, counted, logged once. A probe that passes
// brings it back.
func TestSetQuietUDPRefusedWhileUp(t *testing.T) {
	mc := memcachedtest.Start(t)
	mcUDP := memcachedtest.StartUDP(t)
	c, n, logs := newUDPCluster(t, mc, mcUDP.UDPPort)
	c.checkAll(t.Context())
	if got := setQuietN(t, c, "a_", 10); got != 10 {
		t.Fatalf("%d of 10 sets went out as datagrams with the port up, want 10", got)
	}
	waitCmdSet(t, mcUDP, 10)
	mcUDP.Kill()

	// The refusal of the first datagram comes back as ICMP, which the
	// kernel reports on the socket's next write.
	sent := 0
	for i := 0; ; i++ {
		udp, err := c.SetQuiet(t.Context(), Item{Key: fmt.Sprint("b_", i), Value: []byte("v")})
		if err != nil {
			t.Fatalf("SetQuiet = %v", err)
		}
		if !udp {
			break
		}
		sent++
		if i > 100 {
			t.Fatal("100 datagrams to a dead UDP port and no refusal seen")
		}
		time.Sleep(time.Millisecond) // let the ICMP come back
	}
	if sent != 1 {
		t.Logf("%d datagrams left before the refusal surfaced (1 expected on loopback)", sent)
	}
	if got := setQuietN(t, c, "c_", 20); got != 0 {
		t.Errorf("%d of 20 sets after the refusal went out as datagrams, want 0", got)
	}
	waitCmdSet(t, mc, 1+20) // the set that saw the refusal, and the 20 after it
	if got := testutil.ToFloat64(n.m.ops[opSetUDP][resError]); got != 1 {
		t.Errorf("set_udp error = %v, want 1 (one refusal)", got)
	}
	if got := testutil.ToFloat64(n.m.udpUp); got != 0 {
		t.Errorf("memcgate_upstream_node_udp_up = %v after the refusal, want 0", got)
	}
	if st := c.Nodes()[0].UDP; st == nil || st.Up || !strings.Contains(st.Reason, "refused") {
		t.Errorf("NodeStatus.UDP = %+v, want down, refused", st)
	}
	if got := strings.Count(logs.String(), "memcached's UDP port refused datagrams"); got != 1 {
		t.Errorf("the refusal was logged %d times, want once:\n%s", got, logs)
	}

	c.checkAll(t.Context()) // still refused: stays down, no new line
	if got := strings.Count(logs.String(), "level=WARN"); got != 1 {
		t.Errorf("%d warnings after a failed probe of a port already down, want 1:\n%s", got, logs)
	}
	mcUDP.Restart()
	c.checkAll(t.Context())
	if got := setQuietN(t, c, "d_", 5); got != 5 {
		t.Errorf("%d of 5 sets went out as datagrams after a probe passed, want 5", got)
	}
	if got := testutil.ToFloat64(n.m.udpUp); got != 1 {
		t.Errorf("memcgate_upstream_node_udp_up = %v after a probe passed, want 1", got)
	}
}
