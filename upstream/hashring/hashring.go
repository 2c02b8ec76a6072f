// Package hashring places memcached keys on servers exactly as the clients we
// must interoperate with do: php-memcached/libmemcached weighted ketama,
// non-weighted consistent hashing (php-memcached's session handler) and
// modula; pecl/memcache's standard and consistent strategies with either of
// its hash functions, for its Memcache class and its session handler; and
// nginx's `hash $key consistent`. It also gives the failover order used when
// a key's owner is down.
//
// The package is pure computation: it does no I/O, resolves no names, keeps
// no health state and takes no locks. A Ring is immutable after New and safe
// for concurrent use; health and ejection belong to the caller, which skips
// dead members while ranging over Owners.
package hashring

import (
	"errors"
	"fmt"
	"iter"
	"math"
	"slices"
)

// Distribution names a placement algorithm. The zero value is not valid;
// callers choose their default (the gateway uses Ketama).
type Distribution string

const (
	// Ketama is libmemcached's weighted ketama
	// (MEMCACHED_DISTRIBUTION_CONSISTENT_WEIGHTED), which is what
	// php-memcached uses with Memcached::OPT_LIBKETAMA_COMPATIBLE set to true:
	// MD5 points, 160 per server scaled by the server's weight share, four
	// points per digest read as little-endian uint32 groups, point strings
	// "host-i" when the port is 11211 and "host:port-i" otherwise, with the
	// host exactly as configured. Keys are hashed with the first
	// little-endian uint32 of MD5(key).
	Ketama Distribution = "ketama"

	// Modula is php-memcached's default placement: Jenkins one-at-a-time
	// hash of the key modulo the number of servers, in configured order.
	// Weights are ignored, as libmemcached ignores them for modula. Key bytes
	// >= 0x80 are sign-extended as libhashkit does where C's char is signed
	// (x86-64); libmemcached on arm64 places such keys differently.
	Modula Distribution = "modula"

	// Nginx is nginx's `hash $key consistent` (Cache::Memcached::Fast
	// compatible): a CRC32 ring with 160*weight points per server, chained
	// over the server name split into host and port, and keys hashed with
	// CRC32 (IEEE). The server name is "host:port" (IPv6 hosts in
	// brackets), or the host alone when Port <= 0, and must be spelled as in
	// nginx.conf's `server` lines because nginx hashes the text, not the
	// address.
	Nginx Distribution = "nginx"

	// Consistent is libmemcached's non-weighted consistent distribution
	// (MEMCACHED_DISTRIBUTION_CONSISTENT, or _KETAMA without _WEIGHTED)
	// with its default key hash: what php-memcached's session handler uses
	// with its defaults (memcached.sess_consistent_hash=On,
	// memcached.sess_consistent_hash_type=ketama), and what the Memcached
	// class uses with Memcached::OPT_DISTRIBUTION set to
	// DISTRIBUTION_CONSISTENT and servers of weight 1. Each server gets 100
	// points, the Jenkins one-at-a-time hashes of the ketama point strings
	// "host-i" (port 11211) or "host:port-i", i = 0..99; keys are hashed
	// with one-at-a-time too (sign-extending bytes >= 0x80, as Modula).
	// Weights are ignored: the session handler sets the distribution after
	// adding its servers, which turns libmemcached's weighting off.
	Consistent Distribution = "consistent"

	// The pecl/memcache distributions place keys as the older Memcache
	// class (pecl/memcache 3.x and 4.x, Debian php-memcache) does for
	// memcache.hash_strategy standard or consistent and
	// memcache.hash_function crc32 or fnv. The key hashes are CRC-32
	// (IEEE, PHP's crc32()) and 32-bit FNV-1a (with bytes >= 0x80
	// sign-extended, as pecl/memcache does where char is signed).
	//
	// Standard: each server appears weight times in a bucket list, in the
	// order added; a key goes to bucket ((hash >> 16) & 0x7fff, or 1 when
	// that is 0) modulo the list's length.
	//
	// Consistent: each server gets 160*weight points, the hashes of
	// "host:port-i" (the port always written, the host exactly as
	// configured); 1024 buckets are precomputed, bucket b owned by the
	// first point >= b*(0xffffffff/1024), and a key goes to bucket
	// hash % 1024.
	//
	// In both, the failover order (Owners) is pecl/memcache's: after the
	// key's owner come the owners of "key-0", "key-1", … "key-19", as its
	// mmc_pool_find_next rehashes (memcache.max_failover_attempts = 20).
	PeclStandardCRC32   Distribution = "pecl-standard-crc32"
	PeclStandardFNV     Distribution = "pecl-standard-fnv"
	PeclConsistentCRC32 Distribution = "pecl-consistent-crc32"
	PeclConsistentFNV   Distribution = "pecl-consistent-fnv"

	// The pecl/memcache session distributions place session keys as
	// pecl/memcache's session handler (session.save_handler = memcache)
	// does: it never looks at find(key) but starts with the failover
	// candidates, so a session lives on the owner of "key-0", and its
	// copies (memcache.session_redundancy, 2 by default) on the next
	// distinct owners of "key-1", "key-2", …, which is the order Owners
	// yields. Unlike the Memcache class, the session handler does not stop
	// at "key-19": it goes on with "key-20", "key-21", … until it has as
	// many distinct servers as it wants, and so does Owners. Strategy and
	// hash function as for the distributions above.
	PeclSessionStandardCRC32   Distribution = "pecl-session-standard-crc32"
	PeclSessionStandardFNV     Distribution = "pecl-session-standard-fnv"
	PeclSessionConsistentCRC32 Distribution = "pecl-session-consistent-crc32"
	PeclSessionConsistentFNV   Distribution = "pecl-session-consistent-fnv"
)

