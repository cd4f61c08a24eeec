package dtype

import (
	"fmt"
	"sort"
)

// walk visits the packed bytes [from, to) of one instance of t whose origin
// is at memory offset base, in packed order, as contiguous pieces: fn(mem
// offset, length). fn returns false to stop; walk then returns false.
// 0 <= from <= to <= t.size.
func walk(t *Type, base, from, to int64, fn func(off, n int64) bool) bool {
	if from >= to {
		return true
	}
	if t.run {
		return fn(base+t.tlb+from, to-from)
	}
	// The first part holding byte from.
	i := sort.Search(len(t.parts), func(i int) bool {
		p := &t.parts[i]
		return p.pre+p.bytes() > from
	})
	for ; i < len(t.parts); i++ {
		p := &t.parts[i]
		if p.pre >= to {
			break
		}
		c := p.t
		bb := p.n * c.size // packed bytes of one block
		if bb == 0 {
			continue
		}
		lo, hi := max(from-p.pre, 0), min(to-p.pre, p.count*bb)
		ext := c.ub - c.lb
		for j := lo / bb; j < p.count && j*bb < hi; j++ {
			bbase := base + p.disp + j*p.stride
			blo, bhi := max(lo-j*bb, 0), min(hi-j*bb, bb)
			if c.dense {
				if !fn(bbase+c.tlb+blo, bhi-blo) {
					return false
				}
				continue
			}
			for k := blo / c.size; k < p.n && k*c.size < bhi; k++ {
				if !walk(c, bbase+k*ext, max(blo-k*c.size, 0), min(bhi-k*c.size, c.size), fn) {
					return false
				}
			}
		}
	}
	return true
}

// Walk visits the packed bytes [from, to) of count instances of t whose
// first origin is at memory offset 0, as contiguous pieces in packed order:
// fn(memory offset, length in bytes). fn returns false to stop.
func (t *Type) Walk(count, from, to int64, fn func(off, n int64) bool) {
	if t.size == 0 {
		return
	}
	to = min(to, count*t.size)
	ext := t.ub - t.lb
	if t.dense {
		if from < to {
			fn(t.tlb+from, to-from)
		}
		return
	}
	for i := from / t.size; i < count && i*t.size < to; i++ {
		if !walk(t, i*ext, max(from-i*t.size, 0), min(to-i*t.size, t.size), fn) {
			return
		}
	}
}

// Pack copies packed bytes [from, from+len(dst)) of count instances of t,
// whose first origin is mem[0], into dst, and returns how many it copied
// (fewer at the end of the data). The caller checks mem against Span.
func (t *Type) Pack(dst, mem []byte, count, from int64) int {
	n := 0
	t.Walk(count, from, from+int64(len(dst)), func(off, ln int64) bool {
		n += copy(dst[n:], mem[off:off+ln])
		return true
	})
	return n
}

// Unpack copies src into count instances of t whose first origin is mem[0],
// as packed bytes [from, from+len(src)), and returns how many it copied.
// The caller checks mem against Span.
func (t *Type) Unpack(mem, src []byte, count, from int64) int {
	n := 0
	t.Walk(count, from, from+int64(len(src)), func(off, ln int64) bool {
		n += copy(mem[off:off+ln], src[n:])
		return true
	})
	return n
}

// Check reports whether count instances of t fit in a buffer of memLen
// bytes whose first origin is at its start.
func (t *Type) Check(count, memLen int64) error {
	if count < 0 {
		return invalid("count %d", count)
	}
	if _, ok := mul(count, max(t.size, t.ub-t.lb, t.lb-t.ub)); !ok {
		return invalid("count %d of %s overflows", count, t.name)
	}
	lo, hi := t.Span(count)
	if lo < 0 || hi > memLen {
		return fmt.Errorf("%w: %d of %s touch bytes [%d, %d) of a buffer of %d", ErrOutside, count, t.name, lo, hi, memLen)
	}
	return nil
}

// ErrOutside reports data that would lie outside the buffer given.
var ErrOutside = fmt.Errorf("dtype: data outside the buffer")
