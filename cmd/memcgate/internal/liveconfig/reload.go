// Package liveconfig reads memcgate's configuration (the environment,
// CONFIG_FILE's variables over it, the nodes from SERVERS, SERVERS_FILE
// or SERVERS_DNS) and keeps it live while the gateway runs: it reloads on
// SIGHUP, when a file it names changes and when SERVERS_DNS answers
// others, decides which settings a reload may change, refuses a bad one
// whole, and keeps the history of reloads for the status page. What a
// reload changes in the running gateway is its caller's: Options.Apply.
package liveconfig

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/config"
	"github.com/memcgate/memcgate/gateway"
	"github.com/memcgate/memcgate/upstream"
	"github.com/memcgate/memcgate/upstream/route"
)

// Live reload. The configuration is read again on SIGHUP, when one of the
// files it names changes (CONFIG_FILE, SERVERS_FILE, POOLS_FILE,
// AUTH_TOKENS_FILE, the TLS files in force), and
// the nodes also when SERVERS_DNS resolves to others. A file is taken
// once it reads the same twice (readSettled), a node gone from DNS once
// it is missing from dnsMissLimit answers (holdMissing). A configuration is
// validated whole first: a bad one changes nothing and says why. Of a good
// one, the settings in liveVars take effect at once, without dropping a
// request (new nodes and ring swapped in, nodes that stay keep their
// connections, removed ones drain); the others need a restart, which the
// reload names.

// liveVars are the variables a reload applies.
var liveVars = []string{
	"SERVERS", "SERVERS_FILE", "SERVERS_DNS", "DNS_INTERVAL", "DNS_SERVER", "MAX_NODES", "DISTRIBUTION",
	"POOLS", "POOLS_FILE", "REPLICAS", "WRITE_POLICY", "READ_POLICY", "MISS_FALLBACK",
	"WARM_POOL", "SHADOW_POOL", "SHADOW_PERCENT",
	"AUTH_TOKENS", "AUTH_TOKENS_FILE", "READ_ONLY", "ALLOWED_HOSTS",
	"LOG_LEVEL", "ACCESS_LOG", "MAX_REQUESTS", "MAX_BUFFERED_BYTES", "REQUEST_TIMEOUT", "MAX_CLIENT_CONNS",
	"CONFIG_FILE", "WATCH_INTERVAL",
}

// Reload is one reload's outcome, for the log and the status page.
type Reload struct {
	Time    time.Time        `json:"time"`
	Trigger string           `json:"trigger"` // sighup, file, dns
	Result  string           `json:"result"`  // ok, error
	Error   string           `json:"error,omitempty"`
	Changed []string         `json:"changed,omitempty"` // variables applied
	Restart []string         `json:"needs_restart,omitempty"`
	Servers *upstream.Change `json:"servers,omitempty"` // the default pool's nodes
	// Pools lists what changed in each pool, the default one included.
	Pools []route.Change `json:"pools,omitempty"`
	// Repeated counts the reloads after this one folded into it, the
	// last at Last: for a refusal, the polls (DNS, or the watch poll
	// trying a server list whose nodes did not answer again or finding
	// a file still being written) refused with the same error; for a reload that changed nothing, the
	// reloads by the same trigger that changed nothing either.
	Repeated int       `json:"repeated,omitempty"`
	Last     time.Time `json:"last,omitzero"`
	// warnings are Options.Warn's for the configuration read, logged
	// with the reload.
	warnings []string
	// noNodeUp is set when a server list was refused because none of its
	// nodes answered: such refusals repeat each other whatever the
	// probes' errors (a timeout names the probe's local port).
	noNodeUp bool
}

// maxReloads is how many reloads the history keeps.
const maxReloads = 20

// repeatLogEvery is how often a refusal that DNS polls keep repeating,
// or a reload that changes nothing again, is logged again: a DNS answer
// the gateway refuses (one over MAX_NODES, a name that stopped
// resolving) comes back every DNS_INTERVAL, SIGHUPs may come in storms,
// and a line each would crowd the log's room for warnings and errors
// (logbuf's reserve).
const repeatLogEvery = time.Minute

