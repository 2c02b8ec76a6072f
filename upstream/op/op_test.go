package op

import "testing"

func TestEncode(t *testing.T) {
	it := Item{Value: []byte("hello"), Flags: 7, Expiration: 60, CAS: 99}
	tests := []struct {
		o    Op
		want string
	}{
		{Op{Verb: Get}, "gets k\r\n"},
		{Op{Verb: GAT, Item: Item{Expiration: 300}}, "gats 300 k\r\n"},
		{Op{Verb: Set, Item: it}, "set k 7 60 5\r\nhello\r\n"},
		{Op{Verb: Add, Item: it}, "add k 7 60 5\r\nhello\r\n"},
		{Op{Verb: Replace, Item: it}, "replace k 7 60 5\r\nhello\r\n"},
		{Op{Verb: CAS, Item: it}, "cas k 7 60 5 99\r\nhello\r\n"},
		{Op{Verb: Append, Item: it}, "append k 7 60 5\r\nhello\r\n"},
		{Op{Verb: Prepend, Item: Item{Value: []byte{}}}, "prepend k 0 0 0\r\n\r\n"},
		{Op{Verb: Incr, Delta: 18446744073709551615}, "incr k 18446744073709551615\r\n"},
		{Op{Verb: Decr, Delta: 1}, "decr k 1\r\n"},
		{Op{Verb: Touch, Item: Item{Expiration: -1}}, "touch k -1\r\n"},
		{Op{Verb: Delete}, "delete k\r\n"},
		{Op{Verb: Head, Item: it}, "mg k s f c\r\n"},
		{Op{Verb: HeadTouch, Item: Item{Expiration: -1}}, "mg k s f c T-1\r\n"},
		// Flags and expiration are the item's, as for append: not sent.
		{Op{Verb: AppendCAS, Item: it}, "ms k 5 MA C99\r\nhello\r\n"},
		{Op{Verb: PrependCAS, Item: Item{Value: []byte{}, CAS: 18446744073709551615}}, "ms k 0 MP C18446744073709551615\r\n\r\n"},
		{Op{Verb: DeleteCAS, Item: it}, "md k C99\r\n"},
		// No CAS: deleted only if the item exists (If-Match: *).
		{Op{Verb: DeleteCAS}, "md k\r\n"},
	}
	for _, tt := range tests {
		if got := string(Encode([]byte(">"), &tt.o, "k")); got != ">"+tt.want {
			t.Errorf("Encode(%v) = %q, want %q", tt.o.Verb, got, ">"+tt.want)
		}
		got := string(EncodeHead([]byte(">"), &tt.o, "k"))
		if tt.o.Verb.TakesValue() {
			got += string(tt.o.Item.Value) + "\r\n"
		}
		if got != ">"+tt.want {
			t.Errorf("EncodeHead(%v) and its value = %q, want %q", tt.o.Verb, got, ">"+tt.want)
		}
	}
}

// TestVerbs: every verb has a row, its name parses back to it, and a
// verb that writes is never one that sends nothing to write but a key.
func TestVerbs(t *testing.T) {
	for _, v := range Verbs() {
		if v.String() == "" || v.Command() == "" {
			t.Errorf("verb %d has no row", v)
		}
		if Parse(v.String()) != v {
			t.Errorf("Parse(%q) = %v, want %v", v.String(), Parse(v.String()), v)
		}
	}
	for _, name := range []string{"", "gets", "GET", "flush_all", "invalid"} {
		if v := Parse(name); v.Valid() {
			t.Errorf("Parse(%q) = %v, want no verb", name, v)
		}
	}
	if Verb(0).Valid() || Verb(MaxVerb+1).Valid() || !Verb(MaxVerb).Valid() {
		t.Error("Valid is wrong at the table's ends")
	}
}

// TestUnchecked: the verbs with a CAS check name the one without it,
// which sends the same value; the rest are their own.
func TestUnchecked(t *testing.T) {
	tests := []struct{ v, want Verb }{
		{CAS, Set}, {AppendCAS, Append}, {PrependCAS, Prepend}, {DeleteCAS, Delete},
		{Append, Append}, {Set, Set}, {Get, Get}, {Head, Head},
	}
	for _, tt := range tests {
		if got := tt.v.Unchecked(); got != tt.want {
			t.Errorf("%v.Unchecked() = %v, want %v", tt.v, got, tt.want)
		}
	}
	for _, v := range Verbs() {
		if u := v.Unchecked(); u.Unchecked() != u || u.TakesValue() != v.TakesValue() || u.Writes() != v.Writes() {
			t.Errorf("%v.Unchecked() = %v, which is checked or sends something else", v, u)
		}
	}
}
