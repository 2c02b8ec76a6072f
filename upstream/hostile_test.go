package upstream

import (
	"bufio"
	"errors"
	"net"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/test/memcachedtest"
)

// TestStatsFromALiar: a node's answer to a raw command (/memc?cmd=stats)
// is read up to 1 MiB, a line up to the reader's 4 KiB: a node that
// answers stats with a stream of STAT lines that never ends, or with a
// line that never ends, costs an error (ErrServer, the memc endpoint's
// 502) and about 1 MiB held (the reply grows to it by append, so a few
// MiB allocated on the way), not the stream.
func TestStatsFromALiar(t *testing.T) {
	for _, tt := range []struct {
		name   string
		stream string
	}{
		{"endless STAT lines", strings.Repeat("STAT x 1\r\n", 4096)},
		{"an endless line", strings.Repeat("STAT ", 8192)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			addr := memcachedtest.StartRaw(t, func(c net.Conn, br *bufio.Reader) {
				if _, err := br.ReadString('\n'); err != nil {
					return
				}
				for {
					if _, err := c.Write([]byte(tt.stream)); err != nil {
						return
					}
				}
			})
			_, p, _ := net.SplitHostPort(addr)
			port, _ := strconv.Atoi(p)
			c, err := New(Options{Servers: []Server{{Host: "127.0.0.1", Port: port}}, Timeout: 5 * time.Second, Health: HealthOptions{Interval: time.Hour, Timeout: time.Hour}},
				testLogger(), prometheus.NewRegistry())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			replies := c.Stats(t.Context())
			runtime.ReadMemStats(&after)
			if len(replies) != 1 || !errors.Is(replies[0].Err, ErrServer) || len(replies[0].Reply) > 0 {
				t.Fatalf("stats: %d bytes, %v; want ErrServer and nothing", len(replies[0].Reply), replies[0].Err)
			}
			if n := after.TotalAlloc - before.TotalAlloc; n > 16<<20 {
				t.Errorf("stats allocated %d MiB", n>>20)
			}
		})
	}
}
