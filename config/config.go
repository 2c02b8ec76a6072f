// Package config reads the gateway's settings from environment variables
// prefixed MEMCGATE_. It knows nothing about the other packages: cmd/memcgate
// maps a Config onto their options. Defaults live in the envDefault tags and
// nowhere else; Load reports every bad variable at once.
package config

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"
)

// Prefix is prepended to every variable name.
const Prefix = "MEMCGATE_"

// Config is the whole configuration. Each field's env tag names its variable
// (without Prefix), envDefault holds its default and help says what it means;
// Usage renders all three. A variable with a default may not be set to the
// empty string (unset it to get the default) unless its empty tag says what
// the empty value means ("off"); a secret tag marks a value /debug/config
// must not show.
type Config struct {
	Servers      []Server      `env:"SERVERS" envDefault:"127.0.0.1:11211" help:"memcached nodes, host:port[:weight] separated by commas; the ring hashes these names as written"`
	ServersFile  string        `env:"SERVERS_FILE" help:"file with the memcached nodes, host:port[:weight] one per line or separated by commas (# comments); re-read when it changes (a Kubernetes ConfigMap volume works); instead of SERVERS"`
	ServersDNS   string        `env:"SERVERS_DNS" help:"discover the nodes in DNS instead of SERVERS, from one name (not a list: its records give every node): _service._proto.name for SRV records (the ring hashes the targets' names: a headless Service's stable pod names), or name:port for A/AAAA records (the ring hashes the addresses); re-resolved every DNS_INTERVAL"`
	DNSInterval  time.Duration `env:"DNS_INTERVAL" envDefault:"10s" help:"how often SERVERS_DNS is resolved again"`
	DNSServer    string        `env:"DNS_SERVER" help:"host:port of the DNS server SERVERS_DNS asks, one (not a list; default: the system's resolver)"`
	MaxNodes     int           `env:"MAX_NODES" envDefault:"256" help:"most memcached nodes over the default pool and every pool (a node in two pools counts twice), each with its own connections, health probes and about 400 metric series: a configuration with more is refused, at start (the gateway does not start) and on reload (the running nodes stay), a SERVERS_DNS answer included"`
	ConfigFile   string        `env:"CONFIG_FILE" help:"file of MEMCGATE_ variables, NAME=value one per line (# comments; systemd EnvironmentFile style), read over the environment at start and again on SIGHUP or when it changes"`
	Watch        time.Duration `env:"WATCH_INTERVAL" envDefault:"2s" help:"how often CONFIG_FILE, SERVERS_FILE, POOLS_FILE, AUTH_TOKENS_FILE and the TLS files in force are checked for changes (0: only on SIGHUP)"`
	Distribution string        `env:"DISTRIBUTION" envDefault:"ketama" help:"key placement: ketama (libmemcached/php-memcached OPT_LIBKETAMA_COMPATIBLE), modula (php-memcached default), consistent (php-memcached's session handler, DISTRIBUTION_CONSISTENT), nginx (nginx hash $key consistent), pecl-STRATEGY-HASH (pecl/memcache's Memcache class with memcache.hash_strategy standard|consistent and memcache.hash_function crc32|fnv, e.g. pecl-consistent-crc32, its default) or pecl-session-STRATEGY-HASH (pecl/memcache's session handler)"`

	ListenAddr string `env:"LISTEN_ADDR" envDefault:":8080" help:"data listener (GET/PUT/DELETE/POST /{key})"`
	AdminAddr  string `env:"ADMIN_ADDR" envDefault:"127.0.0.1:9090" help:"admin listener (/status /metrics /healthz /readyz /debug/nodes /debug/owners /debug/config /debug/pprof/); loopback only unless you change it"`
	// ListenSocket is a second data listener, on a Unix socket.
	ListenSocket     string `env:"LISTEN_SOCKET" help:"absolute path of a Unix socket that serves the data API too, for clients on this host (curl --unix-socket, CURLOPT_UNIX_SOCKET_PATH, nginx unix: upstreams); a stale socket file there is replaced at start, and the file is removed at stop (a socket systemd passes is taken instead, and left); empty: none"`
	ListenSocketMode string `env:"LISTEN_SOCKET_MODE" envDefault:"0660" help:"permissions of LISTEN_SOCKET, in octal: connecting needs write permission, so 0660 lets memcgate's user and group in, 0666 every local user (as 127.0.0.1 does)"`

	Timeout           time.Duration `env:"TIMEOUT" envDefault:"500ms" help:"how long memcached may stall: a dial, a write that moves no byte, a reply that does not come after its request's last progress (a value that keeps moving takes as long as it needs)"`
	MaxIdleConns      int           `env:"KEEPALIVE" envDefault:"64" help:"with PIPELINE_CONNS=0: idle keepalive connections kept per node"`
	MaxConns          int           `env:"MAX_CONNS_PER_NODE" envDefault:"64" help:"with PIPELINE_CONNS=0: cap on data connections, and so on in-flight operations, per node; requests beyond it wait"`
	MaxInFlight       int           `env:"MAX_IN_FLIGHT_PER_NODE" envDefault:"4096" help:"with pipelining: cap on operations in flight per node; requests beyond it wait for a slot on their own goroutine (waiting GETs go out together as multi-key gets)"`
	PipelineConns     int           `env:"PIPELINE_CONNS" envDefault:"2" help:"pipelined connections per node: operations share them and leave in combined writes, and as many again carry reads of values known to be large and the chunks of values in chunks (0: one operation per connection, gomemcache's pool of up to MAX_CONNS_PER_NODE)"`
	BatchGets         bool          `env:"BATCH_GETS" envDefault:"true" help:"when all of a node's connections are busy, send waiting GETs together as one multi-key get (identical keys fetched once); an idle node is never delayed"`
	MaxAttempts       int           `env:"MAX_ATTEMPTS" envDefault:"2" help:"distinct nodes tried per operation (reads retry on transport errors, writes only when the key's node refused the connection or is out of service)"`
	RequestTimeout    time.Duration `env:"REQUEST_TIMEOUT" envDefault:"2s" help:"deadline for all memcached work of one request; keep it >= MAX_ATTEMPTS x TIMEOUT"`
	MaxValueBytes     int64         `env:"MAX_VALUE_BYTES" envDefault:"1048000" help:"largest value accepted (413 beyond); the default fits memcached's default 1 MiB item with a 250-byte key"`
	BigValueMaxBytes  int64         `env:"BIG_VALUE_MAX_BYTES" envDefault:"0" help:"largest value a PUT may store in chunks: a body over MAX_VALUE_BYTES, up to this size, is stored as it arrives in chunks of MAX_VALUE_BYTES under keys of their own, then an index item under its key (413 beyond; 0: off, such bodies get 413); values stored in chunks are read, whole or by Range, whatever it is"`
	DefaultTTL        time.Duration `env:"DEFAULT_TTL" envDefault:"0s" help:"expiry used when a write has no ?exptime= (0 = never)"`
	KeyPrefix         string        `env:"KEY_PREFIX" help:"namespace prepended to every key stored in memcached (placement hashes the unprefixed key, like php-memcached OPT_PREFIX_KEY)"`
	HashWithPrefix    bool          `env:"HASH_WITH_PREFIX" envDefault:"false" help:"hash the prefixed key instead (libmemcached HASH_WITH_PREFIX_KEY)"`
	ShutdownTimeout   time.Duration `env:"SHUTDOWN_TIMEOUT" envDefault:"15s" help:"how long in-flight requests may take to finish after the drain delay"`
	DrainDelay        time.Duration `env:"DRAIN_DELAY" envDefault:"5s" help:"after SIGTERM, /readyz answers 503 for this long before the listener closes, so load balancers stop sending; skipped when systemd holds the data listeners, which do not close"`
	FastPath          bool          `env:"FAST_PATH" envDefault:"true" help:"serve simple HTTP/1.x requests on memcgate's own connection loop (gateway/h1) and hand anything else, and every TLS listener, to Go's net/http; false: net/http for everything"`
	DetachedResponses bool          `env:"DETACHED_RESPONSES" envDefault:"true" help:"with FAST_PATH and PIPELINE_CONNS > 0: GET, HEAD and plain PUT of /{key} are answered by memcached's reply as it is read, with no goroutine waiting per request; false: every request waits for memcached on its own goroutine"`
	MaxHeaderBytes    int           `env:"MAX_HEADER_BYTES" envDefault:"16384" help:"largest request header block"`
	SendBufferBytes   int           `env:"SEND_BUFFER_BYTES" envDefault:"0" help:"SO_SNDBUF of client connections on LISTEN_ADDR (Linux; nginx's listen sndbuf=): caps the kernel memory a client that does not read can fill with its answers, at about twice this (0: the kernel's autotuning, up to net.ipv4.tcp_wmem's maximum, 4 MiB by default)"`
	ReadHeaderTimeout time.Duration `env:"READ_HEADER_TIMEOUT" envDefault:"5s" help:"time allowed to send request headers (slowloris guard); at most READ_TIMEOUT, which counts the head too"`
	ReadTimeout       time.Duration `env:"READ_TIMEOUT" envDefault:"30s" help:"time allowed to read a whole request including its body"`
	WriteTimeout      time.Duration `env:"WRITE_TIMEOUT" envDefault:"30s" help:"time allowed to write a response"`
	IdleTimeout       time.Duration `env:"IDLE_TIMEOUT" envDefault:"120s" help:"how long an idle client keepalive connection is kept"`

	HealthInterval    time.Duration `env:"HEALTH_INTERVAL" envDefault:"1s" help:"active probe (memcached version) interval per node; rounds start at the clock's multiples of it, so gateways whose clocks agree probe together"`
	HealthTimeout     time.Duration `env:"HEALTH_TIMEOUT" envDefault:"300ms" help:"timeout of one probe"`
	Fall              int           `env:"HEALTH_FALL" envDefault:"2" help:"consecutive failed probes that mark a node down"`
	Rise              int           `env:"HEALTH_RISE" envDefault:"2" help:"consecutive passed probes that bring a node back"`
	PassiveFails      int           `env:"PASSIVE_FAILS" envDefault:"3" help:"consecutive data-path timeouts that eject a node (refused/reset connections eject at once; 0 turns passive ejection off)"`
	Failover          string        `env:"FAILOVER" envDefault:"rehash" help:"what happens to a down node's keys: rehash (next live node on the ring; no other key moves) or fail (fast 503, the ring stays)"`
	FailoverTTL       time.Duration `env:"FAILOVER_TTL" envDefault:"60s" help:"expiry cap for writes that land on a node other than the key's owner, so stale copies age out once the owner is back (0 = no cap)"`
	ReadmitFlush      bool          `env:"READMIT_FLUSH" envDefault:"false" help:"flush_all a node before re-admitting it, and a node a reload adds before it joins, so it cannot serve values older than its keys got on other nodes meanwhile"`
	MaxEjectedPercent int           `env:"MAX_EJECTED_PERCENT" envDefault:"50" help:"most nodes (percent, at least one) that passive ejection may hold down at once; probes, and connections refused when dialling, are not capped"`
	PanicPercent      int           `env:"PANIC_PERCENT" envDefault:"0" help:"while fewer than this percent of nodes are up (but some), route as if all were up (Envoy's panic threshold); 0 = off"`
	ReadyMinUpPercent int           `env:"READY_MIN_UP_PERCENT" envDefault:"0" help:"/readyz needs at least this percent of nodes up (and always at least one)"`
	FlapWindow        time.Duration `env:"FLAP_WINDOW" envDefault:"60s" help:"an ejection this soon after a re-admission counts as a flap"`
	FlapBackoff       time.Duration `env:"FLAP_BACKOFF" envDefault:"5s" help:"after a flap, probe passes count only this hold-down after the ejection and after the last failed probe, doubled per further flap"`
	FlapBackoffMax    time.Duration `env:"FLAP_BACKOFF_MAX" envDefault:"2m" help:"cap of the flap hold-down (plus up to 50% jitter, the same for a node in every gateway)"`

	Replicas        int           `env:"REPLICAS" envDefault:"1" help:"copies of each key, on distinct nodes of the default pool (SERVERS); 1 = no replication (docs/pools.md)"`
	WritePolicy     string        `env:"WRITE_POLICY" envDefault:"all" help:"with REPLICAS > 1, when a write is answered: all (every replica answered), majority (more than half of REPLICAS) or first (the first answer; the others finish in the background)"`
	ReadPolicy      string        `env:"READ_POLICY" envDefault:"first" help:"with REPLICAS > 1: first (the first live replica, the next after an error or, with MISS_FALLBACK, a miss) or hedged (also ask the second replica when the first has not answered within the hedge delay)"`
	MissFallback    bool          `env:"MISS_FALLBACK" envDefault:"true" help:"with REPLICAS > 1: a miss on one replica reads the next (a node back from an outage starts empty)"`
	HedgeMinDelay   time.Duration `env:"HEDGE_MIN_DELAY" envDefault:"1ms" help:"least delay before a hedged read asks a second replica (the delay follows the median of the nodes' read p95)"`
	HedgeMaxDelay   time.Duration `env:"HEDGE_MAX_DELAY" envDefault:"50ms" help:"most delay before a hedged read asks a second replica, and the delay while too few reads were measured"`
	HedgeMaxPercent int           `env:"HEDGE_MAX_PERCENT" envDefault:"50" help:"a pool's hedged requests at most, in percent of its reads (a read never sends more than one)"`
	// ReplicaBackgroundBytes and ReplicaBackgroundOps bound the replica
	// writes that run after their write was answered.
	ReplicaBackgroundBytes int64  `env:"REPLICA_BACKGROUND_BYTES" envDefault:"16777216" help:"value bytes of replica writes running after their write was answered (WRITE_POLICY first or majority), over all pools; a write that finds it full waits for every replica"`
	ReplicaBackgroundOps   int    `env:"REPLICA_BACKGROUND_OPS" envDefault:"1024" help:"writes whose replicas run after their answer, at most; beyond it a write waits for every replica"`
	Pools                  Pools  `env:"POOLS" help:"pools besides the default one, one per line or ';': NAME servers=HOST:PORT[:W],… prefixes=P1,… [replicas= write= read= miss_fallback= distribution= failover= warm= shadow= shadow_percent=], settings separated by spaces and a setting's entries by commas without spaces (docs/pools.md, docs/routes.md); keys starting with a pool's prefix go there, the others to SERVERS"`
	PoolsFile              string `env:"POOLS_FILE" help:"file with the pools instead of POOLS, in the same form (# comments); re-read when it changes"`
	// The warm-up and shadow policies (docs/pools.md): the default pool's
	// own, and the settings all pools share.
	WarmPool              string        `env:"WARM_POOL" help:"a pool of POOLS the default pool fills its misses from (warm-up, docs/routes.md: read there, copied back with the item's remaining TTL); empty = none"`
	ShadowPool            string        `env:"SHADOW_POOL" help:"a pool of POOLS a sample of the default pool's keys is also sent to, its answers compared and counted, never returned; empty = none"`
	ShadowPercent         float64       `env:"SHADOW_PERCENT" envDefault:"100" help:"the share of a pool's keys its shadow pool gets, in percent (0 < p <= 100), a stable sample by key hash; the default of the pools' shadow_percent"`
	WarmDefaultTTL        time.Duration `env:"WARM_DEFAULT_TTL" envDefault:"5m" help:"expiration of a warm-up copy when the warm pool cannot tell its item's remaining TTL (a memcached without the meta protocol)"`
	WarmBackgroundBytes   int64         `env:"WARM_BACKGROUND_BYTES" envDefault:"16777216" help:"value bytes of warm-up copies being written back, over all pools; a copy that does not fit is dropped and counted"`
	WarmBackgroundOps     int           `env:"WARM_BACKGROUND_OPS" envDefault:"1024" help:"warm-up copies being written back, at most; beyond it one is dropped and counted"`
	ShadowBackgroundBytes int64         `env:"SHADOW_BACKGROUND_BYTES" envDefault:"16777216" help:"value bytes held by operations mirrored to shadow pools, over all pools; one that does not fit is dropped and counted"`
	ShadowBackgroundOps   int           `env:"SHADOW_BACKGROUND_OPS" envDefault:"1024" help:"operations mirrored to shadow pools and running, at most; beyond it one is dropped and counted"`

	AuthTokens     string `env:"AUTH_TOKENS" secret:"tokens" help:"bearer tokens, scopes:token separated by commas, scopes read, write, admin joined by + (e.g. read:abc…,read+write:def…); a token is 16 or more printable ASCII bytes without spaces or semicolons; empty = no authentication"`
	AuthTokensFile string `env:"AUTH_TOKENS_FILE" help:"file with more scopes:token entries, one per line (# comments); keeps secrets out of the environment. Named, it guards even while it gives no token: every request that needs a scope gets 401 until one comes"`
	ReadOnly       bool   `env:"READ_ONLY" envDefault:"false" help:"refuse every write with 403"`
	AllowedHosts   string `env:"ALLOWED_HOSTS" help:"host names clients reach the gateway by, besides IP addresses and localhost, separated by commas (no port; .example.com: that domain and every name under it; *: any); a request with another Host gets 421, against DNS rebinding. Empty: the admin listener checks while it listens on loopback only, the data listeners never"`
	MaxClientConns int    `env:"MAX_CLIENT_CONNS" envDefault:"0" help:"client connections open at once over the data listeners (TCP and LISTEN_SOCKET); one more closes the connection due to be closed first (idle the longest, or silent nearest its header timeout), or, with neither, is answered 503 with Retry-After and closed (over TLS or with FAST_PATH=false: closed); 0: the open-file limit less a reserve for memcached, the admin listener and files of a quarter of it, at most 4096; -1: no cap"`
	MaxRequests    int    `env:"MAX_REQUESTS" envDefault:"10000" help:"requests with work for memcached in flight beyond which the gateway answers 503 with Retry-After (0 = no cap); a request with a body counts once its body is read"`
	// MaxBufferedBytes is the byte budget (gateway/budget); 0 derives it
	// from the memory limit (cmd/memcgate).
	MaxBufferedBytes int64 `env:"MAX_BUFFERED_BYTES" envDefault:"0" help:"bytes the gateway may hold for clients at once (bodies and values from 4 KiB): request bodies as they arrive, values until their response is written, multi-get and batch answers, the async queue, responses waiting for a slow reader (503 with Retry-After beyond); 0 = a quarter of GOMEMLIMIT or of the container's memory limit, else 64 MiB"`

	TLSCertFile        string `env:"TLS_CERT_FILE" help:"PEM certificate (chain) for HTTPS on the data listener; with TLS_KEY_FILE; a reload loads both again (a certificate renewed in place is served from then on), a new path needs a restart"`
	TLSKeyFile         string `env:"TLS_KEY_FILE" help:"PEM private key for the data listener"`
	AdminTLSCertFile   string `env:"ADMIN_TLS_CERT_FILE" help:"PEM certificate for HTTPS on the admin listener; with ADMIN_TLS_KEY_FILE"`
	AdminTLSKeyFile    string `env:"ADMIN_TLS_KEY_FILE" help:"PEM private key for the admin listener"`
	UpstreamTLS        bool   `env:"UPSTREAM_TLS" envDefault:"false" help:"talk TLS to memcached (memcached -Z / --enable-ssl)"`
	UpstreamTLSCAFile  string `env:"UPSTREAM_TLS_CA_FILE" help:"PEM CA bundle that signs the memcached certificates (default: the system roots)"`
	UpstreamTLSName    string `env:"UPSTREAM_TLS_SERVER_NAME" help:"name to verify in memcached certificates (default: each server's host)"`
	UpstreamTLSCert    string `env:"UPSTREAM_TLS_CERT_FILE" help:"PEM client certificate for memcached's ssl_verify_mode; with UPSTREAM_TLS_KEY_FILE"`
	UpstreamTLSKey     string `env:"UPSTREAM_TLS_KEY_FILE" help:"PEM client key"`
	UpstreamTLSNoCheck bool   `env:"UPSTREAM_TLS_INSECURE_SKIP_VERIFY" envDefault:"false" help:"do not verify memcached certificates (testing only)"`

	BatchMaxOps           int    `env:"BATCH_MAX_OPS" envDefault:"1000" help:"most operations in one POST / batch, and keys in one multi-get (400 beyond)"`
	BatchMaxBytes         int64  `env:"BATCH_MAX_BYTES" envDefault:"16777216" help:"largest POST / batch body (413 beyond)"`
	BatchMaxResponseBytes int64  `env:"BATCH_MAX_RESPONSE_BYTES" envDefault:"16777216" help:"values one multi-get or batch answer may carry; keys whose values do not fit answer 507 (read them on their own)"`
	AsyncQueue            int    `env:"ASYNC_QUEUE" envDefault:"10000" help:"writes accepted with Prefer: respond-async and not yet applied; when full, 503; the keys of one worker may take an eighth of it (half with fewer than 16 workers)"`
	AsyncQueueBytes       int64  `env:"ASYNC_QUEUE_BYTES" envDefault:"16777216" help:"value bytes of writes accepted with Prefer: respond-async and not yet applied; when full, 503"`
	AsyncWorkers          int    `env:"ASYNC_WORKERS" envDefault:"512" help:"goroutines applying asynchronous writes, each one write at a time (writes to one key stay in order), shared out among the nodes so that a node slow to answer holds only its own; the most that run: each ends 10s after its last write"`
	UDPPorts              string `env:"UDP_PORTS" help:"memcached UDP ports for fire-and-forget async sets, server=port separated by commas, server as in SERVERS (e.g. 10.0.0.1:11211=11213); off when empty"`

	// Memc configures the HttpMemcModule-compatible endpoints (config/memc.go).
	Memc Memc `envPrefix:"MEMC_"`

	ValueCodec              string  `env:"VALUE_CODEC" envDefault:"raw" help:"raw (bodies stored as sent, ?flags= are memcached flags), php (values read and written like php-memcached: types decoded, FastLZ/zlib decompressed, large strings compressed, ?flags= are its user flags) or pecl-memcache (the same for pecl/memcache's Memcache class: its types and zlib compression, ?flags= go to bits 16-31)"`
	PHPCompression          string  `env:"PHP_COMPRESSION" envDefault:"fastlz" help:"with VALUE_CODEC=php: fastlz (php-memcached's default), zlib or none, for strings from PHP_COMPRESSION_THRESHOLD bytes"`
	PHPCompressionThreshold int     `env:"PHP_COMPRESSION_THRESHOLD" envDefault:"2000" help:"with VALUE_CODEC=php: compress strings of at least this many bytes (memcached.compression_threshold)"`
	PHPCompressionFactor    float64 `env:"PHP_COMPRESSION_FACTOR" envDefault:"1.3" help:"with VALUE_CODEC=php: keep the compressed form only if it is this many times smaller (memcached.compression_factor)"`

	PeclCompressThreshold  int     `env:"PECL_COMPRESS_THRESHOLD" envDefault:"20000" help:"with VALUE_CODEC=pecl-memcache: zlib-compress strings of at least this many bytes (memcache.compress_threshold, Memcache::setCompressThreshold); 0 never compresses"`
	PeclCompressMinSavings float64 `env:"PECL_COMPRESS_MIN_SAVINGS" envDefault:"0.2" help:"with VALUE_CODEC=pecl-memcache: keep the compressed form only if it saves at least this fraction (setCompressThreshold's min_savings, 0 to 1)"`

	FitProcs bool `env:"FIT_PROCS" envDefault:"false" help:"while the gateway uses under half a CPU, run its goroutines on one processor (GOMAXPROCS=1), and on the runtime's default within 100 ms of it using most of one: for a gateway beside PHP pages that wait for it, where waking idle processors costs more than the requests; not where other programs keep the CPUs busy without waiting for the gateway (one processor gets a smaller share of them); ignored when GOMAXPROCS is set"`

	AccessLog bool   `env:"ACCESS_LOG" envDefault:"true" help:"one log line per request (never values; keys only at debug level)"`
	LogLevel  string `env:"LOG_LEVEL" envDefault:"info" help:"debug, info, warn or error"`
	LogFormat string `env:"LOG_FORMAT" envDefault:"json" help:"json or text"`
}

