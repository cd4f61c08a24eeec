package mpiam

import (
	"testing"
)

// A distributed graph on 5 ranks, asymmetric and with a repeated edge
// (rank r sends to r+1 and r+2, and twice to r+1 when r is 0): neighbor
// queries return what each rank gave, NeighborAllgather and
// NeighborAlltoall deliver each in-neighbor's block in the order of the
// sources, repeated edges matched in order (MPI-4.1 §8.5.4, §8.6).
func TestDistGraphNeighborhood_MPI41_8_6(t *testing.T) {
	eachNetwork(t, 5, func(r *rk, w *Comm) {
		n, me := w.Size(), w.Rank()
		dests := []int{(me + 1) % n, (me + 2) % n}
		if me == 0 {
			dests = append(dests, 1)
		}
		sources := []int{(me + n - 1) % n, (me + n - 2) % n}
		if me == 1 {
			sources = append(sources, 0)
		}
		weights := make([]int, len(dests))
		for i := range weights {
			weights[i] = 10 + i
		}
		g, err := w.DistGraphCreateAdjacent(sources, nil, dests, nil, false)
		r.NoError(err)
		topo, err := g.TopoTest()
		r.NoError(err)
		r.Equal(TopoDistGraph, topo)
		in, out, weighted, err := g.DistGraphNeighborsCount()
		r.NoError(err)
		r.Equal(len(sources), in)
		r.Equal(len(dests), out)
		r.False(weighted)
		s2, sw, d2, dw, err := g.DistGraphNeighbors()
		r.NoError(err)
		r.Equal(sources, s2)
		r.Equal(dests, d2)
		r.Nil(sw)
		r.Nil(dw)

		// Allgather: every in-neighbor's rank, twice (two elements each).
		got := make([]int64, 2*len(sources))
		r.NoError(NeighborAllgather(g, []int64{int64(me), int64(100 + me)}, got))
		for i, s := range sources {
			r.Equal([]int64{int64(s), int64(100 + s)}, got[2*i:2*i+2], "block %d from rank %d", i, s)
		}
		// Alltoall: block i to destination i says (sender, i).
		send := make([]int64, 2*len(dests))
		for i := range dests {
			send[2*i], send[2*i+1] = int64(me), int64(i)
		}
		recv := make([]int64, 2*len(sources))
		r.NoError(NeighborAlltoall(g, send, recv))
		seen := map[int]int{} // per source, how many blocks from it so far
		for i, s := range sources {
			r.Equal(int64(s), recv[2*i])
			// The k-th block from s is the one s addressed to its k-th
			// edge to this rank.
			var idx []int
			sd := []int{(s + 1) % n, (s + 2) % n}
			if s == 0 {
				sd = append(sd, 1)
			}
			for j, d := range sd {
				if d == me {
					idx = append(idx, j)
				}
			}
			r.Equal(int64(idx[seen[s]]), recv[2*i+1], "block %d from rank %d", i, s)
			seen[s]++
		}
		_, err = g.CartDim()
		r.ErrorIs(err, ErrTopology)
		r.ErrorIs(NeighborAllgather(g, []int64{1}, make([]int64, 1)), ErrCount)
		r.NoError(g.Free())

		// Weighted, and checked: weights come back.
		g, err = w.DistGraphCreateAdjacent(sources, make([]int, len(sources)), dests, weights, true)
		r.NoError(err)
		_, _, weighted, err = g.DistGraphNeighborsCount()
		r.NoError(err)
		r.True(weighted)
		_, _, _, dw, err = g.DistGraphNeighbors()
		r.NoError(err)
		r.Equal(weights, dw)
		r.NoError(g.Free())
	})
}

