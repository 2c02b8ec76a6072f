package connlist

import (
	"slices"
	"testing"
)

type conn struct {
	name  string
	links Links[conn]
}

// names walks l from its head and back from its tail, and fails t if the
// two walks disagree or an element's links name another list.
func names(t *testing.T, l *List[conn]) []string {
	t.Helper()
	var fwd, back []string
	for c := l.Front(); c != nil; c = c.links.Next() {
		if c.links.In() != l {
			t.Fatalf("%s is walked in a list it is not in", c.name)
		}
		fwd = append(fwd, c.name)
	}
	for a := l.tail; a != nil; a = a.prev {
		back = append(back, a.elem.name)
	}
	slices.Reverse(back)
	if !slices.Equal(fwd, back) {
		t.Fatalf("walked from the head %v, from the tail %v", fwd, back)
	}
	return fwd
}

// TestList: elements come out in the order they went in; taking one out
// from the head, the middle or the end leaves the others linked, and an
// element taken out can go into another list.
func TestList(t *testing.T) {
	tests := []struct {
		name   string
		remove []string
		want   []string
	}{
		{"none", nil, []string{"a", "b", "c"}},
		{"head", []string{"a"}, []string{"b", "c"}},
		{"middle", []string{"b"}, []string{"a", "c"}},
		{"tail", []string{"c"}, []string{"a", "b"}},
		{"all", []string{"b", "a", "c"}, nil},
		{"twice", []string{"b", "b"}, []string{"a", "c"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var l, other List[conn]
			byName := map[string]*conn{}
			for _, n := range []string{"a", "b", "c"} {
				c := &conn{name: n}
				byName[n] = c
				l.Push(c, &c.links)
			}
			for _, n := range tt.remove {
				byName[n].links.Remove()
				if byName[n].links.In() != nil {
					t.Fatalf("%s removed is still in a list", n)
				}
			}
			if got := names(t, &l); !slices.Equal(got, tt.want) {
				t.Errorf("list %v, want %v", got, tt.want)
			}
			for _, n := range tt.remove {
				if byName[n].links.In() == nil {
					other.Push(byName[n], &byName[n].links)
				}
			}
			if got := names(t, &other); len(got) != len(slices.Compact(slices.Clone(tt.remove))) {
				t.Errorf("the removed ones pushed on another list: %v, want %v", got, tt.remove)
			}
		})
	}
}

// TestMovesAllocateNothing: pushing and removing allocate nothing, the
// point of the links living in the elements.
func TestMovesAllocateNothing(t *testing.T) {
	var a, b List[conn]
	c, d := &conn{name: "c"}, &conn{name: "d"}
	a.Push(d, &d.links)
	if n := testing.AllocsPerRun(100, func() {
		a.Push(c, &c.links)
		c.links.Remove()
		b.Push(c, &c.links)
		_ = b.Front()
		c.links.Remove()
	}); n != 0 {
		t.Errorf("%v allocations a move, want 0", n)
	}
}
