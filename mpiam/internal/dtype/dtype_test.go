package dtype

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// spec describes a type as the test builds it: the reference packer below
// expands it into a typemap by the definitions of MPI-4.1 §5.1.2, without
// the package's parts.
type spec struct {
	op      string // basic, contig, hvector, hindexed, struct, resized, subarray
	kind    Kind
	count   int64
	blen    int64
	stride  int64
	blens   []int64
	displs  []int64
	kids    []*spec
	lb, ext int64
	sizes   []int64
	subs    []int64
	starts  []int64
	order   Order
}

type entry struct {
	off  int64
	kind Kind
}

// build makes the Type that s describes.
func (s *spec) build(t *testing.T) *Type {
	t.Helper()
	var (
		ty  *Type
		err error
	)
	switch s.op {
	case "basic":
		return Basic(s.kind)
	case "contig":
		ty, err = Contiguous(s.count, s.kids[0].build(t))
	case "hvector":
		ty, err = Hvector(s.count, s.blen, s.stride, s.kids[0].build(t))
	case "hindexed":
		ty, err = Hindexed(s.blens, s.displs, s.kids[0].build(t))
	case "struct":
		var kids []*Type
		for _, k := range s.kids {
			kids = append(kids, k.build(t))
		}
		ty, err = Struct(s.blens, s.displs, kids)
	case "resized":
		ty, err = Resized(s.kids[0].build(t), s.lb, s.ext)
	case "subarray":
		ty, err = Subarray(s.sizes, s.subs, s.starts, s.order, s.kids[0].build(t))
	}
	require.NoError(t, err)
	return ty
}

// ref expands s into its typemap and returns its bounds by MPI-4.1's
// definitions: lb and ub the least and greatest bounds of the child
// instances; struct pads the extent to the alignment of its most aligned
// basic type; resized and subarray set them.
func (s *spec) ref() (m []entry, lb, ub int64) {
	first := true
	place := func(km []entry, klb, kub, at int64) {
		m = append(m, shift(km, at)...)
		if first || at+klb < lb {
			lb = at + klb
		}
		if first || at+kub > ub {
			ub = at + kub
		}
		first = false
	}
	switch s.op {
	case "basic":
		return []entry{{0, s.kind}}, 0, s.kind.Size()
	case "contig":
		km, klb, kub := s.kids[0].ref()
		for i := range s.count {
			place(km, klb, kub, i*(kub-klb))
		}
	case "hvector":
		km, klb, kub := s.kids[0].ref()
		for j := range s.count {
			for i := range s.blen {
				place(km, klb, kub, j*s.stride+i*(kub-klb))
			}
		}
	case "hindexed":
		km, klb, kub := s.kids[0].ref()
		for j, bl := range s.blens {
			for i := range bl {
				place(km, klb, kub, s.displs[j]+i*(kub-klb))
			}
		}
	case "struct":
		var align int64 = 1
		for j, k := range s.kids {
			km, klb, kub := k.ref()
			for i := range s.blens[j] {
				place(km, klb, kub, s.displs[j]+i*(kub-klb))
			}
			align = max(align, k.maxAlign())
		}
		if r := (ub - lb) % align; r != 0 {
			ub += align - r
		}
	case "resized":
		km, _, _ := s.kids[0].ref()
		return km, s.lb, s.lb + s.ext
	case "subarray":
		km, klb, kub := s.kids[0].ref()
		ke := kub - klb
		n := len(s.sizes)
		idx := make([]int64, n)
		var rec func(d int)
		rec = func(d int) {
			if d == n {
				var lin int64
				for k := range n { // row-major (C) or column-major linear index
					dd := k
					if s.order == OrderFortran {
						dd = n - 1 - k
					}
					lin = lin*s.sizes[dd] + idx[dd]
				}
				m = append(m, shift(km, lin*ke)...)
				return
			}
			dd := d
			if s.order == OrderFortran {
				dd = n - 1 - d
			}
			for i := s.starts[dd]; i < s.starts[dd]+s.subs[dd]; i++ {
				idx[dd] = i
				rec(d + 1)
			}
		}
		rec(0)
		total := ke
		for _, v := range s.sizes {
			total *= v
		}
		return m, 0, total
	}
	return m, lb, ub
}

