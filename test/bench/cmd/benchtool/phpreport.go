package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
)

// phpVariants names php.sh's variants in the tables, in their order;
// native (php-memcached connecting per page) is the reference. The plain
// HTTP variants call with curl ("curl close": curl sending "Connection:
// close"), "stream" with PHP's stream socket (memcgate_get), "stream
// persistent" with the connection a php-fpm worker keeps
// (memcgate_get_persistent), "file_get_contents" with PHP's http:// wrapper.
var phpVariants = []struct{ name, title string }{
	{"native", "native"},
	{"native-persistent", "native persistent"},
	{"memcgate", "memcgate TCP"},
	{"memcgate-unix", "memcgate Unix socket"},
	{"nginx-memc", "nginx + memc"},
	{"nginx-const", "nginx constant"},
	{"memcgate-close", "memcgate TCP curl close"},
	{"memcgate-unix-close", "memcgate Unix socket curl close"},
	{"nginx-memc-close", "nginx + memc curl close"},
	{"memcgate-stream", "memcgate TCP stream"},
	{"memcgate-unix-stream", "memcgate Unix socket stream"},
	{"nginx-memc-stream", "nginx + memc stream"},
	{"nginx-const-stream", "nginx constant stream"},
	{"memcgate-stream-persist", "memcgate TCP stream persistent"},
	{"memcgate-unix-stream-persist", "memcgate Unix socket stream persistent"},
	{"nginx-memc-stream-persist", "nginx + memc stream persistent"},
	{"memcgate-fgc", "memcgate TCP file_get_contents"},
	{"nginx-memc-fgc", "nginx + memc file_get_contents"},
	{"nginx-const-fgc", "nginx constant file_get_contents"},
}

