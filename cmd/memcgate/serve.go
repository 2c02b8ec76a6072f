package main

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/memcgate/memcgate/cmd/memcgate/internal/closewatch"
	"github.com/memcgate/memcgate/cmd/memcgate/internal/conncap"
	"github.com/memcgate/memcgate/cmd/memcgate/internal/liveconfig"
	"github.com/memcgate/memcgate/config"
	"github.com/memcgate/memcgate/gateway"
	"github.com/memcgate/memcgate/gateway/budget"
	"github.com/memcgate/memcgate/gateway/bufpool"
	"github.com/memcgate/memcgate/gateway/chunk"
	"github.com/memcgate/memcgate/gateway/h1"
	"github.com/memcgate/memcgate/gateway/listen"
	"github.com/memcgate/memcgate/gateway/memc"
	"github.com/memcgate/memcgate/gateway/procs"
	"github.com/memcgate/memcgate/upstream/panicguard"
	"github.com/memcgate/memcgate/upstream/route"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// serve wires the cluster and both servers, and owns every long-lived
// goroutine. When ctx is done it marks the gateway not ready, waits
// DrainDelay so load balancers notice (not when systemd holds the data
// listeners, which stay open), shuts both servers down (letting
// requests in flight finish within ShutdownTimeout), stops health checks
// and closes the pools. Every signal from hup is a reload (nil: none).
func serve(ctx context.Context, cfg config.Config, environ map[string]string, ls listeners, lg logging, hup <-chan os.Signal) error {
	p := &process{cfg: cfg, environ: environ, ls: ls, lg: lg, log: lg.log, started: time.Now(), unixSocket: ls.socket, hup: hup}
	if err := p.listen(); err != nil {
		p.ls.close()
		return err
	}
	p.memory()
	defer p.gcFloor.stop()
	p.metrics()
	if err := p.upstream(); err != nil {
		p.ls.close()
		return err
	}
	defer p.router.Close()
	p.gateway()
	p.reloads()
	p.admin()
	return p.run(ctx)
}

// process holds what serve wires, each part made by one step of it, in
// the order serve calls them.
type process struct {
	cfg     config.Config
	environ map[string]string
	log     *slog.Logger
	lg      logging
	started time.Time
	hup     <-chan os.Signal // SIGHUP, taken since the process began: each is a reload

	// Made by listen, which wraps ls in place.
	ls            listeners
	unixSocket    net.Listener // ls.socket as opened, unwrapped; nil without LISTEN_SOCKET
	sec           *security
	adminLoopback bool               // the admin listener is reached from this host only
	adminCap      *conncap.Cap       // the admin listener's cap (adminMaxConns)
	adminBusy     prometheus.Counter // admin requests refused past adminWorkers (memcgate_admin_requests_refused_total)
	nofile        uint64             // the open-file limit
	maxConns      int                // the cap on client connections; 0: none
	conns         *connTracker

	// Made by memory.
	mem      memoryPlan
	derived  int64 // MAX_BUFFERED_BYTES when unset, for reloads
	buffered *budget.Budget
	gcFloor  *gcFloor // nil when GOGC is set: the operator's choice stands

	// Made by metrics.
	build      buildInfo
	reg        *prometheus.Registry
	handshakes *prometheus.CounterVec
	panics     *panicguard.Guard // every part's, registered once
	sockWatch  *socketWatch      // runs only with LISTEN_SOCKET

	// Made by upstream.
	router *route.Router

	// Made by gateway.
	hosts   *gateway.HostCheck
	access  *gateway.Access
	bodies  *bufpool.Pool
	handler *gateway.Handler
	data    httpServer

	// Made by reloads.
	reloader *liveconfig.Reloader

	// Made by admin.
	adminServer *http.Server
	draining    atomic.Bool // set once the drain begins: /readyz fails
}

