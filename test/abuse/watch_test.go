//go:build linux

package abuse

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"time"
)

// Metrics the suite reads from the gateway's /metrics.
const (
	mNodeUp     = "memcgate_upstream_node_up"
	mQueueDepth = "memcgate_async_queue_depth"
	mInFlight   = "memcgate_http_in_flight_requests"
	mGoroutines = "go_goroutines"
	mHeapInuse  = "go_memstats_heap_inuse_bytes"
	mApplied    = "memcgate_async_writes_applied_total"
	mFailed     = "memcgate_async_writes_failed_total"
	mRejected   = "memcgate_async_writes_rejected_total"
)

// procMem reads VmRSS and VmHWM (the peak of VmRSS since the process
// began) of pid, in bytes.
func procMem(pid int) (rss, hwm int64, err error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || (name != "VmRSS" && name != "VmHWM") {
			continue
		}
		fields := strings.Fields(v) // "123456 kB"
		if len(fields) != 2 || fields[1] != "kB" {
			return 0, 0, fmt.Errorf("abuse: %s: bad line %q", f.Name(), sc.Text())
		}
		kb, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("abuse: %s: %w", f.Name(), err)
		}
		if name == "VmRSS" {
			rss = kb << 10
		} else {
			hwm = kb << 10
		}
	}
	if err := sc.Err(); err != nil {
		return 0, 0, err
	}
	if rss == 0 || hwm == 0 {
		return 0, 0, fmt.Errorf("abuse: %s has no VmRSS or VmHWM", f.Name())
	}
	return rss, hwm, nil
}

// memWatch samples the gateway's VmRSS every 50 ms, so that the report
// can say what it was at the end of the attack and after, beside the
// kernel's exact peak (VmHWM).
type memWatch struct {
	pid  int
	stop chan struct{}
	done chan struct{}
	last int64 // VmRSS of the last sample; read after done
	err  error // the first failed read; read after done
}

func watchMem(pid int) *memWatch {
	w := &memWatch{pid: pid, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			rss, _, err := procMem(pid)
			if err != nil && w.err == nil {
				w.err = err
			}
			if err == nil {
				w.last = rss
			}
			select {
			case <-w.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return w
}

// finish stops sampling and returns the peak (VmHWM) and the current
// VmRSS.
func (w *memWatch) finish() (peak, now int64, err error) {
	close(w.stop)
	<-w.done
	if w.err != nil {
		return 0, 0, w.err
	}
	now, peak, err = procMem(w.pid)
	return peak, now, err
}

// gaugeWatch scrapes the gateway's metrics every 250 ms during an
// attack and keeps the extremes: the lowest node_up (did the node get
// ejected?), the deepest async queue, the most requests in flight,
// goroutines and Go heap in use.
type gaugeWatch struct {
	cancel context.CancelFunc
	done   chan struct{}
	// Written by the watching goroutine, read after done.
	minNodeUp, maxQueue, maxInFlight, maxGoroutines, maxHeap float64
	scrapes, failures                                        int
}

func (r *rig) watchGauges(ctx context.Context) *gaugeWatch {
	ctx, cancel := context.WithCancel(ctx)
	w := &gaugeWatch{cancel: cancel, done: make(chan struct{}), minNodeUp: math.Inf(1)}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			if g, err := r.gauges(ctx); err == nil {
				w.scrapes++
				w.minNodeUp = min(w.minNodeUp, g[mNodeUp])
				w.maxQueue = max(w.maxQueue, g[mQueueDepth])
				w.maxInFlight = max(w.maxInFlight, g[mInFlight])
				w.maxGoroutines = max(w.maxGoroutines, g[mGoroutines])
				w.maxHeap = max(w.maxHeap, g[mHeapInuse])
			} else if ctx.Err() == nil {
				w.failures++
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return w
}

// finish stops scraping and waits for the goroutine.
func (w *gaugeWatch) finish() *gaugeWatch {
	w.cancel()
	<-w.done
	return w
}
