package dtype

import (
	"encoding/binary"
	"fmt"
	"sort"
	"unsafe"

	"github.com/amgo-hpc/amgo/internal/memcopy"
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
	return t.move(dst, mem, count, from, packing)
}

// PackNT is Pack for a destination that another core reads next: its words
// of 8 bytes and its runs go with non-temporal stores (memcopy.CopyNT and
// GatherNT; blocks of 4 bytes and the last bytes of a run that is not a
// whole number of words, with ordinary ones), fenced (memcopy.StoreFence)
// before it returns.
func (t *Type) PackNT(dst, mem []byte, count, from int64) int {
	n := t.move(dst, mem, count, from, packingNT)
	memcopy.StoreFence()
	return n
}

// Unpack copies src into count instances of t whose first origin is mem[0],
// as packed bytes [from, from+len(src)), and returns how many it copied.
// The caller checks mem against Span.
func (t *Type) Unpack(mem, src []byte, count, from int64) int {
	return t.move(src, mem, count, from, unpacking)
}

// dir is the direction of a move between packed bytes and memory, and for
// packing, the kind of stores.
type dir uint8

const (
	packing   dir = iota // memory to packed bytes
	unpacking            // packed bytes to memory
	packingNT            // memory to packed bytes, with non-temporal stores
)

// move packs or unpacks (d) packed bytes [from, from+len(buf)) of count
// instances of t between buf and mem.
func (t *Type) move(buf, mem []byte, count, from int64, d dir) int {
	if t.size == 0 {
		return 0
	}
	to := min(from+int64(len(buf)), count*t.size)
	if from >= to {
		return 0
	}
	if t.dense {
		return copyRun(buf, mem, 0, t.tlb+from, to-from, d)
	}
	ext := t.ub - t.lb
	if len(t.parts) == 1 && from == 0 && to == count*t.size {
		// Whole instances of one strided part of dense blocks (a vector
		// of basic elements, the common layout): block runs straight away.
		if p := &t.parts[0]; p.t.dense {
			var pos int64
			for i := range count {
				pos = moveBlocks(buf, mem, pos, i*ext+p.disp+p.t.tlb, p.stride, p.n*p.t.size, p.count, d)
			}
			return int(pos)
		}
	}
	var pos int64
	for i := from / t.size; i < count && i*t.size < to; i++ {
		pos = moveOne(t, buf, mem, pos, i*ext, max(from-i*t.size, 0), min(to-i*t.size, t.size), d)
	}
	return int(pos)
}

// copyRun moves n bytes between buf[pos:] and mem[off:].
func copyRun(buf, mem []byte, pos, off, n int64, d dir) int {
	switch d {
	case unpacking:
		return copy(mem[off:off+n], buf[pos:pos+n])
	case packingNT:
		return memcopy.CopyNT(buf[pos:pos+n], mem[off:off+n])
	}
	return copy(buf[pos:pos+n], mem[off:off+n])
}

// moveOne moves packed bytes [from, to) of one instance of t whose origin
// is at mem offset base, between mem and buf[pos:], and returns the
// position after them: walk with the copies inlined, and whole blocks of
// a few bytes copied as words (a column of float64s moves 8 bytes a block).
func moveOne(t *Type, buf, mem []byte, pos, base, from, to int64, d dir) int64 {
	if t.run {
		return pos + int64(copyRun(buf, mem, pos, base+t.tlb+from, to-from, d))
	}
	i := 0
	if from > 0 && len(t.parts) > 1 {
		i = sort.Search(len(t.parts), func(i int) bool {
			p := &t.parts[i]
			return p.pre+p.bytes() > from
		})
	}
	for ; i < len(t.parts); i++ {
		p := &t.parts[i]
		if p.pre >= to {
			break
		}
		c := p.t
		bb := p.n * c.size
		if bb == 0 || p.pre+p.count*bb <= from {
			continue
		}
		lo, hi := max(from-p.pre, 0), min(to-p.pre, p.count*bb)
		ext := c.ub - c.lb
		j := lo / bb
		if c.dense {
			origin := base + p.disp + c.tlb
			// A partial first block, then whole blocks, then a partial last.
			if blo := lo - j*bb; blo > 0 {
				n := min(bb, hi-j*bb) - blo
				pos += int64(copyRun(buf, mem, pos, origin+j*p.stride+blo, n, d))
				j++
			}
			whole := min(p.count, hi/bb)
			if j < whole {
				pos = moveBlocks(buf, mem, pos, origin+j*p.stride, p.stride, bb, whole-j, d)
				j = whole
			}
			if j < p.count && j*bb < hi {
				pos += int64(copyRun(buf, mem, pos, origin+j*p.stride, hi-j*bb, d))
			}
			continue
		}
		for ; j < p.count && j*bb < hi; j++ {
			bbase := base + p.disp + j*p.stride
			blo, bhi := max(lo-j*bb, 0), min(hi-j*bb, bb)
			for k := blo / c.size; k < p.n && k*c.size < bhi; k++ {
				pos = moveOne(c, buf, mem, pos, bbase+k*ext, max(blo-k*c.size, 0), min(bhi-k*c.size, c.size), d)
			}
		}
	}
	return pos
}

