package upstream

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/memcgate/memcgate/upstream/op"
)

// Keys written elsewhere. While a node is down (or went out of service
// for a write's connection: movesWrite), writes of its keys land on the
// next live node of their ring order. The node itself keeps what it held before: re-admitted, it
// would serve those older values (a deleted key would come back) until
// each key is written again. So each node remembers, in a bounded set,
// the keys (as memcached sees them, prefixed) whose writes went to
// another node on its account, and the health check deletes them on the
// node before re-admitting it (Cluster.invalidateStale). Only writes
// that fail over pay for it: one lock of the skipped node's set.
// Health.ReadmitFlush, which empties the node instead, makes the set
// moot: it is dropped.
//
// Order of record and admission. A write that finds the node down
// records its key first and then looks at the node again
// (node.skipForWrite): if the node was re-admitted meanwhile, the write
// goes to it instead. A write that saw the node still down did so before
// the admission took effect, so its record came before it too. The
// health check deletes the keys recorded up to the admission
// (invalidateStale, take then delete), admits the node, and then takes
// and deletes once more what was recorded while the first deletes ran or
// before the admission took effect. That second pass runs while the node
// already serves: its keys may read stale for the moment it takes,
// usually a handful of keys for well under a millisecond; a delete that
// overtakes a new write to the node turns that write into a miss, which
// is safe. The other choice, keeping the node out until a pass finds
// nothing recorded, never ends while its keys are written.

// defaultStaleKeyBytes bounds each node's set of keys written elsewhere.
// 4 MiB holds about 60,000 keys of 30 bytes (each entry is charged its
// key plus staleKeyOverhead), the distinct keys of a one-minute outage at
// 1,000 writes a second to the node's keys; at re-admission it is about
// 4 MiB of delete commands, pipelined over the node's data connections
// in well under a second. The memory is taken only while a node is down
// or its writes fail over, and is freed at its re-admission. An outage
// that writes more keys than that overflows the set (counted and
// logged); MEMCGATE_READMIT_FLUSH is the answer there.
const defaultStaleKeyBytes = 4 << 20

// staleKeyOverhead is what one entry costs besides its key's bytes: the
// map slot (a string header, a control byte, the load factor's slack)
// and the key's allocation rounded up to its size class.
const staleKeyOverhead = 48

// staleDeleteWorkers is how many deletes are in flight at once during
// invalidation: enough to fill the pipelined connections' writes, and
// within the 64 connections gomemcache's pool may open by default.
const staleDeleteWorkers = 32

// staleKey is a key written elsewhere: as sent to memcached, and the
// key the ring placed it by when that is not the cluster's own for it
// (Cluster.hashOf): an operation with an op.Op.HashKey, such as a chunk
// of a large value, placed by its value's key. Empty: hashOf(store).
type staleKey struct {
	store, hash string
}

// staleKeys is one node's set of keys written elsewhere. It holds a
// mutex: it must not be copied.
type staleKeys struct {
	mu        sync.Mutex        // guards the fields below; never held across I/O
	keys      map[string]string // store key to its staleKey.hash; nil while empty
	bytes     int               // charged for keys: their lengths (and their hash keys') plus staleKeyOverhead each
	limit     int               // most bytes the set may hold
	untracked int               // keys not recorded since the last re-admission: the set was full
	warned    bool              // the overflow of this outage was logged
	// deleting are the keys takeDeleting took for the deletes before a
	// re-admission, still found by has until endDeleting; nil: none.
	deleting map[string]string
}

// add records k and reports whether it did: false if the set is full.
func (s *staleKeys) add(k staleKey) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.keys[k.store]; ok {
		return true
	}
	cost := len(k.store) + len(k.hash) + staleKeyOverhead
	if s.bytes+cost > s.limit {
		return false
	}
	if s.keys == nil {
		s.keys = map[string]string{}
	}
	// Copies: a key may be part of a longer string (a request's target,
	// kilobytes with its query), which the set would otherwise keep
	// whole while charging only the key.
	s.keys[strings.Clone(k.store)] = strings.Clone(k.hash)
	s.bytes += cost
	return true
}

// lost counts n keys not recorded and reports whether they are the first
// since the last re-admission.
func (s *staleKeys) lost(n int) (first bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.untracked += n
	first = !s.warned
	s.warned = true
	return first
}

