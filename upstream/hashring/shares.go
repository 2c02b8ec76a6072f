package hashring

// Shares returns, for each member (indexed as in the slice given to New),
// the fraction of the key hash space it owns: the share of keys it is
// expected to own when key hashes are uniform, as MD5, CRC32, FNV-1a and
// one-at-a-time hashes of real keys are. The fractions sum to 1. They are
// computed once, by New, from the ring itself (arc lengths between points,
// or bucket counts), not by sampling keys; the returned slice is a copy
// the caller may keep. A Ketama member whose weight share rounds to zero
// points owns 0.
func (r *Ring) Shares() []float64 {
	return append([]float64(nil), r.shares...)
}

// computeShares measures the ring New built; see Shares.
func (r *Ring) computeShares() []float64 {
	s := make([]float64, r.n)
	switch {
	case r.n == 1:
		s[0] = 1 // Owner skips hashing
	case r.dist == Modula:
		for i := range s {
			s[i] = 1 / float64(r.n)
		}
	case r.pecl != nil:
		r.pecl.shares(s)
	default:
		// Point p owns the hashes in (values[p-1], values[p]]: Owner
		// takes the first point >= the hash, the lowest member index
		// among equal values, so a duplicate value owns nothing. Point 0
		// also owns the wrap-around past the last point.
		const space = float64(1 << 32)
		last := len(r.values) - 1
		for p, v := range r.values {
			var arc float64
			if p == 0 {
				arc = float64(v) + 1 + float64(^uint32(0)-r.values[last])
			} else {
				arc = float64(v - r.values[p-1])
			}
			s[r.owners[p]] += arc / space
		}
	}
	return s
}

// shares adds each member's fraction of the hash space to s.
func (t *peclTable) shares(s []float64) {
	if !t.standard {
		// find takes hash % peclBuckets: every bucket is as likely.
		for _, m := range t.buckets {
			s[m] += 1.0 / peclBuckets
		}
		return
	}
	// find takes the 15 bits (hash >> 16) & 0x7fff, each value as likely,
	// with 0 read as 1, modulo the total weight.
	const values = 0x8000
	for x := range uint64(values) {
		b := x
		if b == 0 {
			b = 1
		}
		s[t.buckets[b%t.total]] += 1.0 / values
	}
}