// peclMode describes a pecl/memcache distribution; ok is false for the
// others.
func peclMode(d Distribution) (h peclHash, standard, session, ok bool) {
	switch d {
	case PeclStandardCRC32:
		return peclCRC32, true, false, true
	case PeclStandardFNV:
		return peclFNV, true, false, true
	case PeclConsistentCRC32:
		return peclCRC32, false, false, true
	case PeclConsistentFNV:
		return peclFNV, false, false, true
	case PeclSessionStandardCRC32:
		return peclCRC32, true, true, true
	case PeclSessionStandardFNV:
		return peclFNV, true, true, true
	case PeclSessionConsistentCRC32:
		return peclCRC32, false, true, true
	case PeclSessionConsistentFNV:
		return peclFNV, false, true, true
	}
	return 0, false, false, false
}

// maxNginxPoints bounds the ring nginx mode builds (160 points per unit of
// weight), so that a typo in a weight cannot exhaust memory. nginx itself
// has no such bound (nginx/nginx#191).
const maxNginxPoints = 1 << 24

// Member is one server as configured. Its index in the slice given to New is
// its identity in every answer of the Ring.
type Member struct {
	Host   string // host as configured (name or IP, never resolved); hashed as text
	Port   int    // TCP port; 11211 is left out of ketama point strings
	Weight int    // share of the ring; < 1 is treated as 1; ignored by Modula and Consistent
}

// Ring maps keys to member indexes for one Distribution and one member list.
// It is immutable after New and safe for concurrent use. The zero Ring is not
// usable; build one with New.
type Ring struct {
	dist Distribution
	n    int
	// values holds the ring points in clockwise order (ascending, ties by
	// member index); owners[i] is the member that owns values[i]. Both are
	// nil for Modula and the pecl/memcache distributions.
	values []uint32
	owners []int32
	// pecl is the lookup table of a pecl/memcache distribution, else nil.
	pecl *peclTable
	// shares is each member's fraction of the hash space (Shares).
	shares []float64
}

