package upstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/memcgate/memcgate/upstream/mcpipe"
)

// ErrNoNodeUp: SetServers refused a server list that would leave no
// node up while a running one is up; the running nodes stay.
var ErrNoNodeUp = errors.New("upstream: the new server list refused")

// Protocol outcomes. They are answers from a healthy memcached: none of them
// counts against a node's health and none of them is retried elsewhere.
var (
	// ErrNotFound: the key does not exist (get miss, delete/incr/touch
	// NOT_FOUND, and replace/append/prepend NOT_STORED, which memcached
	// answers only when the key is missing, as it answers
	// append_cas/prepend_cas NS).
	ErrNotFound = errors.New("upstream: not found")
	// ErrExists: add found the key already present.
	ErrExists = errors.New("upstream: key exists")
	// ErrCASConflict: the item changed since the CAS value was read.
	ErrCASConflict = errors.New("upstream: cas conflict")
	// ErrCASNode: a write checked against a CAS value (op.Verb.Checked)
	// that names a node (op.Item.CASNode) holding no copy of the key
	// now, or, in a pool of one copy, whose node (the key's owner for a
	// value that names none) is not the one serving the key now: the
	// version read is not where a check could find it. It wraps
	// ErrCASConflict.
	ErrCASNode = fmt.Errorf("upstream: the CAS value names a node that holds no copy of the key now: %w", ErrCASConflict)
	// ErrNotNumeric: incr/decr on a value that is not a decimal number.
	ErrNotNumeric = errors.New("upstream: value is not a number")
	// ErrBadKey: a key memcached cannot carry (empty, over 250 bytes, spaces
	// or control bytes). Checked before anything is sent.
	ErrBadKey = errors.New("upstream: malformed key")
	// ErrTooLarge: memcached refused the value as too large for an item.
	ErrTooLarge = errors.New("upstream: value too large for memcached")
	// ErrNoMemory: memcached had no memory for an item that fits
	// ("SERVER_ERROR out of memory storing object": nothing it could
	// evict in the item's slab class, or evictions off). A later try may
	// find room; the value is not too large.
	ErrNoMemory = errors.New("upstream: memcached out of memory storing the item")
	// ErrServer: memcached answered with an error line we did not expect.
	ErrServer = errors.New("upstream: memcached error reply")
	// ErrOverLimit: a key of GetMulti whose value did not fit the byte
	// limit of the call; it was read and dropped.
	ErrOverLimit = errors.New("upstream: value past the multi-get's byte limit")
	// ErrNoFit: a Get whose value op.Op.Room refused (the gateway's
	// byte budget was full); it was read and dropped.
	ErrNoFit = errors.New("upstream: value does not fit the byte budget")
)

// ErrPartlyApplied is wrapped in the error of a replicated write that
// did not reach as many replicas as its write policy needs: it may have
// been applied on some of them, or is (docs/pools.md, "What an error
// means"). The failure of a replica it did not reach is wrapped too.
var ErrPartlyApplied = errors.New("upstream: the write may have been applied on some replicas")

// PartlyAppliedError is the error of a replicated write that did not
// reach as many replicas as its write policy needs (package route). It
// wraps ErrPartlyApplied and the failure of a replica it did not reach,
// and says how many replicas answered: a write no replica answered
// reached no memcached, while one that some replicas answered (stored,
// or refused: memcached replied) was applied there, whatever its error
// says of the others.
type PartlyAppliedError struct {
	Msg      string   // what the write did, for Error: "set reached 1 of 2 replicas in pool …"
	Answered int      // replicas that answered the write before it was answered
	Sent     int      // replicas (or spares standing in for them) the write went to
	Failed   []string // the nodes whose copy failed before the write was answered, host:port
	Err      error    // the failure of the first of them in the key's read order
}

func (e *PartlyAppliedError) Error() string {
	return e.Msg + ": " + ErrPartlyApplied.Error() + ": " + e.Err.Error()
}

// Unwrap returns ErrPartlyApplied and the replica's failure.
func (e *PartlyAppliedError) Unwrap() []error { return []error{ErrPartlyApplied, e.Err} }

// ErrNoNodes means no node could take the operation: every candidate is
// down, or the failover policy refuses to move the key.
var ErrNoNodes = errors.New("upstream: no live nodes")

