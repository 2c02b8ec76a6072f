package hashring

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
)

// peersMembers are the servers of peers.md §4.5, in the order added.
func peersMembers(weights ...int) []Member {
	ms := []Member{{"10.0.0.1", 11211, 1}, {"10.0.0.2", 11211, 1}, {"10.0.0.3", 11212, 1}}
	for i, w := range weights {
		ms[i].Weight = w
	}
	return ms
}

// allDistributions returns every Distribution.
func allDistributions() []Distribution {
	return append([]Distribution{Ketama, Modula, Nginx, Consistent}, peclDistributions()...)
}

func mustNew(tb testing.TB, d Distribution, ms []Member) *Ring {
	tb.Helper()
	r, err := New(d, ms)
	if err != nil {
		tb.Fatalf("New(%q, %d members): %v", d, len(ms), err)
	}
	return r
}

// TestVectors checks the verified placement vectors of peers.md §4.5
// (libmemcached 1.1.4 through memcached_server_by_key and
// memcached_generate_hash_value). Owners are 1-based there: .1, .2, .3.
func TestVectors(t *testing.T) {
	tests := []struct {
		key                    string
		md5, oaat              uint32
		ketama, ketama121, mod int
		consistent             int // "non-weighted ketama (PHP sessions)"
	}{
		{"foo", 3675831724, 596015325, 2, 2, 1, 2},
		{"bar", 421377335, 2151715081, 2, 2, 2, 1},
		{"baz", 2768240243, 4290121714, 1, 1, 2, 2},
		{"user:1", 282964413, 2773942091, 2, 2, 3, 1},
		{"session:abc", 226189362, 3277896960, 3, 3, 1, 3},
		{"a", 3111502092, 3392050242, 2, 2, 1, 1},
		{"hello world?", 2147933553, 665399681, 3, 2, 3, 1},
	}
	ketama := mustNew(t, Ketama, peersMembers())
	ketama121 := mustNew(t, Ketama, peersMembers(1, 2, 1))
	modula := mustNew(t, Modula, peersMembers())
	// Weights do not matter to Consistent.
	consistent := mustNew(t, Consistent, peersMembers(1, 2, 1))
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			if got := md5KeyHash(tt.key); got != tt.md5 {
				t.Errorf("md5KeyHash(%q) = %d, want %d", tt.key, got, tt.md5)
			}
			if got := oneAtATime(tt.key); got != tt.oaat {
				t.Errorf("oneAtATime(%q) = %d, want %d", tt.key, got, tt.oaat)
			}
			if got := ketama.Owner(tt.key); got != tt.ketama-1 {
				t.Errorf("ketama 1,1,1: Owner(%q) = %d, want %d", tt.key, got, tt.ketama-1)
			}
			if got := ketama121.Owner(tt.key); got != tt.ketama121-1 {
				t.Errorf("ketama 1,2,1: Owner(%q) = %d, want %d", tt.key, got, tt.ketama121-1)
			}
			if got := modula.Owner(tt.key); got != tt.mod-1 {
				t.Errorf("modula: Owner(%q) = %d, want %d", tt.key, got, tt.mod-1)
			}
			if got := consistent.Owner(tt.key); got != tt.consistent-1 {
				t.Errorf("consistent: Owner(%q) = %d, want %d", tt.key, got, tt.consistent-1)
			}
		})
	}
}

func TestKetamaDigestPoints(t *testing.T) {
	s := ketamaPointString(nil, Member{Host: "10.0.0.1", Port: 11211}, 0)
	if string(s) != "10.0.0.1-0" {
		t.Fatalf("ketamaPointString = %q, want %q", s, "10.0.0.1-0")
	}
	want := [4]uint32{563378236, 920037467, 4058903954, 1084864719}
	if got := ketamaDigestPoints(s); got != want {
		t.Errorf("ketamaDigestPoints(%q) = %v, want %v", s, got, want)
	}
}

