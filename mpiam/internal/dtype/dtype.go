// Package dtype is the representation of MPI derived datatypes (MPI-4.1
// chapter 5) and the engine that packs and unpacks them: pure data
// structures and loops, with no communication, so that they are tested and
// fuzzed alone.
//
// A Type is a list of parts. A part is a regular family of blocks: block j
// (0 <= j < count) starts disp + j*stride bytes from the instance's origin
// and holds n consecutive instances of a child type (each the child's
// extent after the previous). Every constructor maps to parts without
// flattening: a vector of a million blocks is one part, an indexed type one
// part per block, a struct one part per field. The packed form of a type is
// its basic elements in typemap order, and every part knows how many packed
// bytes precede it, so that packing can start at any byte of the packed
// stream in time proportional to the depth of the type (rendezvous chunks).
//
// Bounds follow MPI-4.1 §5.1.6-5.1.7: lb and ub are the least and greatest
// bounds of the instances of the children (their own lb/ub, so that a
// resized child keeps its marks), the true bounds those of the data;
// TypeCreateStruct pads ub to the alignment of its most aligned basic type,
// as C compilers pad a struct.
package dtype

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
)

// Kind is a basic (predefined) datatype.
type Kind uint8

// The basic datatypes, by their Go types.
const (
	Byte Kind = iota + 1
	Bool
	Int8
	Int16
	Int32
	Int64
	Uint8
	Uint16
	Uint32
	Uint64
	Float32
	Float64
	Complex64
	Complex128
	Packed
	numKinds
)

var kindInfo = [numKinds]struct {
	size, align int64
	name        string
}{
	Byte: {1, 1, "byte"}, Bool: {1, 1, "bool"}, Int8: {1, 1, "int8"}, Int16: {2, 2, "int16"},
	Int32: {4, 4, "int32"}, Int64: {8, 8, "int64"}, Uint8: {1, 1, "uint8"}, Uint16: {2, 2, "uint16"},
	Uint32: {4, 4, "uint32"}, Uint64: {8, 8, "uint64"}, Float32: {4, 4, "float32"},
	Float64: {8, 8, "float64"}, Complex64: {8, 4, "complex64"}, Complex128: {16, 8, "complex128"},
	Packed: {1, 1, "packed"},
}

// Size is the kind's size in bytes (0 for an invalid kind).
func (k Kind) Size() int64 {
	if k == 0 || k >= numKinds {
		return 0
	}
	return kindInfo[k].size
}

// String is the kind's Go type name.
func (k Kind) String() string {
	if k == 0 || k >= numKinds {
		return fmt.Sprintf("kind(%d)", uint8(k))
	}
	return kindInfo[k].name
}

// ErrInvalid reports a constructor argument MPI forbids (a negative count,
// mismatched lengths, a size that overflows).
var ErrInvalid = errors.New("dtype: invalid argument")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}

type part struct {
	disp   int64 // bytes from the instance's origin to block 0's origin
	count  int64 // blocks
	stride int64 // bytes from one block's origin to the next's
	n      int64 // child instances per block
	t      *Type
	pre    int64 // packed bytes of the parts before this one
}

// bytes is the part's packed size.
func (p *part) bytes() int64 { return p.count * p.n * p.t.size }

// Type is a committed-ready datatype: immutable once made, shared freely.
type Type struct {
	size      int64 // packed bytes of one instance
	lb, ub    int64 // bounds: extent = ub - lb
	tlb, tub  int64 // true bounds of the data
	elems     int64 // basic elements of one instance
	kind      Kind  // for a basic type; 0 otherwise
	homog     Kind  // the one basic kind of every element, 0 when mixed or none
	align     int64 // the largest alignment of a basic type within
	parts     []part
	run       bool   // the data is one contiguous run [tlb, tlb+size), in packed order
	dense     bool   // run, with lb == tlb and extent == size: instances follow on
	hash, pow uint64 // signature hash of one instance, and hashBase^elems
	depth     int
	blocks    int64 // contiguous pieces of one instance (capped), for cost estimates
	name      string
}

// Basic returns the predefined type of kind k.
func Basic(k Kind) *Type { return basics[k] }

var basics [numKinds]*Type

