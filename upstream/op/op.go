// Package op describes memcached operations as values, one table row per
// verb: the text-protocol command it sends, how its reply reads, and how
// routing treats it. Every layer works on these values: the gateway
// translates HTTP requests into them and results into responses, the
// upstream cluster routes them by key, and mcpipe encodes them and parses
// their replies. Adding a verb is a row here and its encoding; a reply of
// a kind not yet known also needs its parser in mcpipe.
package op

import "strconv"

// Item is a memcached item.
type Item struct {
	Key        string // as the client named it (without a key prefix)
	Value      []byte
	Flags      uint32
	Expiration int32  // seconds; 0 = never; memcached's 30-day rule applies
	CAS        uint64 // filled by reads; required by CAS
	// CASNode names the node that gave out CAS, as each node counts CAS
	// values of its own: filled by reads with the node's tag
	// (upstream.Replica.Tag) in a pool that keeps copies of each key on
	// several nodes, and in a pool of one copy when a node other than
	// the key's owner answered (a failover); 0 when the owner of a key
	// in a pool of one copy answered. A write checked against CAS (CAS,
	// AppendCAS, PrependCAS, DeleteCAS) is checked on that node alone,
	// and with 0 in a pool of one copy on the owner alone.
	CASNode uint32
}

// Verb is one memcached operation on one key.
type Verb uint8

// The verbs.
const (
	Get        Verb = iota + 1 // the item, with its CAS (gets)
	GAT                        // get and touch: the item, with a new expiration (gats; memcached 1.5.3+)
	Set                        // store unconditionally
	Add                        // store if absent
	Replace                    // store if present
	CAS                        // store if unchanged since Item.CAS was read
	Append                     // add to the end of the value
	Prepend                    // add to the start of the value
	Incr                       // add Delta to a decimal value
	Decr                       // subtract Delta, stopping at 0
	Touch                      // set a new expiration
	Delete                     // remove
	Head                       // the item's size, flags and CAS, without its value (mg; memcached 1.6+)
	HeadTouch                  // Head, and a new expiration (mg … T; memcached 1.6+)
	AppendCAS                  // Append if the item is unchanged since Item.CAS was read (ms … MA C; memcached 1.6.10+)
	PrependCAS                 // Prepend if the item is unchanged since Item.CAS was read (ms … MP C; memcached 1.6.10+)
	DeleteCAS                  // Delete if the item is unchanged since Item.CAS was read, or, with Item.CAS 0, if it exists (md … C; memcached 1.6+)
	numVerbs

	// MaxVerb is the highest verb, for tables indexed by verb.
	MaxVerb = numVerbs - 1
)

// Reply is how a verb's reply reads.
type Reply uint8

// The kinds of reply.
const (
	Items       Reply = iota // VALUE blocks, then END
	Stored                   // STORED | NOT_STORED | EXISTS | NOT_FOUND
	Deleted                  // DELETED | NOT_FOUND
	Touched                  // TOUCHED | NOT_FOUND
	Number                   // a decimal number | NOT_FOUND
	Meta                     // HD with the flags asked for | EN (a meta get's)
	MetaStored               // HD | NS | EX | NF (a meta set's)
	MetaDeleted              // HD (OK before memcached 1.6.10) | EX | NF (a meta delete's)
)

// spec is one verb's row.
type spec struct {
	name    string // in the APIs: batch "op", metrics labels
	command string // the text-protocol command
	reply   Reply
	// write: the operation changes data. After a transport failure it is
	// tried on another node only if nothing was sent, since the first may
	// have applied it; it needs write access.
	write bool
	value bool // it sends a data block (Item.Value)
	ttl   bool // it sends Item.Expiration, which is capped when a node other than the key's owner serves it
	delta bool // it sends Delta
	// unchecked is the verb without the CAS check, for the verbs that
	// have one: what the other copies of a write get once one copy
	// passed the check (a CAS value is one node's).
	unchecked Verb
}

