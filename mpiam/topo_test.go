package mpiam

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// DimsCreate balances the free extents, keeps the given ones, and refuses
// what cannot be (MPI-4.1 §8.5.2, with the standard's examples).
func TestDimsCreate_MPI41_8_5_2(t *testing.T) {
	for _, c := range []struct {
		n         int
		dims, out []int
	}{
		{6, []int{0, 0}, []int{3, 2}},
		{7, []int{0, 0}, []int{7, 1}},
		{6, []int{0, 3, 0}, []int{2, 3, 1}},
		{12, []int{0, 0}, []int{4, 3}},
		{16, []int{0, 0, 0}, []int{4, 2, 2}},
		{36, []int{0, 0}, []int{6, 6}},
		{30, []int{0, 0, 0}, []int{5, 3, 2}},
		{64, []int{0, 0, 0}, []int{4, 4, 4}},
		{1, []int{0, 0}, []int{1, 1}},
		{8, []int{2, 0, 2}, []int{2, 2, 2}},
		{5, []int{5}, []int{5}},
		{1, nil, nil},
		{1 << 20, []int{0, 0, 0, 0}, []int{32, 32, 32, 32}},
		{720720, []int{0, 0, 0}, []int{91, 90, 88}},
		{1000000007, []int{0, 0}, []int{1000000007, 1}}, // a large prime: quick, not a scan of every integer
	} {
		dims := append([]int(nil), c.dims...)
		require.NoError(t, DimsCreate(c.n, dims), "%d %v", c.n, c.dims)
		require.Equal(t, c.out, dims, "DimsCreate(%d, %v)", c.n, c.dims)
	}
	for _, c := range []struct {
		n    int
		dims []int
	}{{7, []int{0, 3, 0}}, {6, []int{0, -1}}, {0, []int{0}}, {6, []int{4}}, {6, []int{2, 2}}} {
		err := DimsCreate(c.n, append([]int(nil), c.dims...))
		require.ErrorIs(t, err, ErrDims, "DimsCreate(%d, %v)", c.n, c.dims)
		require.Equal(t, ClassDims, ErrorClass(err))
	}
}

// A 2-D grid of 3 x 2 ranks out of 7, periodic along the first dimension
// only (MPI-4.1 §8.5): row-major coordinates, CartRank and CartCoords
// inverse to each other, CartShift wrapping along the periodic dimension and
// ProcNull past the edges of the other, a halo exchange with the shifted
// ranks, CartSub into rows and columns, and the seventh rank left out.
func TestCartesianTopology_MPI41_8_5(t *testing.T) {
	eachNetwork(t, 7, func(r *rk, w *Comm) {
		topo, err := w.TopoTest()
		r.NoError(err)
		r.Equal(TopoNone, topo)
		_, err = w.CartDim()
		r.ErrorIs(err, ErrTopology)

		g, err := w.CartCreate([]int{3, 2}, []bool{true, false}, true)
		r.NoError(err)
		if w.Rank() == 6 {
			r.Nil(g, "the rank beyond the grid gets no communicator")
			return
		}
		r.Equal(6, g.Size())
		r.Equal(w.Rank(), g.Rank(), "ranks are not reordered")
		topo, err = g.TopoTest()
		r.NoError(err)
		r.Equal(TopoCart, topo)
		nd, err := g.CartDim()
		r.NoError(err)
		r.Equal(2, nd)
		dims, periods, coords, err := g.CartGet()
		r.NoError(err)
		r.Equal([]int{3, 2}, dims)
		r.Equal([]bool{true, false}, periods)
		r.Equal([]int{g.Rank() / 2, g.Rank() % 2}, coords)
		for q := range g.Size() {
			c, err := g.CartCoords(q)
			r.NoError(err)
			back, err := g.CartRank(c)
			r.NoError(err)
			r.Equal(q, back)
		}
		wrapped, err := g.CartRank([]int{-1, 1})
		r.NoError(err)
		r.Equal(5, wrapped, "periodic dimension wraps")
		_, err = g.CartRank([]int{0, 2})
		r.ErrorIs(err, ErrRank)
		_, err = g.CartRank([]int{0})
		r.ErrorIs(err, ErrArg)
		_, err = g.CartCoords(6)
		r.ErrorIs(err, ErrRank)

		// Along the periodic dimension: a ring of 3.
		src, dst, err := g.CartShift(0, 1)
		r.NoError(err)
		r.Equal(((coords[0]+2)%3)*2+coords[1], src)
		r.Equal(((coords[0]+1)%3)*2+coords[1], dst)
		// Along the other: ProcNull past the edge.
		src, dst, err = g.CartShift(1, 1)
		r.NoError(err)
		if coords[1] == 0 {
			r.Equal(ProcNull, src)
			r.Equal(g.Rank()+1, dst)
		} else {
			r.Equal(g.Rank()-1, src)
			r.Equal(ProcNull, dst)
		}
		_, _, err = g.CartShift(2, 1)
		r.ErrorIs(err, ErrDims)
		// A halo exchange along dimension 1 with ProcNull at the edges.
		in := []int64{-7}
		_, err = Sendrecv(g, []int64{int64(g.Rank())}, dst, 5, in, src, 5)
		r.NoError(err)
		if src == ProcNull {
			r.Equal(int64(-7), in[0], "a receive from ProcNull leaves the buffer")
		} else {
			r.Equal(int64(src), in[0])
		}

		// Rows (keep dimension 1) and columns (keep dimension 0).
		row, err := g.CartSub([]bool{false, true})
		r.NoError(err)
		r.Equal(2, row.Size())
		r.Equal(coords[1], row.Rank())
		rd, rp, rc, err := row.CartGet()
		r.NoError(err)
		r.Equal([]int{2}, rd)
		r.Equal([]bool{false}, rp)
		r.Equal([]int{coords[1]}, rc)
		sum := make([]int64, 1)
		r.NoError(Allreduce(row, []int64{int64(g.Rank())}, sum, Sum[int64]()))
		r.Equal(int64(4*coords[0]+1), sum[0], "a row holds ranks 2i and 2i+1")
		col, err := g.CartSub([]bool{true, false})
		r.NoError(err)
		r.Equal(3, col.Size())
		r.Equal(coords[0], col.Rank())
		_, cp, _, err := col.CartGet()
		r.NoError(err)
		r.Equal([]bool{true}, cp)
		none, err := g.CartSub([]bool{false, false})
		r.NoError(err)
		r.Equal(1, none.Size())
		nd, err = none.CartDim()
		r.NoError(err)
		r.Zero(nd)
		_, err = g.CartSub([]bool{true})
		r.ErrorIs(err, ErrArg)
		for _, c := range []*Comm{row, col, none, g} {
			r.NoError(c.Free())
		}
	})
}

