package main

import (
	"log/slog"
	"time"

	"github.com/memcgate/memcgate/gateway/listen"
)

// warnConnCap logs a warning if maxConns, the cap on client connections
// (0: none), leaves less than listen.ConnCap's reserve of the open-file
// limit nofile (0: unknown or unlimited) to the other descriptors.
func warnConnCap(log *slog.Logger, maxConns int, nofile uint64) {
	if nofile > 0 && maxConns > listen.ConnCap(0, nofile) {
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
