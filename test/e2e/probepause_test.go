package e2e

import (
	"encoding/json"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/memcgate/memcgate/test/gatewaytest"
	"github.com/memcgate/memcgate/test/memcachedtest"
)

// probeEnvFor is a gateway's environment for mcs that probes once a
// second, on the wall clock's seconds (decision 0070), with the default
// timeout and fall: a test knows when each probe is sent.
func probeEnvFor(mcs []*memcachedtest.Server) map[string]string {
	return map[string]string{
		"MEMCGATE_SERVERS":         memcachedtest.Addrs(mcs),
		"MEMCGATE_HEALTH_INTERVAL": "1s",
		"MEMCGATE_HEALTH_TIMEOUT":  "300ms",
		"MEMCGATE_HEALTH_FALL":     "2",
	}
}

// metricSum is the sum of a family's samples in the gateway's /metrics.
func metricSum(t *testing.T, g *gateway, name string) float64 {
	t.Helper()
	fams, err := g.Families(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if f := fams[name]; f != nil {
		return f.Sum
	}
	return 0
}

// TestGatewayPausedWithANodeKeepsIt stops a node's memcached and then
// the gateway while a probe of the node waits for its answer, as a
// host or a container frozen whole (both processes stopped) would, and
// lets the gateway go first, memcached 30 ms later: the probe's deadline
// passed while the gateway was not running, and memcached had no time to
// answer. Two rounds in a row (HEALTH_FALL 2). The probe is sent once
// more and passes: no ejection, two probes counted late. Before, each
// failed and the node was ejected ("probe: … i/o timeout"), its keys
// written meanwhile to the next node forgotten on its return.
func TestGatewayPausedWithANodeKeepsIt(t *testing.T) {
	mcs := memcachedtest.StartN(t, 2)
	g := startGateway(t, probeEnvFor(mcs))
	g.Families(t.Context()) // a first scrape: the admin connection is made
	round := time.Now().Truncate(time.Second).Add(2 * time.Second)
	for range 2 {
		time.Sleep(time.Until(round.Add(-150 * time.Millisecond)))
		mcs[0].Pause()
		// The round's probe is sent at the second and waits for memcached.
		time.Sleep(time.Until(round.Add(150 * time.Millisecond)))
		g.Signal(syscall.SIGSTOP)
		memcachedtest.WaitStopped(t, "gateway", g.Pid())
		// Its deadline (the second + 300 ms) passes while the gateway is
		// stopped (unless a loaded machine stops it late: the probe then
		// fails on time, which no rule forgives); the gateway wakes
		// 400 ms after it.
		time.Sleep(time.Until(round.Add(700 * time.Millisecond)))
		g.Signal(syscall.SIGCONT)
		time.Sleep(30 * time.Millisecond)
		mcs[0].Resume()
		round = round.Add(time.Second)
	}
	time.Sleep(time.Until(round.Add(500 * time.Millisecond))) // one more round
	if n := metricSum(t, g, "memcgate_upstream_ejections_total"); n != 0 {
		t.Errorf("%v ejections of a node whose probes the gateway came to late; log:\n%s", n, gatewaytest.Tail(g.Logs(), 3000))
	}
	// Two probes of the stopped node, one a pause, unless a loaded
	// machine started a round after its pause (its probe then passed,
	// and the case was not made: the ejection could not happen either);
	// it may make the gateway late to other probes too.
	if n := metricSum(t, g, "memcgate_upstream_probes_late_total"); n < 2 {
		t.Logf("memcgate_upstream_probes_late_total = %v, want 2 or more (one probe a pause): a round started late", n)
	}
}

// TestStoppedNodeEjectedByProbesInTime: a memcached stopped while the
// gateway runs is ejected by HEALTH_FALL failed probes in a row, between
// (FALL-1)×INTERVAL + TIMEOUT and FALL×INTERVAL + TIMEOUT after it
// stopped (1.3–2.3 s here), as operations.md says. A gateway on time
// sends each probe once; one that a loaded machine makes late to a
// deadline sends it twice, which may add a TIMEOUT per such probe.
func TestStoppedNodeEjectedByProbesInTime(t *testing.T) {
	mcs := memcachedtest.StartN(t, 2)
	g := startGateway(t, probeEnvFor(mcs))
	time.Sleep(1500 * time.Millisecond) // a round passed with both up
	mcs[0].Pause()
	stopped := time.Now()
	var took time.Duration
	for {
		if at, ok := nodeDownAt(t, g.Logs()); ok {
			took = at.Sub(stopped) // the gateway's clock is this one: one host
			break
		}
		if time.Since(stopped) > 5*time.Second {
			t.Fatalf("a stopped memcached not ejected after 5s%s; log:\n%s", mcs[0].ResumedNote(), gatewaytest.Tail(g.Logs(), 3000))
		}
		time.Sleep(10 * time.Millisecond)
	}
	late := metricSum(t, g, "memcgate_upstream_probes_late_total")
	t.Logf("stopped memcached ejected %v after it stopped (its log line's time); %v probes late", took, late)
	// The slack is for a loaded machine, on which the rounds start late.
	least := 1300*time.Millisecond - 50*time.Millisecond
	most := 2300*time.Millisecond + time.Duration(late)*300*time.Millisecond + 500*time.Millisecond
	if took < least || took > most {
		t.Errorf("ejected %v after it stopped, want within %v..%v", took, least, most)
	}
	if text, err := g.Metrics(t.Context()); err != nil || !strings.Contains(text, `reason="probe"} 1`) {
		t.Errorf("no ejection by probe (%v); log:\n%s", err, gatewaytest.Tail(g.Logs(), 3000))
	}
}

// nodeDownAt is the time of the first "node down" line in logs, the
// gateway's JSON log.
func nodeDownAt(t *testing.T, logs string) (time.Time, bool) {
	t.Helper()
	for line := range strings.Lines(logs) {
		var l struct {
			Time time.Time `json:"time"`
			Msg  string    `json:"msg"`
		}
		if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "node down" {
			return l.Time, true
		}
	}
	return time.Time{}, false
}