func TestKetamaPointString(t *testing.T) {
	tests := []struct {
		m    Member
		i    int
		want string
	}{
		{Member{Host: "10.0.0.1", Port: 11211}, 0, "10.0.0.1-0"},
		{Member{Host: "10.0.0.3", Port: 11212}, 39, "10.0.0.3:11212-39"},
		{Member{Host: "cache-a.example", Port: 11211}, 7, "cache-a.example-7"},
		{Member{Host: "/var/run/memcached.sock", Port: 0}, 1, "/var/run/memcached.sock:0-1"},
	}
	for _, tt := range tests {
		if got := string(ketamaPointString(nil, tt.m, tt.i)); got != tt.want {
			t.Errorf("ketamaPointString(%+v, %d) = %q, want %q", tt.m, tt.i, got, tt.want)
		}
	}
}

// TestKetamaPointCount pins libmemcached's single-precision arithmetic: with
// equal weights most server counts give 160 points, but 25 servers give 156
// each (0.04f * 40 * 25 rounds to 39.999996).
func TestKetamaPointCount(t *testing.T) {
	tests := []struct {
		w, total uint64
		n        int
		want     int
	}{
		{1, 3, 3, 160},
		{1, 4, 3, 120},
		{2, 4, 3, 240},
		{1, 24, 24, 160},
		{1, 25, 25, 156},
		{1, 26, 26, 160},
		{1, 47, 47, 156},
		{1, 64, 64, 160},
		{5, 12, 5, 332},
		{1, 12, 5, 64},
		{1, 100001, 2, 0},
	}
	for _, tt := range tests {
		if got := ketamaPointCount(tt.w, tt.total, tt.n); got != tt.want {
			t.Errorf("ketamaPointCount(%d, %d, %d) = %d, want %d", tt.w, tt.total, tt.n, got, tt.want)
		}
	}
}

func TestNew(t *testing.T) {
	tests := []struct {
		name    string
		d       Distribution
		ms      []Member
		points  int
		wantErr string
	}{
		{"ketama", Ketama, peersMembers(), 480, ""},
		{"ketama 1,2,1", Ketama, peersMembers(1, 2, 1), 120 + 240 + 120, ""},
		{"ketama weight 0 is 1", Ketama, peersMembers(0, -3, 1), 480, ""},
		{"modula", Modula, peersMembers(), 0, ""},
		{"nginx", Nginx, peersMembers(1, 2, 1), 4 * 160, ""},
		{"consistent ignores weights", Consistent, peersMembers(1, 2, 1), 300, ""},
		{"pecl standard", PeclStandardCRC32, peersMembers(1, 2, 1), 0, ""},
		{"pecl consistent", PeclConsistentFNV, peersMembers(1, 2, 1), 4 * 160, ""},
		{"pecl session consistent", PeclSessionConsistentCRC32, peersMembers(1, 3, 1), 5 * 160, ""},
		{"pecl consistent too heavy", PeclConsistentCRC32, peersMembers(1<<20, 1), 0, "hashring: pecl/memcache consistent ring of total weight 1048578 needs more than 16777216 points"},
		{"no members", Ketama, nil, 0, "hashring: no members"},
		{"unknown", Distribution("rendezvous"), peersMembers(), 0, `hashring: unknown distribution "rendezvous"`},
		{"empty distribution", "", peersMembers(), 0, `hashring: unknown distribution ""`},
		{"nginx too heavy", Nginx, peersMembers(1<<20, 1), 0, "hashring: nginx ring of total weight 1048578 needs more than 16777216 points"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := New(tt.d, tt.ms)
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr {
					t.Fatalf("New() error = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("New() error = %v", err)
			}
			if got := r.Len(); got != len(tt.ms) {
				t.Errorf("Len() = %d, want %d", got, len(tt.ms))
			}
			if got := r.Points(); got != tt.points {
				t.Errorf("Points() = %d, want %d", got, tt.points)
			}
		})
	}
}

