package main

import (
	"fmt"
	"io"
	"math"
)

// The targets of issue #20 for big values, memcgate over nginx + memc.
const (
	bigMBsTarget = 1.5 // MB/s at least this
	bigP99Target = 1.0 // p99 at most this
)

// mbs is the value bytes a run moved in 2xx answers, in MB (10⁶ bytes)
// per second.
func mbs(r record) float64 {
	return (r.num("requests") - r.num("non2xx")) * r.num("value_bytes") / r.num("duration_us")
}

// cpuPerMB is the target's CPU microseconds per MB of values moved.
func cpuPerMB(k string) func(record) float64 {
	return func(r record) float64 {
		return r.num(k) / ((r.num("requests") - r.num("non2xx")) * r.num("value_bytes") / 1e6)
	}
}

// yesNo says whether a target is met, with the ratio to three places
// when the table's two would hide which side of it a ratio is on.
func yesNo(ok bool, r float64) string {
	s := "met"
	if !ok {
		s = "**not met**"
	}
	if math.Abs(r-math.Round(r*100)/100) > 0 || math.IsNaN(r) {
		return s + " (" + fmtNum(r, 3) + ")"
	}
	return s
}

// bigTables prints the big-value runs: throughput in MB/s of values
// answered 2xx, latency, CPU per MB and the servers' peak RSS, then the
// ratios against the targets.
func bigTables(recs []record, w io.Writer, wrkLimit float64) {
	order, points := group(recs, "workload")
	cells, reps := cells(order, points)

	fmt.Fprintf(w, "#### Big values, wrk: medians of %d runs per point\n\n", reps)
	fmt.Fprintln(w, "| workload | clients | target | req/s | MB/s | MB/s min–max | p50 ms | p99 ms | socket errors | non-2xx | server CPU µs/MB | memcached CPU µs/MB | peak RSS MiB | own conns to memcached max | wrk CPU % |")
	fmt.Fprintln(w, "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	var flagged []string
	maxSpread := map[string]float64{}
	for _, c := range cells {
		for _, t := range []string{gate, nginx, copyFloor} {
			p := points[pointKey{c.workload, c.conc, t}]
			if p == nil {
				continue
			}
			v := p.values(mbs)
			if sp := spread(v); !math.IsNaN(sp) && !math.IsInf(sp, 0) {
				maxSpread[t] = max(maxSpread[t], sp)
			}
			wrkCPU := p.max(field("wrk_cpu_pct"))
			if wrkCPU > wrkLimit {
				flagged = append(flagged, fmt.Sprintf("%s %d %s (wrk at %.0f%% CPU)", c.workload, c.conc, t, wrkCPU))
			}
			mm := "–"
			if len(v) > 0 {
				mm = fmtNum(v[0], 0) + "–" + fmtNum(v[len(v)-1], 0)
			}
			fmt.Fprintf(w, "| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
				c.workload, c.conc, t,
				fmtInt(p.median(field("rps"))), fmtNum(median(v), 0), mm,
				fmtNum(p.median(field("p50_us"))/1000, 1), fmtNum(p.median(field("p99_us"))/1000, 1),
				fmtInt(p.sum("sock_err")), fmtInt(p.sum("non2xx")),
				fmtInt(p.median(cpuPerMB("target_cpu_us"))), fmtInt(p.median(cpuPerMB("memc_cpu_us"))),
				fmtNum(p.max(field("rss_max_kb"))/1024, 0), fmtInt(p.max(field("own_max"))),
				fmtNum(wrkCPU, 0))
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "MB/s is value bytes answered 2xx per second (MB = 10⁶ bytes): a GET's body, a PUT's request body. Socket errors and non-2xx are totals over all runs of the point. CPU is per MB of values moved. Peak RSS is the highest VmRSS sampled every 200 ms during the point's runs (memcgate's process, or the nginx workers summed); the process lives through every point, so memory a point leaves behind shows in the next one.")
	fmt.Fprintln(w)

	fmt.Fprintln(w, "#### Big values, ratios memcgate / nginx (medians) and issue #20's targets")
	fmt.Fprintln(w)
	fmt.Fprintf(w, "| workload | clients | MB/s | p99 | server CPU/MB | peak RSS | MB/s ≥ %.1f× | p99 ≤ %.1f× | MB/s over the copying floor's | server CPU/MB over the copying floor's |\n", bigMBsTarget, bigP99Target)
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---|---|---:|---:|")
	for _, c := range cells {
		g, n := points[pointKey{c.workload, c.conc, gate}], points[pointKey{c.workload, c.conc, nginx}]
		if g == nil || n == nil {
			continue
		}
		rm := g.median(mbs) / n.median(mbs)
		rp := g.median(field("p99_us")) / n.median(field("p99_us"))
		fm, fc := "–", "–"
		if f := points[pointKey{c.workload, c.conc, copyFloor}]; f != nil {
			fm = ratio(g.median(mbs), f.median(mbs))
			fc = ratio(g.median(cpuPerMB("target_cpu_us")), f.median(cpuPerMB("target_cpu_us")))
		}
		fmt.Fprintf(w, "| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s |\n", c.workload, c.conc,
			ratio(g.median(mbs), n.median(mbs)),
			ratio(g.median(field("p99_us")), n.median(field("p99_us"))),
			ratio(g.median(cpuPerMB("target_cpu_us")), n.median(cpuPerMB("target_cpu_us"))),
			ratio(g.max(field("rss_max_kb")), n.max(field("rss_max_kb"))),
			yesNo(rm >= bigMBsTarget, rm), yesNo(rp <= bigP99Target, rp), fm, fc)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "The copying floor (%s, PUT only) is `benchtool proxy`: the least a gateway that copies a value does, with a memcached connection of its own per client connection, the body read whole into a reused buffer and written at once, and nothing bounded or checked; its MB/s over nginx + memc's bounds what copying allows on this machine.\n", copyFloor)
	fmt.Fprintln(w)
	fmt.Fprintf(w, "Noise between repeats: the widest MB/s spread (max−min over median) of any point was %s%% for memcgate and %s%% for nginx.\n",
		fmtNum(maxSpread[gate], 1), fmtNum(maxSpread[nginx], 1))
	interference(recs, flagged, w, wrkLimit)
}
