package hashring

import (
	"fmt"
	"hash/crc32"
	"slices"
	"strconv"
)

// Constants of pecl/memcache (src/memcache_pool.h, memcache.c).
const (
	peclPointsPerWeight  = 160  // MMC_CONSISTENT_POINTS: consistent points per unit of weight
	peclBuckets          = 1024 // MMC_CONSISTENT_BUCKETS: precomputed consistent lookup table
	peclFailoverAttempts = 20   // memcache.max_failover_attempts default: rehashes tried
	// peclSessionCandidates bounds the candidates a session walk hashes.
	// The session handler itself has no bound (see peclTable.walk), but
	// a member that owns no bucket is never met, and a member with a
	// tiny share of them seldom: past this many candidates, the members
	// not met follow in index order. A member with the smallest share a
	// consistent table gives (1 bucket of 1024) is met within it but for
	// a chance of e^-64.
	peclSessionCandidates = 1 << 16
	fnv32Init             = 0x811c9dc5
	fnv32Prime            = 0x01000193
	// peclStandardSpan is one more than the largest standard-strategy
	// hash, ((hash >> 16) & 0x7fff): no bucket index reaches it, so the
	// bucket list is kept only up to here whatever the total weight.
	peclStandardSpan = 0x8000
)

// maxPeclPoints bounds the points a pecl consistent ring sorts while it is
// built (160 per unit of weight), as maxNginxPoints does for nginx.
const maxPeclPoints = 1 << 24

// peclHash names pecl/memcache's memcache.hash_function.
type peclHash uint8

const (
	peclCRC32 peclHash = iota // "crc32": CRC-32 (IEEE), PHP's crc32()
	peclFNV                   // "fnv": FNV-1a, 32 bits, bytes sign-extended
)

// peclTable is what a pecl/memcache mode looks keys up in.
type peclTable struct {
	hash     peclHash
	standard bool // memcache.hash_strategy=standard; else consistent
	// session places a key as the session handler does, by the first
	// failover candidate "key-0" instead of the key itself.
	session bool
	// buckets maps a bucket to a member index. Standard: the weighted
	// server list (each member weight times, in order), cut at
	// peclStandardSpan. Consistent: the peclBuckets precomputed owners.
	buckets []int32
	total   uint64 // standard: sum of the weights, the modulus
	points  int    // consistent: the points the table was computed from
	// reachable counts the members find can return: a session walk
	// stops hashing candidates once it has met them all.
	reachable int
}

// peclState is a key hash in progress: pecl/memcache hashes through
// init/combine/finish, so the failover candidates "key-N" continue the
// state of "key" instead of hashing it again.
type peclState struct {
	h   peclHash
	acc uint32
}

// newPeclState starts a hash (pecl/memcache's init step).
func newPeclState(h peclHash) peclState {
	if h == peclFNV {
		return peclState{h, fnv32Init}
	}
	return peclState{h, ^uint32(0)}
}

// add combines s into the state (mmc_hash_crc32_combine and
// mmc_hash_fnv1a_combine).
func (p peclState) add(s string) peclState { return combine(p, s) }

// addInt combines the decimal text of i, as sprintf("%d") writes it.
func (p peclState) addInt(i int) peclState {
	var buf [20]byte
	return combine(p, strconv.AppendInt(buf[:0], int64(i), 10))
}

// combine runs one hash function over s. The FNV-1a step XORs
// `(unsigned int)` of a `const char`, which sign-extends bytes >= 0x80
// where char is signed (x86-64, where PHP fleets run); we do the same, as
// for oneAtATime. CRC-32 masks the byte with 0xff, so sign does not matter
// there.
func combine[S string | []byte](p peclState, s S) peclState {
	if p.h == peclFNV {
		for i := 0; i < len(s); i++ {
			p.acc ^= uint32(int8(s[i]))
			p.acc *= fnv32Prime
		}
		return p
	}
	tab := crc32.IEEETable
	for i := 0; i < len(s); i++ {
		p.acc = tab[byte(p.acc)^s[i]] ^ p.acc>>8
	}
	return p
}

// sum finishes the hash (CRC-32 inverts; FNV-1a is the state).
func (p peclState) sum() uint32 {
	if p.h == peclFNV {
		return p.acc
	}
	return ^p.acc
}

// candidate returns the hash of pecl/memcache's failover key "key-n"
// (mmc_pool_find_next's sprintf("%s-%d")) from the state after "key".
func (p peclState) candidate(n int) uint32 {
	return p.add("-").addInt(n).sum()
}

// find returns the member owning hash h (mmc_standard_find_server and
// mmc_consistent_find_server with more than one server).
func (t *peclTable) find(h uint32) int32 {
	if t.standard {
		x := uint64(h>>16) & 0x7fff
		if x == 0 {
			x = 1 // "(hash ? hash : 1)"
		}
		return t.buckets[x%t.total]
	}
	return t.buckets[h%peclBuckets]
}

// owner returns key's member: find(key), or find("key-0") for the session
// handler, which reads and writes through mmc_pool_find_next from the start.
func (t *peclTable) owner(key string) int {
	s := newPeclState(t.hash).add(key)
	if t.session {
		return int(t.find(s.candidate(0)))
	}
	return int(t.find(s.sum()))
}