// Server is one memcached node as configured.
type Server struct {
	Host   string // as written: a name or an IP, never resolved here
	Port   int
	Weight int // 1 unless given
}

// Addr returns host:port, with brackets for IPv6 literals.
func (s Server) Addr() string { return net.JoinHostPort(s.Host, strconv.Itoa(s.Port)) }

// String returns the server as it would be written in MEMCGATE_SERVERS.
func (s Server) String() string {
	if s.Weight == 1 {
		return s.Addr()
	}
	return s.Addr() + ":" + strconv.Itoa(s.Weight)
}

// ParseServer parses host:port[:weight]. IPv6 literals must be bracketed:
// [::1]:11211:2.
func ParseServer(s string) (Server, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return Server{}, errors.New("empty server")
	}
	outside := s // what is not inside an IPv6 address's brackets
	if strings.HasPrefix(s, "[") {
		_, outside, _ = strings.Cut(s, "]")
	}
	if sep := separatorIn(outside, " \t;"); sep != "" {
		// Most often two servers separated by a space, which would
		// otherwise be reported as a port of "11211 10.0.0.2".
		return Server{}, fmt.Errorf("%q: has %s: one host:port[:weight] per entry, entries separated by commas", short(s), sep)
	}
	if !strings.HasPrefix(s, "[") && strings.Count(s, ":") > 2 {
		// host:port:weight has two colons at most; an IPv6 address
		// written bare would be reported as an empty host or a bad port.
		return Server{}, fmt.Errorf("%q: an IPv6 address goes in brackets, as in [::1]:11211", short(s))
	}
	var host, rest string
	bracketed := strings.HasPrefix(s, "[")
	if bracketed {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return Server{}, fmt.Errorf("%q: missing ']'", short(s))
		}
		host, rest = s[1:end], s[end+1:]
		if !strings.HasPrefix(rest, ":") {
			return Server{}, fmt.Errorf("%q: want [ipv6]:port", short(s))
		}
		rest = rest[1:]
	} else {
		var ok bool
		host, rest, ok = strings.Cut(s, ":")
		if !ok {
			return Server{}, fmt.Errorf("%q: want host:port[:weight]", short(s))
		}
	}
	if err := checkHost(host, bracketed); err != nil {
		return Server{}, fmt.Errorf("%q: %w", short(s), err)
	}
	portStr, weightStr, hasWeight := strings.Cut(rest, ":")
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 1 || port > 65535 {
		return Server{}, fmt.Errorf("%q: port %q is not a number from 1 to 65535", short(s), short(portStr))
	}
	weight := 1
	if hasWeight {
		weight, err = strconv.Atoi(weightStr)
		if err != nil || weight < 1 || weight > 1000 {
			return Server{}, fmt.Errorf("%q: weight %q is not a number from 1 to 1000", short(s), short(weightStr))
		}
	}
	return Server{Host: host, Port: port, Weight: weight}, nil
}

