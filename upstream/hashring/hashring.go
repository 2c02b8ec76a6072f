// Package hashring places memcached keys on servers exactly as the clients we
// must interoperate with do: php-memcached/libmemcached weighted ketama and
// modula, and nginx's `hash $key consistent`. It also gives the failover
// order used when a key's owner is down.
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
)

// maxNginxPoints bounds the ring nginx mode builds (160 points per unit of
// weight), so that a typo in a weight cannot exhaust memory. nginx itself
// has no such bound (nginx/nginx#191).
const maxNginxPoints = 1 << 24

// Member is one server as configured. Its index in the slice given to New is
// its identity in every answer of the Ring.
type Member struct {
	Host   string // host as configured (name or IP, never resolved); hashed as text
	Port   int    // TCP port; 11211 is left out of ketama point strings
	Weight int    // share of the ring; < 1 is treated as 1; ignored by Modula
}

// Ring maps keys to member indexes for one Distribution and one member list.
// It is immutable after New and safe for concurrent use. The zero Ring is not
// usable; build one with New.
type Ring struct {
	dist Distribution
	n    int
	// values holds the ring points in clockwise order (ascending, ties by
	// member index); owners[i] is the member that owns values[i]. Both are
	// nil for Modula.
	values []uint32
	owners []int32
}

// New builds the ring for d over members. The members slice is not retained.
// It returns an error for an unknown distribution, for zero members, and for
// an Nginx ring whose total weight would need more than 16M points.
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
	default:
		return nil, fmt.Errorf("hashring: unknown distribution %q", string(d))
	}
	return r, nil
}

// Len returns the number of members.
func (r *Ring) Len() int { return r.n }

// Points returns the number of points on the ring, for introspection: 0 for
// Modula; for Nginx it counts points after nginx's removal of duplicate
// values.
func (r *Ring) Points() int { return len(r.values) }

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
	if r.dist == Ketama {
		h = md5KeyHash(key)
	} else {
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
// For Ketama and Nginx the order is the members met walking the ring
// clockwise from the key's point, each at its first point. Skipping the
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
//
// A Ketama member whose weight share rounds to zero points is never met on
// the ring; such members are yielded last, in index order.
//
// For Modula the order is owner, owner+1, … modulo Len(). That is not what a
// modula ring without the dead member would pick (modula remaps almost every
// key when the count changes), only a deterministic fallback.
func (r *Ring) Owners(key string) iter.Seq[int] {
	// Kept tiny so that it inlines: the closure then does not escape and a
	// range over Owners costs no allocation.
	return func(yield func(int) bool) { r.walk(key, yield) }
}

// walk implements Owners.
func (r *Ring) walk(key string, yield func(int) bool) {
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
