package listen

import (
	"math"
	"testing"
)

func TestConnCap(t *testing.T) {
	for _, tc := range []struct {
		setting int
		nofile  uint64
		want    int
	}{
		{setting: 100, nofile: 1024, want: 100},
		{setting: 5000, nofile: 1024, want: 5000}, // as set (the start logs a warning)
		{setting: -1, nofile: 1024, want: 0},
		{setting: 0, nofile: 0, want: 0}, // unlimited or unknown
		{setting: 0, nofile: 256, want: 192},
		{setting: 0, nofile: 1024, want: 768},
		{setting: 0, nofile: 524288, want: 524288 - 4096},
		{setting: 0, nofile: math.MaxUint64, want: math.MaxInt32}, // RLIM_INFINITY: an int on 32-bit too
	} {
		if got := ConnCap(tc.setting, tc.nofile); got != tc.want {
			t.Errorf("ConnCap(%d, %d) = %d, want %d", tc.setting, tc.nofile, got, tc.want)
		}
	}
}