// checkHost accepts an IPv6 literal (with an optional zone) when bracketed,
// and otherwise an IPv4 address or a DNS name: letters, digits, '-', '_' and
// '.', so that a host written with a space or a stray bracket is refused
// here rather than at the first dial.
func checkHost(host string, bracketed bool) error {
	if host == "" {
		return errors.New("empty host")
	}
	if bracketed {
		a, err := netip.ParseAddr(host)
		if err != nil || !a.Is6() || badNameByte(a.Zone()) >= 0 {
			return fmt.Errorf("[%s] is not an IPv6 address", short(host))
		}
		return nil
	}
	if i := badNameByte(host); i >= 0 {
		return fmt.Errorf("host %q: character %q is not allowed in a host name", short(host), host[i])
	}
	return nil
}

// checkListenAddr accepts what the listeners take: [host]:port with a port
// from 1 to 65535 and a host that is empty (every interface), an IP
// address (IPv6 in brackets) or a name. Checked here, with the other
// settings, rather than when listening, where the error would not name
// the variable.
func checkListenAddr(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not host:port or :port (e.g. :8080, 127.0.0.1:9090, [::1]:9090)", addr)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		if err == nil && p == 0 {
			return fmt.Errorf("%q: port 0 would listen on a random port; give one from 1 to 65535", addr)
		}
		return fmt.Errorf("%q: port %q is not a number from 1 to 65535", addr, port)
	}
	if host == "" {
		return nil
	}
	if a, err := netip.ParseAddr(host); err == nil {
		if a.Is6() && !strings.HasPrefix(addr, "[") {
			return fmt.Errorf("%q: write an IPv6 address in brackets, [%s]:%s", addr, host, port)
		}
		return nil
	}
	if err := checkHost(host, false); err != nil {
		return fmt.Errorf("%q: %w", addr, err)
	}
	return nil
}

