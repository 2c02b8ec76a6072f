package main

import (
	"log/slog"
	"math"
	"time"
)

// Of the open-file limit, what MAX_CLIENT_CONNS=0 keeps from clients for
// the process's other descriptors: memcached connections (PIPELINE_CONNS
// and a probe per node, up to MAX_CONNS_PER_NODE without pipelining),
// the admin listener's clients, files. A quarter, but no more than
// reserveMax: a limit of 1024 leaves 768 client connections, one of
// 1048576 all but 4096.
const reserveMax = 4096

// clientConnCap is the cap on client connections for the MAX_CLIENT_CONNS
// setting, given the open-file limit nofile (0: unknown or unlimited): the
// setting if positive, none (0) for -1, and for 0 nofile less its reserve.
func clientConnCap(setting int, nofile uint64) int {
	switch {
	case setting > 0:
		return setting
	case setting < 0 || nofile == 0:
		return 0
	}
	return int(min(nofile-min(nofile/4, reserveMax), math.MaxInt32)) // RLIM_INFINITY too, on 32-bit
}

// warnConnCap logs a warning if maxConns, the cap on client connections
// (0: none), leaves less than clientConnCap's reserve of the open-file
// limit nofile (0: unknown or unlimited) to the other descriptors.
func warnConnCap(log *slog.Logger, maxConns int, nofile uint64) {
	if nofile > 0 && uint64(maxConns) > nofile-min(nofile/4, reserveMax) {
		log.Warn("MEMCGATE_MAX_CLIENT_CONNS leaves few descriptors of the open-file limit for memcached and the admin listener: while clients hold them all, memcached connections cannot be opened; raise the limit (ulimit -n, LimitNOFILE=) or lower the cap",
			"max_client_conns", maxConns, "open_file_limit", nofile)
	}
}

// orRead is d, or read if d is 0, as net/http reads its timeouts: a
// ReadHeaderTimeout or IdleTimeout of 0 is the ReadTimeout.
func orRead(d, read time.Duration) time.Duration {
	if d != 0 {
		return d
	}
	return read
}