// phpReport prints the Markdown tables of php.sh's runs (-runs) and of
// its perf stat runs (-perf).
func phpReport(args []string, w io.Writer) error {
	fs := flag.NewFlagSet("phpreport", flag.ExitOnError)
	runsFile := fs.String("runs", "", "ab results, one key=value line per run")
	perfFile := fs.String("perf", "", "perf stat results, one key=value line per gateway")
	_ = fs.Parse(args)
	if *runsFile == "" {
		return errors.New("phpreport: -runs is required")
	}
	recs, err := readRecords(*runsFile)
	if err != nil {
		return err
	}
	for _, r := range recs {
		r["target"] = r["variant"]
		r["tool"] = "php"
	}
	order, points := group(recs, "tool")
	var concs []int
	reps := 0
	present := map[string]bool{}
	for _, k := range order {
		if !slices.Contains(concs, k.conc) {
			concs = append(concs, k.conc)
		}
		present[k.target] = true
		reps = max(reps, len(points[k].runs))
	}
	var vs []struct{ name, title string }
	known := map[string]bool{}
	for _, v := range phpVariants {
		known[v.name] = true
		if present[v.name] {
			vs = append(vs, v)
		}
	}
	for _, k := range order { // others (a script's own experiments) by name, last
		if !known[k.target] {
			known[k.target] = true
			vs = append(vs, struct{ name, title string }{k.target, k.target})
		}
	}
	at := func(v string, c int) *point { return points[pointKey{"php", c, v}] }
	rps := func(v string, c int) float64 {
		if p := at(v, c); p != nil {
			return p.median(field("rps"))
		}
		return math.NaN()
	}

	fmt.Fprintf(w, "#### PHP pages per second, medians of %d runs, and their share of native (php-memcached connecting per page)\n\n", reps)
	head, rule := "| clients |", "|---:|"
	for _, v := range vs {
		head += " " + v.title + " |"
		rule += "---:|"
	}
	fmt.Fprintln(w, head)
	fmt.Fprintln(w, rule)
	for _, c := range concs {
		row := fmt.Sprintf("| %d |", c)
		base := rps("native", c)
		for _, v := range vs {
			x := rps(v.name, c)
			cell := fmtInt(x)
			if base > 0 && !math.IsNaN(x) {
				cell += " (" + fmtNum(x/base*100, 0) + " %)"
			}
			row += " " + cell + " |"
		}
		fmt.Fprintln(w, row)
	}
	fmt.Fprintln(w)

	fmt.Fprintln(w, "#### Per variant")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| clients | variant | pages/s | min–max | p50 ms | p99 ms | failed | non-2xx | gateway CPU µs/page | gateway context switches/page | memcached CPU µs/page | php-fpm CPU µs/page | front nginx CPU µs/page | machine CPU µs/page |")
	fmt.Fprintln(w, "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, c := range concs {
		for _, v := range vs {
			p := at(v.name, c)
			if p == nil {
				continue
			}
			r := p.values(field("rps"))
			mm := "–"
			if len(r) > 0 {
				mm = fmtInt(r[0]) + "–" + fmtInt(r[len(r)-1])
			}
			gw, gcs := "–", "–"
			if !strings.HasPrefix(v.name, "native") {
				gw, gcs = fmtNum(p.median(perReq("gw_cpu_us")), 1), fmtNum(p.median(perReq("gw_cs")), 2)
			}
			fmt.Fprintf(w, "| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", c, v.title,
				fmtInt(median(r)), mm, fmtNum(p.median(field("p50_ms")), 0), fmtNum(p.median(field("p99_ms")), 0),
				fmtInt(p.sum("failed")), fmtInt(p.sum("non2xx")), gw, gcs,
				fmtNum(p.median(perReq("memc_cpu_us")), 1), fmtNum(p.median(perReq("php_cpu_us")), 1),
				fmtNum(p.median(perReq("front_cpu_us")), 1), fmtNum(p.median(perReq("busy_us")), 1))
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Failed and non-2xx are totals over the runs (a page answers 502 on a miss, an error or a value of another length). Gateway CPU is memcgate's process, or nginx + memc's master and workers, from /proc (10 ms ticks); its context switches are summed over its threads; php-fpm CPU is its master and children (the pages, their HTTP or memcached client included), front nginx CPU the nginx that serves the pages to ab; machine CPU is every CPU's non-idle time over the run (/proc/stat: user, nice, system, irq, softirq), other engineers' processes included, per page.")
	fmt.Fprintln(w)

	// Each HTTP client's variants: the suffix of their names and the
	// client's name in the tables.
	clients := []struct{ suffix, title string }{{"", "curl"}, {"-close", "curl close"}, {"-stream", "stream"},
		{"-stream-persist", "stream persistent"}, {"-fgc", "file_get_contents"}}
	var cmp []struct{ suffix, title string }
	for _, cl := range clients {
		if present["memcgate"+cl.suffix] && present["nginx-memc"+cl.suffix] {
			cmp = append(cmp, cl)
		}
	}
	if len(cmp) > 0 {
		fmt.Fprintln(w, "#### memcgate against nginx + memc, the same PHP client calling each (medians)")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "| clients | PHP client | pages/s TCP | pages/s Unix socket | gateway CPU/page TCP | gateway CPU/page Unix socket |")
		fmt.Fprintln(w, "|---:|---|---:|---:|---:|---:|")
		for _, c := range concs {
			for _, cl := range cmp {
				ng := "nginx-memc" + cl.suffix
				n := at(ng, c)
				if n == nil {
					continue
				}
				tcp, unix := "memcgate"+cl.suffix, "memcgate-unix"+cl.suffix
				cells := []string{}
				for _, m := range []string{tcp, unix} {
					cells = append(cells, ratio(rps(m, c), rps(ng, c)))
				}
				for _, m := range []string{tcp, unix} {
					if g := at(m, c); g != nil {
						cells = append(cells, ratio(g.median(perReq("gw_cpu_us")), n.median(perReq("gw_cpu_us"))))
					} else {
						cells = append(cells, "–")
					}
				}
				fmt.Fprintf(w, "| %d | %s | %s |\n", c, cl.title, strings.Join(cells, " | "))
			}
		}
		fmt.Fprintln(w)
		fmt.Fprintln(w, "pages/s above 1× and CPU/page below 1× favour memcgate.")
		fmt.Fprintln(w)
	}

	// The same server called by each PHP client, against curl.
	type pair struct{ server, title, other, client string }
	var pairs []pair
	for _, base := range []struct{ name, title string }{
		{"memcgate", "memcgate TCP"}, {"memcgate-unix", "memcgate Unix socket"},
		{"nginx-memc", "nginx + memc"}, {"nginx-const", "nginx constant"},
	} {
		for _, cl := range clients[1:] {
			if present[base.name] && present[base.name+cl.suffix] {
				pairs = append(pairs, pair{base.name, base.title, base.name + cl.suffix, cl.title})
			}
		}
	}
	if len(pairs) > 0 {
		fmt.Fprintln(w, "#### Each PHP client against curl, the same server (medians)")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "| clients | server | PHP client | pages/s | machine CPU/page | php-fpm CPU/page | gateway CPU/page |")
		fmt.Fprintln(w, "|---:|---|---|---:|---:|---:|---:|")
		for _, c := range concs {
			for _, pr := range pairs {
				a, b := at(pr.other, c), at(pr.server, c)
				if a == nil || b == nil {
					continue
				}
				med := func(p *point, k string) float64 { return p.median(perReq(k)) }
				fmt.Fprintf(w, "| %d | %s | %s | %s | %s | %s | %s |\n", c, pr.title, pr.client,
					ratio(rps(pr.other, c), rps(pr.server, c)), ratio(med(a, "busy_us"), med(b, "busy_us")),
					ratio(med(a, "php_cpu_us"), med(b, "php_cpu_us")), ratio(med(a, "gw_cpu_us"), med(b, "gw_cpu_us")))
			}
		}
		fmt.Fprintln(w)
		fmt.Fprintln(w, "Ratios to the curl variant of the same server: pages/s above 1× and CPU/page below 1× favour the other client.")
		fmt.Fprintln(w)
	}

	if *perfFile == "" {
		return nil
	}
	prs, err := readRecords(*perfFile)
	if err != nil {
		return err
	}
	if len(prs) == 0 {
		return nil
	}
	fmt.Fprintf(w, "#### System calls and context switches per page (perf stat on the gateway's processes, a run of its own at %s clients)\n\n", prs[0]["conc"])
	fmt.Fprintln(w, "| variant | system calls/page | context switches/page |")
	fmt.Fprintln(w, "|---|---:|---:|")
	for _, v := range vs {
		for _, r := range prs {
			if r["variant"] != v.name {
				continue
			}
			n := r.num("requests")
			fmt.Fprintf(w, "| %s | %s | %s |\n", v.title, fmtNum(r.num("syscalls")/n, 1), fmtNum(r.num("cs")/n, 2))
		}
	}
	fmt.Fprintln(w)
	return nil
}