// listen loads the tokens and TLS files, and puts on the listeners what
// their connections go through: TLS, the watch of the connections
// net/http closes, the cap on client connections where net/http serves
// them all, the guard that refuses what the fast path refuses.
func (p *process) listen() error {
	cfg, log := p.cfg, p.log
	sec, err := newSecurity(cfg)
	if err != nil {
		return err
	}
	p.sec = sec
	if sec.noToken {
		log.Warn(config.Prefix + "AUTH_TOKENS_FILE gives no token: every request that needs a scope is refused (401) until a reload brings one; to run without tokens, set neither " + config.Prefix + "AUTH_TOKENS nor " + config.Prefix + "AUTH_TOKENS_FILE")
	}
	p.adminLoopback = loopbackOnly(p.ls.admin.Addr())
	p.adminCap = conncap.New(adminMaxConns, adminHeaderTimeout, orRead(cfg.IdleTimeout, adminReadTimeout), "the admin listener's cap", log)
	p.ls.admin = sec.wrapAdmin(closewatch.Listener(p.adminCap.Listener(p.ls.admin)))
	p.nofile = listen.OpenFileLimit()
	p.maxConns = listen.ConnCap(cfg.MaxClientConns, p.nofile)
	conns := newConnTracker(p.maxConns)
	conns.data, conns.admin = closewatch.New("data", log), closewatch.New("admin", log)
	for _, ln := range []*net.Listener{&p.ls.data, &p.ls.socket} {
		if *ln == nil {
			continue
		}
		if !cfg.FastPath || sec.dataTLS != nil {
			// net/http serves every connection: cap them under TLS (a
			// reload may set a cap where there was none).
			if conns.stdCap == nil {
				conns.stdCap = conncap.New(p.maxConns, cfg.HeadTimeout(), orRead(cfg.IdleTimeout, cfg.ReadTimeout), config.Prefix+"MAX_CLIENT_CONNS", log)
			}
			*ln = closewatch.Listener(conns.stdCap.Listener(*ln))
		}
		*ln = sec.wrapData(*ln)
		if !cfg.FastPath && sec.dataTLS == nil {
			// Go's net/http serves every connection: let it refuse what
			// the fast path refuses (Content-Length with Transfer-Encoding),
			// and name the limit a head too large is over.
			*ln = h1.Guard{HeadTooLarge: headTooLarge(cfg.MaxHeaderBytes)}.Listener(*ln)
		}
	}
	p.conns = conns
	return nil
}

// memory plans the process's memory: the byte budget, the runtime's
// memory limit, and the heap goal's floor unless GOGC is set.
func (p *process) memory() {
	cfg := p.cfg
	mem := planMemory(cfg, cgroupMemoryLimit())
	if w := config.BudgetWarning(mem.budget, cfg.MaxValueBytes, true); !mem.explicit && w != "" {
		p.log.Warn("configuration warning", "warning", w) // cfg.Warnings has the budget set
	}
	derived := mem.budget // MAX_BUFFERED_BYTES when unset, for reloads
	if mem.explicit {
		noBudget := cfg
		noBudget.MaxBufferedBytes = 0
		derived = planMemory(noBudget, cgroupMemoryLimit()).budget
	}
	if mem.runtime > 0 {
		debug.SetMemoryLimit(mem.runtime)
	}
	p.mem, p.derived = mem, derived
	p.buffered = budget.New(mem.budget)
	if _, set := p.environ["GOGC"]; !set {
		p.gcFloor = startGCFloor(heapFloor)
	}
}