func TestNginxServerName(t *testing.T) {
	tests := []struct {
		m          Member
		name       string
		host, port string
	}{
		{Member{Host: "10.0.0.1", Port: 11211}, "10.0.0.1:11211", "10.0.0.1", "11211"},
		{Member{Host: "cache-a.example", Port: 22122}, "cache-a.example:22122", "cache-a.example", "22122"},
		{Member{Host: "::1", Port: 11211}, "[::1]:11211", "[::1]", "11211"},
		{Member{Host: "[fe80::1]", Port: 11211}, "[fe80::1]:11211", "[fe80::1]", "11211"},
		{Member{Host: "10.0.0.1"}, "10.0.0.1", "10.0.0.1", ""},
		{Member{Host: "unix:/run/mc.sock"}, "unix:/run/mc.sock", "/run/mc.sock", ""},
		{Member{Host: "UNIX:/run/mc.sock"}, "UNIX:/run/mc.sock", "/run/mc.sock", ""},
		{Member{Host: "a:b"}, "a:b", "a:b", ""},
	}
	for _, tt := range tests {
		name := nginxServerName(tt.m)
		if name != tt.name {
			t.Errorf("nginxServerName(%+v) = %q, want %q", tt.m, name, tt.name)
		}
		if host, port := nginxSplit(name); host != tt.host || port != tt.port {
			t.Errorf("nginxSplit(%q) = %q, %q, want %q, %q", name, host, port, tt.host, tt.port)
		}
	}
}

// TestNginxVectors pins nginx-mode placements for the §4.5 servers with
// weights 1,2,1. They come from this implementation, which TestNginxInterop
// checks against nginx 1.22.1 itself (10.0.0.x cannot be proxied to here).
func TestNginxVectors(t *testing.T) {
	tests := []struct {
		key  string
		want int
	}{
		{"foo", 1},
		{"bar", 1},
		{"baz", 0},
		{"user:1", 2},
		{"session:abc", 1},
		{"a", 2},
		{"hello world?", 1},
	}
	r := mustNew(t, Nginx, peersMembers(1, 2, 1))
	for _, tt := range tests {
		if got := r.Owner(tt.key); got != tt.want {
			t.Errorf("Owner(%q) = %d, want %d", tt.key, got, tt.want)
		}
	}
	if got, want := crc32KeyHash("123456789"), uint32(0xCBF43926); got != want {
		t.Errorf("crc32KeyHash(%q) = %#x, want %#x", "123456789", got, want)
	}
}

func TestOneAtATimeSignExtends(t *testing.T) {
	// "é" is C3 A9. libhashkit adds (uint32_t)(char)0xC3 = 0xFFFFFFC3 on
	// signed-char platforms; the php interop test checks this against PHP.
	var unsigned uint32
	for _, c := range []byte("é") {
		unsigned += uint32(c)
		unsigned += unsigned << 10
		unsigned ^= unsigned >> 6
	}
	unsigned += unsigned << 3
	unsigned ^= unsigned >> 11
	unsigned += unsigned << 15
	if got := oneAtATime("é"); got == unsigned {
		t.Errorf("oneAtATime(%q) = %d, the unsigned-char value; want the sign-extended one", "é", got)
	}
}

func testKeys(n int, seed uint64) []string {
	rng := rand.New(rand.NewPCG(seed, 0))
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("key:%d:%x", i, rng.Uint64())
	}
	return keys
}

func collect(r *Ring, key string) []int {
	var got []int
	for i := range r.Owners(key) {
		got = append(got, i)
	}
	return got
}

func without(ms []Member, dead ...int) (rest []Member, index []int) {
	for i, m := range ms {
		if !slices.Contains(dead, i) {
			rest = append(rest, m)
			index = append(index, i)
		}
	}
	return rest, index
}