// Options are what a Reloader needs of the process.
type Options struct {
	// Environ is the process's environment, which every reload reads
	// again with CONFIG_FILE's variables over it.
	Environ map[string]string
	// Log takes the reloads' lines; required.
	Log *slog.Logger
	// Registerer takes the reloads' metrics; required.
	Registerer prometheus.Registerer
	// Check refuses a configuration for what the process alone can tell:
	// the TLS files the running listeners loaded must load still, as
	// Apply puts their content in force and a restart would need them.
	// It is given the configuration read with the running TLS settings,
	// whose paths a reload does not change; nil: no check.
	Check func(config.Config) error
	// Warn returns what the process alone can tell a restart with a
	// configuration read would stop at, though the reload takes it:
	// listeners systemd passed that its addresses no longer match. Each
	// is logged as a configuration warning with the reload; nil: none.
	Warn func(context.Context, config.Config) []string
	// Apply makes an Update take effect in the running gateway, the
	// content of the TLS files in force included (their paths need a
	// restart), and returns what changed in each pool (nil if
	// Update.Routes is nil). If
	// it fails, it must have changed nothing: the reload is refused and
	// the running configuration stays. ctx cuts short the wait for the
	// probes of the nodes added. Required.
	Apply func(ctx context.Context, u Update) ([]route.Change, error)
}

// Update is what a reload that passed every check applies.
type Update struct {
	// Config is the configuration read: its live settings take effect.
	Config config.Config
	// Tokens are Config's tokens, AUTH_TOKENS_FILE's included, as they
	// were checked: the file may have changed since.
	Tokens []config.Token
	// Routes is the configuration to build the pools again from (the
	// live settings of Config beside the running values of the others);
	// nil if the pools, their nodes and policies do not change.
	Routes *config.Config
	// Changed are the live variables the reload changes, with the prefix.
	Changed []string
}

// Reloader reads and applies configuration changes while the gateway
// runs. Its methods are safe for concurrent use.
type Reloader struct {
	environ   map[string]string // the process's environment
	log       *slog.Logger
	check     func(config.Config) error
	warn      func(context.Context, config.Config) []string
	applyTo   func(context.Context, Update) ([]route.Change, error)
	reloads   *prometheus.CounterVec
	lastOK    prometheus.Gauge
	lastOKAt  prometheus.Gauge   // when the configuration in force was applied
	pending   prometheus.Gauge   // settings read that need a restart to take effect
	dnsMissed prometheus.Counter // running nodes missing from SERVERS_DNS answers
	dnsHeld   prometheus.Gauge   // of them, the nodes kept

	// run serializes reloads. Only a reload writes the fields below, so
	// it reads them without mu.
	run sync.Mutex

	// mu guards the fields below. A reload takes it only where it writes them,
	// never across its DNS lookup or the probes of the nodes it adds:
	// the status page and /debug/config read them meanwhile.
	mu      sync.Mutex
	started config.Config        // what the settings a reload cannot change stay at
	cur     config.Config        // what runs now
	tokens  []config.Token       // cur's tokens, AUTH_TOKENS_FILE's included: that file's content is not in cur
	sums    map[string]fileState // watched files' contents at the last reload; Run's goroutine, which writes it, reads it without mu
	// inForce is the watched files' contents the configuration in
	// force was read from; a reload alone reads and writes it.
	inForce map[string]fileState
	// settle waits for a file being written to settle: sleepSettle.
	settle func(context.Context) bool
	// missing counts, for each running node missing from the last
	// SERVERS_DNS answer, the answers in a row it was missing from; a
	// reload alone reads and writes it.
	missing map[string]int
	// retry is set while the last reload, from a file or SIGHUP, was
	// refused because no node of a server list answered: the watch poll
	// tries it again until its nodes answer or it changes. Run's
	// goroutine alone reads and writes it.
	retry   bool
	history []Reload
	// The last refusal repeated by DNS polls: when it was last logged,
	// and how many refusals since then were not.
	repeatLogged   time.Time
	repeatUnlogged int
}

// fileState is what a reload knows of a file it reads: its content's
// hash, and whether the content ends in the middle of a line.
type fileState struct {
	sum     [sha256.Size]byte
	midLine bool
	id      [2]uint64 // fileID: the same while the file is written in place
}

// New returns a Reloader that starts from cfg, what the gateway was built
// with (Load's). Its metrics are registered on o.Registerer; it reads
// nothing until Run.
func New(cfg config.Config, o Options) *Reloader {
	r := &Reloader{environ: o.Environ, log: o.Log, check: o.Check, warn: o.Warn, applyTo: o.Apply, started: cfg, cur: cfg}
	r.reloads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "memcgate_config_reloads_total",
		Help: "Configuration reloads (SIGHUP, a changed file, a DNS change), by result: ok, error (nothing changed).",
	}, []string{"result"})
	r.reloads.WithLabelValues("ok")
	r.reloads.WithLabelValues("error")
	r.lastOK = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "memcgate_config_last_reload_successful",
		Help: "1 if the last configuration reload was applied (or none was tried), 0 if it was refused.",
	})
	r.lastOK.Set(1)
	r.lastOKAt = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "memcgate_config_last_reload_success_timestamp_seconds",
		Help: "When the last configuration reload was applied, or the gateway started if none was, in seconds since the Unix epoch: a refused reload leaves it.",
	})
	r.lastOKAt.SetToCurrentTime()
	r.pending = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "memcgate_config_restart_pending_settings",
		Help: "Settings the last applied configuration reload read with a value other than the running one, which only a restart applies (the reload's needs_restart); 0 at start.",
	})
	r.dnsMissed = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "memcgate_dns_missing_nodes_total",
		Help: "Running nodes missing from a MEMCGATE_SERVERS_DNS answer, once per answer: an answer that flaps counts at every poll.",
	})
	r.dnsHeld = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "memcgate_dns_held_nodes",
		Help: "Nodes kept though missing from the last MEMCGATE_SERVERS_DNS answer: a node is removed once missing from 3 answers in a row.",
	})
	o.Registerer.MustRegister(r.reloads, r.lastOK, r.lastOKAt, r.pending, r.dnsMissed, r.dnsHeld)
	r.sums = r.fileSums(cfg)
	r.inForce, r.settle = r.sums, sleepSettle
	r.tokens, _ = cfg.Tokens() // checked at start
	return r
}

