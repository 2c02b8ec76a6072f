package gateway

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/memcgate/memcgate/gateway/budget"
	"github.com/memcgate/memcgate/gateway/chunk"
	"github.com/memcgate/memcgate/upstream/op"
	"github.com/memcgate/memcgate/upstream/panicguard"
)

// Store is what the gateway needs from the memcached side.
// *route.Router (what memcgate passes) and *upstream.Cluster implement
// it. Do must not keep an item's Value after it returns: the gateway
// reuses the buffer.
type Store interface {
	// Do runs one operation on its key's node; the result's error is one
	// of package upstream's.
	Do(ctx context.Context, o op.Op) op.Result
	// GetMulti reads many keys, each once, keeping at most limit bytes of
	// values (0: no limit; the keys of values past it fail with
	// upstream.ErrOverLimit); a key in neither map is a miss. room, if
	// not nil, holds each value before it is read (op.Room, values of any
	// size); the keys of those it refuses fail with upstream.ErrNoFit.
	GetMulti(ctx context.Context, keys []string, limit int, room op.Room) (found map[string]op.Item, failed map[string]error)
	// Up reports whether an operation on key could be served now: its
	// node, or one it fails over to, is up.
	Up(key string) bool
}

// AsyncStore starts an operation and calls back instead of waiting, or
// declines having done nothing (then the gateway waits for Store.Do).
// done must not block. *route.Router and *upstream.Cluster implement it
// (DoAsync).
type AsyncStore interface {
	DoAsync(ctx context.Context, o op.Op, done func(op.Result)) bool
}

// QuietSetter sets without waiting for memcached's answer (UDP datagrams).
// *upstream.Cluster and *route.Router implement it (SetQuiet; the router
// sends datagrams only for a pool of one copy, and a replicated write
// otherwise).
type QuietSetter interface {
	// SetQuiet stores it. udp reports whether the set left as a datagram
	// memcached does not confirm: then err is nil and nobody knows whether
	// it was applied. Otherwise it went over TCP and err is its outcome.
	SetQuiet(ctx context.Context, it op.Item) (udp bool, err error)
}

// Owners tells which memcached node a key belongs to, so that the
// asynchronous queue keeps each node's writes apart: a node slow to
// answer then holds up and fills only its own part of the queue.
// *upstream.Cluster and *route.Router implement it (Owner).
type Owners interface {
	// Owner returns the index of key's home node among the store's n
	// nodes now, 0 <= i < n: the node its writes go to while it is up.
	// The nodes' health must not change it, so that a key's writes keep
	// one lane (and their order) through a failover; a new server list
	// may change it and n.
	Owner(key string) (i, n int)
}

// Route is an endpoint served beside the REST API (the HttpMemcModule
// endpoints of package memc): its requests get the gateway's request IDs,
// metrics, access log, in-flight cap and byte budget (ReadBody), and
// nothing else of it.
type Route struct {
	// Owns reports whether a request for path is the route's.
	Owns func(path string) bool
	// MaxBody is the most body it reads (a server that reads bodies ahead
	// of their handler reads that much).
	MaxBody int64
	// Handler serves the route's requests.
	Handler http.Handler
}

