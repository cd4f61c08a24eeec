package mpiam

import (
	"fmt"
	"strings"
	"testing"
)

// Layouts of the node-aware tests: 3 nodes of 1, 2 and 5 ranks, as blocks
// and interleaved; 2 nodes of 2 ranks; 2 nodes of 1 and 1 rank, and one
// node (where the flat algorithms run).
var nodeLayouts = [][]int{
	{0, 1, 1, 2, 2, 2, 2, 2},
	{2, 0, 1, 2, 2, 1, 2, 2},
	{0, 0, 1, 1},
	{0, 1, 0, 1},
	{0, 1, 1},
	{0, 0, 0},
}

func layoutName(nodes []int) string {
	s := make([]string, len(nodes))
	for i, k := range nodes {
		s[i] = fmt.Sprint(k)
	}
	return "nodes=" + strings.Join(s, ",")
}

// The levels of a communicator: leaders, each rank's node, whether blocks
// are contiguous and whether the levels help.
func TestLevels(t *testing.T) {
	runJob(t, layoutName(nodeLayouts[1]), 8, Config{}, func(r *rk, w *Comm) {
		l := w.levels()
		r.Equal([]int{0, 1, 2}, l.leaders.ranks, "the lowest rank of each node, in node order")
		r.Equal([]int{0, 3, 4, 6, 7, 1, 2, 5}, l.order, "node by node")
		r.Equal([]int{0, 1, 2, 0, 0, 2, 0, 0}, l.leaderOf)
		r.False(l.contiguous)
		r.True(l.useful)
		switch w.Rank() {
		case 0, 3, 4, 6, 7:
			r.Equal([]int{0, 3, 4, 6, 7}, l.node.ranks)
		case 2, 5:
			r.Equal([]int{2, 5}, l.node.ranks)
		default:
			r.Equal([]int{1}, l.node.ranks)
		}
		r.Equal(indexOf(l.node.ranks, w.Rank()), l.node.me)
		r.Equal(w.Rank() <= 2, l.isLeader())
	})
	runJob(t, layoutName(nodeLayouts[0]), 8, Config{}, func(r *rk, w *Comm) {
		l := w.levels()
		r.True(l.contiguous)
		r.Equal([]int{0, 1, 2, 3, 4, 5, 6, 7}, l.order)
	})
	runJob(t, layoutName([]int{0, 1, 2}), 3, Config{}, func(r *rk, w *Comm) {
		r.False(w.levels().useful, "one rank per node: flat")
	})
}

// digits is a non-commutative, associative operation: (a, la) ∘ (b, lb) =
// (a·10^lb + b, la+lb), the decimal concatenation of the ranks' digits, so
// the result shows the order the contributions were combined in.
type digits struct{ V, L int64 }

var concat = NewOp("concat", func(in, inout []digits) {
	for i := range inout {
		v := in[i].V
		for range inout[i].L {
			v *= 10
		}
		inout[i] = digits{v + inout[i].V, in[i].L + inout[i].L}
	}
}, false)

// Known answers of the node-aware collectives on uneven layouts, every root,
// small and large messages, commutative and non-commutative operations (in
// rank order), with the levels on and off.
func TestNodeAwareCollectives(t *testing.T) {
	for _, nodes := range nodeLayouts {
		n := len(nodes)
		for _, aware := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/aware=%v", layoutName(nodes), aware), func(t *testing.T) {
				was := nodeAware
				nodeAware = aware
				defer func() { nodeAware = was }()
				runJob(t, layoutName(nodes), n, Config{}, func(r *rk, w *Comm) {
					checkNodeColls(r, w)
				})
			})
		}
	}
}

func checkNodeColls(r *rk, w *Comm) {
	n, me := w.Size(), w.Rank()
	for root := range n {
		for _, size := range []int{1, 3, bcastLarge/8 + 5} {
			// Bcast.
			buf := make([]int64, size)
			if me == root {
				for i := range buf {
					buf[i] = int64(root*1000 + i)
				}
			}
			r.NoError(Bcast(w, buf, root))
			for i, v := range buf {
				r.EqualValues(root*1000+i, v, "Bcast root %d size %d element %d", root, size, i)
			}
			// Reduce, commutative.
			send := make([]int64, size)
			for i := range send {
				send[i] = int64(me + i)
			}
			recv := make([]int64, size)
			r.NoError(Reduce(w, send, recv, Sum[int64](), root))
			if me == root {
				for i, v := range recv {
					r.EqualValues(n*(n-1)/2+n*i, v, "Reduce root %d size %d", root, size)
				}
			}
		}
		// Reduce, non-commutative: the ranks' digits in rank order.
		d := []digits{{int64(me + 1), 1}}
		out := make([]digits, 1)
		r.NoError(Reduce(w, d, out, concat, root))
		if me == root {
			r.Equal(inOrder(n), out[0].V, "non-commutative Reduce at root %d", root)
		}
		// Gather.
		blk := []int32{int32(me), int32(-me)}
		var all []int32
		if me == root {
			all = make([]int32, 2*n)
		}
		r.NoError(Gather(w, blk, all, root))
		if me == root {
			for q := range n {
				r.Equal([]int32{int32(q), int32(-q)}, all[2*q:2*q+2], "Gather root %d rank %d", root, q)
			}
		}
	}
	for _, size := range []int{1, 700, allreduceRabenseifner/8 + 3} {
		send := make([]int64, size)
		for i := range send {
			send[i] = int64(me*7 + i)
		}
		recv := make([]int64, size)
		r.NoError(Allreduce(w, send, recv, Sum[int64]()))
		for i, v := range recv {
			r.EqualValues(7*n*(n-1)/2+n*i, v, "Allreduce size %d", size)
		}
		// In place.
		copy(recv, send)
		r.NoError(Allreduce(w, nil, recv, Max[int64]()))
		r.EqualValues(7*(n-1), recv[0])
	}
	d := []digits{{int64(me + 1), 1}}
	out := make([]digits, 1)
	r.NoError(Allreduce(w, d, out, concat))
	r.Equal(inOrder(n), out[0].V, "non-commutative Allreduce")
	for _, k := range []int{1, 5, 9000} {
		blk := make([]int16, k)
		for i := range blk {
			blk[i] = int16(me*100 + i%50)
		}
		all := make([]int16, k*n)
		r.NoError(Allgather(w, blk, all))
		for q := range n {
			for i := 0; i < k; i += 97 {
				r.EqualValues(q*100+i%50, all[q*k+i], "Allgather block %d of %d", q, k)
			}
		}
	}
	for range 3 {
		r.NoError(w.Barrier())
	}
	req, err := w.Ibarrier()
	r.NoError(err)
	_, err = req.Wait()
	r.NoError(err)
	// A split communicator has levels of its own.
	s, err := w.Split(me%2, n-me)
	r.NoError(err)
	sum := make([]int64, 1)
	r.NoError(Allreduce(s, []int64{int64(me)}, sum, Sum[int64]()))
	want := 0
	for q := me % 2; q < n; q += 2 {
		want += q
	}
	r.EqualValues(want, sum[0])
	r.NoError(s.Barrier())
	r.NoError(s.Free())
}