// walk yields the members in pecl/memcache's failover order, each once:
// find(key) (except for the session handler), then find("key-0"),
// find("key-1"), … for memcache.max_failover_attempts (20) candidates, as
// mmc_pool_find and mmc_pool_failover_handler try them; pecl/memcache gives
// up there, and the members never met are yielded last, in index order.
//
// The session handler does not give up at 20: it asks
// mmc_pool_find_next for one server per copy, which returns a server
// already written once the 20 are used up, and mmc_queue_push does not
// count a server twice, so the handler asks again, for "key-20", "key-21",
// … until it has memcache.session_redundancy distinct servers. A session
// whose 20 candidates all name one member has its second copy on the
// owner of the first later candidate that names another. The session walk
// therefore goes on past 20, up to peclSessionCandidates, until it has met
// every member find can return.
func (t *peclTable) walk(key string, n int, yield func(int) bool) {
	var seen memberSet
	if n > 64 {
		seen.big = make([]uint64, (n+63)/64)
	}
	left := n
	s := newPeclState(t.hash).add(key)
	first, last := -1, peclFailoverAttempts
	if t.session {
		first, last = 0, peclSessionCandidates
	}
	for c := first; c < last; c++ {
		if c >= peclFailoverAttempts && n-left == t.reachable {
			break // the members left are never met
		}
		var m int32
		if c < 0 {
			m = t.find(s.sum())
		} else {
			m = t.find(s.candidate(c))
		}
		if !seen.add(m) {
			continue
		}
		if !yield(int(m)) {
			return
		}
		if left--; left == 0 {
			return
		}
	}
	for i := range int32(n) {
		if seen.add(i) && !yield(int(i)) {
			return
		}
	}
}

// countReachable sets t.reachable: the distinct members of the buckets
// find can pick (standard: bucket x % total for every x from 1 to
// 0x7fff; consistent: all of them).
func (t *peclTable) countReachable(n int) {
	var seen memberSet
	if n > 64 {
		seen.big = make([]uint64, (n+63)/64)
	}
	count := func(m int32) {
		if seen.add(m) {
			t.reachable++
		}
	}
	if !t.standard {
		for _, m := range t.buckets {
			count(m)
		}
		return
	}
	for x := uint64(1); x < peclStandardSpan && t.reachable < n; x++ {
		count(t.buckets[x%t.total])
	}
}

// newPeclTable builds the lookup table of a pecl/memcache mode.
func newPeclTable(members []Member, h peclHash, standard, session bool) (*peclTable, error) {
	t := &peclTable{hash: h, standard: standard, session: session}
	if standard {
		t.buckets, t.total = peclStandardBuckets(members)
	} else {
		var err error
		if t.buckets, t.points, err = peclConsistentBuckets(members, h); err != nil {
			return nil, err
		}
	}
	t.countReachable(len(members))
	return t, nil
}

// peclStandardBuckets builds mmc_standard_add_server's bucket list: each
// member weight times, in order. Only the first peclStandardSpan entries
// can ever be picked, so only they are kept; the modulus is the full total.
func peclStandardBuckets(members []Member) ([]int32, uint64) {
	var total uint64
	for _, m := range members {
		total += m.weight()
	}
	buckets := make([]int32, 0, min(total, peclStandardSpan))
	for i, m := range members {
		for w := m.weight(); w > 0 && len(buckets) < peclStandardSpan; w-- {
			buckets = append(buckets, int32(i))
		}
	}
	return buckets, total
}

// peclConsistentBuckets builds mmc_consistent_add_server's points and the
// table mmc_consistent_populate_buckets derives from them. Member i gets
// 160*weight points: point j is the hash of "host:port-j" (the port always
// written, as an unsigned short). Points are sorted by value (glibc's qsort
// is a stable merge sort, so equal values keep the member added first,
// which is what sorting by member index gives), and bucket b is owned by
// the first point >= b*(0xffffffff/1024), wrapping to the first point:
// mmc_consistent_find is such a lower-bound search.
func peclConsistentBuckets(members []Member, h peclHash) ([]int32, int, error) {
	var total uint64
	for _, m := range members {
		total += m.weight()
	}
	if total > maxPeclPoints/peclPointsPerWeight {
		return nil, 0, fmt.Errorf("hashring: pecl/memcache consistent ring of total weight %d needs more than %d points", total, maxPeclPoints)
	}
	pts := make([]ringPoint, 0, total*peclPointsPerWeight)
	for i, m := range members {
		base := newPeclState(h).add(m.Host).add(":").addInt(int(uint16(m.Port))).add("-")
		for j := range int(m.weight() * peclPointsPerWeight) {
			pts = append(pts, point(base.addInt(j).sum(), i))
		}
	}
	slices.Sort(pts)
	values, owners := split(pts)
	const step = uint32(0xffffffff / peclBuckets)
	buckets := make([]int32, peclBuckets)
	for b := range buckets {
		p, _ := slices.BinarySearch(values, uint32(b)*step)
		if p == len(values) {
			p = 0
		}
		buckets[b] = owners[p]
	}
	return buckets, len(pts), nil
}