func (s *spec) maxAlign() int64 {
	if s.op == "basic" {
		return kindInfo[s.kind].align
	}
	a := int64(1)
	for _, k := range s.kids {
		a = max(a, k.maxAlign())
	}
	return a
}

func shift(m []entry, d int64) []entry {
	out := make([]entry, len(m))
	for i, e := range m {
		out[i] = entry{e.off + d, e.kind}
	}
	return out
}

// refPack packs count instances (extent apart) of typemap m from mem.
func refPack(m []entry, extent, count int64, mem []byte) []byte {
	var out []byte
	for i := range count {
		for _, e := range m {
			o := i*extent + e.off
			out = append(out, mem[o:o+e.kind.Size()]...)
		}
	}
	return out
}

var kinds = []Kind{Byte, Int16, Int32, Int64, Float32, Float64, Complex64, Complex128, Uint8, Bool}

// gen makes a random spec of at most depth levels with non-negative
// displacements.
func gen(r *rand.Rand, depth int) *spec {
	if depth == 0 || r.IntN(4) == 0 {
		return &spec{op: "basic", kind: kinds[r.IntN(len(kinds))]}
	}
	kid := gen(r, depth-1)
	_, klb, kub := kid.ref()
	ke := kub - klb
	switch r.IntN(6) {
	case 0:
		return &spec{op: "contig", count: int64(r.IntN(4)), kids: []*spec{kid}}
	case 1:
		bl := int64(r.IntN(3) + 1)
		return &spec{op: "hvector", count: int64(r.IntN(4)), blen: bl, stride: bl*ke + int64(r.IntN(3))*ke/2 + int64(r.IntN(2))*8, kids: []*spec{kid}}
	case 2:
		n := r.IntN(4) + 1
		s := &spec{op: "hindexed", kids: []*spec{kid}}
		var at int64
		for range n {
			bl := int64(r.IntN(3))
			at += int64(r.IntN(3)) * 4
			s.blens, s.displs = append(s.blens, bl), append(s.displs, at)
			at += bl * ke
		}
		if r.IntN(3) == 0 { // blocks out of memory order
			r.Shuffle(n, func(i, j int) {
				s.blens[i], s.blens[j] = s.blens[j], s.blens[i]
				s.displs[i], s.displs[j] = s.displs[j], s.displs[i]
			})
		}
		return s
	case 3:
		n := r.IntN(3) + 1
		s := &spec{op: "struct"}
		var at int64
		for range n {
			k := gen(r, depth-1)
			_, klb, kub := k.ref()
			e := kub - klb
			a := k.maxAlign()
			at = (at + a - 1) / a * a
			bl := int64(r.IntN(2) + 1)
			s.kids, s.blens, s.displs = append(s.kids, k), append(s.blens, bl), append(s.displs, at)
			at += bl * e
		}
		return s
	case 4:
		return &spec{op: "resized", ext: ke + int64(r.IntN(3))*8, kids: []*spec{kid}}
	default:
		nd := r.IntN(3) + 1
		s := &spec{op: "subarray", order: Order(r.IntN(2)), kids: []*spec{kid}}
		for range nd {
			sz := int64(r.IntN(4) + 1)
			sub := int64(r.IntN(int(sz)) + 1)
			st := int64(r.IntN(int(sz-sub) + 1))
			s.sizes, s.subs, s.starts = append(s.sizes, sz), append(s.subs, sub), append(s.starts, st)
		}
		return s
	}
}