// has reports whether store is recorded, or taken for a delete that
// has not ended (takeDeleting).
func (s *staleKeys) has(store string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.keys[store]
	if !ok {
		_, ok = s.deleting[store]
	}
	return ok
}

// len is the number of keys recorded.
func (s *staleKeys) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.keys)
}

// take empties the set and returns its keys.
func (s *staleKeys) take() []staleKey {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.takeLocked()
}

// takeDeleting is take for the deletes before a re-admission: has still
// finds the keys taken until endDeleting, called once the node serves
// or its deletes failed. Until then the node is down, and in panic mode
// a key taken is read and written where its write went, as while it was
// recorded (node.passedOver), not on the node, which would answer it
// with the value that write replaced until its delete runs there, and
// with a miss after it (decision 0093).
func (s *staleKeys) takeDeleting() []staleKey {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.deleting = s.keys
	return s.takeLocked()
}

// endDeleting forgets the keys takeDeleting took.
func (s *staleKeys) endDeleting() {
	s.mu.Lock()
	s.deleting = nil
	s.mu.Unlock()
}

// takeLocked is take with s.mu held.
func (s *staleKeys) takeLocked() []staleKey {
	keys := make([]staleKey, 0, len(s.keys))
	for k, h := range s.keys {
		keys = append(keys, staleKey{k, h})
	}
	s.keys, s.bytes = nil, 0
	return keys
}

// putBack records again keys that take returned and whose deletion did
// not happen, within the bound; it returns how many did not fit.
func (s *staleKeys) putBack(keys []staleKey) (lost int) {
	for _, k := range keys {
		if !s.add(k) {
			lost++
		}
	}
	return lost
}

// admitted closes an outage: it returns the keys not recorded during it
// and starts counting afresh.
func (s *staleKeys) admitted() (untracked int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	untracked = s.untracked
	s.untracked, s.warned = 0, false
	return untracked
}

// drop forgets everything: the node was flushed, or removed.
func (s *staleKeys) drop() {
	s.take()
	s.endDeleting()
	s.admitted()
}

// recordStale notes that a write of store (the key as sent to
// memcached, placed by hash: see staleKey) goes to another node on n's
// account. If the set is full it counts the key as
// untracked, and logs the first such key of the outage; not while
// ReadmitFlush is on, which empties the node anyway. (The key is still
// recorded then, within the bound, so that turning ReadmitFlush off
// during an outage leaves the keys written before to be deleted.)
func (n *node) recordStale(store, hash string) {
	if n.stale.add(staleKey{store, hash}) {
		return
	}
	n.staleLost(1)
}

// staleLost counts n keys written elsewhere that the set had no room for
// and logs the first of the outage, unless ReadmitFlush is on.
func (n *node) staleLost(lost int) {
	if n.h.readmitFlush.Load() {
		return
	}
	n.m.staleUntracked.Add(float64(lost))
	if n.stale.lost(lost) {
		n.log.Warn("too many keys written to other nodes while this node is away to remember them all: some may read stale values after its re-admission (MEMCGATE_READMIT_FLUSH=true avoids it by emptying the node instead)",
			"limit_bytes", n.stale.limit)
	}
}

// skipForWrite is called for a write of store (as sent; placed by hash,
// see staleKey) that found n down: it records the key on n, then reports whether n is still down, so that
// the write goes elsewhere; false means n was re-admitted meanwhile and
// the write goes to n. Recording before looking again orders the record
// before any admission the write did not see (see the comment at the top
// of this file).
func (n *node) skipForWrite(store, hash string) bool {
	n.recordStale(store, hash)
	return !n.available()
}

// passedOver reports whether routing passes over n for the key store
// (as sent to memcached): n is down and health is followed, or, in
// panic mode (ignoreHealth), a write of store went to another node on
// n's account while n was down (its set records it, or the deletes
// before its re-admission took it and n does not serve yet:
// takeDeleting). That write's value is where it went, and n may hold
// the value it replaced until its re-admission deletes the key there:
// in panic mode the key's reads and writes go on where it went, as
// outside it (decisions 0090, 0093). A key the set had no room for is
// not known, and goes to n.
func (n *node) passedOver(ignoreHealth bool, store string) bool {
	if n.available() {
		return false
	}
	return !ignoreHealth || n.stale.has(store)
}

