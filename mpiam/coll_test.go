package mpiam

import (
	"fmt"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// collSizes are the communicator sizes every collective is checked on:
// powers of two and odd sizes (non-power-of-two folding).
var collSizes = []int{1, 2, 3, 4, 5, 7, 8, 16}

// runColl runs body on n in-process ranks and fails the test on any error.
func runColl(t *testing.T, n int, body func(w *Comm) error) {
	t.Helper()
	require.NoError(t, RunLocal(n, Config{}, body), "size %d", n)
}

// value is rank r's element i in the known-answer tests.
func value(r, i int) float64 { return float64((r+1)*1000 + i%997) }

// lengths exercises the small, medium and large algorithms of each collective.
var lengths = []int{1, 7, 3000, 140000}

func TestBcastKnownAnswer(t *testing.T) {
	for _, n := range collSizes {
		runColl(t, n, func(w *Comm) error {
			for _, m := range lengths {
				for _, root := range []int{0, n - 1, n / 2} {
					buf := make([]float64, m)
					if w.Rank() == root {
						for i := range buf {
							buf[i] = value(root, i)
						}
					}
					if err := Bcast(w, buf, root); err != nil {
						return err
					}
					for i := range buf {
						if buf[i] != value(root, i) {
							return fmt.Errorf("size %d root %d len %d: rank %d has %v at %d", n, root, m, w.Rank(), buf[i], i)
						}
					}
				}
			}
			return nil
		})
	}
}

func sumOver(n, i int) float64 {
	s := 0.0
	for r := 0; r < n; r++ {
		s += value(r, i)
	}
	return s
}

func TestReduceAndAllreduceKnownAnswer(t *testing.T) {
	for _, n := range collSizes {
		runColl(t, n, func(w *Comm) error {
			for _, m := range lengths {
				send := make([]float64, m)
				for i := range send {
					send[i] = value(w.Rank(), i)
				}
				root := n - 1
				recv := make([]float64, m)
				if err := Reduce(w, send, recv, Sum[float64](), root); err != nil {
					return err
				}
				if w.Rank() == root {
					for i := range recv {
						if recv[i] != sumOver(n, i) {
							return fmt.Errorf("reduce size %d len %d: %v at %d, want %v", n, m, recv[i], i, sumOver(n, i))
						}
					}
				}
				all := make([]float64, m)
				if err := Allreduce(w, send, all, Sum[float64]()); err != nil {
					return err
				}
				for i := range all {
					if all[i] != sumOver(n, i) {
						return fmt.Errorf("allreduce size %d len %d: rank %d has %v at %d, want %v", n, m, w.Rank(), all[i], i, sumOver(n, i))
					}
				}
				// In place.
				copy(all, send)
				if err := Allreduce(w, nil, all, Max[float64]()); err != nil {
					return err
				}
				for i := range all {
					if all[i] != value(n-1, i) {
						return fmt.Errorf("in-place max size %d len %d: %v at %d", n, m, all[i], i)
					}
				}
			}
			return nil
		})
	}
}

// matMul is a non-commutative operation: 2x2 matrix products.
type mat2 [4]int64

func matMulOp() Op[mat2] {
	return NewOp("matmul", func(in, io []mat2) {
		for i := range io {
			a, b := in[i], io[i]
			io[i] = mat2{a[0]*b[0] + a[1]*b[2], a[0]*b[1] + a[1]*b[3], a[2]*b[0] + a[3]*b[2], a[2]*b[1] + a[3]*b[3]}
		}
	}, false)
}

func matOf(r int) mat2 { return mat2{1, int64(r + 1), 0, 1 + int64(r%2)} }

func matProduct(lo, hi int) mat2 { // matOf(lo) · ... · matOf(hi-1)
	acc := mat2{1, 0, 0, 1}
	for r := lo; r < hi; r++ {
		b := matOf(r)
		acc = mat2{acc[0]*b[0] + acc[1]*b[2], acc[0]*b[1] + acc[1]*b[3], acc[2]*b[0] + acc[3]*b[2], acc[2]*b[1] + acc[3]*b[3]}
	}
	return acc
}

// Non-commutative operations are applied in rank order (MPI-4.1 §6.9.1).
func TestNonCommutativeOrder(t *testing.T) {
	for _, n := range collSizes {
		runColl(t, n, func(w *Comm) error {
			op := matMulOp()
			send := []mat2{matOf(w.Rank()), matOf(w.Rank())}
			recv := make([]mat2, 2)
			for _, root := range []int{0, n - 1} {
				if err := Reduce(w, send, recv, op, root); err != nil {
					return err
				}
				if w.Rank() == root && recv[1] != matProduct(0, n) {
					return fmt.Errorf("reduce size %d root %d: %v want %v", n, root, recv[1], matProduct(0, n))
				}
			}
			if err := Allreduce(w, send, recv, op); err != nil {
				return err
			}
			if recv[0] != matProduct(0, n) {
				return fmt.Errorf("allreduce size %d: %v", n, recv[0])
			}
			if err := Scan(w, send, recv, op); err != nil {
				return err
			}
			if recv[0] != matProduct(0, w.Rank()+1) {
				return fmt.Errorf("scan size %d rank %d: %v want %v", n, w.Rank(), recv[0], matProduct(0, w.Rank()+1))
			}
			recv[0] = mat2{9, 9, 9, 9}
			if err := Exscan(w, send, recv, op); err != nil {
				return err
			}
			if w.Rank() > 0 && recv[0] != matProduct(0, w.Rank()) {
				return fmt.Errorf("exscan size %d rank %d: %v want %v", n, w.Rank(), recv[0], matProduct(0, w.Rank()))
			}
			if w.Rank() == 0 && recv[0] != (mat2{9, 9, 9, 9}) {
				return fmt.Errorf("exscan must leave rank 0's buffer alone")
			}
			blocks := make([]mat2, n)
			for i := range blocks {
				blocks[i] = matOf(w.Rank())
			}
			out := make([]mat2, 1)
			if err := ReduceScatterBlock(w, blocks, out, op); err != nil {
				return err
			}
			if out[0] != matProduct(0, n) {
				return fmt.Errorf("reduce-scatter size %d: %v", n, out[0])
			}
			return nil
		})
	}
}

func TestGatherScatterAllgatherAlltoall(t *testing.T) {
	for _, n := range collSizes {
		runColl(t, n, func(w *Comm) error {
			me := w.Rank()
			for _, k := range []int{1, 5, 600} {
				send := make([]int32, k)
				for i := range send {
					send[i] = int32(me*100000 + i)
				}
				all := make([]int32, n*k)
				root := n / 2
				if err := Gather(w, send, all, root); err != nil {
					return err
				}
				check := func(what string, got []int32) error {
					for r := 0; r < n; r++ {
						for i := 0; i < k; i++ {
							if got[r*k+i] != int32(r*100000+i) {
								return fmt.Errorf("%s size %d k %d: rank %d block %d elem %d = %d", what, n, k, me, r, i, got[r*k+i])
							}
						}
					}
					return nil
				}
				if me == root {
					if err := check("gather", all); err != nil {
						return err
					}
				}
				all2 := make([]int32, n*k)
				if err := Allgather(w, send, all2); err != nil {
					return err
				}
				if err := check("allgather", all2); err != nil {
					return err
				}
				part := make([]int32, k)
				if err := Scatter(w, all2, part, root); err != nil {
					return err
				}
				for i := range part {
					if part[i] != send[i] {
						return fmt.Errorf("scatter size %d: rank %d got %d at %d", n, me, part[i], i)
					}
				}
				// Alltoall: block j of rank i is i*1000+j; rank j receives i*1000+j in block i.
				a2a := make([]int32, n*k)
				for j := 0; j < n; j++ {
					for i := 0; i < k; i++ {
						a2a[j*k+i] = int32(me*1000 + j)
					}
				}
				out := make([]int32, n*k)
				if err := Alltoall(w, a2a, out); err != nil {
					return err
				}
				for i := 0; i < n; i++ {
					for e := 0; e < k; e++ {
						if out[i*k+e] != int32(i*1000+me) {
							return fmt.Errorf("alltoall size %d k %d: rank %d block %d = %d", n, k, me, i, out[i*k+e])
						}
					}
				}
			}
			return nil
		})
	}
}

func TestVectorVariants(t *testing.T) {
	for _, n := range collSizes {
		runColl(t, n, func(w *Comm) error {
			me := w.Rank()
			// Rank r contributes r+1 elements of value r.
			counts, displs := make([]int, n), make([]int, n)
			total := 0
			for r := 0; r < n; r++ {
				counts[r], displs[r] = r+1, total
				total += r + 1
			}
			send := make([]int64, me+1)
			for i := range send {
				send[i] = int64(me)
			}
			all := make([]int64, total)
			if err := Allgatherv(w, send, all, counts, displs); err != nil {
				return err
			}
			for r := 0; r < n; r++ {
				for i := 0; i < counts[r]; i++ {
					if all[displs[r]+i] != int64(r) {
						return fmt.Errorf("allgatherv size %d: %v", n, all)
					}
				}
			}
			g := make([]int64, total)
			if err := Gatherv(w, send, g, counts, displs, 0); err != nil {
				return err
			}
			if me == 0 && fmt.Sprint(g) != fmt.Sprint(all) {
				return fmt.Errorf("gatherv size %d: %v", n, g)
			}
			part := make([]int64, me+1)
			if err := Scatterv(w, all, counts, displs, part, n-1); err != nil {
				return err
			}
			if fmt.Sprint(part) != fmt.Sprint(send) {
				return fmt.Errorf("scatterv size %d rank %d: %v", n, me, part)
			}
			// Alltoallv: rank i sends j+1 copies of i*100+j to rank j.
			sc, sd, rc, rd := make([]int, n), make([]int, n), make([]int, n), make([]int, n)
			st, rt := 0, 0
			for j := 0; j < n; j++ {
				sc[j], sd[j] = j+1, st
				st += j + 1
				rc[j], rd[j] = me+1, rt
				rt += me + 1
			}
			sb := make([]int64, st)
			for j := 0; j < n; j++ {
				for e := 0; e < sc[j]; e++ {
					sb[sd[j]+e] = int64(me*100 + j)
				}
			}
			rb := make([]int64, rt)
			if err := Alltoallv(w, sb, sc, sd, rb, rc, rd); err != nil {
				return err
			}
			for i := 0; i < n; i++ {
				for e := 0; e < rc[i]; e++ {
					if rb[rd[i]+e] != int64(i*100+me) {
						return fmt.Errorf("alltoallv size %d rank %d: %v", n, me, rb)
					}
				}
			}
			return nil
		})
	}
}

func TestOperations(t *testing.T) {
	runColl(t, 5, func(w *Comm) error {
		me := int32(w.Rank())
		checks := []struct {
			op   Op[int32]
			in   int32
			want int32
		}{
			{Sum[int32](), me, 10},
			{Prod[int32](), me + 1, 120},
			{Max[int32](), me, 4},
			{Min[int32](), me, 0},
			{LAnd[int32](), me, 0},
			{LOr[int32](), me, 1},
			{LXor[int32](), 1, 1},
			{BAnd[int32](), 7 - me, 0},
			{BAnd[int32](), 12 | me, 12},
			{BOr[int32](), 1 << me, 31},
			{BXor[int32](), me, 4},
		}
		for _, c := range checks {
			out := []int32{0}
			if err := Allreduce(w, []int32{c.in}, out, c.op); err != nil {
				return err
			}
			if out[0] != c.want {
				return fmt.Errorf("%s: got %d want %d", c.op.Name, out[0], c.want)
			}
		}
		vals := []float64{3, 9, 1, 9, 2}
		loc := []ValueIndex[float64]{{Value: vals[me], Index: int64(me)}}
		out := make([]ValueIndex[float64], 1)
		if err := Allreduce(w, loc, out, MaxLoc[float64]()); err != nil {
			return err
		}
		if out[0] != (ValueIndex[float64]{9, 1}) {
			return fmt.Errorf("maxloc: %+v", out[0])
		}
		if err := Allreduce(w, loc, out, MinLoc[float64]()); err != nil {
			return err
		}
		if out[0] != (ValueIndex[float64]{1, 2}) {
			return fmt.Errorf("minloc: %+v", out[0])
		}
		c := []complex128{complex(float64(me), 1)}
		cs := make([]complex128, 1)
		if err := Allreduce(w, c, cs, Sum[complex128]()); err != nil {
			return err
		}
		if cs[0] != complex(10, 5) {
			return fmt.Errorf("complex sum: %v", cs[0])
		}
		return nil
	})
}

func TestCollectiveErrors(t *testing.T) {
	runColl(t, 3, func(w *Comm) error {
		type withPtr struct{ P *int }
		if err := Bcast(w, []withPtr{{P: nil}}, 0); !isErr(err, ErrType) {
			return fmt.Errorf("pointer type: %v", err)
		}
		if err := Bcast(w, []int{1}, 3); !isErr(err, ErrRoot) {
			return fmt.Errorf("bad root: %v", err)
		}
		if err := Allgather(w, []int{1}, make([]int, 4)); !isErr(err, ErrCount) {
			return fmt.Errorf("bad count: %v", err)
		}
		var nilComm *Comm
		if err := Bcast(nilComm, []int{1}, 0); !isErr(err, ErrComm) {
			return fmt.Errorf("nil comm: %v", err)
		}
		return w.Barrier()
	})
}

func TestSplitAndCreate(t *testing.T) {
	runColl(t, 7, func(w *Comm) error {
		me := w.Rank()
		// Odd and even ranks, reversed order by key.
		sub, err := w.Split(me%2, -me)
		if err != nil {
			return err
		}
		size := 4 - me%2
		if sub.Size() != size {
			return fmt.Errorf("split: size %d want %d", sub.Size(), size)
		}
		// Key -me reverses: the highest rank of the color is rank 0.
		want := (6 - me - (me%2)*0) / 2
		if me%2 == 1 {
			want = (5 - me) / 2
		}
		if sub.Rank() != want {
			return fmt.Errorf("split: rank %d has sub-rank %d want %d", me, sub.Rank(), want)
		}
		// Collectives on the split run while point-to-point traffic flows on
		// the parent with the same tags.
		pr, err := Irecv(w, make([]int, 1), (me+6)%7, 0)
		if err != nil {
			return err
		}
		if err := Send(w, []int{me}, (me+1)%7, 0); err != nil {
			return err
		}
		sum := []int{0}
		if err := Allreduce(sub, []int{me}, sum, Sum[int]()); err != nil {
			return err
		}
		wantSum := 0
		for r := me % 2; r < 7; r += 2 {
			wantSum += r
		}
		if sum[0] != wantSum {
			return fmt.Errorf("allreduce on split: %d want %d", sum[0], wantSum)
		}
		if _, err := pr.Wait(); err != nil {
			return err
		}
		none, err := w.Split(Undefined, 0)
		if err != nil || none != nil {
			return fmt.Errorf("undefined color: %v %v", none, err)
		}
		g, _ := w.Group()
		g3, err := g.Incl([]int{6, 2, 4})
		if err != nil {
			return err
		}
		c3, err := w.Create(g3)
		if err != nil {
			return err
		}
		if (c3 != nil) != (me == 6 || me == 2 || me == 4) {
			return fmt.Errorf("create: membership of %d", me)
		}
		if c3 != nil {
			if c3.Rank() != map[int]int{6: 0, 2: 1, 4: 2}[me] {
				return fmt.Errorf("create: rank %d", c3.Rank())
			}
			b := []int{0}
			if c3.Rank() == 0 {
				b[0] = 42
			}
			if err := Bcast(c3, b, 0); err != nil {
				return err
			}
			if b[0] != 42 {
				return fmt.Errorf("bcast on created: %d", b[0])
			}
			cmp, _ := c3.Compare(c3)
			if cmp != Ident {
				return fmt.Errorf("compare self: %d", cmp)
			}
		}
		d, err := w.Dup()
		if err != nil {
			return err
		}
		if cmp, _ := w.Compare(d); cmp != Congruent {
			return fmt.Errorf("compare dup: %d", cmp)
		}
		if cmp, _ := w.Compare(sub); cmp != Unequal {
			return fmt.Errorf("compare split: %d", cmp)
		}
		return d.Free()
	})
}

func TestGroups(t *testing.T) {
	runColl(t, 4, func(w *Comm) error {
		g, _ := w.Group()
		a, err := g.Incl([]int{3, 1})
		if err != nil {
			return err
		}
		b, _ := g.Excl([]int{0, 1})
		if a.Size() != 2 || b.Size() != 2 {
			return fmt.Errorf("sizes")
		}
		u := a.Union(b)
		if u.Size() != 3 || u.Compare(g) != Unequal {
			return fmt.Errorf("union: %v", u.world)
		}
		in := a.Intersection(b)
		if in.Size() != 1 || in.world[0] != 3 {
			return fmt.Errorf("intersection: %v", in.world)
		}
		tr, err := g.TranslateRanks([]int{0, 1, 3, ProcNull}, a)
		if err != nil {
			return err
		}
		if fmt.Sprint(tr) != fmt.Sprint([]int{Undefined, 1, 0, ProcNull}) {
			return fmt.Errorf("translate: %v", tr)
		}
		rev, _ := g.Incl([]int{3, 2, 1, 0})
		if rev.Compare(g) != Similar || g.Compare(g) != Ident {
			return fmt.Errorf("compare")
		}
		if _, err := g.Incl([]int{1, 1}); !isErr(err, ErrRank) {
			return fmt.Errorf("duplicate rank: %v", err)
		}
		if _, err := g.Incl([]int{4}); !isErr(err, ErrRank) {
			return fmt.Errorf("out of range: %v", err)
		}
		return nil
	})
}

func TestNonblockingCollectives(t *testing.T) {
	for _, n := range []int{1, 3, 4, 6} {
		runColl(t, n, func(w *Comm) error {
			me := w.Rank()
			// Several in flight at once, plus point-to-point traffic, completed
			// by one Waitall.
			b := make([]float64, 5000)
			if me == 0 {
				for i := range b {
					b[i] = float64(i)
				}
			}
			r1, err := Ibcast(w, b, 0)
			if err != nil {
				return err
			}
			sum := make([]int, 3)
			r2, err := Iallreduce(w, []int{me, 1, 2 * me}, sum, Sum[int]())
			if err != nil {
				return err
			}
			r3, err := w.Ibarrier()
			if err != nil {
				return err
			}
			all := make([]int, n)
			r4, err := Iallgather(w, []int{me * me}, all)
			if err != nil {
				return err
			}
			a2a := make([]int, n)
			r5, err := Ialltoall(w, func() []int {
				s := make([]int, n)
				for j := range s {
					s[j] = me*10 + j
				}
				return s
			}(), a2a)
			if err != nil {
				return err
			}
			red := make([]int, 1)
			r6, err := Ireduce(w, []int{1}, red, Sum[int](), n-1)
			if err != nil {
				return err
			}
			if err := Waitall([]Request{r1, r2, r3, r4, r5, r6}, nil); err != nil {
				return err
			}
			for i := range b {
				if b[i] != float64(i) {
					return fmt.Errorf("ibcast: %v at %d", b[i], i)
				}
			}
			if sum[0] != n*(n-1)/2 || sum[1] != n || sum[2] != n*(n-1) {
				return fmt.Errorf("iallreduce: %v", sum)
			}
			for r := range all {
				if all[r] != r*r {
					return fmt.Errorf("iallgather: %v", all)
				}
			}
			for i := range a2a {
				if a2a[i] != i*10+me {
					return fmt.Errorf("ialltoall: %v", a2a)
				}
			}
			if me == n-1 && red[0] != n {
				return fmt.Errorf("ireduce: %v", red)
			}
			return nil
		})
	}
}

// A rank in a nonblocking barrier keeps computing; the barrier completes only
// after every rank has entered it.
func TestIbarrierOverlap(t *testing.T) {
	var entered atomic.Int32
	runColl(t, 4, func(w *Comm) error {
		if w.Rank() == 3 {
			for i := 0; i < 1000; i++ {
				_ = math.Sqrt(float64(i))
			}
		}
		entered.Add(1)
		r, err := w.Ibarrier()
		if err != nil {
			return err
		}
		if _, err := r.Wait(); err != nil {
			return err
		}
		if entered.Load() != 4 {
			return fmt.Errorf("barrier completed with %d ranks entered", entered.Load())
		}
		return nil
	})
}

func isErr(err, target error) bool {
	return err != nil && ErrorClass(err) == ErrorClass(target)
}

// Blocking collectives share one tag base (blockingCollTag): a rank that runs
// several calls ahead queues messages of different calls under the same tags,
// and the non-overtaking order must pair each with its own call. Ranks other
// than 0 start late, so that the roots' messages wait as unexpected; a
// nonblocking broadcast (a tag of its own) is in flight across the blocking
// calls.
func TestBlockingCollectivesRunAhead(t *testing.T) {
	for _, n := range []int{2, 3, 5} {
		runColl(t, n, func(w *Comm) error {
			me := w.Rank()
			nb := make([]int, 3000)
			if me == 0 {
				for i := range nb {
					nb[i] = 7 * i
				}
			}
			rq, err := Ibcast(w, nb, 0)
			if err != nil {
				return err
			}
			if me != 0 {
				time.Sleep(20 * time.Millisecond)
			}
			for call := range 60 {
				size := 1 + call%5
				if call%10 == 9 {
					size = 40000 // rendezvous between eager calls
				}
				b := make([]int, size)
				if me == 0 {
					for i := range b {
						b[i] = call*100000 + i
					}
				}
				if err := Bcast(w, b, 0); err != nil {
					return err
				}
				for i := range b {
					if b[i] != call*100000+i {
						return fmt.Errorf("call %d: rank %d has %d at %d", call, me, b[i], i)
					}
				}
				sum := []int{0}
				if err := Reduce(w, []int{me + call}, sum, Sum[int](), n-1); err != nil {
					return err
				}
				if want := n*(n-1)/2 + n*call; me == n-1 && sum[0] != want {
					return fmt.Errorf("call %d: reduce %d, want %d", call, sum[0], want)
				}
				part := []int{-1}
				var all []int
				if me == 0 {
					all = make([]int, n)
					for i := range all {
						all[i] = call + i
					}
				}
				if err := Scatter(w, all, part, 0); err != nil {
					return err
				}
				if part[0] != call+me {
					return fmt.Errorf("call %d: scatter gave rank %d %d", call, me, part[0])
				}
			}
			if _, err := rq.Wait(); err != nil {
				return err
			}
			for i := range nb {
				if nb[i] != 7*i {
					return fmt.Errorf("ibcast: rank %d has %d at %d", me, nb[i], i)
				}
			}
			return nil
		})
	}
}

// Sum's unrolled loop gives, element by element, what the plain loop gives,
// at every length around its eight-element step.
func TestSumIntoMatchesPlainLoop(t *testing.T) {
	for n := range 27 {
		in, io, want := make([]float32, n), make([]float32, n), make([]float32, n)
		for i := range n {
			in[i], io[i] = float32(i)*1.1+0.3, float32(n-i)*0.7
			want[i] = in[i] + io[i]
		}
		Sum[float32]().Fn(in, io)
		require.Equal(t, want, io, "length %d", n)
	}
}