// An inconsistent graph (an edge that only its sender names) and a
// neighbor outside the communicator are refused on every rank; a
// neighborhood collective needs a topology.
func TestDistGraphErrors(t *testing.T) {
	runJob(t, "loop", 3, Config{}, func(r *rk, w *Comm) {
		me := w.Rank()
		dests := []int{(me + 1) % 3}
		if me == 0 {
			dests = append(dests, 2) // rank 2 does not list 0 twice
		}
		_, err := w.DistGraphCreateAdjacent([]int{(me + 2) % 3}, nil, dests, nil, false)
		r.ErrorIs(err, ErrTopology)
		r.Equal(ClassTopology, ErrorClass(err))
		srcs := []int{(me + 2) % 3}
		if me == 1 {
			srcs = []int{7}
		}
		_, err = w.DistGraphCreateAdjacent(srcs, nil, []int{(me + 1) % 3}, nil, false)
		if me == 1 {
			r.ErrorIs(err, ErrRank)
		} else {
			r.ErrorIs(err, ErrTopology, "the others see the graph fail")
		}
		_, err = w.DistGraphCreateAdjacent(nil, nil, nil, []int{1}, false)
		r.ErrorIs(err, ErrArg)
		r.ErrorIs(NeighborAllgather(w, []int64{1}, make([]int64, 2)), ErrTopology)
		// Still usable: an empty graph.
		g, err := w.DistGraphCreateAdjacent(nil, nil, nil, nil, false)
		r.NoError(err)
		r.NoError(NeighborAlltoall(g, []int64{}, []int64{}))
		r.NoError(g.Free())
	})
}

// On a Cartesian grid the neighbors are, per dimension, the rank below and
// the rank above (MPI-4.1 §8.6): on a non-periodic 1-D grid of 4 the end
// ranks have a ProcNull neighbor, whose block is left untouched.
func TestCartNeighborhood_MPI41_8_6(t *testing.T) {
	runJob(t, "loop", 4, Config{}, func(r *rk, w *Comm) {
		g, err := w.CartCreate([]int{4}, []bool{false}, false)
		r.NoError(err)
		me := g.Rank()
		got := []int64{-1, -1}
		r.NoError(NeighborAllgather(g, []int64{int64(me)}, got))
		want := []int64{int64(me - 1), int64(me + 1)}
		if me == 0 {
			want[0] = -1
		}
		if me == 3 {
			want[1] = -1
		}
		r.Equal(want, got)
		// Alltoall: send "down" to the lower neighbor and "up" to the upper.
		recv := []int64{-1, -1}
		r.NoError(NeighborAlltoall(g, []int64{int64(-me), int64(me)}, recv))
		if me > 0 {
			r.Equal(int64(me-1), recv[0], "the lower neighbor's up block")
		}
		if me < 3 {
			r.Equal(int64(-(me + 1)), recv[1], "the upper neighbor's down block")
		}
		r.NoError(g.Free())
	})
}

// The v variants on a ring graph (each rank sends to both neighbors):
// rank r sends r+1 elements, placed at reversed displacements, and in
// NeighborAlltoallv a different count to each neighbor (MPI-4.1 §8.6).
func TestNeighborV_MPI41_8_6(t *testing.T) {
	eachNetwork(t, 4, func(r *rk, w *Comm) {
		n, me := w.Size(), w.Rank()
		left, right := (me+n-1)%n, (me+1)%n
		g, err := w.DistGraphCreateAdjacent([]int{left, right}, nil, []int{left, right}, nil, false)
		r.NoError(err)
		send := make([]int32, me+1)
		for i := range send {
			send[i] = int32(10*me + i)
		}
		counts := []int{left + 1, right + 1}
		displs := []int{right + 1, 0} // the left neighbor's block after the right one's
		recv := make([]int32, counts[0]+counts[1])
		r.NoError(NeighborAllgatherv(g, send, recv, counts, displs))
		for i := 0; i <= left; i++ {
			r.Equal(int32(10*left+i), recv[displs[0]+i])
		}
		for i := 0; i <= right; i++ {
			r.Equal(int32(10*right+i), recv[i])
		}
		r.ErrorIs(NeighborAllgatherv(g, send, recv, counts[:1], displs[:1]), ErrCount)

		// Alltoallv: 1 element to the left neighbor, 2 to the right.
		out := []int32{int32(me), int32(100 + me), int32(200 + me)}
		in := make([]int32, 3)
		// From the left neighbor (which sends 2 to its right), from the
		// right neighbor (which sends 1 to its left).
		r.NoError(NeighborAlltoallv(g, out, []int{1, 2}, []int{0, 1}, in, []int{2, 1}, []int{0, 2}))
		r.Equal([]int32{int32(100 + left), int32(200 + left), int32(right)}, in)
		r.ErrorIs(NeighborAlltoallv(g, out, []int{1, 9}, []int{0, 1}, in, []int{2, 1}, []int{0, 2}), ErrCount)
		r.NoError(g.Free())
	})
}