func init() {
	for k := Byte; k < numKinds; k++ {
		s := kindInfo[k].size
		basics[k] = &Type{size: s, ub: s, tub: s, elems: 1, kind: k, homog: k, align: kindInfo[k].align,
			run: true, dense: true, hash: uint64(k), pow: hashBase, blocks: 1, name: kindInfo[k].name}
	}
}

// Size is the number of bytes of data in one instance (MPI_Type_size).
func (t *Type) Size() int64 { return t.size }

// Extent returns lb and the extent, in bytes (MPI_Type_get_extent).
func (t *Type) Extent() (lb, extent int64) { return t.lb, t.ub - t.lb }

// TrueExtent returns the true lb and extent of the data, in bytes
// (MPI_Type_get_true_extent).
func (t *Type) TrueExtent() (lb, extent int64) { return t.tlb, t.tub - t.tlb }

// Elements is the number of basic elements in one instance.
func (t *Type) Elements() int64 { return t.elems }

// Kind is the basic kind of a predefined type, 0 for a derived one.
func (t *Type) Kind() Kind { return t.kind }

// Homogeneous is the basic kind of every element of t, or 0 when t mixes
// kinds or has none (reductions with predefined operations need one kind).
func (t *Type) Homogeneous() Kind { return t.homog }

// Dense reports that consecutive instances of t are one contiguous run of
// bytes, in packed order, starting at their true lb: count instances move
// as plain memory.
func (t *Type) Dense() bool { return t.dense }

// Contiguous reports whether count instances of t are one run of bytes in
// packed order; off is where the run starts relative to the origin.
func (t *Type) Contiguous(count int64) (off int64, ok bool) {
	if count == 0 || t.size == 0 {
		return 0, true
	}
	if t.dense || count == 1 && t.run {
		return t.tlb, true
	}
	return 0, false
}

// Span is the range of bytes, relative to the origin, that count instances
// of t touch: [lo, hi). Zero-size data touches nothing (lo == hi == 0).
func (t *Type) Span(count int64) (lo, hi int64) {
	if count == 0 || t.size == 0 {
		return 0, 0
	}
	ext := t.ub - t.lb
	last := (count - 1) * ext
	return t.tlb + min(0, last), t.tub + max(0, last)
}

// String describes t briefly (its constructor and size).
func (t *Type) String() string { return t.name }

// Signature returns the type signature hash of the first elems basic
// elements of count instances of t, and whether there are that many: a
// message's signature is a prefix of its receive's (MPI-4.1 §3.3.1) when
// the hash of the receive's first elems elements equals the message's.
func (t *Type) Signature(count, elems int64) (uint64, bool) {
	if elems < 0 || elems > count*t.elems {
		return 0, false
	}
	h, _ := prefixHash(t, count, elems)
	return h, true
}

// PackedHash is the signature hash of count whole instances.
func (t *Type) PackedHash(count int64) uint64 {
	h, _ := repeat(t.hash, t.pow, count)
	return h
}

// ElementsIn returns how many whole basic elements the first n packed bytes
// of count instances of t hold, and whether n ends on an element boundary
// (MPI_Get_elements).
func (t *Type) ElementsIn(count, n int64) (int64, bool) {
	if t.size == 0 || n <= 0 {
		return 0, n == 0
	}
	if n > count*t.size {
		n = count * t.size
	}
	whole := n / t.size
	e := whole * t.elems
	rest, exact := elemsIn(t, n-whole*t.size)
	return e + rest, exact
}

func elemsIn(t *Type, n int64) (int64, bool) {
	if n == 0 {
		return 0, true
	}
	if t.kind != 0 {
		return 0, false // n < size of one element
	}
	var e int64
	for i := range t.parts {
		p := &t.parts[i]
		b := p.bytes()
		if n >= b {
			e += p.count * p.n * p.t.elems
			n -= b
			continue
		}
		whole := n / p.t.size
		e += whole * p.t.elems
		r, exact := elemsIn(p.t, n-whole*p.t.size)
		return e + r, exact
	}
	return e, n == 0
}

// The signature hash: a polynomial hash over the sequence of basic kinds,
// h(a||b) = h(a)*B^len(b) + h(b), computed for repetitions by doubling.
const hashBase = 0x100000001b3