// New builds the ring for d over members. The members slice is not retained.
// It returns an error for an unknown distribution, for zero members, and for
// an Nginx or pecl/memcache consistent ring whose total weight would need
// more than 16M points.
func New(d Distribution, members []Member) (*Ring, error) {
	if len(members) == 0 {
		return nil, errors.New("hashring: no members")
	}
	if len(members) > math.MaxInt32 {
		return nil, errors.New("hashring: too many members")
	}
	r := &Ring{dist: d, n: len(members)}
	switch d {
	case Ketama:
		r.values, r.owners = ketamaPoints(members)
	case Modula:
	case Nginx:
		var err error
		if r.values, r.owners, err = nginxPoints(members); err != nil {
			return nil, err
		}
	case Consistent:
		r.values, r.owners = consistentRing(members)
	default:
		h, standard, session, ok := peclMode(d)
		if !ok {
			return nil, fmt.Errorf("hashring: unknown distribution %q", string(d))
		}
		var err error
		if r.pecl, err = newPeclTable(members, h, standard, session); err != nil {
			return nil, err
		}
	}
	r.shares = r.computeShares()
	return r, nil
}

// Len returns the number of members.
func (r *Ring) Len() int { return r.n }

// Points returns the number of points on the ring, for introspection: 0 for
// Modula and the pecl/memcache standard strategy; for Nginx it counts points
// after nginx's removal of duplicate values; for the pecl/memcache
// consistent strategy it counts the points its 1024 buckets were computed
// from.
func (r *Ring) Points() int {
	if r.pecl != nil {
		return r.pecl.points
	}
	return len(r.values)
}

// Owner returns the index (into the members given to New) of the member that
// owns key. It does not allocate for keys of up to 256 bytes, which covers
// every valid memcached key (250 bytes at most).
func (r *Ring) Owner(key string) int {
	if r.n == 1 {
		// libmemcached skips hashing with one server
		// (_generate_hash_wrapper); every mode agrees on member 0.
		return 0
	}
	if r.dist == Modula {
		return int(oneAtATime(key) % uint32(r.n))
	}
	if r.pecl != nil {
		return r.pecl.owner(key)
	}
	return int(r.owners[r.point(key)])
}

// point returns the index into r.values of key's point: the first point whose
// value is >= the key's hash, wrapping to point 0 past the last one.
//
// libmemcached (hash.cc dispatch_host) runs a lower-bound binary search
// ("middle->value < hash ? left = middle+1 : right = middle") over the
// continuum that hosts.cc update_continuum sorted with continuum_item_cmp,
// i.e. by (value, server index). So among equal values the point of the
// lowest server index is picked, and "first >= hash" is exact: a hash equal
// to a point's value maps to that point, not the next one. We sort the same
// way and search the same way.
//
// nginx (ngx_http_upstream_find_chash_point) searches for the "first point
// >= hash" over points whose duplicate values were removed at build time, so
// a lower bound is again exact; get_chash_peer wraps with hash % number.
func (r *Ring) point(key string) int {
	var h uint32
	switch r.dist {
	case Ketama:
		h = md5KeyHash(key)
	case Consistent:
		h = oneAtATime(key)
	default:
		h = crc32KeyHash(key)
	}
	i, _ := slices.BinarySearch(r.values, h)
	if i == len(r.values) {
		i = 0
	}
	return i
}