// metrics makes the registry every part registers on, with the
// process's own metrics: the runtime's, the build's, the log's.
func (p *process) metrics() {
	p.build = currentBuild()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	registerBuildInfo(reg, p.build)
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "memcgate_log_lines_dropped_total",
		Help: "Log lines dropped because the log's destination (stderr) took them slower than they came, or refused them (a full disk); requests never wait for it.",
	}, func() float64 { return float64(p.lg.dropped()) }))
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "memcgate_admin_connections_reclaimed_total",
		Help: "Admin listener connections closed to make room for a new one at its cap of 64 (ones that sent no complete request head yet; it keeps none idle, serving one request per connection).",
	}, func() float64 { return float64(p.adminCap.Reclaimed()) }), prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "memcgate_admin_connections_refused_total",
		Help: "New admin listener connections closed unserved at its cap of 64, with none idle or quiet to close for room.",
	}, func() float64 { return float64(p.adminCap.Refused()) }))
	p.adminBusy = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "memcgate_admin_requests_refused_total",
		Help: "Admin listener requests other than /healthz and /readyz (metrics, status page, /debug) answered 503 because 4 such requests were under way.",
	})
	reg.MustRegister(p.adminBusy)
	p.handshakes = newHandshakeErrors(reg)
	reg.MustRegister(p.sec.certs) // the expiry of each certificate in force
	p.panics = panicguard.New(p.log, reg)
	p.sockWatch = newSocketWatch(p.cfg.ListenSocket, p.unixSocket, p.log, reg)
	p.reg = reg
}

// upstream builds the pools of memcached nodes.
func (p *process) upstream() error {
	ro := routeOptions(p.cfg, p.sec.dialer, p.buffered)
	for i := range ro.Pools {
		ro.Pools[i].Cluster.Panics = p.panics
	}
	router, err := route.New(ro, p.log, p.reg)
	if err != nil {
		return err
	}
	p.router = router
	return nil
}

// gateway builds the handler over the pools and the data server that
// serves it: net/http's, with the fast path in front of it unless TLS or
// FAST_PATH=false.
func (p *process) gateway() {
	cfg, log, reg, router, conns, buffered := p.cfg, p.log, p.reg, p.router, p.conns, p.buffered
	allowed, _ := config.ParseAllowedHosts(cfg.AllowedHosts) // validated by config.Load
	p.hosts = gateway.NewHostCheck(gateway.NewAllowedHosts(allowed), log, reg)
	gopts := gatewayOptions(cfg)
	p.access = gateway.NewAccess(p.sec.tokens, cfg.ReadOnly)
	// Values in chunks, shared by the REST API and the HttpMemc
	// endpoints, so that deleting a key through either removes its chunks;
	// chunks go through the router, so they follow their key's route.
	gopts.Chunks = chunk.New(router, chunk.Options{ChunkSize: int(cfg.MaxValueBytes), Grace: gopts.BigValueGrace, Timeout: cfg.RequestTimeout, Layout: router.Layout, Panics: p.panics}, reg)
	var memcStore memc.Store = router
	if cfg.BigValueMaxBytes > 0 {
		memcStore = gopts.Chunks
	}
	// The HttpMemc endpoints' writes wait, as the REST API's do, for the
	// asynchronous writes of their key accepted before them.
	gopts.WriteOrder = gateway.NewWriteOrder()
	memcStore = gopts.WriteOrder.Ordered(memcStore)
	gopts.AccessLogger, gopts.AccessLogJSON, gopts.Routes, gopts.Access, gopts.Budget = p.lg.access, p.lg.accessJSON, memcRoutes(cfg, memcStore, router, p.access), p.access, buffered
	if cfg.DetachedResponses && cfg.PipelineConns > 0 { // only pipelined connections answer without waiting
		gopts.Async = router
	}
	if cfg.UDPPorts != "" {
		gopts.Quiet = router
	}
	gopts.Owners = router         // each node's asynchronous writes in a lane of their own
	gopts.TakeBody = h1.TakeAhead // bodies the fast path read ahead, kept without a copy
	// How a request's connection read last ended, for a chunked body whose
	// trailer section net/http's read deadline cut: a 408, not a 400.
	gopts.ReadError = conns.data.ReadErrorOf
	// Body buffers, lent by the fast path and given back by the handler;
	// as many bytes of them as the budget kept for reuse at most.
	bodies := bufpool.New(int(p.mem.budget))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "memcgate_body_buffers_kept_bytes",
		Help: "Bytes of request body buffers over 16 KiB kept for reuse: at most MEMCGATE_MAX_BUFFERED_BYTES, each for 1s at most unused.",
	}, func() float64 { return float64(bodies.Kept()) }))
	gopts.Buffers = bodies
	gopts.Hosts = p.hosts
	gopts.Panics = p.panics
	handler := gateway.NewHandler(router, log, reg, gopts)
	router.CountRequests(handler.RequestsInFlight) // a node past its fair part of MAX_REQUESTS holds no more than are free
	router.ShareBytes(buffered)                    // a node's reads hold at most their share of MAX_BUFFERED_BYTES
	std := &http.Server{
		Handler:           takeTurns(handler),
		ReadHeaderTimeout: cfg.HeadTimeout(),
		ReadTimeout:       cfg.ReadTimeout,
		WriteTimeout:      cfg.WriteTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		MaxHeaderBytes:    cfg.MaxHeaderBytes,
		ErrorLog:          newServerLog(log, "data", p.handshakes, &conns.stdAcceptErrs),
		Protocols:         http1Only(),
	}
	std.ConnState = conns.hook
	conns.data.Serve(std) // net/http's own refusals and timeouts, fast path or not
	p.data, conns.fastH1 = dataServer(cfg, p.sec, std, handler, buffered, bodies, p.maxConns)
	if conns.fastH1 != nil {
		conns.fast = conns.fastH1.ConnStats
	}
	reg.MustRegister(conns)
	p.bodies, p.handler = bodies, handler
}