// TestRemoveMember checks the failover property documented on Owners:
// removing members moves only their keys, and each lands on the first live
// member Owners yields.
func TestRemoveMember(t *testing.T) {
	mixed := []Member{
		{"10.0.0.1", 11211, 1}, {"cache-b.example", 11211, 3}, {"10.0.0.3", 11212, 1},
		{"cache-d", 22122, 2}, {"192.168.7.20", 11211, 5},
	}
	equal := func(n int) []Member {
		ms := make([]Member, n)
		for i := range ms {
			ms[i] = Member{fmt.Sprintf("10.1.0.%d", i+1), 11211, 1}
		}
		return ms
	}
	tests := []struct {
		name string
		d    Distribution
		ms   []Member
		dead []int
	}{
		{"ketama equal 3 minus 1", Ketama, peersMembers(), []int{1}},
		{"ketama equal 5 minus 0", Ketama, equal(5), []int{0}},
		{"ketama equal 5 minus 4", Ketama, equal(5), []int{4}},
		{"ketama equal 16 minus 3 and 9", Ketama, equal(16), []int{3, 9}},
		{"ketama equal 64 minus 10", Ketama, equal(64), []int{10}},
		{"nginx mixed minus 1", Nginx, mixed, []int{1}},
		{"nginx mixed minus 4", Nginx, mixed, []int{4}},
		{"nginx mixed minus 0 and 3", Nginx, mixed, []int{0, 3}},
		{"consistent mixed minus 1", Consistent, mixed, []int{1}},
		{"consistent equal 16 minus 3 and 9", Consistent, equal(16), []int{3, 9}},
	}
	keys := testKeys(20000, 1)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			full := mustNew(t, tt.d, tt.ms)
			rest, index := without(tt.ms, tt.dead...)
			small := mustNew(t, tt.d, rest)
			if tt.d == Nginx && full.Points() != 160*totalWeight(tt.ms) {
				t.Fatalf("test ring has a CRC32 collision; pick other members")
			}
			moved := 0
			for _, k := range keys {
				var live int = -1
				for i := range full.Owners(k) {
					if !slices.Contains(tt.dead, i) {
						live = i
						break
					}
				}
				owner := full.Owner(k)
				got := index[small.Owner(k)]
				if got != live {
					t.Fatalf("Owner(%q) without %v = %d, want first live of Owners = %d", k, tt.dead, got, live)
				}
				if slices.Contains(tt.dead, owner) {
					moved++
				} else if got != owner {
					t.Fatalf("Owner(%q) moved from %d to %d though %d is alive", k, owner, got, owner)
				}
			}
			t.Logf("%d of %d keys moved", moved, len(keys))
		})
	}
}

// TestRemoveMemberKetamaLimits documents where the ketama property stops:
// with 25 equal members each has 156 points but with 24 each has 160, and
// with unequal weights every survivor's count changes.
func TestRemoveMemberKetamaLimits(t *testing.T) {
	// The equal-weight ring sizes n <= 64 listed in the Owners doc, where
	// one dead member changes the survivors' point counts.
	var changes []int
	for n := 2; n <= 64; n++ {
		if ketamaPointCount(1, uint64(n), n) != ketamaPointCount(1, uint64(n-1), n-1) {
			changes = append(changes, n)
		}
	}
	if want := []int{25, 26, 47, 48, 50, 51, 55, 56, 61, 62}; !slices.Equal(changes, want) {
		t.Errorf("equal-weight sizes whose point count changes with one member less = %v, want %v", changes, want)
	}
	ms := peersMembers(1, 2, 1)
	full := mustNew(t, Ketama, ms)
	small := mustNew(t, Ketama, ms[1:])
	differ := 0
	for _, k := range testKeys(5000, 2) {
		var second int
		for i := range full.Owners(k) {
			if i != 0 {
				second = i
				break
			}
		}
		if 1+small.Owner(k) != second {
			differ++
		}
	}
	if differ == 0 {
		t.Errorf("ketama 1,2,1 minus member 0 agreed with Owners for every key; the documented limit is wrong")
	}
}

func totalWeight(ms []Member) int {
	t := 0
	for _, m := range ms {
		t += int(m.weight())
	}
	return t
}