// moveBlocks moves n blocks of bb bytes, stride bytes apart in mem from
// off, between mem and consecutive bytes of buf from pos. It is never
// inlined: inlined into moveOne (as profile-guided optimization did), its
// loops kept their index on the stack for want of registers and moved
// blocks at half the speed.
//
//go:noinline
func moveBlocks(buf, mem []byte, pos, off, stride, bb, n int64, d dir) int64 {
	switch {
	case bb == 8:
		// Bounds checked once for the whole run (its first and last blocks
		// and the ends of buf's part), then word moves through pointers: a
		// column of float64s, the common strided case.
		if n == 0 {
			return pos
		}
		last := off + stride*(n-1)
		_ = buf[pos+8*n-1]
		_ = mem[min(off, last)]
		_ = mem[max(off, last)+7]
		b := unsafe.Pointer(&buf[pos])
		m := unsafe.Pointer(&mem[off])
		// Eight blocks a round, both offsets advanced rather than the
		// block index multiplied by the stride, each block one load and
		// one store (an [8]byte moved in one statement is a MOV pair; held
		// in a variable it would go through the stack, and an unaligned
		// *uint64 is refused by checkptr): under 3 instructions a block,
		// against 7 for a multiply per block. Offsets, not pointers,
		// advance, so that no pointer past the data is ever formed.
		if d == packingNT {
			memcopy.GatherNT(b, m, int(stride), int(n))
			return pos + 8*n
		}
		s2, s3, s4 := 2*stride, 3*stride, 4*stride
		var bo, mo int64
		if d == unpacking {
			for k := n >> 3; k > 0; k-- {
				s, d := unsafe.Add(b, bo), unsafe.Add(m, mo)
				d4 := unsafe.Add(d, s4)
				*(*[8]byte)(d) = *(*[8]byte)(s)
				*(*[8]byte)(unsafe.Add(d, stride)) = *(*[8]byte)(unsafe.Add(s, 8))
				*(*[8]byte)(unsafe.Add(d, s2)) = *(*[8]byte)(unsafe.Add(s, 16))
				*(*[8]byte)(unsafe.Add(d, s3)) = *(*[8]byte)(unsafe.Add(s, 24))
				*(*[8]byte)(d4) = *(*[8]byte)(unsafe.Add(s, 32))
				*(*[8]byte)(unsafe.Add(d4, stride)) = *(*[8]byte)(unsafe.Add(s, 40))
				*(*[8]byte)(unsafe.Add(d4, s2)) = *(*[8]byte)(unsafe.Add(s, 48))
				*(*[8]byte)(unsafe.Add(d4, s3)) = *(*[8]byte)(unsafe.Add(s, 56))
				bo, mo = bo+64, mo+2*s4
			}
			for k := n & 7; k > 0; k-- {
				*(*[8]byte)(unsafe.Add(m, mo)) = *(*[8]byte)(unsafe.Add(b, bo))
				bo, mo = bo+8, mo+stride
			}
		} else {
			for k := n >> 3; k > 0; k-- {
				s, d := unsafe.Add(m, mo), unsafe.Add(b, bo)
				s4p := unsafe.Add(s, s4)
				*(*[8]byte)(d) = *(*[8]byte)(s)
				*(*[8]byte)(unsafe.Add(d, 8)) = *(*[8]byte)(unsafe.Add(s, stride))
				*(*[8]byte)(unsafe.Add(d, 16)) = *(*[8]byte)(unsafe.Add(s, s2))
				*(*[8]byte)(unsafe.Add(d, 24)) = *(*[8]byte)(unsafe.Add(s, s3))
				*(*[8]byte)(unsafe.Add(d, 32)) = *(*[8]byte)(s4p)
				*(*[8]byte)(unsafe.Add(d, 40)) = *(*[8]byte)(unsafe.Add(s4p, stride))
				*(*[8]byte)(unsafe.Add(d, 48)) = *(*[8]byte)(unsafe.Add(s4p, s2))
				*(*[8]byte)(unsafe.Add(d, 56)) = *(*[8]byte)(unsafe.Add(s4p, s3))
				bo, mo = bo+64, mo+2*s4
			}
			for k := n & 7; k > 0; k-- {
				*(*[8]byte)(unsafe.Add(b, bo)) = *(*[8]byte)(unsafe.Add(m, mo))
				bo, mo = bo+8, mo+stride
			}
		}
		pos += 8 * n
	case bb == 4 && d != unpacking:
		for range n {
			binary.LittleEndian.PutUint32(buf[pos:], binary.LittleEndian.Uint32(mem[off:]))
			pos, off = pos+4, off+stride
		}
	case bb == 4:
		for range n {
			binary.LittleEndian.PutUint32(mem[off:], binary.LittleEndian.Uint32(buf[pos:]))
			pos, off = pos+4, off+stride
		}
	case d == packing:
		for range n {
			copy(buf[pos:pos+bb], mem[off:off+bb])
			pos, off = pos+bb, off+stride
		}
	case d == packingNT:
		for range n {
			memcopy.CopyNT(buf[pos:pos+bb], mem[off:off+bb])
			pos, off = pos+bb, off+stride
		}
	default:
		for range n {
			copy(mem[off:off+bb], buf[pos:pos+bb])
			pos, off = pos+bb, off+stride
		}
	}
	return pos
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