// reloads makes the reloader, which changes the live settings of the
// parts built so far.
func (p *process) reloads() {
	live := &liveParts{log: p.log, level: p.lg.level, router: p.router, handler: p.handler, access: p.access, budget: p.buffered, budgetDef: p.derived,
		bodies: p.bodies, conns: p.conns, fast: p.conns.fastH1, hosts: p.hosts, nofile: p.nofile,
		sec: p.sec, started: p.cfg}
	p.reloader = liveconfig.New(p.cfg, liveconfig.Options{Environ: p.environ, Log: p.log, Registerer: p.reg, Check: checkTLS, Warn: p.restartWarnings, Apply: live.apply})
}

// adminMaxConns caps the admin listener's connections, as
// MAX_CLIENT_CONNS caps the data listener's: it answers /healthz and
// /readyz to anyone who reaches it, token or not (probes must), so
// without a cap one client opening connections and keeping them alive
// took descriptors without end, those of the reserve memcached's
// connections need too. Probes, a scraper and a few people need far
// fewer; a new connection over the cap closes the one idle or silent
// the longest (conncap), so that probes are still answered.
const adminMaxConns = 64

// The admin listener's timeouts: a head within adminHeaderTimeout, a
// whole request within adminReadTimeout.
const (
	adminHeaderTimeout = 5 * time.Second
	adminReadTimeout   = 30 * time.Second
)