// repeat returns the hash and power of m repetitions of a sequence with
// hash h and power pw.
func repeat(h, pw uint64, m int64) (uint64, uint64) {
	rh, rp := uint64(0), uint64(1)
	for m > 0 {
		if m&1 != 0 {
			rh, rp = rh*pw+h, rp*pw
		}
		h, pw = h*pw+h, pw*pw
		m >>= 1
	}
	return rh, rp
}

// prefixHash is the hash and power of the first e elements of count
// instances of t (e <= count*t.elems).
func prefixHash(t *Type, count, e int64) (uint64, uint64) {
	if t.elems == 0 {
		return 0, 1
	}
	whole := e / t.elems
	h, pw := repeat(t.hash, t.pow, whole)
	if rest := e - whole*t.elems; rest > 0 {
		rh, rp := partialHash(t, rest)
		h, pw = h*rp+rh, pw*rp
	}
	return h, pw
}

func partialHash(t *Type, e int64) (uint64, uint64) {
	h, pw := uint64(0), uint64(1)
	for i := range t.parts {
		p := &t.parts[i]
		pe := p.count * p.n * p.t.elems
		if e >= pe {
			ph, pp := repeat(p.t.hash, p.t.pow, p.count*p.n)
			h, pw = h*pp+ph, pw*pp
			e -= pe
			if e == 0 {
				break
			}
			continue
		}
		ph, pp := prefixHash(p.t, p.count*p.n, e)
		return h*pp + ph, pw * pp
	}
	return h, pw
}

// mul multiplies non-negative a and b, reporting overflow of int64.
func mul(a, b int64) (int64, bool) {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi != 0 || lo > math.MaxInt64 {
		return 0, false
	}
	return int64(lo), true
}

// build makes a type of parts (pre filled here), computing bounds, size,
// signature and contiguity; structAlign pads ub as TypeCreateStruct does.
func build(name string, parts []part, structAlign bool) (*Type, error) {
	t := &Type{name: name, pow: 1}
	first := true
	var pre int64
	for i := range parts {
		p := &parts[i]
		if p.count < 0 || p.n < 0 {
			return nil, invalid("%s: negative count", name)
		}
		p.pre = pre
		bn, ok := mul(p.count, p.n)
		var b int64
		if ok {
			b, ok = mul(bn, p.t.size)
		}
		var e int64
		if ok {
			e, ok = mul(bn, p.t.elems)
		}
		if !ok || pre+b < pre || t.elems+e < t.elems {
			return nil, invalid("%s: more than 2^63 bytes", name)
		}
		pre += b
		t.elems += e
		ph, pp := repeat(p.t.hash, p.t.pow, bn)
		t.hash, t.pow = t.hash*pp+ph, t.pow*pp
		t.align = max(t.align, p.t.align)
		if bn == 0 {
			continue
		}
		t.depth = max(t.depth, p.t.depth+1)
		ext := p.t.ub - p.t.lb
		lastB, lastI := (p.count-1)*p.stride, (p.n-1)*ext
		lo := p.disp + min(0, lastB) + min(0, lastI)
		hi := p.disp + max(0, lastB) + max(0, lastI)
		lb, ub := lo+p.t.lb, hi+p.t.ub
		if first {
			t.lb, t.ub = lb, ub
		} else {
			t.lb, t.ub = min(t.lb, lb), max(t.ub, ub)
		}
		if p.t.size > 0 {
			tlb, tub := lo+p.t.tlb, hi+p.t.tub
			if t.size == 0 {
				t.tlb, t.tub = tlb, tub
			} else {
				t.tlb, t.tub = min(t.tlb, tlb), max(t.tub, tub)
			}
			t.size += b
		}
		if t.homog == 0 && first {
			t.homog = p.t.homog
		} else if t.homog != p.t.homog {
			t.homog = 0
		}
		first = false
	}
	t.parts = parts
	if structAlign && t.align > 1 {
		if r := (t.ub - t.lb) % t.align; r != 0 {
			t.ub += t.align - r
		}
	}
	if t.elems == 0 {
		t.homog = 0
	}
	t.blocks = countBlocks(t)
	t.run = t.size == 0 || t.blocks == 1 && t.tub-t.tlb == t.size
	t.dense = t.run && t.lb == t.tlb && t.ub-t.lb == t.size
	return t, nil
}