func TestWeightShares(t *testing.T) {
	tests := []struct {
		name string
		d    Distribution
		ms   []Member
		tol  float64 // allowed |got-want|/want
	}{
		{"ketama 1,2,1", Ketama, peersMembers(1, 2, 1), 0.2},
		{"ketama 1,3,1,2,5", Ketama, []Member{
			{"10.0.0.1", 11211, 1}, {"cache-b.example", 11211, 3}, {"10.0.0.3", 11212, 1},
			{"cache-d", 22122, 2}, {"192.168.7.20", 11211, 5},
		}, 0.2},
		{"nginx 1,2,1", Nginx, peersMembers(1, 2, 1), 0.2},
		{"modula", Modula, peersMembers(1, 2, 1), 0.05},        // weights ignored
		{"consistent", Consistent, peersMembers(1, 2, 1), 0.2}, // weights ignored
		{"pecl standard crc32 1,2,1", PeclStandardCRC32, peersMembers(1, 2, 1), 0.05},
		{"pecl standard fnv 1,2,1", PeclStandardFNV, peersMembers(1, 2, 1), 0.05},
		// No pecl consistent rows: its points hash strings that differ only
		// in their last digits, which CRC-32 and FNV-1a spread poorly, so
		// its shares are far from the weights (TestPeclConsistentShares).
	}
	keys := testKeys(100000, 3)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := mustNew(t, tt.d, tt.ms)
			counts := make([]int, len(tt.ms))
			for _, k := range keys {
				counts[r.Owner(k)]++
			}
			total := float64(totalWeight(tt.ms))
			for i, c := range counts {
				want := float64(tt.ms[i].weight()) / total
				if tt.d == Modula || tt.d == Consistent {
					want = 1 / float64(len(tt.ms))
				}
				got := float64(c) / float64(len(keys))
				if d := (got - want) / want; d > tt.tol || d < -tt.tol {
					t.Errorf("member %d share = %.3f, want %.3f ± %.0f%%", i, got, want, 100*tt.tol)
				}
			}
		})
	}
}

func TestOwnersEachOnce(t *testing.T) {
	keys := testKeys(300, 4)
	for _, d := range allDistributions() {
		for _, n := range []int{1, 2, 3, 16, 64, 65, 130} {
			t.Run(fmt.Sprintf("%s/%d", d, n), func(t *testing.T) {
				ms := make([]Member, n)
				for i := range ms {
					ms[i] = Member{fmt.Sprintf("node-%d", i), 11211 + i%3, 1 + i%3}
				}
				r := mustNew(t, d, ms)
				for _, k := range keys {
					checkOwners(t, r, k)
				}
			})
		}
	}
}

// TestOwnersPointless covers members that get no ketama points at all.
func TestOwnersPointless(t *testing.T) {
	ms := []Member{{"big", 11211, 100000}, {"tiny", 11211, 1}, {"tiny2", 11211, 1}}
	r := mustNew(t, Ketama, ms)
	// big: floor(100000/100002*40*3) = 119 groups; the tiny ones get none.
	if got, want := r.Points(), 119*4; got != want {
		t.Errorf("Points() = %d, want %d", got, want)
	}
	for _, k := range testKeys(50, 5) {
		got := checkOwners(t, r, k)
		if want := []int{0, 1, 2}; !slices.Equal(got, want) {
			t.Errorf("Owners(%q) = %v, want %v", k, got, want)
		}
	}
}

func checkOwners(t *testing.T, r *Ring, key string) []int {
	t.Helper()
	got := collect(r, key)
	if len(got) != r.Len() {
		t.Fatalf("Owners(%q) yielded %d members, want %d: %v", key, len(got), r.Len(), got)
	}
	seen := make([]bool, r.Len())
	for _, i := range got {
		if i < 0 || i >= r.Len() || seen[i] {
			t.Fatalf("Owners(%q) = %v: %d out of range or repeated", key, got, i)
		}
		seen[i] = true
	}
	if got[0] != r.Owner(key) {
		t.Fatalf("Owners(%q)[0] = %d, want Owner = %d", key, got[0], r.Owner(key))
	}
	// Breaking early must stop the walk.
	calls := 0
	for range r.Owners(key) {
		calls++
		break
	}
	if calls != 1 {
		t.Fatalf("Owners(%q) yielded %d times after break", key, calls)
	}
	return got
}