// admin builds the admin server: probes, metrics, the status page, the
// configuration in force.
func (p *process) admin() {
	cfg, router, rl, build, buffered := p.cfg, p.router, p.reloader, p.build, p.buffered
	p.adminServer = &http.Server{
		Handler: gateway.NewAdminHandler(p.reg, gateway.Admin{
			Unready: func() string {
				if p.draining.Load() {
					return "draining: the gateway is shutting down"
				}
				return router.Unready()
			},
			Nodes:   func() any { return router.Nodes() },
			Owners:  func(key string) any { return router.Placement(key) },
			Status:  func() gateway.StatusInfo { return statusInfo(router, rl.Current()) },
			Reloads: rl.StatusRows,
			Config:  func() any { return newDebugConfig(build, rl.Current(), buffered) },
			Started: p.started,
			Build:   gateway.BuildInfo{Version: build.Version, Revision: build.Revision, GoVersion: build.GoVersion, Platform: build.Platform},
			Access:  p.access, // the data listener's: a reload changes the tokens of both
			Busy:    p.adminBusy.Inc,
			// Bound to loopback only, it answers the names that reach
			// loopback and no other (docs/security.md, "Browsers").
			Hosts:        p.hosts,
			LoopbackOnly: p.adminLoopback,
		}),
		ReadHeaderTimeout: adminHeaderTimeout,
		ReadTimeout:       adminReadTimeout,
		WriteTimeout:      60 * time.Second, // pprof profiles take 30s by default
		ConnState:         p.adminCap.State,
		IdleTimeout:       cfg.IdleTimeout,
		MaxHeaderBytes:    cfg.MaxHeaderBytes,
		ErrorLog:          newServerLog(p.log, "admin", p.handshakes, nil),
		Protocols:         http1Only(),
	}
	// One request per connection: answers a client pipelines and leaves
	// unread held its connection serving until the write timeout, one
	// after the other, and the listener's every connection with a few
	// hundred KB of requests each, keeping probes out. A probe or a
	// scrape costs a connection's setup more.
	p.adminServer.SetKeepAlivesEnabled(false)
	p.conns.admin.Serve(p.adminServer)
}

// run starts every long-lived goroutine (health checks, asynchronous
// writes, both servers, reloads, the processor fit) and serves until ctx
// is done or a server fails; then it drains and stops them in order, as
// serve says.
func (p *process) run(ctx context.Context) error {
	cfg, log, ls, router, handler, data, admin, mem := p.cfg, p.log, p.ls, p.router, p.handler, p.data, p.adminServer, p.mem
	healthCtx, stopHealth := context.WithCancel(context.WithoutCancel(ctx))
	defer stopHealth()
	asyncCtx, stopAsync := context.WithCancel(context.WithoutCancel(ctx))
	defer stopAsync()
	var wg sync.WaitGroup
	errc := make(chan error, 5)
	wg.Go(func() { errc <- router.Run(healthCtx) })
	asyncDone := make(chan struct{})
	wg.Go(func() { defer close(asyncDone); errc <- handler.Run(asyncCtx) })
	for _, ln := range ls.dataListeners() {
		wg.Go(func() { errc <- ignoreClosed(data.Serve(ln)) })
	}
	wg.Go(func() { errc <- ignoreClosed(admin.Serve(ls.admin)) })
	reloadCtx, stopReload := context.WithCancel(ctx)
	defer stopReload()
	wg.Go(func() { p.reloader.Run(reloadCtx, p.hup) })
	// The socket watch stops before the shutdown, whose close of the
	// listener removes the socket file: that is no file gone.
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	watchDone := make(chan struct{})
	if p.unixSocket != nil {
		wg.Go(func() { defer close(watchDone); p.sockWatch.Run(watchCtx) })
	} else {
		close(watchDone)
	}
	fitting := cfg.FitProcs && !goMaxProcsSet(p.environ)
	if fitting {
		fitter := procs.New(procs.Options{})
		wg.Go(func() { fitter.Run(reloadCtx) })
	}
	log.Info("memcgate started", "version", p.build.Version, "revision", p.build.Revision,
		"listen", ls.data.Addr().String(), "listen_socket", cfg.ListenSocket, "admin", ls.admin.Addr().String(),
		"inherited", ls.inherited,
		"servers", len(cfg.Servers), "distribution", cfg.Distribution, "pools", router.Pools(), "replicas", cfg.Replicas,
		"max_buffered_bytes", mem.budget, "memory_limit", mem.limit, "memory_limit_from", mem.source,
		"max_client_conns", p.maxConns, "open_file_limit", p.nofile, "procs", runtime.GOMAXPROCS(0), "fit_procs", fitting)
	warnConnCap(log, p.maxConns, p.nofile)

	var first error
	select {
	case <-ctx.Done():
	case first = <-errc: // a server failed on its own
		if first != nil {
			// In the log, where its readers look, and not only on stderr
			// at the exit, after the shutdown's lines.
			log.Error("the gateway stops: a server failed", "err", first.Error())
		}
	}
	p.draining.Store(true)
	stopWatch()
	<-watchDone
	// Answers carry Connection: close from now on, so load balancers and
	// clients move their keepalive connections elsewhere during the drain
	// instead of racing the final close.
	data.SetKeepAlivesEnabled(false)
	switch {
	case first != nil || cfg.DrainDelay <= 0:
	case ls.dataInherited():
		// The listening sockets stay open in systemd, which queues new
		// connections until the next process accepts them: a balancer
		// that keeps sending loses nothing, so there is no one to wait
		// for (docs/decisions/0063).
		log.Info("draining without the delay: systemd keeps the listening sockets", "delay_skipped", cfg.DrainDelay.String())
	default:
		log.Info("draining", "delay", cfg.DrainDelay.String())
		time.Sleep(cfg.DrainDelay)
	}
	// The watch stopped as the drain began: the path may have been given
	// to another socket since (the next gateway, started while this one
	// drains), which the listener's close must not remove.
	p.sockWatch.keepOthers()
	shutCtx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	if err := data.Shutdown(shutCtx); err != nil {
		log.Warn("data server shutdown", "err", err.Error())
		data.Close()
	}
	// Apply the asynchronous writes queued, with health checks still
	// running so failover stays right. A request still running after
	// Close (the timeout passed) may be queueing one: Run applies it too,
	// and refuses later ones with 503.
	stopAsync()
	<-asyncDone
	if err := admin.Shutdown(shutCtx); err != nil {
		admin.Close()
	}
	stopHealth()
	stopReload()
	wg.Wait()
	close(errc)
	for err := range errc {
		if first == nil {
			first = err
		}
	}
	log.Info("memcgate stopped")
	return first
}