// countBlocks counts the contiguous pieces that one instance of t packs
// from, merging neighbours that follow each other in memory, up to 2.
func countBlocks(t *Type) int64 {
	var n int64
	end := int64(math.MinInt64)
	_ = walk(t, 0, 0, t.size, func(off, ln int64) bool {
		if off != end {
			n++
		}
		end = off + ln
		return n < 2
	})
	return n
}

// Contiguous is MPI_Type_contiguous: count instances of t, one after the
// other (count >= 0).
func Contiguous(count int64, t *Type) (*Type, error) {
	if count < 0 {
		return nil, invalid("contiguous: count %d", count)
	}
	return build(fmt.Sprintf("contiguous(%d, %s)", count, t.name), []part{{count: 1, n: count, t: t}}, false)
}

// Hvector is MPI_Type_create_hvector: count blocks of blocklen instances of
// t, stride bytes apart.
func Hvector(count, blocklen, stride int64, t *Type) (*Type, error) {
	if count < 0 || blocklen < 0 {
		return nil, invalid("vector: count %d, block length %d", count, blocklen)
	}
	return build(fmt.Sprintf("hvector(%d, %d, %d, %s)", count, blocklen, stride, t.name),
		[]part{{count: count, stride: stride, n: blocklen, t: t}}, false)
}

// Vector is MPI_Type_vector: Hvector with the stride in extents of t.
func Vector(count, blocklen, stride int64, t *Type) (*Type, error) {
	s, ok := mul(abs(stride), t.ub-t.lb)
	if !ok {
		return nil, invalid("vector: stride %d overflows", stride)
	}
	if stride < 0 {
		s = -s
	}
	v, err := Hvector(count, blocklen, s, t)
	if err == nil {
		v.name = fmt.Sprintf("vector(%d, %d, %d, %s)", count, blocklen, stride, t.name)
	}
	return v, err
}

// Hindexed is MPI_Type_create_hindexed: block i holds blocklens[i]
// instances of t at displs[i] bytes.
func Hindexed(blocklens, displs []int64, t *Type) (*Type, error) {
	if len(blocklens) != len(displs) {
		return nil, invalid("indexed: %d block lengths, %d displacements", len(blocklens), len(displs))
	}
	parts := make([]part, len(blocklens))
	for i := range parts {
		parts[i] = part{disp: displs[i], count: 1, n: blocklens[i], t: t}
	}
	return build(fmt.Sprintf("hindexed(%d blocks, %s)", len(parts), t.name), parts, false)
}

// Indexed is MPI_Type_indexed: Hindexed with displacements in extents of t.
func Indexed(blocklens, displs []int64, t *Type) (*Type, error) {
	b, err := scale(displs, t)
	if err != nil {
		return nil, err
	}
	x, err := Hindexed(blocklens, b, t)
	if err == nil {
		x.name = fmt.Sprintf("indexed(%d blocks, %s)", len(b), t.name)
	}
	return x, err
}

// HindexedBlock is MPI_Type_create_hindexed_block: blocks of blocklen
// instances of t at displs bytes.
func HindexedBlock(blocklen int64, displs []int64, t *Type) (*Type, error) {
	if blocklen < 0 {
		return nil, invalid("indexed block: block length %d", blocklen)
	}
	parts := make([]part, len(displs))
	for i := range parts {
		parts[i] = part{disp: displs[i], count: 1, n: blocklen, t: t}
	}
	return build(fmt.Sprintf("hindexed_block(%d x %d, %s)", len(parts), blocklen, t.name), parts, false)
}

// IndexedBlock is MPI_Type_create_indexed_block: HindexedBlock with
// displacements in extents of t.
func IndexedBlock(blocklen int64, displs []int64, t *Type) (*Type, error) {
	b, err := scale(displs, t)
	if err != nil {
		return nil, err
	}
	x, err := HindexedBlock(blocklen, b, t)
	if err == nil {
		x.name = fmt.Sprintf("indexed_block(%d x %d, %s)", len(b), blocklen, t.name)
	}
	return x, err
}

