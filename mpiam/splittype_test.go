package mpiam

import (
	"testing"

	"github.com/amgo-hpc/amgo/am/transport"
)

// SplitType with CommTypeShared groups the ranks of one node (MPI-4.1
// §7.4.2): the whole job on one network; in the mixed jobs (ranks
// alternating between two emulated nodes) the ranks of one parity, ordered
// by key and then by rank. Undefined gives nil; other types are ErrArg.
func TestSplitTypeShared_MPI41_7_4_2(t *testing.T) {
	eachNetwork(t, 5, func(r *rk, w *Comm) {
		nodes := map[int][]int{}
		for q := range w.Size() {
			k := w.p.ep.Node(q)
			nodes[k] = append(nodes[k], q)
		}
		mine := nodes[w.p.ep.Node(w.Rank())]
		// key -rank: the new communicator lists the node's ranks in reverse.
		s, err := w.SplitType(CommTypeShared, -w.Rank())
		r.NoError(err)
		r.Equal(len(mine), s.Size())
		r.Equal(len(mine)-1-indexOf(mine, w.Rank()), s.Rank())
		got := make([]int64, s.Size())
		r.NoError(Allgather(s, []int64{int64(w.Rank())}, got))
		for i, q := range got {
			r.EqualValues(mine[len(mine)-1-i], q, "member %d", i)
		}
		r.NoError(s.Free())

		// Undefined on some ranks: they get nil, the others their node.
		st := CommTypeShared
		if w.Rank() == 0 {
			st = CommType(Undefined)
		}
		s, err = w.SplitType(st, 0)
		r.NoError(err)
		if w.Rank() == 0 {
			r.Nil(s)
		} else {
			want := len(mine)
			if w.p.ep.Node(0) == w.p.ep.Node(w.Rank()) {
				want--
			}
			r.Equal(want, s.Size())
			r.NoError(s.Free())
		}
		_, err = w.SplitType(CommType(7), 0)
		r.ErrorIs(err, ErrArg)
		if _, mixed := w.p.ep.Transport().(transport.PeerCapser); mixed {
			r.Len(nodes, 2, "two emulated nodes")
		} else {
			r.Len(nodes, 1)
		}
	})
}

func indexOf(s []int, v int) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}