func TestRandomTypesAgainstReference(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for iter := range 3000 {
		s := gen(r, 3)
		ty := s.build(t)
		m, rlb, rub := s.ref()
		ext := rub - rlb
		var size int64
		tlb, tub := int64(1<<62), int64(-1)
		for _, e := range m {
			size += e.kind.Size()
			tlb, tub = min(tlb, e.off), max(tub, e.off+e.kind.Size())
		}
		require.Equal(t, size, ty.Size(), "iter %d: size of %s", iter, ty)
		require.Equal(t, int64(len(m)), ty.Elements(), "iter %d", iter)
		lb, e := ty.Extent()
		require.Equal(t, rlb, lb, "iter %d: lb of %s", iter, ty)
		require.Equal(t, ext, e, "iter %d: extent of %s", iter, ty)
		if size > 0 {
			l, te := ty.TrueExtent()
			require.Equal(t, tlb, l, "iter %d: true lb of %s", iter, ty)
			require.Equal(t, tub-tlb, te, "iter %d: true extent of %s", iter, ty)
		}
		count := int64(r.IntN(3) + 1)
		_, hi := ty.Span(count)
		require.NoError(t, ty.Check(count, hi))
		if size > 0 {
			require.Error(t, ty.Check(count, hi-1))
		}
		mem := make([]byte, hi)
		for i := range mem {
			mem[i] = byte(r.IntN(256))
		}
		want := refPack(m, ext, count, mem)
		got := make([]byte, len(want))
		require.Equal(t, len(want), ty.Pack(got, mem, count, 0))
		require.True(t, bytes.Equal(want, got), "iter %d: pack of %d x %s", iter, count, ty)
		nt := make([]byte, len(want))
		require.Equal(t, len(want), ty.PackNT(nt, mem, count, 0))
		require.True(t, bytes.Equal(want, nt), "iter %d: non-temporal pack of %d x %s", iter, count, ty)

		// Packing in chunks from any byte gives the same stream.
		if len(want) > 1 {
			chunk := r.IntN(len(want)-1) + 1
			var pieced []byte
			for from := 0; from < len(want); from += chunk {
				buf := make([]byte, min(chunk, len(want)-from))
				require.Equal(t, len(buf), ty.Pack(buf, mem, count, int64(from)))
				pieced = append(pieced, buf...)
			}
			require.True(t, bytes.Equal(want, pieced), "iter %d: chunks of %d", iter, chunk)
		}

		// Contiguous means packing is a plain slice of memory.
		if off, ok := ty.Contiguous(count); ok && len(want) > 0 {
			require.True(t, bytes.Equal(want, mem[off:off+int64(len(want))]), "iter %d: %s claims contiguity", iter, ty)
		}

		// Unpacking (into types without overlap) puts every byte back and
		// touches nothing else, chunk by chunk.
		if !overlaps(m, ext, count) {
			dst := make([]byte, len(mem))
			chunk := max(1, r.IntN(len(want)+1))
			for from := 0; from < len(want); from += chunk {
				end := min(from+chunk, len(want))
				require.Equal(t, end-from, ty.Unpack(dst, want[from:end], count, int64(from)))
			}
			touched := make([]bool, len(mem))
			for i := range count {
				for _, e := range m {
					for b := range e.kind.Size() {
						touched[i*ext+e.off+b] = true
					}
				}
			}
			for i := range dst {
				if touched[i] {
					require.Equal(t, mem[i], dst[i], "iter %d: byte %d", iter, i)
				} else {
					require.Zero(t, dst[i], "iter %d: byte %d written", iter, i)
				}
			}
		}

		// Elements and signatures of prefixes.
		n := int64(r.IntN(len(want) + 1))
		el, exact := ty.ElementsIn(count, n)
		var refEl, acc int64
	count:
		for range count {
			for _, e := range m {
				if acc+e.kind.Size() > n {
					break count
				}
				refEl++
				acc += e.kind.Size()
			}
		}
		refExact := acc == n
		require.Equal(t, refEl, el, "iter %d: elements in %d bytes", iter, n)
		require.Equal(t, refExact, exact, "iter %d: exact", iter)
		h, ok := ty.Signature(count, refEl)
		require.True(t, ok)
		require.Equal(t, refHash(m, count, refEl), h, "iter %d: signature of %d elements", iter, refEl)
	}
}

func refHash(m []entry, count, elems int64) uint64 {
	var h uint64
	for i := range count * int64(len(m)) {
		if i >= elems {
			break
		}
		h = h*hashBase + uint64(m[i%int64(len(m))].kind)
	}
	return h
}

func overlaps(m []entry, ext, count int64) bool {
	seen := map[int64]bool{}
	for i := range count {
		for _, e := range m {
			for b := range e.kind.Size() {
				o := i*ext + e.off + b
				if seen[o] {
					return true
				}
				seen[o] = true
			}
		}
	}
	return false
}