// Current returns the configuration in force: the one the gateway started
// with, with the live settings of the last reload applied. It does not
// wait for a reload in progress: that one's settings are returned once
// they are applied.
func (r *Reloader) Current() config.Config {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cur
}

// History returns the reloads so far, the last first.
func (r *Reloader) History() []Reload {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := slices.Clone(r.history)
	slices.Reverse(out)
	return out
}

// Run reloads on every signal from hup, and polls the watched files
// (every WATCH_INTERVAL) and SERVERS_DNS (every DNS_INTERVAL), until ctx
// is done.
func (r *Reloader) Run(ctx context.Context, hup <-chan os.Signal) {
	watch, dns := time.NewTimer(0), time.NewTimer(0)
	defer watch.Stop()
	defer dns.Stop()
	arm := func() {
		r.mu.Lock()
		w, d, byDNS := r.cur.Watch, r.cur.DNSInterval, r.cur.ServersDNS != ""
		r.mu.Unlock()
		if w > 0 {
			watch.Reset(w)
		}
		if byDNS {
			dns.Reset(d)
		}
	}
	watch.Stop()
	dns.Stop()
	arm()
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			r.reload(ctx, "sighup")
		case <-watch.C:
			if r.retry || r.filesChanged() {
				r.reload(ctx, "file")
			}
		case <-dns.C:
			r.reload(ctx, "dns")
		}
		watch.Stop()
		dns.Stop()
		arm()
	}
}

// watchedFiles are the files cfg names that a reload reads, and the TLS
// files in force, which a reload loads again (tlsFiles).
func (r *Reloader) watchedFiles(cfg config.Config) []string {
	var out []string
	for _, f := range []string{r.environ[config.Prefix+"CONFIG_FILE"], cfg.ServersFile, cfg.PoolsFile, cfg.AuthTokensFile} {
		if f != "" {
			out = append(out, f)
		}
	}
	for _, tf := range tlsFiles(r.started) {
		if !slices.Contains(out, tf.path) {
			out = append(out, tf.path)
		}
	}
	return out
}

// tlsFile is a TLS file a reload loads again: its variable and path.
type tlsFile struct{ name, path string }

// tlsFiles are the TLS files of cfg, the configuration at start: a
// reload loads the same files again and puts what they hold in force
// (Options.Apply; docs/decisions/0094), while a new path takes a
// restart.
func tlsFiles(cfg config.Config) []tlsFile {
	all := []tlsFile{{"TLS_CERT_FILE", cfg.TLSCertFile}, {"TLS_KEY_FILE", cfg.TLSKeyFile},
		{"ADMIN_TLS_CERT_FILE", cfg.AdminTLSCertFile}, {"ADMIN_TLS_KEY_FILE", cfg.AdminTLSKeyFile}}
	if cfg.UpstreamTLS {
		all = append(all, tlsFile{"UPSTREAM_TLS_CA_FILE", cfg.UpstreamTLSCAFile},
			tlsFile{"UPSTREAM_TLS_CERT_FILE", cfg.UpstreamTLSCert}, tlsFile{"UPSTREAM_TLS_KEY_FILE", cfg.UpstreamTLSKey})
	}
	var out []tlsFile
	for _, f := range all {
		if f.path != "" {
			out = append(out, tlsFile{config.Prefix + f.name, f.path})
		}
	}
	return out
}

// tlsChanged names the variables of the TLS files whose content in
// files, as a reload read them, is not the one in force.
func (r *Reloader) tlsChanged(files map[string]fileState) []string {
	var out []string
	for _, f := range tlsFiles(r.started) {
		if in, ok := r.inForce[f.path]; !ok || in.sum != files[f.path].sum {
			out = append(out, f.name)
		}
	}
	return out
}