// The nonblocking forms give what the blocking ones give, several in
// flight at once and completed in any order with point-to-point traffic
// between them; without a topology they fail at the call (MPI-4.1 §8.7).
func TestIneighbor_MPI41_8_7(t *testing.T) {
	eachNetwork(t, 4, func(r *rk, w *Comm) {
		n, me := w.Size(), w.Rank()
		left, right := (me+n-1)%n, (me+1)%n
		g, err := w.DistGraphCreateAdjacent([]int{left, right}, nil, []int{left, right}, nil, false)
		r.NoError(err)
		ag := make([]int64, 2)
		r1, err := IneighborAllgather(g, []int64{int64(me)}, ag)
		r.NoError(err)
		aa := make([]int64, 2)
		r2, err := IneighborAlltoall(g, []int64{int64(10 * me), int64(10*me + 1)}, aa)
		r.NoError(err)
		agv := make([]int64, 2)
		r3, err := IneighborAllgatherv(g, []int64{int64(me)}, agv, []int{1, 1}, []int{1, 0})
		r.NoError(err)
		aav := make([]int64, 2)
		r4, err := IneighborAlltoallv(g, []int64{int64(-me), int64(me)}, []int{1, 1}, []int{0, 1}, aav, []int{1, 1}, []int{0, 1})
		r.NoError(err)
		// Point-to-point on the parent communicator while they run.
		in := make([]int64, 1)
		_, err = Sendrecv(w, []int64{int64(me)}, right, 3, in, left, 3)
		r.NoError(err)
		r.Equal(int64(left), in[0])
		err = Waitall([]Request{r4, r2, r3, r1}, nil)
		r.NoError(err)
		r.Equal([]int64{int64(left), int64(right)}, ag)
		r.Equal([]int64{int64(10*left + 1), int64(10 * right)}, aa, "the left neighbor's block for its right, the right's for its left")
		r.Equal([]int64{int64(right), int64(left)}, agv)
		r.Equal([]int64{int64(left), int64(-right)}, aav)
		_, err = IneighborAllgather(w, []int64{1}, make([]int64, 2))
		r.ErrorIs(err, ErrTopology)
		r.NoError(g.Free())
	})
}

// DistGraphCreate with edges named by ranks other than their ends: rank 0
// names a ring for everyone; ranks 1 and 2 each name an edge 0 -> 2 with
// its own weight, so 0 and 2 share a repeated edge whose two copies must be
// paired alike at both ends (ordered by who named them). Bad arguments on
// one rank fail the call on all (MPI-4.1 §8.5.4).
func TestDistGraphCreate_MPI41_8_5_4(t *testing.T) {
	eachNetwork(t, 4, func(r *rk, w *Comm) {
		n, me := w.Size(), w.Rank()
		var sources, degrees, dests, weights []int
		if me == 0 {
			for q := range n {
				sources = append(sources, q)
				degrees = append(degrees, 1)
				dests = append(dests, (q+1)%n)
				weights = append(weights, 1)
			}
		}
		if me == 1 || me == 2 {
			sources, degrees, dests, weights = []int{0}, []int{1}, []int{2}, []int{10 * me}
		}
		g, err := w.DistGraphCreate(sources, degrees, dests, weights, false)
		r.NoError(err)
		src, sw, dst, dw, err := g.DistGraphNeighbors()
		r.NoError(err)
		left, right := (me+n-1)%n, (me+1)%n
		switch me {
		case 0:
			r.Equal([]int{left}, src)
			r.Equal([]int{right, 2, 2}, dst, "the ring's edge first (named by rank 0), then rank 1's, then rank 2's")
			r.Equal([]int{1, 10, 20}, dw)
		case 2:
			r.Equal([]int{left, 0, 0}, src)
			r.Equal([]int{1, 10, 20}, sw)
			r.Equal([]int{right}, dst)
		default:
			r.Equal([]int{left}, src)
			r.Equal([]int{right}, dst)
		}
		// A block per edge, saying which edge: the repeated edges pair up.
		send := make([]int64, len(dst))
		for i := range dst {
			send[i] = int64(100*me + i)
		}
		recv := make([]int64, len(src))
		r.NoError(NeighborAlltoall(g, send, recv))
		if me == 2 {
			r.Equal([]int64{100 * 1, 100*0 + 1, 100*0 + 2}, recv)
		}
		r.NoError(g.Free())

		// One rank's degrees do not add up: everyone fails.
		if me == 3 {
			_, err = w.DistGraphCreate([]int{3}, []int{2}, []int{0}, nil, false)
		} else {
			_, err = w.DistGraphCreate(nil, nil, nil, nil, false)
		}
		r.ErrorIs(err, ErrArg)
		_, err = w.DistGraphCreate([]int{0}, []int{1}, []int{9}, nil, false)
		r.Error(err)
		// Unweighted, empty on every rank: a graph without edges.
		g, err = w.DistGraphCreate(nil, nil, nil, nil, false)
		r.NoError(err)
		in, out, weighted, err := g.DistGraphNeighborsCount()
		r.NoError(err)
		r.Zero(in + out)
		r.False(weighted)
		r.NoError(g.Free())
	})
}

