// Command memcgate is an HTTP gateway to a cluster of memcached servers.
// Run it with -help for the configuration variables.
package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/caarlos0/env/v11"

	"github.com/memcgate/memcgate/cmd/memcgate/internal/liveconfig"
	"github.com/memcgate/memcgate/cmd/memcgate/internal/logbuf"
	"github.com/memcgate/memcgate/config"
)

func main() {
	// A reader of stdout or stderr that goes away (a `| logger` killed, a
	// log collector restarted) must not take the gateway with it: with
	// SIGPIPE ignored, a write to the broken pipe fails with EPIPE, and
	// the log counts its lines as dropped, as nginx and memcached do.
	signal.Ignore(syscall.SIGPIPE)
	// SIGHUP is taken from here on, not once the gateway serves: its
	// default action ends the process, and "systemctl reload" may send it
	// as soon as the process runs (Type=exec), while the start still
	// waits for a DNS answer, say. One sent meanwhile waits in hup and
	// is a reload once the gateway runs.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], env.ToMap(os.Environ()), os.Stdout, os.Stderr, hup); err != nil {
		fmt.Fprintln(os.Stderr, "memcgate:", err)
		os.Exit(1)
	}
}

// run parses arguments and configuration, opens the listeners and serves
// until ctx is done, reloading on every signal from hup (nil: never).
func run(ctx context.Context, args []string, environ map[string]string, stdout, stderr io.Writer, hup <-chan os.Signal) error {
	if len(args) > 0 {
		switch args[0] {
		case "-h", "-help", "--help", "help":
			fmt.Fprint(stdout, config.Usage(), arguments)
			return nil
		case "-version", "--version", "version":
			fmt.Fprintln(stdout, currentBuild())
			return nil
		case "healthcheck":
			return healthcheck(ctx, environ, args[1:])
		case "check":
			return check(ctx, environ, args[1:], stdout)
		default:
			return fmt.Errorf("unknown argument %q (memcgate takes its configuration from MEMCGATE_* variables; see -help)", args[0])
		}
	}
	cfg, err := liveconfig.Load(ctx, environ)
	if err != nil {
		return fmt.Errorf("invalid configuration:\n%w", err)
	}
	logs := logbuf.New(stderr, logbuf.Backlog, func(w io.Writer, lines int, err error) {
		// At error level, which every LOG_LEVEL shows: lines are missing.
		l := newLogger(cfg, w, nil)
		if err != nil {
			l.Error("log lines dropped: the log's destination refused them, or took them slower than they came", "lines", lines, "err", err.Error())
			return
		}
		l.Error("log lines dropped: the log's destination took them slower than they came", "lines", lines)
	})
	lg := logging{level: new(slog.LevelVar), dropped: logs.Dropped}
	_ = lg.level.UnmarshalText([]byte(cfg.LogLevel)) // validated by config.Load
	lg.log = newLogger(cfg, logs, lg.level)
	// Access lines go to the log's access backlog, so that a flood of
	// requests cannot crowd out the errors; in JSON, most without slog.
	lg.access = newLogger(cfg, logs.Access(), lg.level)
	if cfg.LogFormat == "json" {
		lg.accessJSON = logs.Access()
	}
	log := lg.log
	logCtx, stopLogs := context.WithCancel(context.WithoutCancel(ctx))
	flushed := make(chan struct{})
	go func() { logs.Run(logCtx); close(flushed) }()
	defer func() { // the last lines, shutdown included, unless stderr takes nothing
		stopLogs()
		select {
		case <-flushed:
		case <-time.After(logbuf.StopWait):
		}
	}()
	for _, w := range cfg.Warnings() {
		log.Warn("configuration warning", "warning", w)
	}
	for _, w := range processWarnings(cfg, environ) {
		log.Warn("configuration warning", "warning", w)
	}
	ls, err := openListeners(ctx, cfg, environ)
	if err != nil {
		return err
	}
	return serve(ctx, cfg, environ, ls, lg, hup)
}

