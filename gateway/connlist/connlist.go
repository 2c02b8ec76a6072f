// Package connlist keeps connections in lists in the order they went in,
// each in one list at most, linked through fields of the connections
// themselves: putting one in, taking it out or moving it allocates
// nothing, so a connection cap can follow every connection's state
// changes and find the one to close first (the head of a list). It owns
// no lock: its users guard a connection's Links and the lists it may be
// in with one mutex.
package connlist

// Links are an element's place in a List, embedded in the element (or a
// field of it). The zero value is in no list. They must not be copied
// while in one.
type Links[T any] struct {
	in         *List[T]
	prev, next *Links[T]
	elem       *T
}

// In returns the list the element is in, nil if none.
func (a *Links[T]) In() *List[T] { return a.in }

// Next returns the element after this one in its list, nil at its end
// or if it is in none.
func (a *Links[T]) Next() *T {
	return elemOf(a.next)
}

// Prev returns the element before this one in its list, nil at its head
// or if it is in none.
func (a *Links[T]) Prev() *T {
	return elemOf(a.prev)
}

// Remove takes the element out of the list it is in; in none, it does
// nothing.
func (a *Links[T]) Remove() {
	l := a.in
	if l == nil {
		return
	}
	if a.prev != nil {
		a.prev.next = a.next
	} else {
		l.head = a.next
	}
	if a.next != nil {
		a.next.prev = a.prev
	} else {
		l.tail = a.prev
	}
	a.in, a.prev, a.next, a.elem = nil, nil, nil, nil
}

// List is a list of elements in the order they were pushed. The zero
// value is an empty list. It must not be copied.
type List[T any] struct{ head, tail *Links[T] }

// Push puts e, whose Links are a, at the end of l. e must be in no list
// (Links.Remove first).
func (l *List[T]) Push(e *T, a *Links[T]) {
	a.in, a.prev, a.next, a.elem = l, l.tail, nil, e
	if l.tail != nil {
		l.tail.next = a
	} else {
		l.head = a
	}
	l.tail = a
}

// Front returns the element at the head of l, the first pushed of those
// in it; nil if l is empty.
func (l *List[T]) Front() *T {
	return elemOf(l.head)
}

// Back returns the element at the end of l, the last pushed of those in
// it; nil if l is empty.
func (l *List[T]) Back() *T {
	return elemOf(l.tail)
}

// elemOf returns the element whose Links are a, nil for nil.
func elemOf[T any](a *Links[T]) *T {
	if a == nil {
		return nil
	}
	return a.elem
}