// maxSocketPath is the longest path a Unix socket can be bound to on
// Linux (sun_path holds 108 bytes with the terminating NUL).
const maxSocketPath = 107

// checkSocketPath accepts an empty path (no socket) or an absolute one
// that fits a Unix socket address. A relative path would depend on the
// working directory, and an abstract socket (@name) has no file
// permissions, so anyone on the host could connect.
func checkSocketPath(path string) error {
	switch {
	case path == "":
		return nil
	case !strings.HasPrefix(path, "/"):
		return fmt.Errorf("%q is not an absolute path (e.g. /run/memcgate/memcgate.sock)", path)
	case len(path) > maxSocketPath:
		return fmt.Errorf("%q is %d bytes long; a Unix socket path has at most %d", path, len(path), maxSocketPath)
	case strings.ContainsRune(path, 0):
		return fmt.Errorf("%q holds a NUL byte", path)
	}
	return nil
}

// parseFileMode parses permissions written in octal, 0 to 0777.
func parseFileMode(s string) (os.FileMode, error) {
	m, err := strconv.ParseUint(s, 8, 32)
	if err != nil || m > 0o777 {
		return 0, fmt.Errorf("%q is not an octal file mode from 0000 to 0777 (e.g. 0660)", s)
	}
	return os.FileMode(m), nil
}

// HeadTimeout is the time a request's head may take: ReadHeaderTimeout,
// but no more than ReadTimeout, which counts the whole request, head
// included. Both servers (the fast path and net/http, which would give a
// head the longer ReadHeaderTimeout) and the connection cap take it.
func (c Config) HeadTimeout() time.Duration { return min(c.ReadHeaderTimeout, c.ReadTimeout) }

// SocketMode is ListenSocketMode as a file mode; zero if it does not
// parse (Load refuses that).
func (c Config) SocketMode() os.FileMode {
	m, _ := parseFileMode(c.ListenSocketMode)
	return m
}

// sameListener reports whether two valid listen addresses would take the
// same port: equal ports, and equal hosts or one of them every interface.
func sameListener(a, b string) bool {
	ha, pa, err1 := net.SplitHostPort(a)
	hb, pb, err2 := net.SplitHostPort(b)
	if err1 != nil || err2 != nil || pa != pb {
		return false
	}
	everywhere := func(h string) bool { return h == "" || h == "0.0.0.0" || h == "::" }
	return ha == hb || everywhere(ha) || everywhere(hb)
}

// badNameByte returns the index of the first byte of s that cannot appear in
// a host name or an interface name, or -1.
func badNameByte(s string) int {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.') {
			return i
		}
	}
	return -1
}

var serverType = reflect.TypeFor[Server]()

