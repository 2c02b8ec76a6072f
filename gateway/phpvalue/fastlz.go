package phpvalue

import (
	"fmt"
	"slices"
)

// FastLZ is a byte-aligned LZ77 format. A block is a sequence of
// instructions, each starting with a control byte c:
//
//   - c>>5 == 0: a literal run of (c&31)+1 bytes follows (1-32).
//   - otherwise a match: copy from distance d back in the output, where
//     d-1 = (c&31)<<8 | the next offset byte. The length is (c>>5)+2 for
//     codes 1-6; code 7 adds one extension byte (level 1) or a run of
//     bytes ending in one below 255, all summed (level 2), and the
//     extension precedes the offset byte. In level 2 an offset of
//     31<<8|255 means a far match: two more big-endian bytes hold d-8192.
//
// The top 3 bits of the first byte carry the level (0 for 1, 1 for 2); the
// first instruction is always a literal run, so they are free. Matches may
// overlap the bytes they produce (a run is a match at distance 1).
const (
	flzMaxLiteral = 32    // bytes in one literal run
	flzMinMatch   = 3     // shortest match
	flzL1MaxMatch = 264   // longest level-1 match in one instruction
	flzL1MaxDist  = 8191  // farthest level-1 match emitted (the format allows 8192)
	flzL2NearDist = 8191  // level-2 distances up to this use the short form
	flzL2MaxDist  = 73724 // farthest level-2 match emitted (the format allows 73727)
	flzL2FarMin   = 5     // a far match costs at least 4 bytes, so it must be longer
	flzHashBits   = 14
)

// fastlzBound is an upper bound on the compressed size of n bytes: the
// all-literal encoding, one control byte per 32 bytes.
func fastlzBound(n int) int { return n + n/flzMaxLiteral + 1 }

// fastlzAppend appends the FastLZ block (level 1 or 2) for src to dst.
// An empty src appends nothing. The encoder is greedy: it looks up the
// last position with the same 3-byte hash and takes the match if it is
// real and in range.
func fastlzAppend(dst, src []byte, level int) []byte {
	if len(src) == 0 {
		return dst
	}
	start := len(dst)
	maxDist := flzL1MaxDist
	if level == 2 {
		maxDist = flzL2MaxDist
	}
	// table holds position+1 of the latest 3-byte sequence per hash; 0 is
	// empty. uint32 suffices: Encode refuses inputs over 4 GiB - 1.
	table := make([]uint32, 1<<flzHashBits)
	lit := 0 // start of the pending literal run
	for i := 0; i+flzMinMatch <= len(src); {
		h := flzHash(src[i:])
		cand := int(table[h]) - 1
		table[h] = uint32(i + 1)
		if cand < 0 || i-cand > maxDist ||
			src[cand] != src[i] || src[cand+1] != src[i+1] || src[cand+2] != src[i+2] {
			i++
			continue
		}
		n := flzMinMatch + commonPrefix(src[cand+flzMinMatch:], src[i+flzMinMatch:])
		dist := i - cand
		if level == 2 && dist > flzL2NearDist && n < flzL2FarMin {
			i++
			continue
		}
		// i > 0 here (position 0 has no candidate), so the block always
		// starts with a literal run, as the format requires.
		dst = flzLiterals(dst, src[lit:i])
		if level == 2 {
			dst = flz2Match(dst, n, dist)
		} else {
			dst = flz1Match(dst, n, dist)
		}
		// Index the match's last positions so the next search can use them.
		for j := max(i+1, i+n-2); j < i+n && j+flzMinMatch <= len(src); j++ {
			table[flzHash(src[j:])] = uint32(j + 1)
		}
		i += n
		lit = i
	}
	dst = flzLiterals(dst, src[lit:])
	if level == 2 {
		dst[start] |= 1 << 5
	}
	return dst
}

func flzHash(b []byte) uint32 {
	v := uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16
	return (v * 2654435761) >> (32 - flzHashBits)
}

// commonPrefix returns the length of the common prefix of a and b.
func commonPrefix(a, b []byte) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

func flzLiterals(dst, lit []byte) []byte {
	for len(lit) > 0 {
		k := min(len(lit), flzMaxLiteral)
		dst = append(dst, byte(k-1))
		dst = append(dst, lit[:k]...)
		lit = lit[k:]
	}
	return dst
}

// flz1Match emits a level-1 match of n >= 3 bytes at distance 1..8192,
// split into instructions of at most 264 bytes, none shorter than 3.
func flz1Match(dst []byte, n, dist int) []byte {
	d := dist - 1
	for n > 0 {
		k := n
		if k > flzL1MaxMatch {
			k = flzL1MaxMatch
			if n-k < flzMinMatch {
				k = n - flzMinMatch
			}
		}
		code := k - 2
		if code < 7 {
			dst = append(dst, byte(code<<5|d>>8), byte(d))
		} else {
			dst = append(dst, byte(7<<5|d>>8), byte(code-7), byte(d))
		}
		n -= k
	}
	return dst
}