// CartCreate refuses bad grids on every rank alike, and a grid that the
// ranks do not agree on with ErrNotSame on all of them.
func TestCartCreateErrors(t *testing.T) {
	runJob(t, "loop", 4, Config{}, func(r *rk, w *Comm) {
		_, err := w.CartCreate([]int{2, 2}, []bool{false}, false)
		r.ErrorIs(err, ErrArg)
		_, err = w.CartCreate([]int{3, 2}, []bool{false, false}, false)
		r.ErrorIs(err, ErrDims, "more points than ranks")
		_, err = w.CartCreate([]int{2, 0}, []bool{false, false}, false)
		r.ErrorIs(err, ErrDims)
		dims := []int{2, 2}
		if w.Rank() == 3 {
			dims = []int{4, 1}
		}
		_, err = w.CartCreate(dims, []bool{false, false}, false)
		r.ErrorIs(err, ErrNotSame)
		r.Equal(ClassNotSame, ErrorClass(err))
		// One rank's bad grid fails there, and on the others as a mismatch
		// (never a rank left waiting in the collective step).
		dims = []int{2, 2}
		if w.Rank() == 3 {
			dims = []int{2, 0}
		}
		_, err = w.CartCreate(dims, []bool{false, false}, false)
		if w.Rank() == 3 {
			r.ErrorIs(err, ErrDims)
		} else {
			r.ErrorIs(err, ErrNotSame)
		}
		// The communicator is still usable afterwards.
		g, err := w.CartCreate([]int{4}, []bool{true}, false)
		r.NoError(err)
		src, dst, err := g.CartShift(0, -1)
		r.NoError(err)
		r.Equal((w.Rank()+1)%4, src)
		r.Equal((w.Rank()+3)%4, dst)
		r.NoError(g.Free())
	})
}

// Wtime advances with the wall clock and never goes back; Wtick is its
// resolution (MPI-4.1 §9.6.1).
func TestWtime_MPI41_9_6_1(t *testing.T) {
	a := Wtime()
	time.Sleep(20 * time.Millisecond)
	b := Wtime()
	require.GreaterOrEqual(t, b-a, 0.019)
	require.Less(t, b-a, 10.0)
	for range 1000 {
		c := Wtime()
		require.GreaterOrEqual(t, c, b)
		b = c
	}
	require.Equal(t, 1e-9, Wtick())
}
