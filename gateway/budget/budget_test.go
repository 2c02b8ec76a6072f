package budget

import (
	"errors"
	"sync"
	"testing"
)

func TestBudget(t *testing.T) {
	tests := []struct {
		name    string
		limit   int64
		acquire []int64
		want    []error
		used    int64
	}{
		{"within", 100, []int64{40, 60}, []error{nil, nil}, 100},
		{"over", 100, []int64{60, 41, 40}, []error{nil, ErrExhausted, nil}, 100},
		{"unlimited", 0, []int64{1 << 40, 1 << 40}, []error{nil, nil}, 2 << 40},
		{"nothing", 10, []int64{0, -5}, []error{nil, nil}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := New(tt.limit)
			for i, n := range tt.acquire {
				if err := b.Acquire(n); !errors.Is(err, tt.want[i]) {
					t.Errorf("Acquire(%d) = %v, want %v", n, err, tt.want[i])
				}
			}
			if got := b.Used(); got != tt.used {
				t.Errorf("Used() = %d, want %d", got, tt.used)
			}
		})
	}
}

func TestBudgetForceAndRelease(t *testing.T) {
	b := New(10)
	b.Force(15)
	if err := b.Acquire(1); err == nil {
		t.Error("Acquire over a forced overdraft succeeded")
	}
	b.Release(15)
	if got, refused := b.Used(), b.Refused(); got != 0 || refused != 1 {
		t.Errorf("Used() = %d, Refused() = %d; want 0, 1", got, refused)
	}
	var nb *Budget
	if err := nb.Acquire(1 << 60); err != nil || nb.Used() != 0 {
		t.Errorf("nil budget: Acquire = %v, Used = %d", err, nb.Used())
	}
}

// TestBudgetConcurrent: however acquisitions interleave, what is held
// never passes the limit and every byte comes back.
func TestBudgetConcurrent(t *testing.T) {
	b := New(1000)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 10000 {
				if b.Acquire(7) == nil {
					if u := b.Used(); u > 1000+7*8 {
						t.Errorf("Used() = %d past the limit", u)
					}
					b.Release(7)
				}
			}
		})
	}
	wg.Wait()
	if u := b.Used(); u != 0 {
		t.Errorf("Used() = %d after every release", u)
	}
}

// TestOnFree: every change that may give room calls the functions
// OnFree was given, after Room shows it (a Release, an Acquire refused,
// a SetLimit), and nothing else does; stop ends the calls of its
// function alone.
func TestOnFree(t *testing.T) {
	b := New(100)
	var calls, others int
	var roomSeen int64
	stop := b.OnFree(func() { calls++; roomSeen = b.Room() })
	stopOther := b.OnFree(func() { others++ })
	defer stopOther()
	steps := []struct {
		name  string
		do    func()
		calls int
		room  int64 // Room as the call saw it
	}{
		{"acquire", func() { b.Acquire(60) }, 0, 0},
		{"force", func() { b.Force(10) }, 0, 0},
		{"refused", func() { b.Acquire(50) }, 1, 30},
		{"release", func() { b.Release(20) }, 2, 50},
		{"set limit", func() { b.SetLimit(200) }, 3, 150},
		{"release nothing", func() { b.Release(0) }, 3, 150},
	}
	for _, s := range steps {
		s.do()
		if calls != s.calls || calls > 0 && roomSeen != s.room {
			t.Fatalf("after %s: %d calls, room seen %d; want %d, %d", s.name, calls, roomSeen, s.calls, s.room)
		}
	}
	stop()
	b.Release(50)
	if calls != 3 || others != 4 {
		t.Errorf("after stop: %d calls of the stopped function, %d of the other; want 3 and 4", calls, others)
	}
	var nilBudget *Budget
	nilBudget.OnFree(func() { t.Error("a nil Budget called its function") })()
	nilBudget.Release(1)
}
