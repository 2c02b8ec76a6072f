package hashring

import (
	"crypto/md5"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Constants from libmemcached include/libmemcached-1.0/defaults.h.
const (
	ketamaPointsPerServer = 160   // MEMCACHED_POINTS_PER_SERVER_KETAMA
	consistentPoints      = 100   // MEMCACHED_POINTS_PER_SERVER (non-weighted)
	ketamaPointsPerHash   = 4     // one MD5 digest gives four points
	memcachedDefaultPort  = 11211 // MEMCACHED_DEFAULT_PORT
	nginxPointsPerWeight  = 160   // ngx_http_upstream_init_chash
)

// stackKey is the longest key hashed without a heap copy. crypto/md5 takes a
// []byte, and a []byte(key) conversion longer than 32 bytes is heap
// allocated even when it does not escape, so keys are copied into a stack
// buffer first.
const stackKey = 256

// md5KeyHash is libmemcached's MEMCACHED_HASH_MD5 (libhashkit md5.cc
// hashkit_md5): the first four bytes of MD5(key) read little-endian.
func md5KeyHash(key string) uint32 {
	var buf [stackKey]byte
	var sum [md5.Size]byte
	if len(key) <= len(buf) {
		sum = md5.Sum(buf[:copy(buf[:], key)])
	} else {
		sum = md5.Sum([]byte(key))
	}
	return binary.LittleEndian.Uint32(sum[:4])
}

// crc32KeyHash is nginx's ngx_crc32_long: plain CRC-32 (IEEE) of the key.
// The table-driven loop runs over the string directly, because
// crc32.ChecksumIEEE's argument escapes and would force a copy of the key.
func crc32KeyHash(key string) uint32 {
	tab := crc32.IEEETable
	crc := ^uint32(0)
	for i := 0; i < len(key); i++ {
		crc = tab[byte(crc)^key[i]] ^ crc>>8
	}
	return ^crc
}

// oneAtATime is libmemcached's default key hash (libhashkit one_at_a_time.cc
// hashkit_one_at_a_time), Bob Jenkins' one-at-a-time hash in uint32.
//
// libhashkit reads each byte as `(uint32_t) *ptr` through a `const char *`,
// so where char is signed (x86-64, i386, the platforms PHP fleets run on) a
// byte >= 0x80 is sign-extended: 0xC3 is added as 0xFFFFFFC3. We do the same.
// On platforms where char is unsigned (arm64, ppc64le, s390x Linux),
// libmemcached places keys containing such bytes differently; ASCII keys are
// unaffected.
func oneAtATime(key string) uint32 {
	var h uint32
	for i := 0; i < len(key); i++ {
		h += uint32(int8(key[i]))
		h += h << 10
		h ^= h >> 6
	}
	h += h << 3
	h ^= h >> 11
	h += h << 15
	return h
}

// weight returns m's weight as the placement algorithms see it: < 1 is 1
// (libmemcached and nginx both default to 1), and values that do not fit
// libmemcached's uint32 are clamped.
func (m Member) weight() uint64 {
	return uint64(min(max(int64(m.Weight), 1), math.MaxUint32))
}

// ketamaPointCount is the number of points libmemcached gives a server of
// weight w in update_continuum (hosts.cc) for weighted ketama:
//
//	float pct = (float) weight / (float) total_weight;
//	points = (uint32_t)(floor((float)(pct * 160 / 4 * (float) live_servers
//	                                  + 0.0000000001F)) * 4);
//
// The arithmetic is single precision in C; every step is converted to
// float32 here so that Go neither keeps extra precision nor fuses the
// multiply and add. The result differs from exact arithmetic: with equal
// weights and some server counts the product lands just below 40.
func ketamaPointCount(w, total uint64, n int) int {
	pct := float32(w) / float32(total)
	x := float32(pct * ketamaPointsPerServer)
	x = float32(x / ketamaPointsPerHash)
	x = float32(x * float32(n))
	x = float32(x + float32(0.0000000001))
	return int(math.Floor(float64(x))) * ketamaPointsPerHash
}

// ketamaPointString appends libmemcached's point string for point group i
// of m: "host-i" when the port is 11211, else "host:port-i" (the `%s-%u` and
// `%s:%u-%u` formats of update_continuum).
func ketamaPointString(dst []byte, m Member, i int) []byte {
	dst = append(dst, m.Host...)
	if m.Port != memcachedDefaultPort {
		dst = append(dst, ':')
		dst = strconv.AppendUint(dst, uint64(uint32(m.Port)), 10)
	}
	dst = append(dst, '-')
	return strconv.AppendInt(dst, int64(i), 10)
}

// ketamaDigestPoints returns the four points of one point string: the four
// little-endian uint32 groups of its MD5 digest (ketama_server_hash).
func ketamaDigestPoints(s []byte) [ketamaPointsPerHash]uint32 {
	d := md5.Sum(s)
	var p [ketamaPointsPerHash]uint32
	for a := range p {
		p[a] = binary.LittleEndian.Uint32(d[4*a:])
	}
	return p
}

// ringPoint is a point of a continuum: its value in the high 32 bits,
// its member's index in the low ones, so that sorting the numbers sorts
// by (value, member index), libmemcached's continuum_item_cmp and the
// order we use for nginx too (see nginxPoints). A sort of integers does
// without a comparison function: the rings are built at each reload of
// a pool, and the fuzz targets build thousands.
type ringPoint uint64

func point(value uint32, member int) ringPoint {
	return ringPoint(value)<<32 | ringPoint(uint32(member))
}

func (p ringPoint) value() uint32 { return uint32(p >> 32) }

func (p ringPoint) member() int32 { return int32(uint32(p)) }

// ketamaPoints builds libmemcached's weighted ketama continuum, sorted by
// (value, member index), as parallel slices.
func ketamaPoints(members []Member) ([]uint32, []int32) {
	var total uint64
	for _, m := range members {
		total += m.weight()
	}
	pts := make([]ringPoint, 0, len(members)*ketamaPointsPerServer)
	var buf []byte
	for i, m := range members {
		groups := ketamaPointCount(m.weight(), total, len(members)) / ketamaPointsPerHash
		for g := range groups {
			buf = ketamaPointString(buf[:0], m, g)
			for _, v := range ketamaDigestPoints(buf) {
				pts = append(pts, point(v, i))
			}
		}
	}
	slices.Sort(pts)
	return split(pts)
}

// consistentRing builds libmemcached's non-weighted continuum
// (update_continuum without weighted ketama): 100 points per member, point i
// being the one-at-a-time hash of the ketama point string "host-i" or
// "host:port-i", sorted by (value, member index).
func consistentRing(members []Member) ([]uint32, []int32) {
	pts := make([]ringPoint, 0, len(members)*consistentPoints)
	var buf []byte
	for i, m := range members {
		for j := range consistentPoints {
			buf = ketamaPointString(buf[:0], m, j)
			pts = append(pts, point(oneAtATime(string(buf)), i))
		}
	}
	slices.Sort(pts)
	return split(pts)
}

// nginxServerName is the text of nginx's `server` directive for m:
// "host:port", with an IPv6 host in brackets, or the host alone when the
// port is not positive (a `server` line without a port, or "unix:/path").
func nginxServerName(m Member) string {
	if m.Port <= 0 {
		return m.Host
	}
	host := m.Host
	if strings.Contains(host, ":") && !strings.HasPrefix(host, "[") {
		host = "[" + host + "]"
	}
	return host + ":" + strconv.Itoa(m.Port)
}

// nginxSplit splits a server name as ngx_http_upstream_init_chash does: a
// "unix:" prefix is dropped and there is no port; otherwise the port is the
// run of digits after the last ':' when the name ends with one, and there is
// no port when the name does not end in ":digits".
func nginxSplit(server string) (host, port string) {
	if len(server) >= 5 && strings.EqualFold(server[:5], "unix:") {
		return server[5:], ""
	}
	for j := len(server) - 1; j >= 0; j-- {
		c := server[j]
		if c == ':' {
			return server[:j], server[j+1:]
		}
		if c < '0' || c > '9' {
			break
		}
	}
	return server, ""
}

// nginxPoints builds nginx's consistent-hash points (init_chash): for each
// server, base = crc32 over host, one NUL byte and port; point j is
// crc32(base bytes, prev) where prev is point j-1 as four little-endian
// bytes (0 for j = 0), 160*weight points per server. Points are sorted by
// value and points with a value equal to the previous one are dropped.
//
// nginx sorts with qsort on the value alone, so which server keeps a
// duplicated value depends on the C library's qsort. glibc's merge sort is
// stable, which keeps the server listed first; we always keep the lowest
// member index. Collisions between servers are rare (about 1% of 64-server
// rings have one) and affect one point.
func nginxPoints(members []Member) ([]uint32, []int32, error) {
	var total uint64
	for _, m := range members {
		total += m.weight()
	}
	if total > maxNginxPoints/nginxPointsPerWeight {
		return nil, nil, fmt.Errorf("hashring: nginx ring of total weight %d needs more than %d points", total, maxNginxPoints)
	}
	pts := make([]ringPoint, 0, total*nginxPointsPerWeight)
	tab := crc32.IEEETable
	var prev [4]byte
	for i, m := range members {
		host, port := nginxSplit(nginxServerName(m))
		base := crc32.Update(0, tab, []byte(host))
		base = crc32.Update(base, tab, []byte{0})
		base = crc32.Update(base, tab, []byte(port))
		clear(prev[:])
		for range m.weight() * nginxPointsPerWeight {
			h := crc32.Update(base, tab, prev[:])
			pts = append(pts, point(h, i))
			binary.LittleEndian.PutUint32(prev[:], h)
		}
	}
	slices.Sort(pts)
	pts = slices.CompactFunc(pts, func(a, b ringPoint) bool { return a.value() == b.value() })
	v, o := split(pts)
	return v, o, nil
}

func split(pts []ringPoint) ([]uint32, []int32) {
	values := make([]uint32, len(pts))
	owners := make([]int32, len(pts))
	for i, p := range pts {
		values[i], owners[i] = p.value(), p.member()
	}
	return values, owners
}