var specs = [numVerbs]spec{
	Get:       {name: "get", command: "gets", reply: Items},
	GAT:       {name: "gat", command: "gats", reply: Items, ttl: true},
	Set:       {name: "set", command: "set", reply: Stored, write: true, value: true, ttl: true},
	Add:       {name: "add", command: "add", reply: Stored, write: true, value: true, ttl: true},
	Replace:   {name: "replace", command: "replace", reply: Stored, write: true, value: true, ttl: true},
	CAS:       {name: "cas", command: "cas", reply: Stored, write: true, value: true, ttl: true, unchecked: Set},
	Append:    {name: "append", command: "append", reply: Stored, write: true, value: true},
	Prepend:   {name: "prepend", command: "prepend", reply: Stored, write: true, value: true},
	Incr:      {name: "incr", command: "incr", reply: Number, write: true, delta: true},
	Decr:      {name: "decr", command: "decr", reply: Number, write: true, delta: true},
	Touch:     {name: "touch", command: "touch", reply: Touched, write: true, ttl: true},
	Delete:    {name: "delete", command: "delete", reply: Deleted, write: true},
	Head:      {name: "head", command: "mg", reply: Meta},
	HeadTouch: {name: "head_touch", command: "mg", reply: Meta, write: true, ttl: true},
	// Like append and prepend they keep the item's flags and expiration;
	// memcached 1.6.10 and later compare the CAS in those modes too.
	AppendCAS:  {name: "append_cas", command: "ms", reply: MetaStored, write: true, value: true, unchecked: Append},
	PrependCAS: {name: "prepend_cas", command: "ms", reply: MetaStored, write: true, value: true, unchecked: Prepend},
	// The one compare-and-delete memcached has: md takes a CAS to
	// compare (C<cas>) where delete takes none.
	DeleteCAS: {name: "delete_cas", command: "md", reply: MetaDeleted, write: true, unchecked: Delete},
}

// Verbs lists every verb, in table order.
func Verbs() []Verb {
	vs := make([]Verb, 0, numVerbs-1)
	for v := Get; v < numVerbs; v++ {
		vs = append(vs, v)
	}
	return vs
}

// Parse returns the verb named name ("get", "set", …), or 0.
func Parse(name string) Verb {
	for v := Get; v < numVerbs; v++ {
		if specs[v].name == name {
			return v
		}
	}
	return 0
}

// Valid reports whether v is one of the verbs.
func (v Verb) Valid() bool { return v > 0 && v < numVerbs }

func (v Verb) spec() spec {
	if !v.Valid() {
		return spec{name: "invalid"}
	}
	return specs[v]
}

// String is the verb's name.
func (v Verb) String() string { return v.spec().name }

// Command is the text-protocol command the verb sends.
func (v Verb) Command() string { return v.spec().command }

// Reply is how the verb's reply reads.
func (v Verb) Reply() Reply { return v.spec().reply }

// Writes reports whether the verb changes data.
func (v Verb) Writes() bool { return v.spec().write }

// TakesValue reports whether the verb sends a value.
func (v Verb) TakesValue() bool { return v.spec().value }

// TakesTTL reports whether the verb sends an expiration.
func (v Verb) TakesTTL() bool { return v.spec().ttl }

// TakesDelta reports whether the verb sends a delta.
func (v Verb) TakesDelta() bool { return v.spec().delta }

// Checked reports whether the verb is checked against Item.CAS (CAS,
// AppendCAS, PrependCAS, DeleteCAS).
func (v Verb) Checked() bool { return v.spec().unchecked != 0 }

// Unchecked is the verb without its CAS check (Set for CAS, Append for
// AppendCAS, Prepend for PrependCAS, Delete for DeleteCAS), or v itself
// for a verb that has none.
func (v Verb) Unchecked() Verb {
	if u := v.spec().unchecked; u != 0 {
		return u
	}
	return v
}