// Options configures the data handler. Zero values take the defaults named
// on each field.
type Options struct {
	// MaxKeyLen is the longest key a client may send; if zero, MaxKeyLen
	// (250). Set it to 250 minus the length of the store's key prefix.
	MaxKeyLen int
	// MaxValueBytes caps request bodies; larger ones get 413 and nothing is
	// stored. If zero, 1048000 (fits memcached's default 1 MiB item).
	MaxValueBytes int64
	// BigValueMaxBytes, if positive, lets a PUT store a value larger
	// than MaxValueBytes, up to this many bytes: in chunks of
	// MaxValueBytes under keys of their own and an index item under the
	// key (package chunk), written as the body arrives. Larger bodies get
	// 413. Zero: a body over MaxValueBytes gets 413. Values stored in
	// chunks are read, streamed, whatever it is.
	BigValueMaxBytes int64
	// BigValueGrace is how long the chunks of a value outlive its index
	// (after it expires, is replaced or is deleted), and so the longest
	// a read of such a value may take; set it to the server's write
	// timeout plus RequestTimeout. If zero, 60s. Unused if Chunks is set.
	BigValueGrace time.Duration
	// WriteTimeout is the server's write timeout, which runs from a
	// request's head: a PUT of a value in chunks, whose body may take
	// longer than that to arrive, gets it anew for its answer once the
	// body is read. Zero: its answer keeps the deadline the server set.
	WriteTimeout time.Duration
	// Chunks, if not nil, reads and writes the values stored in chunks,
	// shared with other endpoints (package memc); its chunk size must be
	// MaxValueBytes. Nil: the handler makes its own over the Store, from
	// MaxValueBytes, BigValueGrace and RequestTimeout.
	Chunks *chunk.Values
	// WriteOrder, if not nil, is the count of asynchronous writes pending
	// per key that keeps each synchronous write behind the ones of its key
	// accepted before it, shared with other endpoints that write beside
	// this handler (package memc, through WriteOrder.Ordered); one
	// WriteOrder serves one Handler, which registers its metric. Nil: the
	// handler makes its own.
	WriteOrder *WriteOrder
	// DefaultTTL is the expiration of writes without ?exptime=; zero means
	// never.
	DefaultTTL time.Duration
	// RequestTimeout bounds all memcached work of one request; if zero, 2s.
	RequestTimeout time.Duration
	// AccessLog writes one log line per request.
	AccessLog bool
	// AccessLogger, if not nil, writes the access log's lines instead of
	// the handler's logger, so that their destination can bound them
	// apart from the other lines (a flood of requests must not crowd
	// out the errors). Its level should be the handler logger's.
	AccessLogger *slog.Logger
	// AccessLogJSON, if not nil, is where access log lines go without
	// log/slog, as the exact bytes slog's JSONHandler would write for them
	// (cheaper, and no allocation but the request ID's: docs/benchmarks.md,
	// "The access log").
	// Lines that need JSON escaping, and all of them when the logger is
	// enabled at debug level (which adds the path), still go through the
	// logger. Set it only to the writer of a logger made with
	// slog.NewJSONHandler(w, nil), or with options that leave its
	// records' shape alone (Level). Unlike slog's handler, the gateway
	// does not serialize its writes: w must be safe for concurrent use
	// and write each call's bytes whole (cmd/memcgate's log buffer does).
	AccessLogJSON io.Writer
	// Panics stops and counts the panics of a request's code on
	// goroutines that are not its handler's (memcached's reply reader,
	// a large value's writer), which would otherwise end the process.
	// If nil, the handler makes one, registered on its registry; give
	// it the Store's (cmd/memcgate does) when both register on one
	// registry, where memcgate_panics_total can be registered once.
	Panics *panicguard.Guard
	// Routes are endpoints served beside the REST API, in order.
	Routes []Route
	// Tokens, if any are set, are required as bearer tokens: read scope
	// for GET/HEAD, write scope for everything else (401/403).
	Tokens Tokens
	// ReadOnly refuses every write with 403.
	ReadOnly bool
	// Access, if not nil, replaces Tokens and ReadOnly: rules that can
	// change while the handler runs, shared with other endpoints.
	Access *Access
	// Hosts, if not nil, refuses with 421 the requests (the Routes'
	// included) whose Host it does not allow while it has names
	// configured (MEMCGATE_ALLOWED_HOSTS); nil refuses none.
	Hosts *HostCheck
	// MaxRequests caps requests in flight; beyond it 503 with Retry-After.
	// Zero means no cap.
	MaxRequests int
	// BatchMaxOps caps the operations of a batch or keys of a multi-get;
	// if zero, 1000.
	BatchMaxOps int
	// BatchMaxBytes caps a batch body; if zero, 16 MiB.
	BatchMaxBytes int64
	// AsyncQueue caps writes accepted with Prefer: respond-async and not
	// yet applied; if zero, 10000.
	AsyncQueue int
	// AsyncWorkers is the number of goroutines applying them, each one
	// write at a time; if zero, 512. A write waits for its node's
	// answer. With Owners they are shared out among the nodes, each
	// node's writes applied by its own (at least one each), so that a
	// node answering slowly holds only its own workers. They are the
	// most that run: a worker runs while its share of the writes has any,
	// and ends 10s after its last.
	AsyncWorkers int
	// Codec is how values are stored; if empty, CodecRaw.
	Codec ValueCodec
	// PHP configures CodecPHP's writes.
	PHP PHPOptions
	// PeclMemcache configures CodecPeclMemcache's writes.
	PeclMemcache PeclMemcacheOptions
	// Budget bounds the bytes held for clients beyond 4 KiB per request:
	// request bodies as they are read, values read for responses until
	// they are written, multi-get and batch results, the asynchronous
	// queue. What it refuses is answered 503 with Retry-After (507 for
	// one key of a multi-get or batch). Nil: no bound.
	Budget *budget.Budget
	// BatchMaxResponseBytes caps the body of a multi-get's or batch's
	// answer: values past it answer 507 for their keys (read them one
	// by one). If zero, 16 MiB.
	BatchMaxResponseBytes int64
	// AsyncQueueBytes caps the value bytes of writes accepted with
	// Prefer: respond-async and not yet applied; if zero, 16 MiB.
	AsyncQueueBytes int64
	// Async, if not nil, lets GET, HEAD and plain PUT of /{key} be
	// answered by memcached's reply, with no goroutine waiting, on a
	// server whose ResponseWriter can be detached (detached.go). Nil:
	// every request waits on the goroutine that serves it.
	Async AsyncStore
	// Owners, if not nil, places asynchronous writes by their key's
	// node: each node's writes wait in a lane of their own, applied by
	// workers of their own (AsyncWorkers shared out among the nodes) and
	// holding at most a share of the queue, so that a slow node cannot
	// delay or refuse writes for the others. Nil: one lane for all.
	Owners Owners
	// Quiet, if not nil, applies asynchronous sets without waiting for
	// memcached's answer where it can (UDP). Nil: they go through Do.
	Quiet QuietSetter
	// TakeBody, if not nil, hands over a request's body when its server
	// has read all of it ahead of the handler (h1.TakeAhead), or returns
	// nil: the body is then kept as it is, without a copy, and held
	// against Budget once. Nil: bodies are read from the request.
	TakeBody func(r *http.Request) []byte
	// ReadError, if not nil, reports how the last read of the connection
	// of the request whose context is ctx ended: nil if it had no error,
	// or if the server does not know. A body read that fails with an error
	// other than a timeout is answered 408, as a body late at the read
	// timeout, when ReadError says that read timed out: Go's net/http
	// fails a chunked body whose trailer section its read deadline cut
	// with an error that drops the timeout ("http: unexpected EOF reading
	// trailer"). It is called on the goroutine whose body read failed,
	// after it failed. Nil: a body read's error is taken as it is.
	ReadError func(ctx context.Context) error
	// Buffers, if not nil, lends the buffers request bodies are read
	// into and takes them back once their operation is done; give the
	// server that reads bodies ahead (h1.Server.Buffers) the same one.
	// Nil: bodies are allocated, and left to the garbage collector.
	Buffers Buffers
}

