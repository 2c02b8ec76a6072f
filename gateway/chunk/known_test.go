package chunk

import (
	"context"
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memcgate/memcgate/upstream/op"
)

// TestKnown: a key added is known until forgotten; forgetting a key
// whose word another key took leaves that key known.
func TestKnown(t *testing.T) {
	v := New(nopStore{}, Options{ChunkSize: raceChunk}, prometheus.NewRegistry())
	k := &v.known
	if k.has("a") {
		t.Fatal("a key is known before any was added")
	}
	k.add("a")
	if !k.has("a") || k.has("b") {
		t.Fatalf("after add(a): has(a) %v, has(b) %v", k.has("a"), k.has("b"))
	}
	// A key in a's word (found by trying): it takes the word, and a is
	// forgotten; forgetting a then leaves it.
	w := k.hash("a") % knownWords
	other := ""
	for i := 0; other == ""; i++ {
		if s := strconv.Itoa(i); k.hash(s)%knownWords == w {
			other = s
		}
	}
	k.add(other)
	k.forget("a")
	if k.has("a") || !k.has(other) {
		t.Fatalf("after add(%s), forget(a): has(a) %v, has(%s) %v", other, k.has("a"), other, k.has(other))
	}
	k.forget(other)
	if k.has(other) {
		t.Fatalf("%s is still known after forget", other)
	}
}

// nopStore answers every operation at once with nothing: what a Store
// costs is not measured.
type nopStore struct{}

func (nopStore) Do(context.Context, op.Op) op.Result { return op.Result{} }

// BenchmarkSmallSet is what Values.Do adds to a small set, with values
// in chunks on, over the Store's own Do: for a key never seen holding an
// index, with no index seen at all (no table yet) and with the table
// allocated. (With values in chunks off the gateway's sets do not go
// through Values.)
func BenchmarkSmallSet(b *testing.B) {
	ctx := context.Background()
	o := op.Op{Verb: op.Set, Item: op.Item{Key: "user:12345:profile", Value: []byte("small value")}}
	b.Run("store", func(b *testing.B) {
		var s Store = nopStore{}
		b.ReportAllocs()
		for b.Loop() {
			s.Do(ctx, o)
		}
	})
	b.Run("values, no index seen", func(b *testing.B) {
		v := New(nopStore{}, Options{ChunkSize: raceChunk}, prometheus.NewRegistry())
		b.ReportAllocs()
		for b.Loop() {
			v.Do(ctx, o)
		}
	})
	b.Run("values, other keys seen", func(b *testing.B) {
		v := New(nopStore{}, Options{ChunkSize: raceChunk}, prometheus.NewRegistry())
		v.Saw("big")
		b.ReportAllocs()
		for b.Loop() {
			v.Do(ctx, o)
		}
	})
}