// flz2Match emits a level-2 match of n >= 3 bytes at distance 1..73727
// (n >= 5 beyond 8191, which the encoder ensures).
func flz2Match(dst []byte, n, dist int) []byte {
	code := n - 2
	d := dist - 1
	near := dist <= flzL2NearDist
	ctrl := byte(min(code, 7) << 5)
	if near {
		ctrl |= byte(d >> 8) // d <= 8190, so never the far marker 31<<8|255
	} else {
		ctrl |= 31
	}
	dst = append(dst, ctrl)
	if code >= 7 {
		r := code - 7
		for ; r >= 255; r -= 255 {
			dst = append(dst, 255)
		}
		dst = append(dst, byte(r))
	}
	if near {
		return append(dst, byte(d))
	}
	far := d - flzL2NearDist
	return append(dst, 255, byte(far>>8), byte(far))
}

// fastlzDecompress decodes a FastLZ block of either level that must
// expand to exactly want bytes. Every read and back-reference is
// bounds-checked; it never writes more than want bytes and allocates in
// proportion to the output produced, not to want; exact: want bytes at
// once (its memory is held already).
func fastlzDecompress(src []byte, want int, exact bool) ([]byte, error) {
	if len(src) == 0 {
		if want == 0 {
			return []byte{}, nil
		}
		return nil, fmt.Errorf("%w: fastlz: no data for %d bytes", ErrCorrupt, want)
	}
	level := int(src[0]>>5) + 1
	if level > 2 {
		return nil, fmt.Errorf("%w: fastlz: unknown level %d", ErrCorrupt, level)
	}
	dst := make([]byte, 0, min(want, 16*len(src)+64))
	if exact {
		dst = make([]byte, 0, want)
	}
	ctrl := int(src[0] & 31)
	i := 1
	for {
		if ctrl < 32 {
			n := ctrl + 1
			if n > len(src)-i {
				return nil, flzTruncated(i)
			}
			if n > want-len(dst) {
				return nil, flzTooLong(want)
			}
			dst = append(dst, src[i:i+n]...)
			i += n
		} else {
			n := ctrl>>5 + 2
			if ctrl>>5 == 7 {
				for {
					if i >= len(src) {
						return nil, flzTruncated(i)
					}
					b := src[i]
					i++
					n += int(b)
					if level == 1 || b != 255 {
						break
					}
				}
			}
			if i >= len(src) {
				return nil, flzTruncated(i)
			}
			low := src[i]
			i++
			d := (ctrl&31)<<8 | int(low)
			if level == 2 && ctrl&31 == 31 && low == 255 {
				if len(src)-i < 2 {
					return nil, flzTruncated(i)
				}
				d = (int(src[i])<<8 | int(src[i+1])) + flzL2NearDist
				i += 2
			}
			dist := d + 1
			if dist > len(dst) {
				return nil, fmt.Errorf("%w: fastlz: match at distance %d with only %d bytes decoded", ErrCorrupt, dist, len(dst))
			}
			if n > want-len(dst) {
				return nil, flzTooLong(want)
			}
			dst = appendBackref(dst, dist, n)
		}
		if i >= len(src) {
			break
		}
		ctrl = int(src[i])
		i++
	}
	if len(dst) != want {
		return nil, fmt.Errorf("%w: fastlz data decodes to %d bytes, stored length is %d", ErrCorrupt, len(dst), want)
	}
	return dst, nil
}

// appendBackref appends n bytes copied from dist bytes back, where the
// source may overlap the bytes being written (dist < n repeats a pattern).
// Each copy takes the whole periods written so far, so a run (dist 1) of
// a megabyte is about 20 copies, not a million one-byte ones: FastLZ
// stores a run of zeros as such matches, and a GET of a megabyte of zeros
// spent 3.4 ms here.
func appendBackref(dst []byte, dist, n int) []byte {
	pos := len(dst)
	dst = slices.Grow(dst, n)[:pos+n]
	from := pos - dist
	for done := 0; done < n; {
		// dst[from:pos+done] is written and repeats with period dist,
		// so the last whole periods of it continue the pattern at
		// pos+done.
		span := (pos + done - from) / dist * dist
		done += copy(dst[pos+done:pos+n], dst[pos+done-span:pos+done])
	}
	return dst
}

func flzTruncated(at int) error {
	return fmt.Errorf("%w: fastlz: data truncated at byte %d", ErrCorrupt, at)
}

func flzTooLong(want int) error {
	return fmt.Errorf("%w: fastlz data decodes to more than the stored length %d", ErrCorrupt, want)
}