// invalidateStale deletes on n the keys written elsewhere while it was
// away, staleDeleteWorkers at a time over its data connections. Deleted
// and missing keys are done with; other protocol refusals are dropped too,
// as they would be refused again. At the first transport failure (or ctx
// ending) it stops, records again the keys not deleted, and returns the
// failure: n must not be admitted yet. It returns how many keys it
// deleted or found missing.
func (c *Cluster) invalidateStale(ctx context.Context, n *node, keys []staleKey) (int, error) {
	if len(keys) == 0 {
		return 0, nil
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make([]bool, len(keys)) // each index written by the one worker that took it
	var (
		next    atomic.Int64
		failMu  sync.Mutex // guards fail
		fail    error
		deleted atomic.Int64
	)
	var wg sync.WaitGroup
	for range min(len(keys), staleDeleteWorkers) {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= len(keys) {
					return
				}
				err := n.doAs(ctx, verbOp(op.Delete), false, queued, func(mc dataClient, _ bool) error { // the health check's: no request slot
					_, _, err := mc.Do(ctx, op.Op{Verb: op.Delete}, keys[i].store)
					return err
				})
				var ne *NodeError
				if err != nil && !errors.Is(err, ErrNotFound) && (errors.As(err, &ne) || ctx.Err() != nil) {
					failMu.Lock()
					if fail == nil {
						fail = err
					}
					failMu.Unlock()
					cancel()
					return
				}
				done[i] = true
				if err == nil || errors.Is(err, ErrNotFound) {
					deleted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if fail == nil {
		fail = ctx.Err()
	}
	n.m.staleInvalidated.Add(float64(deleted.Load()))
	if fail == nil {
		return int(deleted.Load()), nil
	}
	var rest []staleKey
	for i, k := range keys {
		if !done[i] {
			rest = append(rest, k)
		}
	}
	if lost := n.stale.putBack(rest); lost > 0 {
		n.staleLost(lost)
	}
	return int(deleted.Load()), fail
}

// Copies left behind. The writes that went elsewhere on n's account left
// their values on the node that took them, the next live node of the
// key's chain, with expiry capped at FailoverTTL. Once n serves again,
// that copy is no longer read, and the key's new writes go to n; but a
// second outage of n within FailoverTTL, or a read that fails over from
// n after a transport error (a connection broken by n's restart), would
// read it again: a value older than ones acknowledged since. So after
// n's admission the keys recorded on n are deleted on the first live
// node after n in their chain that is not one of their live replicas
// (the copies kept, Options.Copies). A write of the key that lands there
// after n's admission (n down again) may be deleted too: a miss, never a
// stale value. A node that took a copy and is down when n returns keeps
// it; its own re-admission cleans only its keys, so that copy can be
// read again if n and every node before it fail within FailoverTTL.

// clearCopies deletes keys (recorded on n, now admitted) on the node
// after n in each key's chain that holds its copy written elsewhere (see
// above), staleDeleteWorkers at a time. It is best effort: a failure
// leaves that copy to age out within FailoverTTL. It returns how many
// copies it deleted or found missing.
func (c *Cluster) clearCopies(ctx context.Context, n *node, keys []staleKey) int {
	if len(keys) == 0 {
		return 0
	}
	c.mu.Lock()
	copies := c.copies
	c.mu.Unlock()
	t := c.topo.Load()
	type target struct {
		key string
		on  *node
	}
	var targets []target
	for _, k := range keys {
		// The chain of the key the write was placed by: a chunk's own
		// name places it elsewhere, and its spare there may be a live
		// replica of the value, whose chunk the delete would take.
		hk := k.hash
		if hk == "" {
			hk = c.hashOf(k.store)
		}
		if m := spareAfter(t, n, hk, copies); m != nil {
			targets = append(targets, target{k.store, m})
		}
	}
	var (
		next    atomic.Int64
		deleted atomic.Int64
		wg      sync.WaitGroup
	)
	for range min(len(targets), staleDeleteWorkers) {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= len(targets) {
					return
				}
				tg := targets[i]
				err := tg.on.doAs(ctx, verbOp(op.Delete), false, queued, func(mc dataClient, _ bool) error { // the health check's: no request slot
					_, _, err := mc.Do(ctx, op.Op{Verb: op.Delete}, tg.key)
					return err
				})
				if err == nil || errors.Is(err, ErrNotFound) {
					deleted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return int(deleted.Load())
}

// spareAfter returns the first live node after n in the chain of hash
// key hk under t that is not one of the key's copies live replicas (the
// first copies live nodes of the chain), nil if there is none or n is
// not in the chain.
func spareAfter(t *topology, n *node, hk string, copies int) *node {
	seen, live := false, 0
	for i := range t.ring.Owners(hk) {
		m := t.nodes[i]
		if m == n {
			seen = true
		}
		if !m.available() {
			continue
		}
		live++
		if seen && m != n && live > copies {
			return m
		}
	}
	return nil
}

// hashOf returns the hash key of a key as sent to memcached (the inverse
// of keys for the store half).
func (c *Cluster) hashOf(store string) string {
	if c.opts.KeyPrefix == "" || c.opts.HashWithPrefix {
		return store
	}
	return strings.TrimPrefix(store, c.opts.KeyPrefix)
}

// placedBy is the staleKey.hash of a write of store placed by hash:
// empty when hash is store's own (hashOf), so that most keys are
// recorded, and charged, once.
func (c *Cluster) placedBy(store, hash string) string {
	if hash == c.hashOf(store) {
		return ""
	}
	return hash
}

// Unknown history. A node that was away when this process started, and
// has not been seen in service since (node.unseen), may have had writes
// of its keys sent to other nodes by the process before this one (a
// restart, a crash, a new pod during the outage), whose record of them
// went with it: its re-admission cannot delete them, and the node
// serves their older values until they are written again or expire. So
// may a node a server change adds (a reload, a SERVERS_DNS answer): its
// keys were written on other nodes while it was out of the list, which
// no write recorded for it (it was gone, not down), or under an earlier
// server list, of this process or one before it. Nothing here can tell
// which keys, or whether any: the node's admission says so, once, with
// a warning that names the remedy and
// memcgate_upstream_readmit_unknown_history_total, which the alert
// MemcgateStaleReadsPossible watches. Not when the node holds no item
// (memcached's curr_items is 0: it was restarted, or is new), which
// serves nothing stale, so that a gateway started with its memcached,
// or a fresh memcached added, does not warn; nor when it is flushed
// before its admission (ReadmitFlush, a replicated pool). A node added
// is asked at its probe before it joins (Prepare, counted at Commit),
// or, if that probe did not pass, at its re-admission (readmit).
// Decisions 0064 and 0065 say why it is not flushed instead.

// unseenHolds is the look, before the admission (readmit, or the probe
// of a node a server change adds), at a node whose history is unknown
// (see above): it reports whether n is unseen and may hold items
// (curr_items above 0, or stats unanswered), with what it found as log
// attributes.
func (c *Cluster) unseenHolds(ctx context.Context, n *node) (holds bool, attrs []any) {
	if !n.unseen.Load() {
		return false, nil
	}
	reply, err := n.command(ctx, "stats\r\n", true, true) // the health check's: no request slot
	if err != nil {
		return true, []any{"stats_err", err.Error()}
	}
	items, ok := statValue(reply, "curr_items")
	if !ok {
		return true, []any{"stats_err", "no curr_items in the stats reply"}
	}
	return items != "0", []any{"curr_items", items}
}

// admittedUnseen closes n's unknown history at its admission: if holds
// (unseenHolds), it counts and warns that n may serve stale values. The
// count comes before /debug/nodes stops showing history_unknown.
func (n *node) admittedUnseen(holds bool, attrs []any) {
	if !n.unseen.Load() {
		return
	}
	defer n.unseen.Store(false)
	if !holds {
		return
	}
	n.m.unknownHistory.Inc()
	n.log.Warn("re-admitted a node away since before this process started or since a server change added it: keys written to other nodes on its account before then were not recorded here, so it may serve values older than those written to other nodes until they are written again or expire (MEMCGATE_READMIT_FLUSH=true flushes a returning node instead; flush_all on the node clears it now)", attrs...)
}

// statValue returns the value of the line "STAT name value" of a stats
// reply.
func statValue(reply []byte, name string) (string, bool) {
	for line := range strings.SplitSeq(string(reply), "\r\n") {
		if rest, ok := strings.CutPrefix(line, "STAT "+name+" "); ok {
			return rest, true
		}
	}
	return "", false
}