// GraphCreate: every rank passes the whole graph; queries return it; a
// symmetric graph carries neighborhood collectives (each neighbor both
// ways), a directed one refuses them; rank 4 of 5 is outside a 4-node graph
// (MPI-4.1 §8.5.3, §8.6).
func TestGraphCreate_MPI41_8_5_3(t *testing.T) {
	eachNetwork(t, 5, func(r *rk, w *Comm) {
		// A star: node 0 joined to 1, 2, 3 both ways.
		index := []int{3, 4, 5, 6}
		edges := []int{1, 2, 3, 0, 0, 0}
		g, err := w.GraphCreate(index, edges, false)
		r.NoError(err)
		if w.Rank() == 4 {
			r.Nil(g)
		} else {
			topo, err := g.TopoTest()
			r.NoError(err)
			r.Equal(TopoGraph, topo)
			nn, ne, err := g.GraphdimsGet()
			r.NoError(err)
			r.Equal(4, nn)
			r.Equal(6, ne)
			gi, ge, err := g.GraphGet()
			r.NoError(err)
			r.Equal(index, gi)
			r.Equal(edges, ge)
			nb, err := g.GraphNeighbors(0)
			r.NoError(err)
			r.Equal([]int{1, 2, 3}, nb)
			k, err := g.GraphNeighborsCount(2)
			r.NoError(err)
			r.Equal(1, k)
			_, err = g.GraphNeighbors(4)
			r.ErrorIs(err, ErrRank)
			mine, _ := g.GraphNeighbors(g.Rank())
			got := make([]int64, len(mine))
			r.NoError(NeighborAllgather(g, []int64{int64(g.Rank())}, got))
			for i, q := range mine {
				r.Equal(int64(q), got[i])
			}
			r.NoError(g.Free())
		}
		// Directed (0 -> 1 only): created, but no neighborhood collective.
		d, err := w.GraphCreate([]int{1, 1}, []int{1}, false)
		r.NoError(err)
		if w.Rank() < 2 {
			r.ErrorIs(NeighborAllgather(d, []int64{1}, make([]int64, 1)), ErrTopology)
			r.NoError(d.Free())
		}
		// Bad on one rank: it says why, the others see a mismatch.
		idx := []int{1, 2}
		if w.Rank() == 1 {
			idx = []int{2, 1}
		}
		_, err = w.GraphCreate(idx, []int{1, 0}, false)
		if w.Rank() == 1 {
			r.ErrorIs(err, ErrArg)
		} else {
			r.ErrorIs(err, ErrNotSame)
		}
		_, err = w.GraphCreate(make([]int, 6), nil, false)
		r.ErrorIs(err, ErrDims)
	})
}