// fileSums reads the files cfg names that a reload reads.
func (r *Reloader) fileSums(cfg config.Config) map[string]fileState {
	return readStates(r.watchedFiles(cfg))
}

// readStates reads files: each one's content hashed, whether it ends
// in the middle of a line, and its fileID (taken before the read: a
// file replaced between the two differs at the next read). A file that
// cannot be read is one state per error.
func readStates(files []string) map[string]fileState {
	out := make(map[string]fileState, len(files))
	for _, f := range files {
		id := fileID(f)
		b, err := config.ReadFile(f)
		if err != nil {
			out[f] = fileState{sum: sha256.Sum256([]byte("unreadable: " + err.Error()))}
			continue
		}
		out[f] = fileState{sum: sha256.Sum256(b), midLine: len(b) > 0 && b[len(b)-1] != '\n', id: id}
	}
	return out
}

// filesChanged reports whether a watched file's content changed since the
// last reload.
func (r *Reloader) filesChanged() bool {
	return !sameContent(r.fileSums(r.Current()), r.sums)
}

// sameContent reports whether a and b hold the same files with the same
// contents: a file renamed over with the same content is the same.
func sameContent(a, b map[string]fileState) bool {
	return maps.EqualFunc(a, b, func(x, y fileState) bool { return x.sum == y.sum })
}

// settleTime is how long a file the reload reads must keep its content
// before it is applied, and settleRounds how many times a reload waits
// for it at most: a file written in place (an editor's save, cat >
// file, lines appended by a script) can be read half written, and a
// list cut short is a valid list that moves keys (docs/decisions/0047).
const (
	settleTime   = 500 * time.Millisecond
	settleRounds = 10
)

// errStillWritten refuses a reload whose files changed on every read
// for settleRounds waits (readSettled).
var errStillWritten = errors.New("it is being written")

