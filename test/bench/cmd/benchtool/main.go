// Command benchtool holds the parts of test/bench/bench.sh that need real
// logic: preloading memcached, sampling the server processes during a run,
// turning the raw results into Markdown tables, and the floor of big-value
// PUTs (proxy).
//
//	benchtool preload -addr 127.0.0.1:P -n 10000 -keylen 96 -vallen 400 -keys FILE
//	benchtool sample  -memc 127.0.0.1:P -target PID,PID -rss PID,PID -memcached PID
//	benchtool report  -runs runs.txt -ab ab.txt
//	benchtool counters -pids PID,PID
//	benchtool phpreport -runs php.txt
//	benchtool proxy   -listen 127.0.0.1:P -memc 127.0.0.1:M [-splice]
//
// It is a benchmark helper, not part of the gateway.
package main

import (
	"fmt"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "preload":
		err = preload(os.Args[2:])
	case "sample":
		err = sample(os.Args[2:])
	case "report":
		err = report(os.Args[2:], os.Stdout)
	case "counters":
		err = counters(os.Args[2:])
	case "phpreport":
		err = phpReport(os.Args[2:], os.Stdout)
	case "proxy":
		err = proxy(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchtool:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: benchtool preload|sample|report|counters|phpreport|proxy [flags] (see the package comment)")
	os.Exit(2)
}