// Op is one operation: a verb on one item.
type Op struct {
	Verb Verb
	// Item names the key and, as the verb takes them, the value, flags,
	// expiration and CAS.
	Item Item
	// Delta is what Incr and Decr add or subtract.
	Delta uint64
	// HashKey, if not empty, places the operation where an operation on
	// HashKey would go, instead of by Item.Key (the HttpMemcModule
	// endpoints store an escaped key but place it by the key before
	// escaping, as nginx does; the chunks of a large value go to their
	// index's node).
	HashKey string
	// Room, if not nil, is where a Get's or GAT's value of LentValue
	// bytes or more goes: held against the caller's byte budget while it
	// is read, refused unread when the budget cannot take it, and read
	// into a buffer the caller lends and takes back. For a caller that
	// answers with the value and would refuse it anyway when its budget
	// is full: one that holds nothing for it yet.
	Room Room
	// Queued marks an operation applied from a queue (an asynchronous
	// write accepted earlier), which holds none of the caller's request
	// slots: when its node's operations hold their share of them
	// (upstream.BusyError), it waits for a slot of the node within its
	// deadline instead of being refused, as nothing would retry it.
	Queued bool
	// Admitted marks an operation its caller already admitted against
	// its node's share: the copies of a replicated write, every replica
	// checked before any was sent (upstream.Replica.Admit), and the
	// chunks of a value whose first operation on their node passed. It
	// counts against the share like any other, but waits for a slot
	// rather than be refused, so that a write reaches all its replicas or
	// none, and a value in chunks is read or written whole.
	Admitted bool
	// Bulk marks the write or the read of a chunk of a value stored in
	// chunks: a pipelined pool sends it on the node's connections for
	// large reads, apart from its other operations, so that a small
	// request never waits behind megabytes of chunks on its connection.
	Bulk bool
	// Peek marks a read made only to decide how to write the key (whether
	// its item is the index of a value in chunks, before a delete or a
	// write over it): a pool with a warm-up source answers it from there
	// as any read, but does not copy what it finds into the cold pool,
	// where the write that follows would race the copy (a delete the
	// copy lands after would bring the value back).
	Peek bool
	// Retire marks a Touch that lets an item go (the chunks of a value
	// just replaced or deleted, set to expire after a grace period): a
	// pool with a warm-up source does not copy the item from there
	// first, as for a touch that keeps an item, but touches it where it
	// is, in either pool; copying a value's chunks into the cold pool
	// only to let them expire would cost the whole value.
	Retire bool
	// CopiesIfSame marks a CAS that writes back the item it read, with
	// an expiration in the past (chunk.Values.Drop: the index of a value
	// whose chunks are gone). A replicated pool checks it on the replica
	// Item.CASNode names, as any CAS, and writes it on each other replica
	// only where the copy there is still that item (the same flags and
	// value bytes), checked against the CAS read there, instead of
	// unchecked: a newer version written there since the read stays.
	CopiesIfSame bool
	// Client is the client the operation is for, or nil. A pool that
	// may send a large read late (gomemcache's, for a Get of a key
	// known large that waited for a connection) asks it just before
	// sending, and sends nothing for a client gone.
	Client Client
}

// Client is the client an operation is for: Gone reports, without
// waiting, whether it has closed or reset its connection, so that an
// answer nobody would read is not asked of memcached. The gateway's
// connections on its fast path are Clients (gateway.Client).
type Client interface{ Gone() bool }

// Room is a caller's say over the values its reads bring into memory.
// Pipelined pools use it, on the connection's reader goroutine, for a
// value read on its own or on a gets line shared with other callers (a Get
// with a Room is never batched with others when every slot of a node is
// busy: it waits for a slot); gomemcache's pool (PIPELINE_CONNS=0) reads
// every value whole into buffers of its own. A read that goes to more than
// one node (a hedged read) may use it once per node.
type Room interface {
	// Reserve holds n bytes of the caller's budget for a value about
	// to be read, or reports that they do not fit: the value is then
	// read off the connection and dropped, never kept, and the read's
	// Result.Err says so (upstream.ErrNoFit).
	Reserve(n int) bool
	// Holds is how many bytes of the caller's budget Reserve(n) holds:
	// n, or more where the caller holds a value for more than itself
	// (its place in an answer that copies it). A node's share of the
	// budget counts its reads at that (mcpipe.Share).
	Holds(n int) int
	// Fits reports whether Reserve(n) would hold n bytes now. A read
	// whose key's value was n bytes when last read, and that does not
	// fit, is refused unsent (upstream.ErrNoFit): memcached is not made
	// to send a value only for it to be dropped. A false answer is a
	// refusal, counted as Reserve counts one.
	Fits(n int) bool
	// Release gives back what Reserve held, once the reply the value
	// came in has been read and handed out (or failed): the caller then
	// holds what it keeps itself. Until then a gets line shared with
	// other callers keeps every value of it in memory, up to a hundred,
	// and the budget sees them.
	Release(n int)
	// Lend returns the buffer (capacity n or more) a value of n bytes
	// is read into, so that the caller can give it back once nothing
	// reads the value (Result.Lent). The value is then the caller's
	// alone: no other read is answered with it. A caller that may
	// abandon a read (hedging) leaves its buffer to the collector.
	Lend(n int) []byte
}