// Buffers lends byte buffers and takes them back (Options.Buffers).
// *bufpool.Pool implements it.
type Buffers interface {
	// Get returns a buffer of length 0 and a capacity of at least n.
	Get(n int) []byte
	// Put gives back a buffer that nothing will use any more.
	Put(b []byte)
}

// WithDefaults returns o with every zero field that has a default set to
// it, as NewHandler uses it.
func (o Options) WithDefaults() Options {
	o.withDefaults()
	return o
}

func (o *Options) withDefaults() {
	if o.MaxKeyLen <= 0 || o.MaxKeyLen > MaxKeyLen {
		o.MaxKeyLen = MaxKeyLen
	}
	if o.MaxValueBytes <= 0 {
		o.MaxValueBytes = 1048000
	}
	if o.RequestTimeout <= 0 {
		o.RequestTimeout = 2 * time.Second
	}
	if o.BatchMaxOps <= 0 {
		o.BatchMaxOps = 1000
	}
	if o.BatchMaxBytes <= 0 {
		o.BatchMaxBytes = 16 << 20
	}
	if o.AsyncQueue <= 0 {
		o.AsyncQueue = 10000
	}
	if o.AsyncWorkers <= 0 {
		o.AsyncWorkers = 512
	}
	if o.BatchMaxResponseBytes <= 0 {
		o.BatchMaxResponseBytes = 16 << 20
	}
	if o.AsyncQueueBytes <= 0 {
		o.AsyncQueueBytes = 16 << 20
	}
}

// route is the Route that owns path, or nil.
func (o *Options) route(path string) *Route {
	for i := range o.Routes {
		if rt := &o.Routes[i]; rt.Owns(path) {
			return rt
		}
	}
	return nil
}
