package hashring

import (
	"fmt"
	"hash/fnv"
	"slices"
	"sync"
	"testing"
)

// peclDistributions returns the pecl/memcache distributions, Memcache
// class first, then session handler.
func peclDistributions() []Distribution {
	return []Distribution{
		PeclStandardCRC32, PeclStandardFNV, PeclConsistentCRC32, PeclConsistentFNV,
		PeclSessionStandardCRC32, PeclSessionStandardFNV, PeclSessionConsistentCRC32, PeclSessionConsistentFNV,
	}
}

// TestPeclVectors pins placements for the peers.md §4.5 servers with
// weights 1,2,1, as pecl/memcache 4.0.5.2 (Debian php-memcache) answers
// them through Memcache::findServer with memcache.hash_strategy and
// memcache.hash_function set; the session columns are findServer("key-0"),
// where the session handler starts (TestPeclSessionInterop checks the
// handler itself). Owners are 1-based: .1, .2, .3.
func TestPeclVectors(t *testing.T) {
	keys := []string{"foo", "bar", "baz", "user:1", "session:abc", "a", "hello_world?", "é", "ключ"}
	tests := []struct {
		d    Distribution
		want []int
	}{
		{PeclStandardCRC32, []int{3, 3, 1, 2, 2, 3, 3, 1, 3}},
		{PeclStandardFNV, []int{3, 3, 3, 2, 1, 1, 1, 2, 2}},
		{PeclConsistentCRC32, []int{1, 1, 1, 1, 1, 1, 1, 2, 1}},
		{PeclConsistentFNV, []int{1, 1, 1, 1, 2, 1, 2, 1, 3}},
		{PeclSessionStandardCRC32, []int{2, 1, 3, 2, 2, 3, 2, 2, 3}},
		{PeclSessionStandardFNV, []int{2, 1, 2, 2, 1, 2, 2, 2, 2}},
		{PeclSessionConsistentCRC32, []int{3, 3, 2, 2, 2, 2, 1, 1, 3}},
		{PeclSessionConsistentFNV, []int{2, 1, 1, 2, 1, 1, 1, 1, 3}},
	}
	for _, tt := range tests {
		t.Run(string(tt.d), func(t *testing.T) {
			r := mustNew(t, tt.d, peersMembers(1, 2, 1))
			for i, k := range keys {
				if got := r.Owner(k) + 1; got != tt.want[i] {
					t.Errorf("Owner(%q) = .%d, want .%d", k, got, tt.want[i])
				}
			}
		})
	}
}

func TestPeclHashes(t *testing.T) {
	tests := []struct {
		h    peclHash
		in   string
		want uint32
	}{
		{peclCRC32, "", 0},
		{peclCRC32, "123456789", 0xCBF43926},
		{peclFNV, "", 0x811c9dc5},
		{peclFNV, "a", 0xe40c292c},
		{peclFNV, "foobar", 0xbf9cf968},
	}
	for _, tt := range tests {
		if got := newPeclState(tt.h).add(tt.in).sum(); got != tt.want {
			t.Errorf("hash %d of %q = %#x, want %#x", tt.h, tt.in, got, tt.want)
		}
	}
	// Candidates continue the key's state: "key-12" hashed in one go.
	for _, h := range []peclHash{peclCRC32, peclFNV} {
		s := newPeclState(h).add("key")
		if got, want := s.candidate(12), newPeclState(h).add("key-12").sum(); got != want {
			t.Errorf("hash %d: candidate(12) = %#x, want hash of %q = %#x", h, got, "key-12", want)
		}
		if got, want := s.addInt(-7).sum(), newPeclState(h).add("key-7").sum(); got != want {
			t.Errorf("hash %d: addInt(-7) = %#x, want %#x", h, got, want)
		}
	}
}

// TestPeclFNVSignExtends: pecl/memcache XORs each byte as a signed char
// widened to unsigned int, so a key with bytes >= 0x80 hashes differently
// from textbook FNV-1a; the interop test checks this against PHP.
func TestPeclFNVSignExtends(t *testing.T) {
	for _, k := range []string{"é", "ключ", "\xff"} {
		std := fnv.New32a()
		std.Write([]byte(k))
		if got := newPeclState(peclFNV).add(k).sum(); got == std.Sum32() {
			t.Errorf("FNV-1a(%q) = %#x, the unsigned-byte value; want the sign-extended one", k, got)
		}
	}
	std := fnv.New32a()
	std.Write([]byte("plain ascii"))
	if got := newPeclState(peclFNV).add("plain ascii").sum(); got != std.Sum32() {
		t.Errorf("FNV-1a of ASCII = %#x, want hash/fnv's %#x", got, std.Sum32())
	}
}