// LentValue is the size from which a read's value is held, refused or
// lent through Op.Room.
const LentValue = 16 << 10

// Result is an operation's outcome.
type Result struct {
	Item Item   // Get and GAT: the item read; Head: its flags and CAS, no value
	N    uint64 // Incr and Decr: the new value; Head: the value's size in bytes
	// Lent: Item.Value is in a buffer Op.Room lent, the caller's alone
	// to give back. A value read otherwise (below LentValue, or batched
	// with other reads and perhaps shared with them) is not.
	Lent bool
	// Err is nil on success, else what memcached answered (a miss, a
	// refusal) or why it could not be asked; the upstream package
	// documents its errors.
	Err error
}

// Encode appends o as a text-protocol request line (and data block) with
// key as the key sent, to b.
func Encode(b []byte, o *Op, key string) []byte {
	b = EncodeHead(b, o, key)
	if o.Verb.TakesValue() {
		b = append(b, o.Item.Value...)
		b = append(b, "\r\n"...)
	}
	return b
}

// EncodeHead is Encode without o's data block: for a verb that takes a
// value it appends the command line only, and the caller sends
// o.Item.Value and "\r\n" after it (so that a large value can be written
// from where it is rather than copied); for any other verb it is Encode.
func EncodeHead(b []byte, o *Op, key string) []byte {
	v := o.Verb
	b = append(b, v.Command()...)
	if v == GAT { // gats <exptime> <key>
		b = append(b, ' ')
		b = strconv.AppendInt(b, int64(o.Item.Expiration), 10)
	}
	b = append(b, ' ')
	b = append(b, key...)
	switch {
	case v == AppendCAS, v == PrependCAS: // ms <key> <datalen> M<mode> C<cas>
		b = append(b, ' ')
		b = strconv.AppendUint(b, uint64(len(o.Item.Value)), 10)
		if v == AppendCAS {
			b = append(b, " MA C"...)
		} else {
			b = append(b, " MP C"...)
		}
		b = strconv.AppendUint(b, o.Item.CAS, 10)
	case v.TakesValue():
		b = append(b, ' ')
		b = strconv.AppendUint(b, uint64(o.Item.Flags), 10)
		b = append(b, ' ')
		b = strconv.AppendInt(b, int64(o.Item.Expiration), 10)
		b = append(b, ' ')
		b = strconv.AppendUint(b, uint64(len(o.Item.Value)), 10)
		if v == CAS {
			b = append(b, ' ')
			b = strconv.AppendUint(b, o.Item.CAS, 10)
		}
	case v.TakesDelta():
		b = append(b, ' ')
		b = strconv.AppendUint(b, o.Delta, 10)
	case v == Touch:
		b = append(b, ' ')
		b = strconv.AppendInt(b, int64(o.Item.Expiration), 10)
	case v == Head: // mg <key> s f c: the size, flags and CAS
		b = append(b, " s f c"...)
	case v == HeadTouch: // and T<exptime>: a new expiration
		b = append(b, " s f c T"...)
		b = strconv.AppendInt(b, int64(o.Item.Expiration), 10)
	case v == DeleteCAS && o.Item.CAS != 0: // md <key> C<cas>; with no CAS, md <key>: deleted if it exists
		b = append(b, " C"...)
		b = strconv.AppendUint(b, o.Item.CAS, 10)
	}
	return append(b, "\r\n"...)
}