func TestOwnersModulaOrder(t *testing.T) {
	r := mustNew(t, Modula, peersMembers())
	tests := []struct {
		key  string
		want []int
	}{
		{"foo", []int{0, 1, 2}},
		{"bar", []int{1, 2, 0}},
		{"user:1", []int{2, 0, 1}},
	}
	for _, tt := range tests {
		if got := collect(r, tt.key); !slices.Equal(got, tt.want) {
			t.Errorf("Owners(%q) = %v, want %v", tt.key, got, tt.want)
		}
	}
}

func TestNoAllocs(t *testing.T) {
	long := strings.Repeat("k", 250)
	for _, d := range allDistributions() {
		for _, n := range []int{3, 64} {
			r := mustNew(t, d, benchMembers(n))
			sink := 0
			if a := testing.AllocsPerRun(100, func() { sink += r.Owner(long) }); a != 0 {
				t.Errorf("%s/%d: Owner allocates %v times, want 0", d, n, a)
			}
			if a := testing.AllocsPerRun(100, func() {
				for i := range r.Owners(long) {
					sink += i
				}
			}); a != 0 {
				t.Errorf("%s/%d: ranging over Owners allocates %v times, want 0", d, n, a)
			}
		}
	}
}

func FuzzOwners(f *testing.F) {
	f.Add("foo", uint8(3), uint8(0), []byte{1, 2, 1})
	f.Add("hello world?", uint8(5), uint8(1), []byte{1, 3, 1, 2, 5})
	f.Add("", uint8(1), uint8(2), []byte{})
	f.Add("\xff\x00é", uint8(70), uint8(0), []byte{0, 255})
	f.Add(strings.Repeat("z", 300), uint8(65), uint8(2), []byte{3})
	// Building a ring costs far more than a lookup, so rings are reused
	// while only the key mutates.
	var mu sync.Mutex
	rings := map[string]*Ring{}
	f.Fuzz(func(t *testing.T, key string, n, d uint8, weights []byte) {
		ms := make([]Member, 1+int(n)%80)
		dists := allDistributions()
		id := []byte{d % byte(len(dists))}
		for i := range ms {
			w := 1
			if len(weights) > 0 {
				w = int(weights[i%len(weights)]) % 5 // includes 0, treated as 1
			}
			ms[i] = Member{fmt.Sprintf("h%d", i), 11211 + i%2, w}
			id = append(id, byte(w))
		}
		mu.Lock()
		r := rings[string(id)]
		if r == nil {
			if len(rings) > 512 {
				clear(rings)
			}
			r = mustNew(t, dists[int(d)%len(dists)], ms)
			rings[string(id)] = r
		}
		mu.Unlock()
		checkOwners(t, r, key)
	})
}

func benchMembers(n int) []Member {
	ms := make([]Member, n)
	for i := range ms {
		ms[i] = Member{fmt.Sprintf("10.2.%d.%d", i/250, i%250+1), 11211, 1}
	}
	return ms
}

func BenchmarkOwner(b *testing.B) {
	keys := testKeys(1024, 6)
	for _, d := range allDistributions() {
		for _, n := range []int{3, 16, 64} {
			b.Run(fmt.Sprintf("%s/%d", d, n), func(b *testing.B) {
				r := mustNew(b, d, benchMembers(n))
				b.ReportAllocs()
				i, sink := 0, 0
				for b.Loop() {
					sink += r.Owner(keys[i%len(keys)])
					i++
				}
				_ = sink
			})
		}
	}
}

// BenchmarkOwners ranges over all members, the worst case of a failover.
func BenchmarkOwners(b *testing.B) {
	keys := testKeys(1024, 7)
	for _, d := range allDistributions() {
		for _, n := range []int{3, 16, 64} {
			b.Run(fmt.Sprintf("%s/%d", d, n), func(b *testing.B) {
				r := mustNew(b, d, benchMembers(n))
				b.ReportAllocs()
				i, sink := 0, 0
				for b.Loop() {
					for m := range r.Owners(keys[i%len(keys)]) {
						sink += m
					}
					i++
				}
				_ = sink
			})
		}
	}
}