// Load reads the configuration from environ (variable name → value; use
// env.ToMap(os.Environ()) for the process environment), applies defaults and
// validates it. The error names every bad variable: one that memcgate does
// not know (with the closest one it does), one set to the empty string
// where that would mean its default, one whose value does not parse or
// makes no sense. Variables starting MEMCGATE_TEST_ (the test suite's) and
// those Kubernetes adds for a Service named memcgate (MEMCGATE_PORT,
// MEMCGATE_SERVICE_HOST …) are not settings and are ignored.
func Load(environ map[string]string) (Config, error) {
	c, err := parse(environ)
	errs := checkEnviron(environ)
	if err != nil {
		errs = append(errs, describe(err, environ)...)
	}
	// A variable whose empty value means something (empty:"off") is
	// empty, not its default.
	for _, v := range vars(reflect.TypeFor[Config](), Prefix) {
		if val, set := environ[v.Name]; set && val == "" && v.empty != "" {
			reflect.ValueOf(&c).Elem().FieldByIndex(v.index).SetZero()
		}
	}
	// A variable that failed to parse is left at its zero value; do not
	// report it a second time as invalid.
	_, serversSet := environ[Prefix+"SERVERS"]
	for _, e := range append(c.Problems(), c.validateSources(serversSet)...) {
		if !mentionsAny(e, errs) {
			errs = append(errs, e)
		}
	}
	// Which settings the mode leaves unread, once PIPELINE_CONNS is known.
	if !mentionsAny(errors.New(Prefix+"PIPELINE_CONNS:"), errs) {
		for _, e := range c.unusedByMode() {
			if !mentionsAny(e, errs) {
				errs = append(errs, e)
			}
		}
	}
	if len(errs) > 0 {
		return c, errors.Join(errs...)
	}
	return c, nil
}

// unusedByMode returns an error for each connection setting not at its
// default that the data connections' mode does not read: KEEPALIVE and
// MAX_CONNS_PER_NODE size gomemcache's pool, used only with
// PIPELINE_CONNS=0, and MAX_IN_FLIGHT_PER_NODE caps pipelined
// connections only. Set so, such a setting looks like a cap on
// memcached's connections or operations, and caps nothing. At its
// default it passes, so that every value /debug/config shows loads.
func (c Config) unusedByMode() []error {
	defaults, _ := parse(map[string]string{})
	var errs []error
	other := "set " + Prefix + "PIPELINE_CONNS=0 for one operation per connection"
	if c.PipelineConns == 0 {
		other = "set " + Prefix + "PIPELINE_CONNS above 0 to pipeline"
	}
	unused := func(name string, v, def int, why string) {
		if v != def {
			errs = append(errs, fmt.Errorf("%s%s: is %d while %sPIPELINE_CONNS is %d: %s; unset %s%s, or %s",
				Prefix, name, v, Prefix, c.PipelineConns, why, Prefix, name, other))
		}
	}
	if c.PipelineConns > 0 {
		unused("KEEPALIVE", c.MaxIdleConns, defaults.MaxIdleConns, "it sizes the idle connections of gomemcache's pool, used only with PIPELINE_CONNS=0, and the pipelined connections ignore it")
		unused("MAX_CONNS_PER_NODE", c.MaxConns, defaults.MaxConns, "it caps the connections of gomemcache's pool, used only with PIPELINE_CONNS=0; with pipelining each node has PIPELINE_CONNS connections (and as many for large reads) and MAX_IN_FLIGHT_PER_NODE caps its operations")
	} else {
		unused("MAX_IN_FLIGHT_PER_NODE", c.MaxInFlight, defaults.MaxInFlight, "it caps the operations of pipelined connections; with PIPELINE_CONNS=0 each operation has a connection of its own and MAX_CONNS_PER_NODE caps them")
	}
	return errs
}

// parse reads environ into a Config with the defaults applied, without
// any check beyond parsing.
func parse(environ map[string]string) (Config, error) {
	var c Config
	err := env.ParseWithOptions(&c, env.Options{
		Environment: environ,
		Prefix:      Prefix,
		FuncMap: map[reflect.Type]env.ParserFunc{
			serverType: func(v string) (any, error) { return ParseServer(v) },
			poolsType:  func(v string) (any, error) { return ParsePools(v) },
		},
	})
	return c, err
}

// Validate checks values that parse but make no sense: Problems, joined.
func (c Config) Validate() error { return errors.Join(c.Problems()...) }