// inOrder is the concatenation of the digits 1..n.
func inOrder(n int) int64 {
	var v int64
	for q := 1; q <= n; q++ {
		v = v*10 + int64(q)
	}
	return v
}

// checkNodeNB checks the nonblocking Ibcast, Ireduce and Iallreduce, whose
// schedules take the node levels as the blocking calls do, against the
// same known answers, several in flight at once.
func checkNodeNB(r *rk, w *Comm) {
	n, me := w.Size(), w.Rank()
	wait := func(q Request, err error) {
		r.NoError(err)
		_, err = q.Wait()
		r.NoError(err)
	}
	for root := range n {
		for _, size := range []int{1, 3, bcastLarge/8 + 5} {
			buf := make([]int64, size)
			if me == root {
				for i := range buf {
					buf[i] = int64(root*1000 + i)
				}
			}
			send := make([]int64, size)
			for i := range send {
				send[i] = int64(me + i)
			}
			recv := make([]int64, size)
			b, errb := Ibcast(w, buf, root)
			red, errr := Ireduce(w, send, recv, Sum[int64](), root)
			wait(b, errb)
			wait(red, errr)
			for i, v := range buf {
				r.EqualValues(root*1000+i, v, "Ibcast root %d size %d element %d", root, size, i)
			}
			if me == root {
				for i, v := range recv {
					r.EqualValues(n*(n-1)/2+n*i, v, "Ireduce root %d size %d", root, size)
				}
			}
		}
		d := []digits{{int64(me + 1), 1}}
		out := make([]digits, 1)
		wait(Ireduce(w, d, out, concat, root))
		if me == root {
			r.Equal(inOrder(n), out[0].V, "non-commutative Ireduce at root %d", root)
		}
		// Igather, and in place at root.
		blk := []int32{int32(me), int32(-me)}
		var all []int32
		if me == root {
			all = make([]int32, 2*n)
		}
		wait(Igather(w, blk, all, root))
		var inpl []int32
		send := blk
		if me == root {
			inpl = make([]int32, 2*n)
			copy(inpl[2*me:], blk)
			send = nil
		}
		wait(Igather(w, send, inpl, root))
		if me == root {
			for q := range n {
				r.Equal([]int32{int32(q), int32(-q)}, all[2*q:2*q+2], "Igather root %d rank %d", root, q)
				r.Equal([]int32{int32(q), int32(-q)}, inpl[2*q:2*q+2], "in-place Igather root %d rank %d", root, q)
			}
		}
	}
	for _, k := range []int{1, 5, 900} {
		blk := make([]int16, k)
		for i := range blk {
			blk[i] = int16(me*100 + i%50)
		}
		all := make([]int16, k*n)
		wait(Iallgather(w, blk, all))
		inpl := make([]int16, k*n)
		copy(inpl[me*k:], blk)
		wait(Iallgather(w, nil, inpl))
		for q := range n {
			for i := 0; i < k; i += 7 {
				r.EqualValues(q*100+i%50, all[q*k+i], "Iallgather block %d of %d", q, k)
				r.EqualValues(q*100+i%50, inpl[q*k+i], "in-place Iallgather block %d of %d", q, k)
			}
		}
	}
	for _, size := range []int{1, 700} {
		send := make([]int64, size)
		for i := range send {
			send[i] = int64(me*7 + i)
		}
		recv := make([]int64, size)
		wait(Iallreduce(w, send, recv, Sum[int64]()))
		for i, v := range recv {
			r.EqualValues(7*n*(n-1)/2+n*i, v, "Iallreduce size %d", size)
		}
		copy(recv, send)
		wait(Iallreduce(w, nil, recv, Max[int64]()))
		r.EqualValues(7*(n-1), recv[0], "in-place Iallreduce")
	}
	d := []digits{{int64(me + 1), 1}}
	out := make([]digits, 1)
	wait(Iallreduce(w, d, out, concat))
	r.Equal(inOrder(n), out[0].V, "non-commutative Iallreduce")
}

func TestNodeAwareNonblocking(t *testing.T) {
	for _, nodes := range nodeLayouts {
		t.Run(layoutName(nodes), func(t *testing.T) {
			runJob(t, layoutName(nodes), len(nodes), Config{}, checkNodeNB)
		})
	}
}
