package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
)

// The targets, in the order the tables list them; ratios are memcgate
// over nginx, over floor: nginx answering a constant body without
// memcached, the cost of an HTTP hop with nothing behind it, and over
// h1Floor: memcgate's own HTTP server (gateway/h1, test/bench/cmd/h1const)
// answering a constant body, what Go and that server cost without the
// gateway's work (both GET only).
const (
	gate    = "memcgate"
	nginx   = "nginx"
	floor   = "nginx-const"
	h1Floor = "h1-const"
	// copyFloor is benchtool's proxy: the floor of a big-value PUT
	// through a gateway that copies the value (proxy.go).
	copyFloor = "copy-proxy"
)

// A record is one line of key=value fields written by bench.sh.
type record map[string]string

func (r record) num(k string) float64 {
	v, err := strconv.ParseFloat(r[k], 64)
	if err != nil {
		return math.NaN()
	}
	return v
}

func readRecords(path string) ([]record, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []record
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		r := record{}
		for f := range strings.FieldsSeq(line) {
			if k, v, ok := strings.Cut(f, "="); ok {
				r[k] = v
			}
		}
		out = append(out, r)
	}
	return out, sc.Err()
}

// point is one (workload, concurrency, target) cell: all its repeats.
type point struct {
	workload string
	conc     int
	target   string
	runs     []record
}

type pointKey struct {
	workload string
	conc     int
	target   string
}

// group keeps the order in which (workload, concurrency) first appear.
func group(recs []record, workloadField string) (order []pointKey, points map[pointKey]*point) {
	points = map[pointKey]*point{}
	for _, r := range recs {
		c, _ := strconv.Atoi(r["conc"])
		k := pointKey{r[workloadField], c, r["target"]}
		p := points[k]
		if p == nil {
			p = &point{workload: k.workload, conc: c, target: k.target}
			points[k] = p
			order = append(order, k)
		}
		p.runs = append(p.runs, r)
	}
	return order, points
}

func (p *point) values(f func(record) float64) []float64 {
	var v []float64
	for _, r := range p.runs {
		if x := f(r); !math.IsNaN(x) && !math.IsInf(x, 0) {
			v = append(v, x)
		}
	}
	slices.Sort(v)
	return v
}

func median(v []float64) float64 {
	n := len(v)
	switch {
	case n == 0:
		return math.NaN()
	case n%2 == 1:
		return v[n/2]
	default:
		return (v[n/2-1] + v[n/2]) / 2
	}
}

func (p *point) median(f func(record) float64) float64 { return median(p.values(f)) }

func (p *point) sum(k string) float64 {
	s := 0.0
	for _, r := range p.runs {
		if x := r.num(k); !math.IsNaN(x) {
			s += x
		}
	}
	return s
}

func (p *point) max(f func(record) float64) float64 {
	v := p.values(f)
	if len(v) == 0 {
		return math.NaN()
	}
	return v[len(v)-1]
}

func field(k string) func(record) float64 { return func(r record) float64 { return r.num(k) } }

// perReq is CPU microseconds per completed request.
func perReq(k string) func(record) float64 {
	return func(r record) float64 { return r.num(k) / r.num("requests") }
}

func both(r record) float64 {
	return (r.num("target_cpu_us") + r.num("memc_cpu_us")) / r.num("requests")
}

// spread is (max-min)/median in percent.
func spread(v []float64) float64 {
	if len(v) < 2 {
		return 0
	}
	return (v[len(v)-1] - v[0]) / median(v) * 100
}

func fmtNum(x float64, prec int) string {
	if math.IsNaN(x) {
		return "–"
	}
	return strconv.FormatFloat(x, 'f', prec, 64)
}