// Problems returns one error for each value that parses but makes no
// sense, each starting with its variable's name; none if all make sense.
func (c Config) Problems() []error {
	var errs []error
	bad := func(name, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s%s: %s", Prefix, name, fmt.Sprintf(format, args...)))
	}
	if len(c.Servers) == 0 {
		bad("SERVERS", "at least one server is required")
	}
	seen := map[string]bool{}
	for _, s := range c.Servers {
		if seen[s.Addr()] {
			bad("SERVERS", "%s is listed twice", s.Addr())
		}
		seen[s.Addr()] = true
	}
	listeners := []struct{ name, addr string }{{"LISTEN_ADDR", c.ListenAddr}, {"ADMIN_ADDR", c.AdminAddr}}
	for _, l := range listeners {
		if err := checkListenAddr(l.addr); err != nil {
			bad(l.name, "%v", err)
		}
	}
	if sameListener(c.ListenAddr, c.AdminAddr) {
		bad("ADMIN_ADDR", "%q and %sLISTEN_ADDR %q would listen on the same port; give the admin listener its own", c.AdminAddr, Prefix, c.ListenAddr)
	}
	if err := checkSocketPath(c.ListenSocket); err != nil {
		bad("LISTEN_SOCKET", "%v", err)
	}
	if _, err := parseFileMode(c.ListenSocketMode); err != nil {
		bad("LISTEN_SOCKET_MODE", "%v", err)
	}
	if !slices.Contains(Distributions(), c.Distribution) {
		bad("DISTRIBUTION", "%q is not one of %s", c.Distribution, strings.Join(Distributions(), ", "))
	}
	positive := []struct {
		name string
		v    time.Duration
	}{
		{"TIMEOUT", c.Timeout}, {"REQUEST_TIMEOUT", c.RequestTimeout},
		{"HEALTH_INTERVAL", c.HealthInterval}, {"HEALTH_TIMEOUT", c.HealthTimeout},
		{"READ_HEADER_TIMEOUT", c.ReadHeaderTimeout}, {"READ_TIMEOUT", c.ReadTimeout},
		{"WRITE_TIMEOUT", c.WriteTimeout}, {"IDLE_TIMEOUT", c.IdleTimeout},
	}
	for _, p := range positive {
		if p.v <= 0 {
			bad(p.name, "must be positive, got %s", p.v)
		}
	}
	nonNegative := []struct {
		name string
		v    time.Duration
	}{{"DEFAULT_TTL", c.DefaultTTL}, {"SHUTDOWN_TIMEOUT", c.ShutdownTimeout}, {"DRAIN_DELAY", c.DrainDelay}}
	for _, p := range nonNegative {
		if p.v < 0 {
			bad(p.name, "must not be negative, got %s", p.v)
		}
	}
	if c.DefaultTTL%time.Second != 0 {
		bad("DEFAULT_TTL", "memcached expiry has whole seconds, got %s", c.DefaultTTL)
	}
	atLeast := []struct {
		name   string
		v, min int
	}{
		{"KEEPALIVE", c.MaxIdleConns, 0}, {"MAX_CONNS_PER_NODE", c.MaxConns, 1}, {"PIPELINE_CONNS", c.PipelineConns, 0},
		{"MAX_IN_FLIGHT_PER_NODE", c.MaxInFlight, 1},
		{"MAX_ATTEMPTS", c.MaxAttempts, 1}, {"HEALTH_FALL", c.Fall, 1},
		{"HEALTH_RISE", c.Rise, 1}, {"PASSIVE_FAILS", c.PassiveFails, 0},
		{"MAX_HEADER_BYTES", c.MaxHeaderBytes, 1024}, {"SEND_BUFFER_BYTES", c.SendBufferBytes, 0},
		{"MAX_NODES", c.MaxNodes, 1},
	}
	for _, a := range atLeast {
		if a.v < a.min {
			bad(a.name, "must be at least %d, got %d", a.min, a.v)
		}
	}
	if c.MaxValueBytes < 1 || c.MaxValueBytes > 1<<30 {
		bad("MAX_VALUE_BYTES", "must be from 1 to 1073741824, got %d", c.MaxValueBytes)
	}
	if len(c.KeyPrefix) > 200 {
		bad("KEY_PREFIX", "is %d bytes; keep it well under memcached's 250-byte key limit", len(c.KeyPrefix))
	}
	for i := 0; i < len(c.KeyPrefix); i++ {
		if b := c.KeyPrefix[i]; b <= ' ' || b == 0x7f {
			bad("KEY_PREFIX", "contains byte 0x%02x at offset %d; memcached keys cannot hold spaces or control bytes", b, i)
			break
		}
	}
	switch c.Failover {
	case "rehash", "fail":
	default:
		bad("FAILOVER", "%q is not rehash or fail", c.Failover)
	}
	for _, p := range []struct {
		name   string
		v, min int
	}{{"MAX_EJECTED_PERCENT", c.MaxEjectedPercent, 1}, {"PANIC_PERCENT", c.PanicPercent, 0}, {"READY_MIN_UP_PERCENT", c.ReadyMinUpPercent, 0}} {
		if p.v < p.min || p.v > 100 {
			bad(p.name, "must be a percentage from %d to 100, got %d", p.min, p.v)
		}
	}
	errs = append(errs, c.validateReplication()...)
	if c.FailoverTTL < 0 || c.FailoverTTL%time.Second != 0 {
		bad("FAILOVER_TTL", "must be whole seconds, not negative, got %s", c.FailoverTTL)
	}
	for _, p := range []struct {
		name string
		v    time.Duration
	}{{"FLAP_WINDOW", c.FlapWindow}, {"FLAP_BACKOFF", c.FlapBackoff}, {"FLAP_BACKOFF_MAX", c.FlapBackoffMax}} {
		if p.v <= 0 {
			bad(p.name, "must be positive, got %s", p.v)
		}
	}
	if c.FlapBackoffMax < c.FlapBackoff {
		bad("FLAP_BACKOFF_MAX", "%s is shorter than FLAP_BACKOFF %s", c.FlapBackoffMax, c.FlapBackoff)
	}
	errs = append(errs, c.Memc.validate()...)
	if _, err := c.Tokens(); err != nil {
		errs = append(errs, err)
	}
	if _, err := c.UDPPortMap(); err != nil {
		errs = append(errs, err)
	}
	for _, p := range []struct {
		name string
		v    int64
	}{{"BATCH_MAX_OPS", int64(c.BatchMaxOps)}, {"BATCH_MAX_BYTES", c.BatchMaxBytes}, {"BATCH_MAX_RESPONSE_BYTES", c.BatchMaxResponseBytes},
		{"ASYNC_QUEUE", int64(c.AsyncQueue)}, {"ASYNC_QUEUE_BYTES", c.AsyncQueueBytes}, {"ASYNC_WORKERS", int64(c.AsyncWorkers)}} {
		if p.v < 1 {
			bad(p.name, "must be at least 1, got %d", p.v)
		}
	}
	if c.MaxClientConns < -1 {
		bad("MAX_CLIENT_CONNS", "must be -1 (no cap), 0 (from the open-file limit) or positive, got %d", c.MaxClientConns)
	}
	if _, err := ParseAllowedHosts(c.AllowedHosts); err != nil {
		bad("ALLOWED_HOSTS", "%v", err)
	}
	if c.MaxRequests < 0 {
		bad("MAX_REQUESTS", "must not be negative, got %d", c.MaxRequests)
	}
	if c.MaxBufferedBytes < 0 {
		bad("MAX_BUFFERED_BYTES", "must not be negative, got %d", c.MaxBufferedBytes)
	} else if c.MaxBufferedBytes > 0 && c.MaxBufferedBytes < c.MaxValueBytes {
		bad("MAX_BUFFERED_BYTES", "%d is less than MAX_VALUE_BYTES %d: no value of the largest size could be stored", c.MaxBufferedBytes, c.MaxValueBytes)
	}
	errs = append(errs, c.validateBigValues()...)
	pairs := []struct{ cert, key, certVal, keyVal string }{
		{"TLS_CERT_FILE", "TLS_KEY_FILE", c.TLSCertFile, c.TLSKeyFile},
		{"ADMIN_TLS_CERT_FILE", "ADMIN_TLS_KEY_FILE", c.AdminTLSCertFile, c.AdminTLSKeyFile},
		{"UPSTREAM_TLS_CERT_FILE", "UPSTREAM_TLS_KEY_FILE", c.UpstreamTLSCert, c.UpstreamTLSKey},
	}
	for _, p := range pairs {
		switch {
		case p.certVal != "" && p.keyVal == "":
			bad(p.key, "is not set while %s%s is: a certificate needs its key; set both or neither", Prefix, p.cert)
		case p.certVal == "" && p.keyVal != "":
			bad(p.cert, "is not set while %s%s is: a key needs its certificate; set both or neither", Prefix, p.key)
		}
	}
	if !c.UpstreamTLS {
		// Each is read only to speak TLS to memcached: set without it,
		// it looks like encrypted traffic to memcached and is plain text.
		for _, u := range []struct {
			name string
			set  bool
		}{
			{"UPSTREAM_TLS_CA_FILE", c.UpstreamTLSCAFile != ""}, {"UPSTREAM_TLS_SERVER_NAME", c.UpstreamTLSName != ""},
			{"UPSTREAM_TLS_CERT_FILE", c.UpstreamTLSCert != ""}, {"UPSTREAM_TLS_KEY_FILE", c.UpstreamTLSKey != ""},
			{"UPSTREAM_TLS_INSECURE_SKIP_VERIFY", c.UpstreamTLSNoCheck},
		} {
			if u.set {
				bad(u.name, "is set while %sUPSTREAM_TLS is false: memcached is spoken to in plain text and this setting is not used; set %sUPSTREAM_TLS=true, or unset %s%s",
					Prefix, Prefix, Prefix, u.name)
			}
		}
	}
	switch c.ValueCodec {
	case "raw", "php", "pecl-memcache":
	default:
		bad("VALUE_CODEC", "%q is not raw, php or pecl-memcache", c.ValueCodec)
	}
	switch c.PHPCompression {
	case "fastlz", "zlib", "none":
	default:
		bad("PHP_COMPRESSION", "%q is not fastlz, zlib or none", c.PHPCompression)
	}
	if c.PHPCompressionThreshold < 1 {
		bad("PHP_COMPRESSION_THRESHOLD", "must be at least 1, got %d", c.PHPCompressionThreshold)
	}
	if !(c.PHPCompressionFactor >= 1) {
		bad("PHP_COMPRESSION_FACTOR", "must be at least 1, got %v", c.PHPCompressionFactor)
	}
	if c.PeclCompressThreshold < 0 {
		bad("PECL_COMPRESS_THRESHOLD", "must not be negative, got %d", c.PeclCompressThreshold)
	}
	if !(c.PeclCompressMinSavings >= 0 && c.PeclCompressMinSavings <= 1) {
		bad("PECL_COMPRESS_MIN_SAVINGS", "must be from 0 to 1, got %v", c.PeclCompressMinSavings)
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		bad("LOG_LEVEL", "%q is not debug, info, warn or error", c.LogLevel)
	}
	switch c.LogFormat {
	case "json", "text":
	default:
		bad("LOG_FORMAT", "%q is not json or text", c.LogFormat)
	}
	return errs
}