func scale(displs []int64, t *Type) ([]int64, error) {
	ext := t.ub - t.lb
	out := make([]int64, len(displs))
	for i, d := range displs {
		v, ok := mul(abs(d), abs(ext))
		if !ok {
			return nil, invalid("displacement %d overflows", d)
		}
		if (d < 0) != (ext < 0) {
			v = -v
		}
		out[i] = v
	}
	return out, nil
}

func abs(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}

// Struct is MPI_Type_create_struct: block i holds blocklens[i] instances
// of types[i] at displs[i] bytes; ub is padded to the alignment of the
// most aligned basic type inside.
func Struct(blocklens, displs []int64, types []*Type) (*Type, error) {
	if len(blocklens) != len(displs) || len(blocklens) != len(types) {
		return nil, invalid("struct: %d block lengths, %d displacements, %d types", len(blocklens), len(displs), len(types))
	}
	parts := make([]part, len(blocklens))
	for i := range parts {
		if types[i] == nil {
			return nil, invalid("struct: type %d is nil", i)
		}
		parts[i] = part{disp: displs[i], count: 1, n: blocklens[i], t: types[i]}
	}
	return build(fmt.Sprintf("struct(%d fields)", len(parts)), parts, true)
}

// Resized is MPI_Type_create_resized: t with lower bound lb and extent
// extent, in bytes.
func Resized(t *Type, lb, extent int64) (*Type, error) {
	r, err := build(fmt.Sprintf("resized(%s, %d, %d)", t.name, lb, extent), []part{{count: 1, n: 1, t: t}}, false)
	if err != nil {
		return nil, err
	}
	r.lb, r.ub = lb, lb+extent
	r.dense = r.run && r.lb == r.tlb && r.ub-r.lb == r.size
	return r, nil
}

// Order is the storage order of a subarray's array.
type Order uint8

// C stores the last dimension fastest, Fortran the first.
const (
	OrderC Order = iota
	OrderFortran
)

// Subarray is MPI_Type_create_subarray: the subsizes block at starts of an
// array of sizes elements of t (row-major for OrderC), with lb 0 and the
// whole array's extent.
func Subarray(sizes, subsizes, starts []int64, order Order, t *Type) (*Type, error) {
	nd := len(sizes)
	if nd == 0 || len(subsizes) != nd || len(starts) != nd {
		return nil, invalid("subarray: %d sizes, %d subsizes, %d starts", nd, len(subsizes), len(starts))
	}
	if order != OrderC && order != OrderFortran {
		return nil, invalid("subarray: order %d", order)
	}
	for i := range nd {
		if sizes[i] <= 0 || subsizes[i] <= 0 || subsizes[i] > sizes[i] || starts[i] < 0 || starts[i] > sizes[i]-subsizes[i] {
			return nil, invalid("subarray: dimension %d: size %d, subsize %d, start %d", i, sizes[i], subsizes[i], starts[i])
		}
	}
	dim := func(k int) int { // the k-th dimension from the fastest
		if order == OrderC {
			return nd - 1 - k
		}
		return k
	}
	ext := t.ub - t.lb
	stride := ext // bytes between consecutive indices of dimension dim(k)
	cur, err := Contiguous(subsizes[dim(0)], t)
	if err != nil {
		return nil, err
	}
	disp, ok := mul(starts[dim(0)], ext)
	for k := 1; k < nd && ok; k++ {
		if stride, ok = mul(stride, sizes[dim(k-1)]); !ok {
			break
		}
		if cur, err = Hvector(subsizes[dim(k)], 1, stride, cur); err != nil {
			return nil, err
		}
		var d int64
		d, ok = mul(starts[dim(k)], stride)
		disp += d
	}
	total, ok2 := mul(stride, sizes[dim(nd-1)])
	if !ok || !ok2 || disp < 0 {
		return nil, invalid("subarray: more than 2^63 bytes")
	}
	s, err := build(fmt.Sprintf("subarray(%v of %v, %s)", subsizes, sizes, t.name), []part{{disp: disp, count: 1, n: 1, t: cur}}, false)
	if err != nil {
		return nil, err
	}
	s.lb, s.ub = 0, total
	s.dense = s.run && s.tlb == 0 && s.size == total
	return s, nil
}