func TestPeclStandardBuckets(t *testing.T) {
	tests := []struct {
		name    string
		weights []int
		want    []int32
		total   uint64
	}{
		{"1,2,1", []int{1, 2, 1}, []int32{0, 1, 1, 2}, 4},
		{"weight 0 is 1", []int{0, 1}, []int32{0, 1}, 2},
		{"3", []int{3}, []int32{0, 0, 0}, 3},
	}
	for _, tt := range tests {
		ms := make([]Member, len(tt.weights))
		for i, w := range tt.weights {
			ms[i] = Member{fmt.Sprintf("h%d", i), 11211, w}
		}
		got, total := peclStandardBuckets(ms)
		if !slices.Equal(got, tt.want) || total != tt.total {
			t.Errorf("%s: peclStandardBuckets = %v, %d, want %v, %d", tt.name, got, total, tt.want, tt.total)
		}
	}
	// A total weight beyond the largest hash keeps only the buckets a
	// hash can reach, and still takes the modulo over the full total.
	big, total := peclStandardBuckets([]Member{{"a", 11211, 40000}, {"b", 11211, 5}})
	if len(big) != peclStandardSpan || total != 40005 || slices.Contains(big, 1) {
		t.Errorf("weights 40000,5: %d buckets (member 1 reachable: %v), total %d; want %d, false, 40005",
			len(big), slices.Contains(big, 1), total, peclStandardSpan)
	}
}

func TestPeclConsistentPoints(t *testing.T) {
	// The first point of 10.0.0.1:11211 is crc32("10.0.0.1:11211-0").
	base := newPeclState(peclCRC32).add("10.0.0.1").add(":").addInt(11211).add("-")
	if got, want := base.addInt(0).sum(), newPeclState(peclCRC32).add("10.0.0.1:11211-0").sum(); got != want {
		t.Errorf("first point = %#x, want %#x", got, want)
	}
	if _, _, err := peclConsistentBuckets([]Member{{"a", 1, 1 << 20}}, peclCRC32); err == nil {
		t.Errorf("peclConsistentBuckets(weight 1<<20) = nil error, want the points bound")
	}
}

// peclCandidates returns the owners of the servers pecl/memcache tries
// for key, in order and with repeats: find(key) (not for the session
// distributions), then find("key-0") … find("key-19"). Each is hashed from
// the text, independently of the package's incremental hashing.
func peclCandidates(r *Ring, key string) []int {
	var out []int
	if !r.pecl.session {
		out = append(out, int(r.pecl.find(newPeclState(r.pecl.hash).add(key).sum())))
	}
	for c := range peclFailoverAttempts {
		out = append(out, int(r.pecl.find(newPeclState(r.pecl.hash).add(fmt.Sprintf("%s-%d", key, c)).sum())))
	}
	return out
}

// TestPeclOwnersOrder checks the failover order against the candidates
// it is defined by: the key, then "key-0", "key-1", … (the session
// distributions skip the key), each new member once; past the 20th
// candidate the Memcache class gives up, while the session handler goes
// on with "key-20", "key-21", … until it has met every member.
func TestPeclOwnersOrder(t *testing.T) {
	ms := []Member{
		{"10.0.0.1", 11211, 1}, {"cache-b.example", 11211, 3}, {"10.0.0.3", 11212, 1},
		{"cache-d", 22122, 2}, {"192.168.7.20", 11211, 5},
	}
	for _, d := range peclDistributions() {
		t.Run(string(d), func(t *testing.T) {
			r := mustNew(t, d, ms)
			for _, k := range testKeys(500, 8) {
				if got, want := checkOwners(t, r, k), peclOrder(r, k); !slices.Equal(got, want) {
					t.Fatalf("Owners(%q) = %v, want %v", k, got, want)
				}
			}
		})
	}
}

// peclOrder is the failover order of key as pecl/memcache builds it,
// hashing each candidate "key-N" afresh: the distinct members of
// peclCandidates, for the session distributions those of "key-20",
// "key-21", … after them until every member is met (within
// peclSessionCandidates), then the members never met in index order.
func peclOrder(r *Ring, key string) []int {
	var order []int
	add := func(m int) {
		if !slices.Contains(order, m) {
			order = append(order, m)
		}
	}
	for _, m := range peclCandidates(r, key) {
		add(m)
	}
	for c := peclFailoverAttempts; r.pecl.session && len(order) < r.Len() && c < peclSessionCandidates; c++ {
		add(int(r.pecl.find(newPeclState(r.pecl.hash).add(fmt.Sprintf("%s-%d", key, c)).sum())))
	}
	for i := range r.Len() {
		add(i)
	}
	return order
}