// The examples of MPI-4.1 §5.1.2-5.1.3 with oldtype {(double, 0), (char, 8)},
// extent 16.
func TestStandardExamples(t *testing.T) {
	old, err := Struct([]int64{1, 1}, []int64{0, 8}, []*Type{Basic(Float64), Basic(Byte)})
	require.NoError(t, err)
	lb, ext := old.Extent()
	require.Equal(t, [2]int64{0, 16}, [2]int64{lb, ext})
	require.Equal(t, int64(9), old.Size())

	c, err := Contiguous(3, old)
	require.NoError(t, err)
	_, ext = c.Extent()
	require.Equal(t, int64(48), ext)

	// MPI_Type_vector(2, 3, 4, oldtype): blocks at 0 and 64, extent 112.
	v, err := Vector(2, 3, 4, old)
	require.NoError(t, err)
	_, ext = v.Extent()
	require.Equal(t, int64(112), ext)
	require.Equal(t, int64(54), v.Size())
	var offs []int64
	v.Walk(1, 0, v.Size(), func(off, n int64) bool { offs = append(offs, off); return true })
	require.Equal(t, []int64{0, 16, 32, 64, 80, 96}, offs) // each instance's 9 bytes are one piece

	// MPI_Type_vector(3, 1, -2, oldtype): {0, 8, -32, -24, -64, -56}, lb -64.
	v, err = Vector(3, 1, -2, old)
	require.NoError(t, err)
	lb, ext = v.Extent()
	require.Equal(t, [2]int64{-64, 80}, [2]int64{lb, ext})

	// MPI_Type_indexed(2, {3, 1}, {4, 0}, oldtype): blocks at 64 and 0.
	x, err := Indexed([]int64{3, 1}, []int64{4, 0}, old)
	require.NoError(t, err)
	offs = nil
	x.Walk(1, 0, x.Size(), func(off, n int64) bool { offs = append(offs, off); return true })
	require.Equal(t, []int64{64, 80, 96, 0}, offs)
	lb, ext = x.Extent()
	require.Equal(t, [2]int64{0, 112}, [2]int64{lb, ext})

	// MPI_Type_create_struct(3, {2, 1, 3}, {0, 16, 26}, {float, oldtype, char}):
	// true data ends at 29, ub padded to the alignment of double.
	s, err := Struct([]int64{2, 1, 3}, []int64{0, 16, 26}, []*Type{Basic(Float32), old, Basic(Byte)})
	require.NoError(t, err)
	require.Equal(t, int64(8+9+3), s.Size())
	lb, ext = s.Extent()
	require.Equal(t, [2]int64{0, 32}, [2]int64{lb, ext})

	// Resized keeps its marks inside a vector.
	r, err := Resized(Basic(Int32), -4, 12)
	require.NoError(t, err)
	v, err = Contiguous(2, r)
	require.NoError(t, err)
	lb, ext = v.Extent()
	require.Equal(t, [2]int64{-4, 24}, [2]int64{lb, ext})
	tl, te := v.TrueExtent()
	require.Equal(t, [2]int64{0, 16}, [2]int64{tl, te})
}

func TestContiguity(t *testing.T) {
	f := Basic(Float64)
	c, _ := Contiguous(10, f)
	require.True(t, c.Dense())
	v, _ := Vector(4, 2, 2, f) // stride == block: contiguous
	require.True(t, v.Dense())
	v, _ = Vector(4, 1, 2, f)
	require.False(t, v.Dense())
	_, ok := v.Contiguous(1)
	require.False(t, ok)
	sub, _ := Subarray([]int64{4, 6}, []int64{2, 6}, []int64{1, 0}, OrderC, f) // whole rows
	off, ok := sub.Contiguous(1)
	require.True(t, ok)
	require.Equal(t, int64(48), off)
	require.False(t, sub.Dense())                    // extent is the whole array
	x, _ := Indexed([]int64{1, 1}, []int64{1, 0}, f) // reversed: not in packed order
	_, ok = x.Contiguous(1)
	require.False(t, ok)
}

