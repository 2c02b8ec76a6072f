package main

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// socketCheckEvery is how often the socket file of LISTEN_SOCKET is
// looked at: a stat, nothing a client waits for.
const socketCheckEvery = time.Second

// socketWatch notices that the file at LISTEN_SOCKET is no longer the
// socket the data listener listens on: removed (rm, a cleanup of /run or
// /tmp, another program's start that clears its path) or replaced by
// another file. The listener still accepts, but no client can reach it
// any more: connect(2) on the path fails with ENOENT, or reaches
// whatever took the path. Nothing else in the process can tell, so
// without this the Unix socket stops serving while every metric, log
// line and /readyz says all is well.
//
// It reports, it does not make the file again: the path may have become
// another service's, and a socket systemd passed is systemd's to
// make. Once it finds the file gone, or finds it so at the stop
// (keepOthers), the listener's close no longer unlinks the path, which
// may by then hold another process's socket.
// It holds an atomic: it must not be copied.
type socketWatch struct {
	path string
	want os.FileInfo       // the file at path when the gateway started; nil if it could not be read
	ul   *net.UnixListener // the listener whose file it is; nil if it is not one (never unlinks then)
	log  *slog.Logger
	gone atomic.Bool // the file at path is not want
}

// newSocketWatch returns the watch of the socket file at path, which ln
// listens on. It reads the file at once, as the one to keep finding; it
// starts nothing (Run). Its gauge is registered on reg, and stays 0 if
// ln is nil (no LISTEN_SOCKET: Run is not to be called then).
func newSocketWatch(path string, ln net.Listener, log *slog.Logger, reg prometheus.Registerer) *socketWatch {
	w := &socketWatch{path: path, log: log}
	if ln != nil {
		w.ul, _ = ln.(*net.UnixListener)
		w.want, _ = os.Lstat(path) // a file not there is gone at the first check
	}
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "memcgate_http_listen_socket_missing",
		Help: "1 while the file at MEMCGATE_LISTEN_SOCKET is not the socket the gateway listens on (removed or replaced since the start): no client can connect over it until a restart makes it again; 0 otherwise.",
	}, func() float64 {
		if w.gone.Load() {
			return 1
		}
		return 0
	}))
	return w
}

// Run checks the socket file every socketCheckEvery until ctx is done.
func (w *socketWatch) Run(ctx context.Context) {
	t := time.NewTicker(socketCheckEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			w.check()
		}
	}
}

// check looks at the file at path once, and logs a change of state: an
// error when it is gone, with what is there instead, an info line when
// the same file is back (a hard link made again).
func (w *socketWatch) check() {
	fi, err := os.Lstat(w.path)
	ok := err == nil && w.want != nil && os.SameFile(w.want, fi)
	if ok == !w.gone.Load() {
		return
	}
	w.gone.Store(!ok)
	if ok {
		w.log.Info("listen socket file back: clients connect over it again", "path", w.path)
		return
	}
	if w.ul != nil {
		// Whatever took the path is not ours to remove at stop.
		w.ul.SetUnlinkOnClose(false)
	}
	found := "another file"
	switch {
	case errors.Is(err, fs.ErrNotExist):
		found = "nothing"
	case err != nil:
		found = err.Error()
	case fi.Mode().Type() == fs.ModeSocket:
		found = "another socket"
	}
	w.log.Error("listen socket file gone: no client can connect over it until the gateway restarts (MEMCGATE_LISTEN_SOCKET; with the socket unit, restart memcgate-unix.socket too); the TCP listener serves on",
		"path", w.path, "found", found)
}

// keepOthers, called once Run has returned and before the listener is
// closed, leaves the file at path alone at the close unless it is still
// the listener's socket. It logs nothing: the gateway is stopping, and
// what the path holds now is another process's to serve.
func (w *socketWatch) keepOthers() {
	if w.ul == nil {
		return
	}
	if fi, err := os.Lstat(w.path); err != nil || w.want == nil || !os.SameFile(w.want, fi) {
		w.ul.SetUnlinkOnClose(false)
	}
}