// TestPeclSessionPast20 checks session keys whose 20 failover candidates
// all name one member: pecl/memcache's session handler writes the second
// copy (memcache.session_redundancy=2) to the member of the first later
// candidate that names another ("key-20", "key-21", …), not to the first
// member in index order. How many keys that happens to depends on the
// ring: the members here give some in 100,000 for three of the session
// distributions (pecl-session-standard-fnv has none with weights 1,3,1).
// TestPeclSessionInterop has PHP write such keys.
func TestPeclSessionPast20(t *testing.T) {
	ms := []Member{{"127.0.0.1", 11238, 1}, {"127.0.0.1", 11239, 3}, {"127.0.0.1", 11240, 1}}
	ids := sessionIDs(100000, 5)
	for _, d := range []Distribution{PeclSessionConsistentCRC32, PeclSessionConsistentFNV, PeclSessionStandardCRC32} {
		t.Run(string(d), func(t *testing.T) {
			r := mustNew(t, d, ms)
			keys := pastCandidates(r, ids, 20)
			if len(keys) == 0 {
				t.Fatalf("no id of %d has all 20 candidates on one member: nothing checked", len(ids))
			}
			for _, k := range keys {
				if got, want := checkOwners(t, r, k), peclOrder(r, k); !slices.Equal(got, want) {
					t.Errorf("Owners(%q) = %v, want %v (all 20 candidates name member %d)", k, got, want, want[0])
				}
			}
		})
	}
}

// pastCandidates returns up to max of ids whose 20 failover candidates
// ("id-0" … "id-19") all name one member of the session distribution r.
func pastCandidates(r *Ring, ids []string, max int) []string {
	var out []string
	for _, id := range ids {
		s := newPeclState(r.pecl.hash).add(id)
		first, c := r.pecl.find(s.candidate(0)), 1
		for c < peclFailoverAttempts && r.pecl.find(s.candidate(c)) == first {
			c++
		}
		if c == peclFailoverAttempts {
			if out = append(out, id); len(out) == max {
				break
			}
		}
	}
	return out
}

// TestPeclConsistentShares logs how far pecl/memcache's consistent shares
// are from the weights (the interop test shows PHP places keys the same
// way), and checks only that every member gets some keys.
func TestPeclConsistentShares(t *testing.T) {
	keys := testKeys(100000, 9)
	for _, d := range []Distribution{PeclConsistentCRC32, PeclConsistentFNV} {
		for _, ms := range [][]Member{peersMembers(1, 2, 1), peersMembers(1, 1, 1)} {
			r := mustNew(t, d, ms)
			counts := make([]float64, len(ms))
			for _, k := range keys {
				counts[r.Owner(k)]++
			}
			for i := range counts {
				if counts[i] == 0 {
					t.Errorf("%s: member %d owns no key of %d", d, i, len(keys))
				}
				counts[i] /= float64(len(keys))
			}
			t.Logf("%s weights %d,%d,%d: shares %.3f", d, ms[0].Weight, ms[1].Weight, ms[2].Weight, counts)
		}
	}
}

// FuzzPeclOwners checks the pecl/memcache failover order against its
// definition (peclCandidates) for fuzzed keys, server counts and weights,
// including weights whose total passes the standard strategy's 0x8000
// reachable buckets.
func FuzzPeclOwners(f *testing.F) {
	f.Add("foo", uint8(3), uint8(0), []byte{1, 2, 1})
	f.Add("hello_world?", uint8(5), uint8(3), []byte{1, 3, 1, 2, 5})
	f.Add("", uint8(1), uint8(6), []byte{})
	f.Add("\xff\x00é", uint8(70), uint8(1), []byte{0, 255})
	f.Add("k", uint8(2), uint8(4), []byte{255, 255})
	// Building a ring costs far more than a lookup, so rings are reused
	// while only the key mutates, as in FuzzOwners.
	var mu sync.Mutex
	rings := map[string]*Ring{}
	f.Fuzz(func(t *testing.T, key string, n, d uint8, weights []byte) {
		dist := peclDistributions()[int(d)%8]
		_, standard, _, _ := peclMode(dist)
		ms := make([]Member, 1+int(n)%80)
		for i := range ms {
			w := 1
			if len(weights) > 0 {
				w = int(weights[i%len(weights)]) % 5 // includes 0, treated as 1
				if standard {
					// Up to 76,500 per member, past the reachable buckets;
					// consistent rings that heavy would take the fuzzer's
					// time building points.
					w = int(weights[i%len(weights)]) * 300
				}
			}
			ms[i] = Member{fmt.Sprintf("h%d", i), 11211 + i%2, w}
		}
		id := fmt.Sprint(dist, ms)
		mu.Lock()
		r := rings[id]
		if r == nil {
			if len(rings) > 512 {
				clear(rings)
			}
			r = mustNew(t, dist, ms)
			rings[id] = r
		}
		mu.Unlock()
		got := checkOwners(t, r, key)
		if r.Len() == 1 {
			return
		}
		var want []int
		for _, m := range peclCandidates(r, key) {
			if !slices.Contains(want, m) {
				want = append(want, m)
			}
		}
		if !slices.Equal(got[:len(want)], want) {
			t.Fatalf("Owners(%q) = %v, want it to start with the candidates' order %v", key, got, want)
		}
	})
}
