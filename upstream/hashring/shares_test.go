package hashring

import (
	"math"
	"testing"
)

// TestShares checks Shares, computed from the ring, against the share of
// random keys Owner gives each member, for every distribution.
func TestShares(t *testing.T) {
	memberSets := []struct {
		name string
		ms   []Member
	}{
		{"one", peersMembers()[:1]},
		{"equal", peersMembers()},
		{"1,2,1", peersMembers(1, 2, 1)},
		{"1,3,1,2,5", []Member{
			{"10.0.0.1", 11211, 1}, {"cache-b.example", 11211, 3}, {"10.0.0.3", 11212, 1},
			{"cache-d", 22122, 2}, {"192.168.7.20", 11211, 5},
		}},
	}
	keys := testKeys(60000, 11)
	for _, d := range allDistributions() {
		for _, set := range memberSets {
			t.Run(string(d)+"/"+set.name, func(t *testing.T) {
				r := mustNew(t, d, set.ms)
				shares := r.Shares()
				if len(shares) != len(set.ms) {
					t.Fatalf("len(Shares()) = %d, want %d", len(shares), len(set.ms))
				}
				sum := 0.0
				for _, s := range shares {
					sum += s
				}
				if math.Abs(sum-1) > 1e-9 {
					t.Errorf("Shares() = %.4f sum to %v, want 1", shares, sum)
				}
				counts := make([]float64, len(set.ms))
				for _, k := range keys {
					counts[r.Owner(k)]++
				}
				for i, c := range counts {
					// 60000 keys: one standard deviation is below 0.002.
					if got := c / float64(len(keys)); math.Abs(got-shares[i]) > 0.01 {
						t.Errorf("member %d owns %.4f of the keys, Shares() says %.4f", i, got, shares[i])
					}
				}
			})
		}
	}
}

func TestSharesIsACopy(t *testing.T) {
	r := mustNew(t, Ketama, peersMembers())
	s := r.Shares()
	s[0] = 42
	if got := r.Shares()[0]; got == 42 {
		t.Errorf("Shares()[0] = %v after the caller changed its copy", got)
	}
}