// Owners yields the distinct member indexes in failover order. The first is
// always Owner(key); each member is yielded exactly once, so ranging to the
// end visits all Len() members. It does not allocate for rings of up to 64
// members (and keys of up to 256 bytes).
//
// For Ketama, Consistent and Nginx the order is the members met walking the
// ring clockwise from the key's point, each at its first point. Skipping the
// members the caller considers dead therefore picks the same member as
// placing the key on that ring's points with the dead members' points
// removed:
//
//   - Nginx: this is exactly how nginx fails over (get_chash_peer moves to
//     the next point when the point's server is down or already tried), and
//     since every member has 160*weight points whatever the others are, it
//     equals a ring built without the dead members, for any weights. The one
//     exception is a CRC32 collision that nginx's de-duplication resolved in
//     favour of a dead member: nginx drops the live member's copy of that
//     point, and so does this walk.
//   - Ketama: it equals New(Ketama, members without the dead ones) exactly
//     when every surviving member keeps the same number of points in that
//     smaller ring, because then the surviving points are the same strings
//     with the same ordering of ties. libmemcached gives a member
//     floor(float32(weight/total * 40 * n) + 1e-10) * 4 points, computed in
//     single precision, so the condition is: all weights equal, and that
//     count the same for n and n-k members (k dead). It is 160 for most n,
//     but 156 for n = 25, 47, 50, 55, 61, …; with one dead member of an
//     equal-weight ring of n <= 64 it holds except for n = 25, 26, 47, 48,
//     50, 51, 55, 56, 61 and 62. With unequal weights it generally fails,
//     because a removal changes every survivor's share. (libmemcached with
//     OPT_REMOVE_FAILED_SERVERS rebuilds the ring that way, so with unequal
//     weights its keys move further than ours.)
//   - Consistent: every member has 100 points whatever the others are, so,
//     as for Nginx, it equals a ring built without the dead members.
//
// A Ketama member whose weight share rounds to zero points is never met on
// the ring; such members are yielded last, in index order.
//
// For Modula the order is owner, owner+1, … modulo Len(). That is not what a
// modula ring without the dead member would pick (modula remaps almost every
// key when the count changes), only a deterministic fallback.
//
// For the pecl/memcache distributions the order is pecl/memcache's own
// failover (see PeclStandardCRC32): the distinct owners of the key (except
// for the session distributions) and of "key-0" … "key-19", which is what
// pecl/memcache with memcache.allow_failover (the default) tries when a
// server is marked failed. Skipping dead members therefore picks the server
// a pecl/memcache client that saw the same members fail would pick. Members
// met by none of those lookups follow in index order: when no live member
// is among them, pecl/memcache gives up (it sends the request to the last,
// failed candidate), while a caller skipping dead members still finds one.
// The session distributions go on with "key-20", "key-21", … first, as the
// session handler does (see PeclSessionStandardCRC32), up to 65,536
// candidates or until every member that owns a bucket was met.
// With the standard strategy and fnv, rehashing "key-N" moves the bucket
// so little that this happens often (see the interop test).
func (r *Ring) Owners(key string) iter.Seq[int] {
	// Kept tiny so that it inlines: the closure then does not escape and a
	// range over Owners costs no allocation.
	return func(yield func(int) bool) { r.walk(key, yield) }
}

// walk implements Owners.
func (r *Ring) walk(key string, yield func(int) bool) {
	if r.pecl != nil && r.n > 1 {
		r.pecl.walk(key, r.n, yield)
		return
	}
	if r.n == 1 || r.dist == Modula {
		first := r.Owner(key)
		for k := range r.n {
			i := first + k
			if i >= r.n {
				i -= r.n
			}
			if !yield(i) {
				return
			}
		}
		return
	}
	var seen memberSet
	if r.n > 64 {
		seen.big = make([]uint64, (r.n+63)/64)
	}
	left := r.n
	start := r.point(key)
	for k := range len(r.owners) {
		p := start + k
		if p >= len(r.owners) {
			p -= len(r.owners)
		}
		i := r.owners[p]
		if !seen.add(i) {
			continue
		}
		if !yield(int(i)) {
			return
		}
		if left--; left == 0 {
			return
		}
	}
	// Members without points (a ketama weight share below one digest).
	for i := range int32(r.n) {
		if seen.add(i) && !yield(int(i)) {
			return
		}
	}
}

// memberSet is a set of member indexes: a bitmap in one word for up to 64
// members (no allocation), in big beyond that.
type memberSet struct {
	small uint64
	big   []uint64
}

// add inserts i and reports whether it was absent.
func (s *memberSet) add(i int32) bool {
	w := &s.small
	if s.big != nil {
		w = &s.big[i/64]
	}
	m := uint64(1) << uint(i%64)
	if *w&m != 0 {
		return false
	}
	*w |= m
	return true
}