// NodeError reports a transport failure talking to one node: the
// connection could not be made, broke, or timed out.
type NodeError struct {
	Node string // the node as configured, host:port
	Op   string // the memcached operation, e.g. "get"
	Err  error  // the underlying network error

	dial    bool // the connection was never made; nothing was sent
	timeout bool
}

func (e *NodeError) Error() string {
	return "upstream: " + e.Op + " " + e.Node + ": " + e.Err.Error()
}

// Unwrap returns the underlying error.
func (e *NodeError) Unwrap() error { return e.Err }

// Timeout reports whether the node did not answer in time.
func (e *NodeError) Timeout() bool { return e.timeout }

// Dial reports whether the failure happened before a connection existed,
// so that the node cannot have applied the operation.
func (e *NodeError) Dial() bool { return e.dial }

// classify translates a gomemcache result into this package's errors. It is
// the only place that knows gomemcache's error values and texts.
func classify(node, op string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, memcache.ErrCacheMiss):
		return ErrNotFound
	case errors.Is(err, memcache.ErrCASConflict):
		return ErrCASConflict
	case errors.Is(err, memcache.ErrNotStored):
		if op == "add" {
			return ErrExists
		}
		return ErrNotFound
	case errors.Is(err, memcache.ErrMalformedKey):
		return ErrBadKey
	case errors.Is(err, mcpipe.ErrNoFit), errors.Is(err, errClaimNoFit):
		return ErrNoFit
	case errors.Is(err, mcpipe.ErrNoMeta):
		return ErrNoMeta
	case errors.Is(err, mcpipe.ErrBehind), errors.Is(err, errReadLate):
		// The oldest caller's deadline passed while memcached was still
		// sending (a queue of large values ahead): a timeout for the
		// callers, but no sign of a stall, so not the node's failure
		// (it wraps context.DeadlineExceeded, which observe ignores).
		// errReadLate is gomemcache's pool's: the node's reply waited
		// in the socket while the gateway was late to read it.
		return &NodeError{Node: node, Op: op, Err: err, timeout: true}
	case errors.Is(err, mcpipe.ErrNoRoom):
		// The wait for room on a connection ended with the caller's
		// context, before anything was sent: the gateway's own queue,
		// like the wait for an in-flight slot, not the node's failure.
		return ctxError(node, op, err)
	}
	msg := err.Error()
	switch {
	case strings.Contains(msg, "non-numeric value"):
		return ErrNotNumeric
	case strings.Contains(msg, "object too large"):
		return fmt.Errorf("%w: %s %s", ErrTooLarge, op, node)
	case strings.Contains(msg, "out of memory storing object"):
		return fmt.Errorf("%w: %s %s", ErrNoMemory, op, node)
	case strings.HasPrefix(msg, "memcache: unexpected response line"),
		strings.HasPrefix(msg, "memcache: client error"):
		return fmt.Errorf("%w: %s %s: %s", ErrServer, op, node, strings.TrimPrefix(msg, "memcache: "))
	}
	ne := &NodeError{Node: node, Op: op, Err: err}
	var cte *memcache.ConnectTimeoutError
	var oe *net.OpError
	switch {
	case errors.As(err, &cte):
		ne.dial, ne.timeout = true, true
	case errors.As(err, &oe) && oe.Op == "dial":
		ne.dial = true
		ne.timeout = oe.Timeout()
	case errors.Is(err, os.ErrDeadlineExceeded):
		ne.timeout = true
	default:
		var nerr net.Error
		ne.timeout = errors.As(err, &nerr) && nerr.Timeout()
	}
	return ne
}

// hardFailure reports whether err says the node is not there at all (refused
// or reset connection, closed socket), which ejects it at once, as opposed
// to a timeout, which may be a slow moment and is counted.
func hardFailure(err error) bool {
	var ne *NodeError
	if !errors.As(err, &ne) || ne.timeout {
		return false
	}
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH)
}

// refusedDial reports whether err, ne's, is a connection refused while
// dialling: the node's host answered that nothing listens on its port.
func refusedDial(ne *NodeError, err error) bool {
	return ne.dial && errors.Is(err, syscall.ECONNREFUSED)
}

// ctxError wraps a context error met while waiting for a node.
func ctxError(node, op string, err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return &NodeError{Node: node, Op: op, Err: fmt.Errorf("waiting for a connection: %w", err), timeout: true, dial: true}
	}
	return err
}