// sleepSettle waits settleTime; it reports false if ctx ends first.
func sleepSettle(ctx context.Context) bool {
	t := time.NewTimer(settleTime)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// settled is a configuration read by readSettled.
type settled struct {
	environ map[string]string // with CONFIG_FILE's variables
	next    config.Config
	tokens  []config.Token       // next's, AUTH_TOKENS_FILE's included
	files   map[string]fileState // as read
}

// readSettled reads the configuration and its tokens once every file it
// reads has stopped changing: a file whose content is not the one in
// force is read again settleTime later, until two reads agree (and the
// configuration is read between them, so that what is applied is what
// was read twice); one that keeps changing for settleRounds is refused,
// and so is a line cut in place (cutShort). The files' states as read
// are returned with an error too, for the poll's comparison.
func (r *Reloader) readSettled(ctx context.Context) (settled, error) {
	files := r.fileSums(r.cur)
	changed := !sameContent(files, r.inForce)
	for round := 0; ; round++ {
		if changed {
			if round == settleRounds {
				return settled{files: files}, fmt.Errorf("%s changed on every read for %s: %w; the running configuration stays (write the new file beside it and rename it in place)",
					strings.Join(r.changedFiles(files), ", "), settleTime*settleRounds, errStillWritten)
			}
			if !r.settle(ctx) {
				return settled{files: files}, ctx.Err()
			}
			now := readStates(slices.Sorted(maps.Keys(files)))
			if !maps.Equal(now, files) {
				files = now
				continue
			}
		}
		if err := r.cutShort(files); err != nil {
			return settled{files: files}, err
		}
		environ, err := withConfigFile(r.environ)
		var next config.Config
		if err == nil {
			next, err = loadEnviron(ctx, environ)
		}
		var tokens []config.Token
		if err == nil {
			tokens, err = next.Tokens() // read once: the tokens applied are the ones checked
		}
		read := next
		if err != nil {
			read = r.cur // next may be partly read: the files settled are the running ones'
		}
		after := r.fileSums(read)
		if maps.Equal(after, files) {
			return settled{environ: environ, next: next, tokens: tokens, files: files}, err
		}
		// A file changed while it was read, or the configuration read
		// names other files: they settle first.
		files, changed = after, true
	}
}

// changedFiles names the files of files whose content is not the one in
// force, or all of them if none is.
func (r *Reloader) changedFiles(files map[string]fileState) []string {
	var out []string
	for _, f := range slices.Sorted(maps.Keys(files)) {
		if in, ok := r.inForce[f]; !ok || in.sum != files[f].sum {
			out = append(out, f)
		}
	}
	if len(out) == 0 {
		return slices.Sorted(maps.Keys(files))
	}
	return out
}

// cutShort refuses a file written in place (the file in force, not one
// renamed over it) that changed and ends in the middle of a line where
// its content in force ended with a newline: the cut of a write in
// progress, caught however long the writer stalls (10.0.0.3:11211 read
// as 10.0.0.3:112 is a valid node, a token cut short a valid token). A
// file that had no newline at its end is not refused, nor is one
// renamed in place: editors and templates write such files whole.
func (r *Reloader) cutShort(files map[string]fileState) error {
	for _, f := range slices.Sorted(maps.Keys(files)) {
		in, ok := r.inForce[f]
		if st := files[f]; ok && st.sum != in.sum && st.id == in.id && st.midLine && !in.midLine {
			return fmt.Errorf("%s ends in the middle of a line (no newline after its last line, where the file in force had one): it is being written or was cut; the running configuration stays (end the file with a newline)", f)
		}
	}
	return nil
}

// reload reads the configuration again and applies it, or keeps the one
// running and says why not. A DNS poll that finds nothing new is not a
// reload, unless the one before was refused: it is neither logged nor
// counted.
func (r *Reloader) reload(ctx context.Context, trigger string) {
	r.run.Lock()
	defer r.run.Unlock()
	// The files as read, once settled: one written after they were read
	// then differs from these states, and the next poll reloads again,
	// instead of the edit being taken as already applied.
	read, err := r.readSettled(ctx)
	next, files := read.next, read.files
	if err == nil {
		r.holdMissing(&next)
		err = r.keepsNodes(read.environ, next)
	}
	rl := Reload{Time: time.Now(), Trigger: trigger, Result: "ok"}
	if err == nil {
		err = r.apply(ctx, next, read.tokens, r.tlsChanged(files), &rl)
	}
	if err != nil && ctx.Err() != nil {
		// The gateway is stopping (a settle wait or a lookup cut short):
		// nothing was refused, and nothing changed.
		return
	}
	// A poll: its refusal, the same as the last one's, is folded. So is
	// the watch poll's refusal of a file still being written: a writer
	// that never stops would otherwise have a line and a row every
	// settleRounds waits.
	polled := trigger == "dns" || trigger == "file" && (r.retry || errors.Is(err, errStillWritten))
	// The files the configuration now names, as read. Read without mu,
	// as every file is: the status page and /debug/config do not wait
	// for a slow file system.
	sums := map[string]fileState{}
	for _, f := range r.watchedFiles(r.cur) {
		st, ok := files[f]
		if !ok {
			st = readStates([]string{f})[f]
		}
		sums[f] = st
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	repeat := false
	if err != nil {
		rl.Result, rl.Error, rl.noNodeUp = "error", err.Error(), errors.Is(err, upstream.ErrNoNodeUp)
		repeat = polled && r.repeated(ctx, rl)
		if !repeat {
			r.log.Error("configuration reload refused: the running configuration stays", "trigger", trigger, "err", err.Error())
			r.repeatLogged, r.repeatUnlogged = rl.Time, 0
		}
		r.lastOK.Set(0)
	} else {
		// A poll reads the files too: what it changes from them is a
		// reload like any other. One that changes nothing is one too
		// when the reload before it was refused: it ends the refusal.
		refused := len(r.history) > 0 && r.history[len(r.history)-1].Result == "error"
		if trigger == "dns" && rl.unchanged() && !refused {
			return
		}
		repeat = r.unchangedAgain(ctx, rl)
		if !repeat {
			level := slog.LevelInfo
			if len(rl.Restart) > 0 {
				level = slog.LevelWarn // some of the file is not in force
			}
			r.log.Log(ctx, level, "configuration reloaded", "trigger", trigger, "changed", rl.Changed, "needs_restart", rl.Restart)
			for _, w := range append(r.cur.Warnings(), rl.warnings...) {
				r.log.Warn("configuration warning", "warning", w)
			}
			r.repeatLogged, r.repeatUnlogged = rl.Time, 0
		}
		r.lastOK.Set(1)
		r.lastOKAt.Set(float64(rl.Time.UnixNano()) / 1e9)
		// Logged once, at this reload; the gauge keeps saying it until a
		// restart or a reload that reads the running values again.
		r.pending.Set(float64(len(rl.Restart)))
	}
	r.reloads.WithLabelValues(rl.Result).Inc()
	// A server list refused because none of its nodes answered may be
	// right a moment early (nodes started with it): a DNS poll tries it
	// again, and so does the watch poll for a file or SIGHUP.
	if trigger != "dns" {
		r.retry = errors.Is(err, upstream.ErrNoNodeUp) && r.cur.Watch > 0
	}
	r.sums = sums
	if err == nil {
		r.inForce = sums
	}
	if repeat {
		return
	}
	r.history = append(r.history, rl)
	if len(r.history) > maxReloads {
		r.history = slices.Delete(r.history, 0, len(r.history)-maxReloads)
	}
}

// repeated reports whether rl, a refusal of a poll (DNS, or the watch
// poll trying a refused server list again or finding a file still
// being written), repeats the last reload's refusal. It is then counted in that reload's history
// entry instead of one of its own, and logged only repeatLogEvery after
// the last line about it, with the number of refusals not logged. Any
// other refusal (SIGHUP, a changed file, a DNS answer refused for another
// reason) is a new one.
func (r *Reloader) repeated(ctx context.Context, rl Reload) bool {
	if len(r.history) == 0 {
		return false
	}
	last := &r.history[len(r.history)-1]
	if last.Result != "error" || last.Error != rl.Error && !(last.noNodeUp && rl.noNodeUp) {
		return false
	}
	last.Repeated++
	last.Last = rl.Time
	r.repeatUnlogged++
	if rl.Time.Sub(r.repeatLogged) >= repeatLogEvery {
		r.log.Log(ctx, slog.LevelError, "configuration reload refused: the running configuration stays", "trigger", rl.Trigger, "err", rl.Error,
			"unlogged_before", r.repeatUnlogged-1)
		r.repeatLogged, r.repeatUnlogged = rl.Time, 0
	}
	return true
}

// unchanged reports whether rl, a reload applied, changed nothing:
// no live setting, no pool's nodes or policy.
func (rl *Reload) unchanged() bool {
	return rl.Servers == nil && len(rl.Pools) == 0 && len(rl.Changed) == 0
}

// unchangedAgain reports whether rl, a reload applied, changed nothing,
// as the last reload did, by the same trigger and naming the same
// settings that need a restart: a storm of SIGHUPs would otherwise fill
// the history with such rows and push out the ones that changed
// something. It is then counted in that reload's history entry instead
// of one of its own, and logged only repeatLogEvery after the last line
// about it, with the number of reloads not logged. A reload that changes
// something always gets its own entry and line.
func (r *Reloader) unchangedAgain(ctx context.Context, rl Reload) bool {
	if len(r.history) == 0 || !rl.unchanged() {
		return false
	}
	last := &r.history[len(r.history)-1]
	if last.Result != "ok" || !last.unchanged() || last.Trigger != rl.Trigger || !slices.Equal(last.Restart, rl.Restart) {
		return false
	}
	last.Repeated++
	last.Last = rl.Time
	r.repeatUnlogged++
	if rl.Time.Sub(r.repeatLogged) >= repeatLogEvery {
		level := slog.LevelInfo
		if len(rl.Restart) > 0 {
			level = slog.LevelWarn
		}
		r.log.Log(ctx, level, "configuration reloaded", "trigger", rl.Trigger, "changed", rl.Changed, "needs_restart", rl.Restart,
			"unlogged_before", r.repeatUnlogged-1)
		r.repeatLogged, r.repeatUnlogged = rl.Time, 0
	}
	return true
}

// dnsMissLimit is how many SERVERS_DNS answers in a row a running node
// must be missing from to be removed: round-robin DNS that cuts its
// answers, or a registry that drops a record from every other answer,
// would otherwise move the node's keys away and back at every poll
// (docs/decisions/0047). A node new in an answer is added at once.
const dnsMissLimit = 3

// holdMissing adds to next's nodes, a SERVERS_DNS answer, the running
// nodes it misses that have not been missing from dnsMissLimit answers
// in a row, and counts them. It holds none if the name asked is not the
// running one's, if the answer keeps no running node (it replaces them,
// and a list of nodes that do not answer is refused as 0042 says, not
// kept up by the nodes held), or if with them the nodes would be more
// than MAX_NODES allows: the answer is then taken as it is.
func (r *Reloader) holdMissing(next *config.Config) {
	missing := map[string]int{}
	var held []config.Server
	if next.ServersDNS != "" && next.ServersDNS == r.cur.ServersDNS {
		in := map[string]bool{}
		for _, s := range next.Servers {
			in[s.Addr()] = true
		}
		keeps := slices.ContainsFunc(r.cur.Servers, func(s config.Server) bool { return in[s.Addr()] })
		for _, s := range r.cur.Servers {
			if in[s.Addr()] {
				continue
			}
			r.dnsMissed.Inc()
			if n := r.missing[s.Addr()] + 1; keeps && n < dnsMissLimit {
				missing[s.Addr()] = n
				held = append(held, s)
			}
		}
	}
	r.missing = missing
	if len(held) > 0 {
		with := *next
		with.Servers = append(slices.Clone(next.Servers), held...)
		sort.Slice(with.Servers, func(i, j int) bool { return with.Servers[i].Addr() < with.Servers[j].Addr() })
		if with.ValidateResolvedServers() != nil {
			held, r.missing = nil, nil
		} else {
			next.Servers = with.Servers
		}
	}
	r.dnsHeld.Set(float64(len(held)))
}

// keepsNodes refuses a configuration read from environ that names no
// nodes (neither SERVERS, SERVERS_FILE nor SERVERS_DNS: a line gone from
// CONFIG_FILE, the file read while it was written) where the nodes
// running are others than SERVERS' default: the default, a memcached on
// this host, would take the place of every node. A start takes the
// default; a reload does not.
func (r *Reloader) keepsNodes(environ map[string]string, next config.Config) error {
	for _, v := range []string{"SERVERS", "SERVERS_FILE", "SERVERS_DNS"} {
		if environ[config.Prefix+v] != "" {
			return nil
		}
	}
	if slices.Equal(next.Servers, r.cur.Servers) {
		return nil
	}
	return fmt.Errorf("%sSERVERS: not set, nor %sSERVERS_FILE or %sSERVERS_DNS: a reload does not put the default (%s) in place of the nodes running (%s); name the nodes, or restart to take the default",
		config.Prefix, config.Prefix, config.Prefix, serverList(next.Servers), serverList(r.cur.Servers))
}

// serverList writes servers as SERVERS does.
func serverList(servers []config.Server) string {
	s := make([]string, len(servers))
	for i, srv := range servers {
		s[i] = srv.String()
	}
	return strings.Join(s, ",")
}

// apply makes next's live settings take effect, tokens (next's, as
// readSettled read them) the tokens, and records in rl what
// changed and what needs a restart; tlsChanged names the TLS files
// whose content changed, which Options.Apply loads again. It changes
// nothing if it fails. ctx cuts short the wait for the probes of the
// nodes added (they then start down).
func (r *Reloader) apply(ctx context.Context, next config.Config, tokens []config.Token, tlsChanged []string, rl *Reload) error {
	live := func(name string) bool { return slices.Contains(liveVars, strings.TrimPrefix(name, config.Prefix)) }
	for _, v := range config.Diff(r.started, next) {
		if !live(v) {
			rl.Restart = append(rl.Restart, v)
		}
	}
	for _, v := range config.Diff(r.cur, next) {
		if live(v) {
			rl.Changed = append(rl.Changed, v)
		}
	}
	// The TLS files the running listeners loaded must load still: the
	// reload puts their content in force (Options.Apply), and a restart
	// would need them.
	if r.check != nil {
		if err := r.check(withTLSOf(next, r.started)); err != nil {
			return err
		}
	}
	if r.warn != nil && len(rl.Restart) > 0 {
		rl.warnings = r.warn(ctx, next)
	}
	// The tokens applied are the ones checked, read with the files
	// (readSettled): a token file may change between two reads.
	if len(tokens) == 0 && len(r.tokens) > 0 {
		// An emptied token file, or one read while it was written, would
		// otherwise open both listeners to every client.
		return fmt.Errorf("%sAUTH_TOKENS and %sAUTH_TOKENS_FILE give no token: a reload does not turn authentication off; give a token (a start with neither variable set runs without any)",
			config.Prefix, config.Prefix)
	}
	// What runs after the reload: next's live settings beside the running
	// values of the others. It must pass the checks a start makes.
	cur := r.started
	config.Copy(&cur, next, liveNames()...)
	if err := checkInForce(cur, next, rl.Restart); err != nil {
		return err
	}
	if !slices.Equal(tokens, r.tokens) && !slices.Contains(rl.Changed, config.Prefix+"AUTH_TOKENS") && !slices.Contains(rl.Changed, config.Prefix+"AUTH_TOKENS_FILE") {
		rl.Changed = append(rl.Changed, config.Prefix+"AUTH_TOKENS_FILE") // only the file's content changed
	}
	rl.Changed = append(rl.Changed, tlsChanged...) // the content of a TLS file in force changed: a certificate renewed
	u := Update{Config: next, Tokens: tokens, Changed: rl.Changed}
	if routingChanged(r.cur, next) {
		routes := withPoolsOf(next, r.started)
		u.Routes = &routes
	}
	changes, err := r.applyTo(ctx, u)
	if err != nil {
		return err
	}
	rl.Pools = changes
	for _, ch := range changes {
		if ch.Pool == route.DefaultPool {
			rl.Servers = ch.Servers
		}
	}
	r.mu.Lock()
	r.cur, r.tokens = cur, tokens
	r.mu.Unlock()
	return nil
}

// checkInForce runs the checks of a start on cur, the configuration a
// reload would leave in force: a setting the reload changes must fit the
// running values of those it cannot change (MAX_BUFFERED_BYTES, live,
// must hold a value of MAX_VALUE_BYTES, which is not). Only the errors
// next, the configuration read, does not have count: both hold what
// their files gave (the nodes, the pools), which the checks of a start
// have not seen yet, and next passed the checks as it was read. Nor do
// the errors under a variable in restart: the reload keeps that one's
// running value, which the next start replaces with next's.
func checkInForce(cur, next config.Config, restart []string) error {
	had := map[string]bool{}
	for _, e := range next.Problems() {
		had[e.Error()] = true
	}
	var kept []error
	for _, e := range cur.Problems() {
		name, _, _ := strings.Cut(e.Error(), ":")
		if !had[e.Error()] && !slices.Contains(restart, name) {
			kept = append(kept, e)
		}
	}
	if len(kept) == 0 {
		return nil
	}
	return fmt.Errorf("beside the running values of the settings that need a restart (%s), the configuration would not pass the checks of a start:\n%w",
		strings.Join(restart, ", "), errors.Join(kept...))
}

// routingChanged reports whether a reload from cur to next changes the
// pools: their nodes, placement, prefixes or policies.
func routingChanged(cur, next config.Config) bool {
	return !slices.Equal(next.Servers, cur.Servers) || next.Distribution != cur.Distribution ||
		!reflect.DeepEqual(next.Pools, cur.Pools) || next.Replicas != cur.Replicas || next.WritePolicy != cur.WritePolicy ||
		next.ReadPolicy != cur.ReadPolicy || next.MissFallback != cur.MissFallback ||
		next.WarmPool != cur.WarmPool || next.ShadowPool != cur.ShadowPool || next.ShadowPercent != cur.ShadowPercent
}

// withPoolsOf is cfg with the settings of started that a reload does not
// change but the pools are built from (timeouts, health, failover, key
// prefix): Reconfigure takes only each pool's nodes, ring and policy, and
// the pools inherit FAILOVER from the default one.
func withPoolsOf(cfg, started config.Config) config.Config {
	cur := started
	config.Copy(&cur, cfg, liveNames()...)
	return cur
}

// liveNames are liveVars with the prefix.
func liveNames() []string {
	out := make([]string, len(liveVars))
	for i, v := range liveVars {
		out[i] = config.Prefix + v
	}
	return out
}

// withTLSOf is cfg with the TLS settings of started, which a reload does
// not change: Options.Check loads them again only to check them.
func withTLSOf(cfg, started config.Config) config.Config {
	cfg.TLSCertFile, cfg.TLSKeyFile = started.TLSCertFile, started.TLSKeyFile
	cfg.AdminTLSCertFile, cfg.AdminTLSKeyFile = started.AdminTLSCertFile, started.AdminTLSKeyFile
	cfg.UpstreamTLS, cfg.UpstreamTLSCAFile, cfg.UpstreamTLSName = started.UpstreamTLS, started.UpstreamTLSCAFile, started.UpstreamTLSName
	cfg.UpstreamTLSCert, cfg.UpstreamTLSKey, cfg.UpstreamTLSNoCheck = started.UpstreamTLSCert, started.UpstreamTLSKey, started.UpstreamTLSNoCheck
	return cfg
}

// StatusRows is the reload history as the status page shows it, the
// last reload first.
func (r *Reloader) StatusRows() []gateway.Reload {
	hist := r.History()
	rows := make([]gateway.Reload, 0, len(hist))
	for _, h := range hist {
		row := gateway.Reload{Time: h.Time, Result: h.Result, Message: h.Error, Changed: slices.Clone(h.Changed)}
		if c := h.Servers; c != nil {
			for _, a := range c.Added {
				row.Changed = append(row.Changed, "added "+a)
			}
			for _, a := range c.Removed {
				row.Changed = append(row.Changed, "removed "+a)
			}
			if c.Reweighted {
				row.Changed = append(row.Changed, "ring reweighted")
			}
		}
		for _, p := range h.Pools {
			if p.Servers != nil && len(p.Servers.KeysBack) > 0 {
				row.Changed = append(row.Changed, fmt.Sprintf("keys back on %s (pool %s): may read stale until written again", strings.Join(p.Servers.KeysBack, ", "), p.Pool))
			}
		}
		if len(h.Restart) > 0 {
			row.Changed = append(row.Changed, "needs restart: "+strings.Join(h.Restart, ", "))
		}
		if row.Message == "" {
			row.Message = h.Trigger
		} else {
			row.Message = h.Trigger + ": " + row.Message
		}
		switch {
		case h.Repeated > 0 && h.Result == "ok":
			row.Message += fmt.Sprintf(" (changed nothing on %d more reloads, the last at %s UTC)", h.Repeated, h.Last.UTC().Format(time.TimeOnly))
		case h.Repeated > 0:
			row.Message += fmt.Sprintf(" (refused the same on %d more polls, the last at %s UTC)", h.Repeated, h.Last.UTC().Format(time.TimeOnly))
		}
		rows = append(rows, row)
	}
	return rows
}