// Warnings are combinations of settings that are valid but probably not
// what was meant, in plain words, for the log at start.
func (c Config) Warnings() []string {
	var out []string
	if need := time.Duration(c.MaxAttempts) * c.Timeout; c.MaxAttempts > 1 && c.RequestTimeout < need {
		out = append(out, fmt.Sprintf("%sREQUEST_TIMEOUT (%s) is shorter than %sMAX_ATTEMPTS × %sTIMEOUT (%d × %s = %s): "+
			"after a node times out, the request's deadline ends before the next node has had its own timeout, "+
			"so the retry MAX_ATTEMPTS promises mostly answers 504 instead. Fast failures (a refused connection) are still retried. "+
			"Raise REQUEST_TIMEOUT to at least %s, or lower TIMEOUT, unless capping the request's time is the point",
			Prefix, c.RequestTimeout, Prefix, Prefix, c.MaxAttempts, c.Timeout, need, need))
	}
	if strings.TrimSpace(c.UDPPorts) != "" && (c.Replicas > 1 || c.WarmPool != "" || c.ShadowPool != "") {
		// Nobody answers a datagram, so it cannot count toward a write
		// to several copies or pools (upstream/route's SetQuiet).
		var why string
		switch {
		case c.Replicas > 1:
			why = fmt.Sprintf("%sREPLICAS is %d", Prefix, c.Replicas)
		case c.WarmPool != "":
			why = Prefix + "WARM_POOL is set"
		default:
			why = Prefix + "SHADOW_POOL is set"
		}
		out = append(out, fmt.Sprintf("%sUDP_PORTS is set but %s: asynchronous sets go over TCP to every copy instead, "+
			"since nobody answers a datagram; no set is sent as a datagram", Prefix, why))
	}
	if c.HealthInterval > 0 && c.HealthTimeout >= c.HealthInterval {
		// A round waits for its slowest probe and skips the multiples of
		// the interval it runs past (upstream's Cluster.Run).
		every := (c.HealthTimeout/c.HealthInterval + 1) * c.HealthInterval
		out = append(out, fmt.Sprintf("%sHEALTH_TIMEOUT (%s) is not shorter than %sHEALTH_INTERVAL (%s): a probe round waits for its slowest probe, "+
			"so while a node does not answer each round runs past the next one's start, which is skipped, and every node is probed every %s, not %s: "+
			"a node that fails then takes %sHEALTH_FALL of those rounds to go down. Lower HEALTH_TIMEOUT below HEALTH_INTERVAL",
			Prefix, c.HealthTimeout, Prefix, c.HealthInterval, every, c.HealthInterval, Prefix))
	}
	if c.MaxBufferedBytes > 0 {
		if w := BudgetWarning(c.MaxBufferedBytes, c.MaxValueBytes, false); w != "" {
			out = append(out, w)
		}
	}
	return out
}

// BudgetWarning is the configuration warning for a byte budget of budget
// bytes that holds less than two values of maxValue bytes, "" for one
// that holds two: a node's reads hold at most their share of the budget
// while another node is up (upstream/readshare.go), one value at most
// half of it. derived says the budget is not MAX_BUFFERED_BYTES, which
// is unset, but what the memory limit gave it.
func BudgetWarning(budget, maxValue int64, derived bool) string {
	if budget >= 2*maxValue {
		return ""
	}
	what := fmt.Sprintf("%sMAX_BUFFERED_BYTES (%d)", Prefix, budget)
	if derived {
		what = fmt.Sprintf("%sMAX_BUFFERED_BYTES is unset, and the budget it gives (a quarter of the memory limit, at least one value: %d)", Prefix, budget)
	}
	return fmt.Sprintf("%s is less than two values of %sMAX_VALUE_BYTES (%d): "+
		"while more than one node is up, a node's reads hold at most their share of the budget, and a GET of a value "+
		"over %d bytes (half of it) is refused with 503. Raise MAX_BUFFERED_BYTES to at least %d",
		what, Prefix, maxValue, budget/2, 2*maxValue)
}

// Distributions lists the values DISTRIBUTION accepts, the names of
// upstream/hashring's distributions (config does not import it; cmd
// passes the value through).
func Distributions() []string {
	return []string{
		"ketama", "modula", "consistent", "nginx",
		"pecl-standard-crc32", "pecl-standard-fnv", "pecl-consistent-crc32", "pecl-consistent-fnv",
		"pecl-session-standard-crc32", "pecl-session-standard-fnv", "pecl-session-consistent-crc32", "pecl-session-consistent-fnv",
	}
}

// varName maps a Config field name (nested structs included) to its
// variable.
func varName(field string) string {
	for _, v := range vars(reflect.TypeFor[Config](), Prefix) {
		if v.field == field {
			return v.Name
		}
	}
	return field
}

func mentionsAny(e error, errs []error) bool {
	name, _, _ := strings.Cut(e.Error(), ":")
	for _, o := range errs {
		if strings.HasPrefix(o.Error(), name+":") {
			return true
		}
	}
	return false
}

// UDPPortMap parses UDP_PORTS into server address → UDP port; every server
// must be one of SERVERS.
func (c Config) UDPPortMap() (map[string]int, error) {
	out := map[string]int{}
	known := map[string]bool{}
	for _, s := range c.Servers {
		known[s.Addr()] = true
	}
	for entry := range strings.SplitSeq(c.UDPPorts, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		server, port, ok := strings.Cut(entry, "=")
		p, err := strconv.Atoi(port)
		switch sepErr := listEntry(entry, "server=port"); {
		case sepErr != nil:
			return nil, fmt.Errorf("%sUDP_PORTS: %w", Prefix, sepErr)
		case !ok:
			return nil, fmt.Errorf("%sUDP_PORTS: %q is not server=port", Prefix, entry)
		case err != nil || p < 1 || p > 65535:
			return nil, fmt.Errorf("%sUDP_PORTS: port %q is not a number from 1 to 65535", Prefix, port)
		case !known[server]:
			return nil, fmt.Errorf("%sUDP_PORTS: %s is not one of MEMCGATE_SERVERS", Prefix, server)
		}
		out[server] = p
	}
	return out, nil
}

// Token is one bearer token and its scopes.
type Token struct {
	Secret             string // the bearer token itself
	Read, Write, Admin bool   // its scopes
}

// ParseTokens reads scopes:token entries separated by commas or newlines;
// scopes are read, write and admin joined by '+'. Blank lines and lines
// starting with '#' are skipped. An error names the entry by its number
// (blank lines and comments not counted) and never quotes it: an entry
// written the wrong way round (token:read) or with a typo has a secret
// where the scopes should be, and errors reach logs and the status page.
func ParseTokens(s string) ([]Token, error) {
	var out []Token
	n := 0
	for entry := range strings.FieldsFuncSeq(s, func(r rune) bool { return r == ',' || r == '\n' || r == '\r' }) {
		entry = strings.TrimSpace(entry)
		if entry == "" || strings.HasPrefix(entry, "#") {
			continue
		}
		n++
		scopes, secret, ok := strings.Cut(entry, ":")
		if !ok || secret == "" {
			return nil, fmt.Errorf("entry %d is not scopes:token (e.g. read+write:s3cr3t-at-least-16); it is not shown, as it may hold a token", n)
		}
		t := Token{Secret: secret}
		for name := range strings.SplitSeq(scopes, "+") {
			switch strings.TrimSpace(name) {
			case "read":
				t.Read = true
			case "write":
				t.Write = true
			case "admin":
				t.Admin = true
			default:
				return nil, fmt.Errorf("entry %d: what comes before its first ':' is not scopes read, write, admin joined by + (scopes:token, not token:scopes); it is not shown, as it may be a token", n)
			}
		}
		if len(secret) < 16 {
			// The scopes are known words by now: naming them is safe.
			return nil, fmt.Errorf("entry %d: the %s token has %d characters; use at least 16", n, strings.TrimSpace(scopes), len(secret))
		}
		if i := tokenByte(secret); i >= 0 {
			// One byte says little of a token; it says which separator
			// was meant.
			return nil, fmt.Errorf("entry %d: the %s token has %q at byte %d; a token is printable ASCII without spaces or ';', and entries are separated by ',' or new lines", n, strings.TrimSpace(scopes), secret[i:i+1], i+1)
		}
		out = append(out, t)
	}
	return out, nil
}