func TestInvalid(t *testing.T) {
	f := Basic(Float64)
	for _, err := range []error{
		func() error { _, err := Contiguous(-1, f); return err }(),
		func() error { _, err := Hvector(2, -1, 8, f); return err }(),
		func() error { _, err := Hindexed([]int64{1}, nil, f); return err }(),
		func() error { _, err := Struct([]int64{1}, []int64{0}, []*Type{nil}); return err }(),
		func() error { _, err := Subarray([]int64{4}, []int64{5}, []int64{0}, OrderC, f); return err }(),
		func() error { _, err := Subarray([]int64{4}, []int64{2}, []int64{3}, OrderC, f); return err }(),
		func() error { _, err := Contiguous(1<<62, f); return err }(),
	} {
		require.ErrorIs(t, err, ErrInvalid)
	}
}

func FuzzPackRange(f *testing.F) {
	f.Add(uint64(1), uint64(2), uint16(3))
	f.Fuzz(func(t *testing.T, a, b uint64, cut uint16) {
		r := rand.New(rand.NewPCG(a, b))
		s := gen(r, 3)
		ty := s.build(t)
		m, rlb, rub := s.ref()
		ext := rub - rlb
		_, hi := ty.Span(2)
		mem := make([]byte, hi)
		for i := range mem {
			mem[i] = byte(i)
		}
		want := refPack(m, ext, 2, mem)
		from := int64(cut) % (int64(len(want)) + 1)
		got := make([]byte, int64(len(want))-from)
		require.Equal(t, len(got), ty.Pack(got, mem, 2, from))
		require.True(t, bytes.Equal(want[from:], got))
		nt := make([]byte, len(got))
		require.Equal(t, len(nt), ty.PackNT(nt, mem, 2, from))
		require.True(t, bytes.Equal(want[from:], nt))
	})
}

// Packing a column of float64s (1 MiB of data, 8-byte blocks 16 bytes
// apart) and a vector of 64-byte blocks: bytes per second of packed data.
func BenchmarkPack(b *testing.B) {
	for _, c := range []struct {
		name      string
		blocklen  int64
		blocks    int64
		elemBytes int64
	}{{"column", 1, 1 << 17, 8}, {"column4k", 1, 512, 8}, {"column64", 1, 8, 8}, {"blocks64", 8, 1 << 14, 8}} {
		v, err := Vector(c.blocks, c.blocklen, 2*c.blocklen, Basic(Float64))
		require.NoError(b, err)
		_, hi := v.Span(1)
		mem := make([]byte, hi)
		dst := make([]byte, v.Size())
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(v.Size())
			for b.Loop() {
				v.Pack(dst, mem, 1, 0)
			}
		})
		b.Run(c.name+"/nt", func(b *testing.B) {
			b.SetBytes(v.Size())
			for b.Loop() {
				v.PackNT(dst, mem, 1, 0)
			}
		})
		b.Run(c.name+"/unpack", func(b *testing.B) {
			b.SetBytes(v.Size())
			for b.Loop() {
				v.Unpack(mem, dst, 1, 0)
			}
		})
	}
}

// A run of 8-byte blocks with a negative stride (an hvector walking down
// from displacement 64) packs and unpacks the blocks in its order, as Walk
// visits them: the word-moving path checks the lowest and highest block.
func TestPackNegativeStrideWords(t *testing.T) {
	hv, err := Hvector(4, 1, -16, Basic(Float64))
	require.NoError(t, err)
	ty, err := Struct([]int64{1}, []int64{64}, []*Type{hv})
	require.NoError(t, err)
	mem := make([]byte, 80)
	for i := range mem {
		mem[i] = byte(i)
	}
	var want []byte
	ty.Walk(1, 0, ty.Size(), func(off, n int64) bool { want = append(want, mem[off:off+n]...); return true })
	require.Len(t, want, 32)
	require.Equal(t, byte(64), want[0], "the first block is the highest")
	got := make([]byte, 32)
	require.Equal(t, 32, ty.Pack(got, mem, 1, 0))
	require.Equal(t, want, got)
	nt := make([]byte, 32)
	require.Equal(t, 32, ty.PackNT(nt, mem, 1, 0))
	require.Equal(t, want, nt)
	back := make([]byte, 80)
	require.Equal(t, 32, ty.Unpack(back, got, 1, 0))
	for _, off := range []int{16, 32, 48, 64} {
		require.Equal(t, mem[off:off+8], back[off:off+8], "block at %d", off)
	}
}