func fmtInt(x float64) string {
	if math.IsNaN(x) {
		return "–"
	}
	s := strconv.FormatInt(int64(math.Round(x)), 10)
	// thousands separators
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

func ratio(a, b float64) string {
	if math.IsNaN(a) || math.IsNaN(b) || b == 0 {
		return "–"
	}
	return fmtNum(a/b, 2) + "×"
}

// report prints the Markdown tables for the wrk runs (-runs) and the ab
// runs (-ab); with -big, the tables of the big-value runs (-runs only).
func report(args []string, w io.Writer) error {
	fs := flag.NewFlagSet("report", flag.ExitOnError)
	runsFile := fs.String("runs", "", "wrk results, one key=value line per run")
	abFile := fs.String("ab", "", "ab results, one key=value line per run")
	big := fs.Bool("big", false, "the runs are big-value runs: throughput in MB/s and the gateway's memory")
	wrkLimit := fs.Float64("wrk-limit", 90, "wrk CPU percent above which a run is flagged as load-generator bound")
	_ = fs.Parse(args)
	if *runsFile == "" && (*big || *abFile == "") {
		return errors.New("report: -runs is required (or -ab alone)")
	}
	if *runsFile != "" {
		recs, err := readRecords(*runsFile)
		if err != nil {
			return err
		}
		if *big {
			bigTables(recs, w, *wrkLimit)
			return nil
		}
		wrkTables(recs, w, *wrkLimit)
	}
	if *abFile == "" {
		return nil
	}
	return abTables(*abFile, w)
}

// cells lists the (workload, concurrency) pairs in the order they first
// appear, and the most repeats any point has.
func cells(order []pointKey, points map[pointKey]*point) (out []pointKey, reps int) {
	for _, k := range order {
		reps = max(reps, len(points[k].runs))
		k.target = ""
		if !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	return out, reps
}

func wrkTables(recs []record, w io.Writer, wrkLimit float64) {
	order, points := group(recs, "workload")
	cells, reps := cells(order, points)

	fmt.Fprintf(w, "#### wrk: medians of %d runs per point\n\n", reps)
	fmt.Fprintln(w, "| workload | clients | target | req/s | req/s min–max | p50 ms | p99 ms | socket errors | non-2xx | server CPU µs/req | memcached CPU µs/req | RSS MB | own conns to memcached avg / max | memcached curr_connections max | conns opened per run | wrk CPU % |")
	fmt.Fprintln(w, "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	var flagged []string
	maxSpread := map[string]float64{}
	for _, c := range cells {
		for _, t := range []string{gate, nginx, floor, h1Floor} {
			p := points[pointKey{c.workload, c.conc, t}]
			if p == nil {
				continue
			}
			rps := p.values(field("rps"))
			maxSpread[t] = max(maxSpread[t], spread(rps))
			wrkCPU := p.max(field("wrk_cpu_pct"))
			if wrkCPU > wrkLimit {
				flagged = append(flagged, fmt.Sprintf("%s %d %s (wrk at %.0f%% CPU)", c.workload, c.conc, t, wrkCPU))
			}
			mm := "–"
			if len(rps) > 0 {
				mm = fmt.Sprintf("%s–%s (±%s%%)", fmtInt(rps[0]), fmtInt(rps[len(rps)-1]), fmtNum(spread(rps)/2, 1))
			}
			fmt.Fprintf(w, "| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s / %s | %s | %s | %s |\n",
				c.workload, c.conc, t,
				fmtInt(median(rps)), mm,
				fmtNum(p.median(field("p50_us"))/1000, 2), fmtNum(p.median(field("p99_us"))/1000, 2),
				fmtInt(p.sum("sock_err")), fmtInt(p.sum("non2xx")),
				fmtNum(p.median(perReq("target_cpu_us")), 1), fmtNum(p.median(perReq("memc_cpu_us")), 1),
				fmtNum(p.max(field("rss_max_kb"))/1024, 1),
				fmtInt(p.median(field("own_avg"))), fmtInt(p.max(field("own_max"))), fmtInt(p.max(field("conn_max"))),
				fmtInt(p.median(field("conn_opened"))),
				fmtNum(wrkCPU, 0))
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Socket errors and non-2xx are totals over all runs of the point; RSS is the highest sampled VmRSS (summed over the nginx workers, or memcgate's), own conns are the target's ESTABLISHED connections to memcached and curr_connections is memcached's own count, both sampled every 200 ms; curr_connections also holds the other target's idle pool and the sampler's connection, so read own conns for the target. conns opened is memcached's total_connections delta over the run (connection churn).")
	fmt.Fprintln(w)

	fmt.Fprintln(w, "#### Ratios memcgate / nginx (medians)")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| workload | clients | req/s | p99 | server CPU/req | server+memcached CPU/req | server CPU/req over the floor's | server CPU/req memcgate over h1-const |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|")
	for _, c := range cells {
		g, n := points[pointKey{c.workload, c.conc, gate}], points[pointKey{c.workload, c.conc, nginx}]
		if g == nil || n == nil {
			continue
		}
		overFloor, overH1 := "–", "–"
		if f := points[pointKey{c.workload, c.conc, floor}]; f != nil {
			overFloor = ratio(g.median(perReq("target_cpu_us")), f.median(perReq("target_cpu_us")))
		}
		if f := points[pointKey{c.workload, c.conc, h1Floor}]; f != nil {
			overH1 = ratio(g.median(perReq("target_cpu_us")), f.median(perReq("target_cpu_us")))
		}
		fmt.Fprintf(w, "| %s | %d | %s | %s | %s | %s | %s | %s |\n", c.workload, c.conc,
			ratio(g.median(field("rps")), n.median(field("rps"))),
			ratio(g.median(field("p99_us")), n.median(field("p99_us"))),
			ratio(g.median(perReq("target_cpu_us")), n.median(perReq("target_cpu_us"))),
			ratio(g.median(both), n.median(both)), overFloor, overH1)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "req/s above 1× favours memcgate; p99 and CPU/req below 1× favour memcgate. The floor is nginx answering a constant body of a value's length without memcached (get only); h1-const is memcgate's own HTTP server (gateway/h1, set up as memcgate sets it up, pinned the same) answering such a body, with no memcached and no routing (get only): memcgate over h1-const is the cost of the gateway's own work, h1-const over the floor that of Go and the server.")
	fmt.Fprintln(w)
	fmt.Fprintf(w, "Noise between repeats: the widest req/s spread (max−min over median) of any point was %s%% for memcgate and %s%% for nginx.\n",
		fmtNum(maxSpread[gate], 1), fmtNum(maxSpread[nginx], 1))
	interference(recs, flagged, w, wrkLimit)
}

// interference says how many runs were repeated, the worst interference
// left, and which runs were load-generator bound.
func interference(recs []record, flagged []string, w io.Writer, wrkLimit float64) {
	repeated, srvF, loadF := 0, 0.0, 0.0
	for _, r := range recs {
		if a := r.num("attempts"); a > 1 {
			repeated++
		}
		srvF = max(srvF, r.num("srv_foreign_pct"))
		loadF = max(loadF, r.num("load_foreign_pct"))
	}
	fmt.Fprintf(w, "\nInterference: %d run(s) were repeated because other processes used CPU during them (the least disturbed attempt is kept); in the runs kept, other processes took at most %s%% of a CPU on the servers' CPUs and %s%% on the load generator's.\n",
		repeated, fmtNum(srvF, 1), fmtNum(loadF, 1))
	if len(flagged) > 0 {
		fmt.Fprintf(w, "\n**Load-generator bound** (wrk above %.0f%% of its CPU): %s.\n", wrkLimit, strings.Join(flagged, "; "))
	} else {
		fmt.Fprintf(w, "\nwrk stayed below %.0f%% of its CPU in every run, so it was not the bottleneck.\n", wrkLimit)
	}
}

func abTables(abFile string, w io.Writer) error {
	abRecs, err := readRecords(abFile)
	if err != nil {
		return err
	}
	aorder, apoints := group(abRecs, "tool")
	titles := map[string]string{
		"ab":     "ab with keep-alive (seed style: `ab -k -c C -n N`, GET of one key)",
		"ab-new": "ab with a new connection per request (`ab -c C -n N`, GET of one key, as a PHP page calls)",
	}
	var tools []string
	for _, k := range aorder {
		if !slices.Contains(tools, k.workload) {
			tools = append(tools, k.workload)
		}
	}
	for _, tool := range tools {
		abReps := 0
		var concs []int
		for _, k := range aorder {
			if k.workload != tool {
				continue
			}
			abReps = max(abReps, len(apoints[k].runs))
			if !slices.Contains(concs, k.conc) {
				concs = append(concs, k.conc)
			}
		}
		title := titles[tool]
		if title == "" {
			title = tool
		}
		fmt.Fprintln(w)
		fmt.Fprintf(w, "#### %s, medians of %d runs\n\n", title, abReps)
		fmt.Fprintln(w, "| clients | target | requests | req/s | req/s min–max | p50 ms | p99 ms | Failed requests | non-2xx | keep-alive requests | server CPU µs/req | req/s memcgate/nginx | CPU/req memcgate/nginx | CPU/req memcgate/floor |")
		fmt.Fprintln(w, "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
		for _, c := range concs {
			g, n, f := apoints[pointKey{tool, c, gate}], apoints[pointKey{tool, c, nginx}], apoints[pointKey{tool, c, floor}]
			for _, p := range []*point{g, n, f} {
				if p == nil {
					continue
				}
				rps := p.values(field("rps"))
				mm := "–"
				if len(rps) > 0 {
					mm = fmtInt(rps[0]) + "–" + fmtInt(rps[len(rps)-1])
				}
				var rat, cpuN, cpuF string
				if p == g && n != nil {
					rat = ratio(g.median(field("rps")), n.median(field("rps")))
					cpuN = ratio(g.median(perReq("target_cpu_us")), n.median(perReq("target_cpu_us")))
				}
				if p == g && f != nil {
					cpuF = ratio(g.median(perReq("target_cpu_us")), f.median(perReq("target_cpu_us")))
				}
				fmt.Fprintf(w, "| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", c, p.target,
					fmtInt(p.median(field("complete"))), fmtInt(median(rps)), mm,
					fmtNum(p.median(field("p50_ms")), 0), fmtNum(p.median(field("p99_ms")), 0),
					fmtInt(p.sum("failed")), fmtInt(p.sum("non2xx")), fmtInt(p.median(field("keepalive"))),
					fmtNum(p.median(perReq("target_cpu_us")), 1), rat, cpuN, cpuF)
			}
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Failed requests and non-2xx are totals over all runs; ab reports whole milliseconds. Server CPU is the target's processes' user+system time over the run (10 ms ticks), per completed request; the floor is nginx answering a constant body of a value's length without memcached.")
	return nil
}