// processWarnings are the configuration warnings only the process's
// environment tells, beside cfg.Warnings: settings the Go runtime's
// variables make do nothing.
func processWarnings(cfg config.Config, environ map[string]string) []string {
	var out []string
	if cfg.FitProcs && goMaxProcsSet(environ) {
		// The runtime read GOMAXPROCS before memcgate ran: the operator's
		// number stands, and FIT_PROCS, set to change it, does nothing.
		out = append(out, fmt.Sprintf("%sFIT_PROCS=true is ignored: GOMAXPROCS=%s sets the processors; unset GOMAXPROCS to fit them to the load, or FIT_PROCS to keep this number",
			config.Prefix, environ["GOMAXPROCS"]))
	}
	return out
}

// goMaxProcsSet reports whether environ's GOMAXPROCS sets the runtime's
// processors: a number above 0, as the runtime reads it (anything else
// leaves the default).
func goMaxProcsSet(environ map[string]string) bool {
	n, err := strconv.Atoi(environ["GOMAXPROCS"])
	return err == nil && n > 0
}

// logging is where serve logs: the log and its level, which a reload
// may change, and the access log's loggers over the log's access backlog
// (logbuf.Buffer.Access).
type logging struct {
	log        *slog.Logger
	level      *slog.LevelVar
	access     *slog.Logger // gateway.Options.AccessLogger
	accessJSON io.Writer    // access log lines without slog, same bytes (gateway.Options.AccessLogJSON); nil unless LOG_FORMAT=json
	dropped    func() uint64
}

// newLogger returns a logger in cfg's format writing to w, at level (nil:
// info).
func newLogger(cfg config.Config, w io.Writer, level slog.Leveler) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	if cfg.LogFormat == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

// arguments ends -help: what the command takes besides the environment.
const arguments = `
Arguments (with none, memcgate serves):
  -help, -version
      this text; the build: version, revision, Go version and platform
  healthcheck [PATH]
      asks the admin listener (MEMCGATE_ADMIN_ADDR, from the environment or MEMCGATE_CONFIG_FILE) for PATH, /healthz by default, and exits 1 unless it answers 200, printing why: a container's health check without curl (the image asks /readyz)
  check
      reads the configuration as a start does (the environment, MEMCGATE_CONFIG_FILE, the nodes, the token and TLS files) and exits 1 on what a start would refuse, printing every problem; opens no port: run it before a reload signal (the systemd unit's ExecReload=)
`

// healthcheck is the container health check: it asks the admin listener's
// /healthz, or the path given (the image's HEALTHCHECK gives /readyz),
// and fails unless it answers 200, so images need no curl.
func healthcheck(ctx context.Context, environ map[string]string, args []string) error {
	path := "/healthz"
	switch {
	case len(args) > 1:
		return fmt.Errorf("healthcheck takes one PATH, got %d arguments", len(args))
	case len(args) == 1 && !strings.HasPrefix(args[0], "/"):
		return fmt.Errorf("healthcheck: %q is not a path: write /%s", args[0], args[0])
	case len(args) == 1:
		path = args[0]
	}
	if f := environ[config.Prefix+"CONFIG_FILE"]; f != "" {
		// The admin address may be set there, as the server reads it.
		over, err := config.ReadEnvFile(f)
		if err != nil {
			return fmt.Errorf("healthcheck: %w", err)
		}
		environ = config.Overlay(environ, over)
	}
	addr := environ[config.Prefix+"ADMIN_ADDR"]
	if addr == "" {
		addr = "127.0.0.1:9090"
	}
	scheme, client := "http", http.DefaultClient
	if environ[config.Prefix+"ADMIN_TLS_CERT_FILE"] != "" {
		// The check talks to this host's own process: its certificate
		// names the service, not 127.0.0.1, so it is not verified here.
		scheme = "https"
		client = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("healthcheck: %s: %w", addr, err)
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, scheme+"://"+net.JoinHostPort(host, port)+path, nil)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	// A name every listener answers (MEMCGATE_ALLOWED_HOSTS), whatever
	// name ADMIN_ADDR gives.
	req.Host = net.JoinHostPort("localhost", port)
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		// The body says why (/readyz: "not ready: no memcached node is
		// up (0 of 3)"); docker inspect shows it in the health log.
		why, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		if s := strings.TrimSpace(string(why)); s != "" {
			return fmt.Errorf("healthcheck: %s answered %s: %s", path, resp.Status, strings.ToValidUTF8(s, "?"))
		}
		return fmt.Errorf("healthcheck: %s answered %s", path, resp.Status)
	}
	return nil
}