// tokenByte returns the index of the first byte of secret that a token
// may not hold, or -1: a space, a tab or ';', which are most often a
// separator meant between two entries (that made them one token no
// client sends), and a byte that is not printable ASCII, which a header
// does not carry as written. Any other byte is taken: a token a password
// generator made with !, @ or : works as it is.
func tokenByte(secret string) int {
	for i := range len(secret) {
		if c := secret[i]; c <= ' ' || c >= 0x7f || c == ';' {
			return i
		}
	}
	return -1
}

// ParseAllowedHosts parses MEMCGATE_ALLOWED_HOSTS: host names separated
// by commas, each a DNS name (letters, digits, '-', '_', '.'), a name
// with a leading dot (a domain and the names under it), an IP address
// (always allowed anyway) or "*" (any). A port, a scheme or a path is an
// error: the Host is compared without its port.
func ParseAllowedHosts(s string) ([]string, error) {
	var out []string
	for entry := range strings.SplitSeq(s, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		if err := listEntry(entry, "host name"); err != nil {
			return nil, err
		}
		if entry == "*" {
			out = append(out, entry)
			continue
		}
		if _, err := netip.ParseAddr(strings.Trim(entry, "[]")); err == nil {
			out = append(out, entry)
			continue
		}
		name := strings.TrimPrefix(entry, ".")
		if strings.ContainsAny(name, ":/") {
			return nil, fmt.Errorf("%q: give a host name alone, without scheme, port or path (the Host is compared without its port)", short(entry))
		}
		if strings.HasPrefix(entry, "*.") {
			return nil, fmt.Errorf("%q: write %s for that domain and every name under it", short(entry), short(entry[1:]))
		}
		if name == "" || strings.HasPrefix(name, ".") || strings.Contains(name, "*") {
			return nil, fmt.Errorf("%q is not a host name, .domain or *", short(entry))
		}
		if i := badNameByte(name); i >= 0 {
			return nil, fmt.Errorf("%q: character %q is not allowed in a host name", short(entry), name[i])
		}
		out = append(out, entry)
	}
	return out, nil
}

// Tokens returns every configured token: AUTH_TOKENS plus the entries of
// AUTH_TOKENS_FILE.
func (c Config) Tokens() ([]Token, error) {
	toks, err := ParseTokens(c.AuthTokens)
	if err != nil {
		return nil, fmt.Errorf("%sAUTH_TOKENS: %w", Prefix, err)
	}
	if len(toks) == 0 && c.AuthTokens != "" {
		// Set, but to separators, blanks or comments alone: most likely a
		// list templated from nothing. Taken as no tokens, it would run
		// the gateway open where its operator meant to close it.
		return nil, fmt.Errorf("%sAUTH_TOKENS is set but holds no token (only separators, blanks or comments); leave it empty for no authentication, or give scopes:token entries", Prefix)
	}
	if c.AuthTokensFile == "" {
		return toks, nil
	}
	b, err := ReadFile(c.AuthTokensFile)
	if err != nil {
		return nil, fmt.Errorf("%sAUTH_TOKENS_FILE: %w", Prefix, err)
	}
	more, err := ParseTokens(string(b))
	if err != nil {
		return nil, fmt.Errorf("%sAUTH_TOKENS_FILE %s: %w", Prefix, c.AuthTokensFile, err)
	}
	return append(toks, more...), nil
}

// Var describes one configuration variable, for -help and docs/configuration.md.
type Var struct {
	Name    string // with Prefix: MEMCGATE_SERVERS
	Default string // the envDefault tag as written; "" when there is none
	Help    string // the help tag: what the variable means
}

// Vars lists every variable in declaration order.
func Vars() []Var {
	vs := vars(reflect.TypeFor[Config](), Prefix)
	out := make([]Var, len(vs))
	for i, v := range vs {
		out[i] = v.Var
	}
	return out
}

// fieldVar is a variable and the Config field it sets.
type fieldVar struct {
	Var
	field  string // the Go field's name
	prefix string // the envPrefix of its enclosing structs (MEMC_), without Prefix
	index  []int  // of the field in Config, for reflect.Value.FieldByIndex
	empty  string // its empty tag: what the empty value means ("" = nothing)
	secret string // its secret tag: how /debug/config redacts it ("" = not secret)
}

// vars walks t's fields: env tags are variables, struct fields with an
// envPrefix tag are walked with that prefix added.
func vars(t reflect.Type, prefix string) []fieldVar {
	var out []fieldVar
	for i := range t.NumField() {
		f := t.Field(i)
		if p, ok := f.Tag.Lookup("envPrefix"); ok && f.Type.Kind() == reflect.Struct {
			for _, v := range vars(f.Type, prefix+p) {
				v.index = append([]int{i}, v.index...)
				out = append(out, v)
			}
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("env"), ",")
		if name == "" {
			continue
		}
		out = append(out, fieldVar{
			Var:    Var{Name: prefix + name, Default: f.Tag.Get("envDefault"), Help: f.Tag.Get("help")},
			field:  f.Name,
			prefix: strings.TrimPrefix(prefix, Prefix),
			index:  []int{i},
			empty:  f.Tag.Get("empty"),
			secret: f.Tag.Get("secret"),
		})
	}
	return out
}

// Usage renders Vars as the text that -help prints.
func Usage() string {
	var b strings.Builder
	b.WriteString("memcgate: an HTTP gateway to a cluster of memcached servers.\n\n" +
		"Configuration comes from the environment. An unset variable takes its default;\n" +
		"a MEMCGATE_ variable memcgate does not know, or one set to the empty string\n" +
		"where that is not a value of its own, is an error. Variables:\n\n")
	for _, v := range Vars() {
		def := v.Default
		if def == "" {
			def = `""`
		}
		fmt.Fprintf(&b, "  %s (default %s)\n      %s\n", v.Name, def, v.Help)
	}
	return b.String()
}

// Limits of values stored in chunks (package gateway/chunk, which config
// does not import): the longest chunk key after KEY_PREFIX, the largest
// chunk and the most chunks of one value.
const (
	chunkKeyLen   = 60
	chunkMaxBytes = 64 << 20
	chunkMax      = 1 << 24
)

// validateBigValues checks BIG_VALUE_MAX_BYTES against the settings that
// values in chunks depend on.
func (c Config) validateBigValues() []error {
	if c.BigValueMaxBytes == 0 {
		return nil
	}
	var errs []error
	bad := func(name, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s%s: %s", Prefix, name, fmt.Sprintf(format, args...)))
	}
	switch {
	case c.BigValueMaxBytes < 0:
		bad("BIG_VALUE_MAX_BYTES", "must not be negative, got %d", c.BigValueMaxBytes)
	case c.BigValueMaxBytes <= c.MaxValueBytes:
		bad("BIG_VALUE_MAX_BYTES", "%d is not more than MAX_VALUE_BYTES %d: values up to MAX_VALUE_BYTES are stored whole; set it larger, or 0 for off", c.BigValueMaxBytes, c.MaxValueBytes)
	case c.MaxValueBytes > 0 && c.BigValueMaxBytes/c.MaxValueBytes >= chunkMax:
		bad("BIG_VALUE_MAX_BYTES", "%d would take %d or more chunks of MAX_VALUE_BYTES %d; at most %d", c.BigValueMaxBytes, chunkMax, c.MaxValueBytes, chunkMax)
	}
	if c.MaxValueBytes > chunkMaxBytes {
		bad("MAX_VALUE_BYTES", "%d is the chunk size of values in chunks (BIG_VALUE_MAX_BYTES), at most %d", c.MaxValueBytes, chunkMaxBytes)
	}
	if len(c.KeyPrefix)+chunkKeyLen > 250 {
		bad("KEY_PREFIX", "is %d bytes; with BIG_VALUE_MAX_BYTES, chunk keys of up to %d bytes follow it within memcached's 250", len(c.KeyPrefix), chunkKeyLen)
	}
	if c.MaxBufferedBytes > 0 && c.MaxBufferedBytes < 2*c.MaxValueBytes {
		bad("MAX_BUFFERED_BYTES", "%d is less than two chunks of MAX_VALUE_BYTES %d: a read of a value in chunks holds two", c.MaxBufferedBytes, c.MaxValueBytes)
	}
	return errs
}
