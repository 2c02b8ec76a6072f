// Package storetest provides an in-memory gateway Store for tests: a map
// with memcached's semantics for every verb and an error to inject, so
// that each outcome can be driven through HTTP without memcached.
package storetest

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"

	"github.com/memcgate/memcgate/upstream"
	"github.com/memcgate/memcgate/upstream/op"
)

// Store is an in-memory Store. Its zero value is not usable: use New.
// It is safe for concurrent use; tests that touch its fields while
// requests run hold Mu.
type Store struct {
	Mu    sync.Mutex
	Items map[string]op.Item // by key
	// Err, when set, is what every operation returns.
	Err error
	// Calls counts the operations run (Do, and GetMulti once per call).
	Calls int
	cas   uint64
}

// New returns an empty Store.
func New() *Store { return &Store{Items: map[string]op.Item{}} }

// Put stores it as Set would, outside any count.
func (s *Store) Put(it op.Item) {
	s.Mu.Lock()
	defer s.Mu.Unlock()
	s.put(it)
}

func (s *Store) put(it op.Item) {
	it.Value = bytes.Clone(it.Value) // a Store does not keep the caller's buffer
	s.cas++
	it.CAS = s.cas
	s.Items[it.Key] = it
}

// Up is false while Err says no node is available.
func (s *Store) Up(string) bool {
	s.Mu.Lock()
	defer s.Mu.Unlock()
	return !errors.Is(s.Err, upstream.ErrNoNodes)
}

// Do runs o on the map.
func (s *Store) Do(_ context.Context, o op.Op) op.Result {
	s.Mu.Lock()
	defer s.Mu.Unlock()
	s.Calls++
	if s.Err != nil {
		return op.Result{Err: s.Err}
	}
	key := o.Item.Key
	old, found := s.Items[key]
	switch o.Verb {
	case op.Get, op.GAT, op.Head, op.HeadTouch:
		if !found {
			return op.Result{Err: upstream.ErrNotFound}
		}
		if o.Verb == op.GAT || o.Verb == op.HeadTouch {
			old.Expiration = o.Item.Expiration
			s.Items[key] = old
		}
		if o.Verb.Reply() == op.Meta { // the size, not the value
			size := len(old.Value)
			old.Value = nil
			return op.Result{Item: old, N: uint64(size)}
		}
		return op.Result{Item: old}
	case op.Set:
		s.put(o.Item)
	case op.Add:
		if found {
			return op.Result{Err: upstream.ErrExists}
		}
		s.put(o.Item)
	case op.Replace, op.CAS:
		switch {
		case !found:
			return op.Result{Err: upstream.ErrNotFound}
		case o.Verb == op.CAS && old.CAS != o.Item.CAS:
			return op.Result{Err: upstream.ErrCASConflict}
		}
		s.put(o.Item)
	case op.Append, op.Prepend, op.AppendCAS, op.PrependCAS:
		switch {
		case !found:
			return op.Result{Err: upstream.ErrNotFound}
		case o.Verb.Unchecked() != o.Verb && old.CAS != o.Item.CAS:
			return op.Result{Err: upstream.ErrCASConflict}
		}
		if o.Verb.Unchecked() == op.Append {
			old.Value = append(bytes.Clone(old.Value), o.Item.Value...)
		} else {
			old.Value = append(bytes.Clone(o.Item.Value), old.Value...)
		}
		s.put(old)
	case op.Incr, op.Decr:
		if !found {
			return op.Result{Err: upstream.ErrNotFound}
		}
		v, err := strconv.ParseUint(strings.TrimSpace(string(old.Value)), 10, 64)
		if err != nil {
			return op.Result{Err: upstream.ErrNotNumeric}
		}
		if o.Verb == op.Incr {
			v += o.Delta
		} else {
			v -= min(v, o.Delta)
		}
		old.Value = []byte(strconv.FormatUint(v, 10))
		s.put(old)
		return op.Result{N: v}
	case op.Touch:
		if !found {
			return op.Result{Err: upstream.ErrNotFound}
		}
		old.Expiration = o.Item.Expiration
		s.Items[key] = old
	case op.Delete, op.DeleteCAS:
		switch {
		case !found:
			return op.Result{Err: upstream.ErrNotFound}
		case o.Verb == op.DeleteCAS && o.Item.CAS != 0 && old.CAS != o.Item.CAS:
			return op.Result{Err: upstream.ErrCASConflict}
		}
		delete(s.Items, key)
	default:
		return op.Result{Err: errors.New("storetest: no such verb " + o.Verb.String())}
	}
	return op.Result{}
}

// GetMulti reads keys, each once, keeping at most limit bytes of values,
// each held through room (if not nil) while it is handed out.
func (s *Store) GetMulti(_ context.Context, keys []string, limit int, room op.Room) (map[string]op.Item, map[string]error) {
	s.Mu.Lock()
	defer s.Mu.Unlock()
	s.Calls++
	found, failed := map[string]op.Item{}, map[string]error{}
	if s.Err != nil {
		for _, k := range keys {
			failed[k] = s.Err
		}
		return found, failed
	}
	kept := 0
	for _, k := range keys {
		it, ok := s.Items[k]
		if _, dup := found[k]; !ok || dup {
			continue
		}
		if limit > 0 && kept+len(it.Value) > limit {
			failed[k] = upstream.ErrOverLimit
			continue
		}
		if n := len(it.Value); room != nil && n > 0 {
			if !room.Reserve(n) {
				failed[k] = upstream.ErrNoFit
				continue
			}
			defer room.Release(n)
		}
		kept += len(it.Value)
		found[k] = it
	}
	return found, failed
}