// listeners are what serve serves: the data API on TCP and, if
// configured, on a Unix socket (else nil), and the admin listener.
type listeners struct {
	data, socket, admin net.Listener
	// inherited names those systemd passed (fdData, fdSocket, fdAdmin):
	// its copy keeps them listening after this process closes them.
	inherited []string
}

// dataInherited reports whether every data listener is a socket systemd
// passed: once this process stops accepting, new connections wait in
// their queue for the next process, and none is refused.
func (ls listeners) dataInherited() bool {
	return slices.Contains(ls.inherited, fdData) && (ls.socket == nil || slices.Contains(ls.inherited, fdSocket))
}

// dataListeners are the listeners of the data API.
func (ls listeners) dataListeners() []net.Listener {
	if ls.socket == nil {
		return []net.Listener{ls.data}
	}
	return []net.Listener{ls.data, ls.socket}
}

func (ls listeners) close() {
	for _, ln := range []net.Listener{ls.data, ls.socket, ls.admin} {
		if ln != nil {
			ln.Close()
		}
	}
}

// loopbackOnly reports whether a listener at addr is reached from this
// host only: a TCP address on a loopback IP (not the unspecified one).
func loopbackOnly(addr net.Addr) bool {
	a, ok := addr.(*net.TCPAddr)
	return ok && a.IP.IsLoopback()
}

// httpServer is what serve needs of the data server: *http.Server, or
// *h1.Server in front of one.
type httpServer interface {
	Serve(net.Listener) error
	Shutdown(context.Context) error
	Close() error
	SetKeepAlivesEnabled(bool)
}

// dataServer puts the h1 fast path in front of std unless it is turned off
// or the listener speaks TLS (h1 has no TLS; std has).
// It also returns the fast path, nil without it.
func dataServer(cfg config.Config, sec *security, std *http.Server, h *gateway.Handler, buffered *budget.Budget, bodies *bufpool.Pool, maxConns int) (httpServer, *h1.Server) {
	if !cfg.FastPath || sec.dataTLS != nil {
		return std, nil
	}
	fast := &h1.Server{
		Handler:           h, // it takes turns itself, when a client pipelines
		Detached:          h.ServeDetached,
		BodyLimit:         h.BodyLimit,
		Budget:            buffered,
		BudgetWait:        cfg.RequestTimeout, // a body waits for room as a request waits for memcached
		Buffers:           bodies,
		ReadHeaderTimeout: std.ReadHeaderTimeout,
		ReadTimeout:       std.ReadTimeout,
		WriteTimeout:      std.WriteTimeout,
		IdleTimeout:       std.IdleTimeout,
		MaxHeaderBytes:    std.MaxHeaderBytes,
		HeadTooLarge:      headTooLarge(cfg.MaxHeaderBytes),
		TooManyConns:      tooManyConns,
		TooManyHanded:     tooManyHanded,
		Fallback:          std,
		ErrorLog:          std.ErrorLog,
		NewContext:        h.NewContext,
		MaxConns:          maxConns,
	}
	return fast, fast
}

// headTooLarge is the body of the 431 that answers a request head over
// net/http's limit on the data listener (h1.Guard.HeadTooLarge): it names
// the variable to raise, as a 413 does, where net/http's own answer
// names nothing. net/http reads maxHeader bytes and 4096 more before it
// refuses; a request line that long is refused so too.
func headTooLarge(maxHeader int) string {
	return "request head too large: its request line and header fields are over " + strconv.Itoa(maxHeader+4096) +
		" bytes (" + config.Prefix + "MAX_HEADER_BYTES=" + strconv.Itoa(maxHeader) + ", and 4096 bytes more are read before refusing); send a shorter target or fewer header fields, or raise " + config.Prefix + "MAX_HEADER_BYTES"
}

// tooManyConns is the body of the 503 that answers a connection over
// MAX_CLIENT_CONNS on the fast path (h1.Server.TooManyConns), naming the
// cap as every other limit's answer names its setting.
const tooManyConns = "too many client connections: " + config.Prefix + "MAX_CLIENT_CONNS are open, none idle or quiet to close for room; retry shortly"

// tooManyHanded is the body of the 503 that answers a request the fast
// path would hand to net/http while net/http serves its share of
// MAX_CLIENT_CONNS (h1.Server.TooManyHanded).
const tooManyHanded = "too many connections with chunked requests or request heads over 4 KiB: a 32nd of " + config.Prefix + "MAX_CLIENT_CONNS (at least 64) are served so, none idle or slower than 1 KiB/s; retry shortly"

// http1Only is what the servers speak: HTTP/1.x alone, never HTTP/2,
// neither negotiated over TLS nor unencrypted. Every bound here is per
// connection (the connection cap, what a connection served by net/http
// holds in the memory model, the hand-overs to net/http), and HTTP/2
// multiplies a connection by its streams, 250 in net/http, each a
// handler goroutine holding what a request holds
// (docs/decisions/0038).
func http1Only() *http.Protocols {
	p := new(http.Protocols)
	p.SetHTTP1(true)
	return p
}

// takeTurns makes a request served by Go's net/http (a connection the
// fast path handed over, TLS, FAST_PATH=false) let the other goroutines
// run before it starts, as the fast path does before each request a
// client pipelined (docs/security.md, rule 1). net/http serves a
// connection's pipelined requests back to back, and Go preempts a
// goroutine only after 10 ms: without the yield, connections pipelining
// requests that net/http must parse (a 16 KB head, a Connection header
// listing tokens) each hold a processor for their turn, and a GET on
// another connection waits seconds, or gets a 504 (docs/benchmarks.md,
// Abuse: attack 9).
func takeTurns(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runtime.Gosched()
		h.ServeHTTP(w, r)
	})
}

func ignoreClosed(err error) error {
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}
