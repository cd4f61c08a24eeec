package mpiam

import (
	"slices"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// Fence epochs (MPI-4.1 §12.5.1): each rank puts into its right neighbour's
// window and gets from its left neighbour's, small and large (past a medium
// request and past a single copy's threshold), with WinCreate over the
// program's memory and a displacement unit that scales.
func TestRMAFencePutGet_MPI41_12_5_1(t *testing.T) {
	eachNetwork(t, 3, func(r *rk, c *Comm) {
		n, me := c.Size(), c.Rank()
		right, left := (me+1)%n, (me+n-1)%n
		const small, large = 4, 20000
		mem := make([]int64, small+large)
		w, err := WinCreate(c, mem, 8)
		r.NoError(err)
		r.Equal(8*(small+large), w.Size())
		r.Equal(raw(mem), w.Base())
		r.Equal(8, w.DispUnit())
		r.NoError(w.Fence(ModeNoprecede))
		src := make([]int64, small+large)
		for i := range src {
			src[i] = int64(me*1_000_000 + i)
		}
		r.NoError(Put(w, src[:small], right, 0))
		r.NoError(Put(w, src[small:], right, small))
		r.NoError(w.Fence(0))
		for i := range mem {
			r.Equal(int64(left*1_000_000+i), mem[i], "element %d", i)
		}
		got := make([]int64, small+large)
		r.NoError(Get(w, got[:small], left, 0))
		r.NoError(Get(w, got[small:], left, small))
		r.NoError(w.Fence(ModeNosucceed))
		for i := range got {
			// left's window holds what left's left put there.
			r.Equal(int64(((left+n-1)%n)*1_000_000+i), got[i], "element %d", i)
		}
		r.NoError(w.Free())
	})
}

// Accumulates from every rank to one location are atomic and complete at
// the fence: the sums, maxima and xors are exact (MPI-4.1 §12.3.4, §12.7).
func TestRMAAccumulate_MPI41_12_3_4(t *testing.T) {
	eachNetwork(t, 3, func(r *rk, c *Comm) {
		n, me := c.Size(), c.Rank()
		const k, rounds = 16, 10
		w, mem, err := WinAllocate[int64](c, 3*k, 8)
		r.NoError(err)
		fw, fmem, err := WinAllocate[float64](c, k, 8)
		r.NoError(err)
		r.NoError(w.Fence(0))
		r.NoError(fw.Fence(0))
		v, f := make([]int64, k), make([]float64, k)
		for round := range rounds {
			for i := range v {
				v[i] = int64((me + 1) * (i + 1))
				f[i] = float64(me+1) / 4
			}
			r.NoError(Accumulate(w, v, 0, 0, Sum[int64]()))
			v[0] = int64(me*100 + round)
			r.NoError(Accumulate(w, v[:1], 0, k, Max[int64]()))
			r.NoError(Accumulate(w, []int64{int64(1) << (me*rounds + round)}, 0, 2*k, BXor[int64]()))
			r.NoError(Accumulate(fw, f, 0, 0, Sum[float64]()))
		}
		r.NoError(w.Fence(0))
		r.NoError(fw.Fence(0))
		if me == 0 {
			ranks := int64(n * (n + 1) / 2)
			for i := range k {
				r.Equal(rounds*ranks*int64(i+1), mem[i], "sum %d", i)
				r.Equal(rounds*float64(ranks)/4, fmem[i], "float sum %d", i)
			}
			r.Equal(int64((n-1)*100+rounds-1), mem[k])
			r.Equal(int64(1)<<(n*rounds)-1, mem[2*k])
		}
		r.ErrorIs(Accumulate(w, v, 0, 0, NewOp("mine", func(in, io []int64) {}, true)), ErrOp)
		r.NoError(fw.Free())
		r.NoError(w.Free())
	})
}

// A counter at rank 0 that every rank increments with FetchAndOp under a
// shared lock: the values fetched are exactly 0 .. n*rounds-1, each once
// (passive target, MPI-4.1 §12.5.3, §12.3.4).
func TestRMAFetchAndOpCounter_MPI41_12_3_4(t *testing.T) {
	eachNetwork(t, 3, func(r *rk, c *Comm) {
		n, me := c.Size(), c.Rank()
		const rounds = 20
		w, mem, err := WinAllocate[int64](c, 1, 8)
		r.NoError(err)
		got := make([]int64, rounds)
		for i := range got {
			r.NoError(w.Lock(LockShared, 0, 0))
			r.NoError(FetchAndOp(w, 1, &got[i], 0, 0, Sum[int64]()))
			r.NoError(w.Unlock(0))
		}
		var last int64
		r.NoError(w.LockAll(0))
		r.NoError(FetchAndOp(w, 0, &last, 0, 0, NoOp[int64]()))
		r.NoError(w.FlushAll())
		r.NoError(w.UnlockAll())
		r.GreaterOrEqual(last, int64(rounds))
		all := make([]int64, n*rounds)
		r.NoError(Gather(c, got, all, 0))
		r.NoError(c.Barrier())
		if me == 0 {
			slices.Sort(all)
			for i, v := range all {
				r.Equal(int64(i), v)
			}
			r.Equal(int64(n*rounds), mem[0])
		}
		r.NoError(w.Free())
	})
}

// A mutex made of CompareAndSwap guards a read-modify-write of Get and Put
// under LockAll with flushes: the final count is exact, and exclusive locks
// serialize the same increment without the mutex.
func TestRMAMutexAndExclusiveLock_MPI41_12_5_3(t *testing.T) {
	eachNetwork(t, 3, func(r *rk, c *Comm) {
		n, me := c.Size(), c.Rank()
		const rounds = 8
		w, mem, err := WinAllocate[int64](c, 3, 8) // mutex, count under the mutex, count under the lock
		r.NoError(err)
		r.NoError(w.LockAll(0))
		for range rounds {
			for {
				var old int64
				r.NoError(CompareAndSwap(w, int64(me+1), 0, &old, 0, 0))
				r.NoError(w.Flush(0))
				if old == 0 {
					break
				}
			}
			var v [1]int64
			r.NoError(Get(w, v[:], 0, 1))
			r.NoError(w.Flush(0))
			v[0]++
			r.NoError(Put(w, v[:], 0, 1))
			r.NoError(w.Flush(0))
			var old int64
			r.NoError(CompareAndSwap(w, 0, int64(me+1), &old, 0, 0))
			r.NoError(w.Flush(0))
			r.Equal(int64(me+1), old, "the mutex was not held")
		}
		r.NoError(w.UnlockAll())
		for range rounds {
			var v [1]int64
			r.NoError(w.Lock(LockExclusive, 0, 0))
			r.NoError(Get(w, v[:], 0, 2))
			r.NoError(w.Flush(0))
			v[0]++
			r.NoError(Put(w, v[:], 0, 2))
			r.NoError(w.Unlock(0))
		}
		r.NoError(c.Barrier())
		if me == 0 {
			r.Equal(int64(0), mem[0])
			r.Equal(int64(n*rounds), mem[1])
			r.Equal(int64(n*rounds), mem[2])
		}
		r.NoError(w.Free())
	})
}

// A rank that spins on calls it completes locally (CompareAndSwap on its
// own window and Flush, or Sync waiting for a flag) still makes progress
// for the others (MPI-4.1 §2.9, §12.7): rank 1 holds a mutex in rank 0's
// window and can release it only through rank 0's handlers on a network,
// while rank 0 spins to take it; then rank 0 spins on Sync until rank 1's
// Put of a flag arrives.
func TestRMASpinningOnLocalCallsMakesProgress_MPI41_12_7(t *testing.T) {
	eachNetwork(t, 2, func(r *rk, c *Comm) {
		me := c.Rank()
		w, mem, err := WinAllocate[int64](c, 2, 8) // mutex, flag
		r.NoError(err)
		r.NoError(w.LockAll(0))
		var old int64
		if me == 1 {
			r.NoError(CompareAndSwap(w, 2, 0, &old, 0, 0))
			r.NoError(w.Flush(0))
			r.Equal(int64(0), old)
		}
		r.NoError(c.Barrier())
		if me == 1 {
			r.NoError(CompareAndSwap(w, 0, 2, &old, 0, 0))
			r.NoError(w.Flush(0))
			r.Equal(int64(2), old)
			r.NoError(Put(w, []int64{1}, 0, 1))
			r.NoError(w.Flush(0))
		} else {
			for old = 1; old != 0; {
				r.NoError(CompareAndSwap(w, 1, 0, &old, 0, 0))
				r.NoError(w.Flush(0))
			}
			for atomic.LoadInt64(&mem[1]) == 0 {
				r.NoError(w.Sync())
			}
		}
		r.NoError(w.UnlockAll())
		r.NoError(c.Barrier())
		r.NoError(w.Free())
	})
}

// Operations and synchronizations used wrongly are errors of MPI's classes,
// never a hang (MPI-4.1 §12.5, §12.7).
func TestRMAErrors_MPI41_12_5(t *testing.T) {
	eachNetwork(t, 2, func(r *rk, c *Comm) {
		me := c.Size() - 1 - c.Rank() // the other rank
		_, err := WinCreate(c, []int64{1}, 0)
		r.ErrorIs(err, ErrDisp)
		_, _, err = WinAllocate[int64](c, -1, 8)
		r.ErrorIs(err, ErrSize)
		w, _, err := WinAllocate[int64](c, 4, 8)
		r.NoError(err)
		buf := []int64{1, 2}
		r.ErrorIs(Put(w, buf, me, 0), ErrRMASync, "no epoch")
		r.Equal(ClassRMASync, ErrorClass(Get(w, buf, me, 0)))
		r.ErrorIs(w.Unlock(me), ErrRMASync, "not locked")
		r.ErrorIs(w.Flush(me), ErrRMASync, "flush outside a passive epoch")
		r.ErrorIs(w.UnlockAll(), ErrRMASync)
		r.ErrorIs(w.Lock(LockType(7), me, 0), ErrLocktype)
		r.ErrorIs(w.Lock(LockShared, 5, 0), ErrRank)
		r.ErrorIs(w.Fence(1), ErrAssert)

		r.NoError(w.Lock(LockShared, me, 0))
		r.ErrorIs(w.Lock(LockShared, me, 0), ErrRMASync, "locked twice")
		r.ErrorIs(w.Fence(0), ErrRMASync, "fence inside a lock epoch")
		r.ErrorIs(Put(w, buf, me, 3), ErrRMARange, "past the end")
		r.ErrorIs(Put(w, buf, me, -1), ErrRMARange)
		r.ErrorIs(Put(w, buf, 2, 0), ErrRank)
		r.NoError(Put(w, buf, me, 2)) // the last two elements: fits
		r.NoError(w.Unlock(me))

		r.NoError(w.Fence(0))
		r.NoError(w.Fence(ModeNosucceed))
		r.ErrorIs(Put(w, buf, me, 0), ErrRMASync, "after ModeNosucceed")
		r.NoError(w.Free())
		r.ErrorIs(w.Free(), ErrWin)
		r.ErrorIs(w.Fence(0), ErrWin)
		r.Equal(ClassWin, ErrorClass(Put(w, buf, me, 0)))
	})
}

// Generalized active target (MPI-4.1 §12.5.2): rank 0 exposes its window to
// the others with Post/Wait (and Test), each of them puts its piece between
// Start and Complete; then the roles turn for gets.
func TestRMAPostStartCompleteWait_MPI41_12_5_2(t *testing.T) {
	eachNetwork(t, 3, func(r *rk, c *Comm) {
		n, me := c.Size(), c.Rank()
		w, mem, err := WinAllocate[int32](c, 2*n, 4)
		r.NoError(err)
		wg, err := w.Group()
		r.NoError(err)
		zero, err := wg.Incl([]int{0})
		r.NoError(err)
		others, err := wg.Excl([]int{0})
		r.NoError(err)
		for round := range 3 {
			if me == 0 {
				r.NoError(w.Post(others, 0))
				r.ErrorIs(w.Post(others, 0), ErrRMASync, "posted twice")
				if round == 1 {
					for {
						done, err := w.Test()
						r.NoError(err)
						if done {
							break
						}
					}
				} else {
					r.NoError(w.Wait())
				}
				for k := 1; k < n; k++ {
					r.Equal(int32(100*round+k), mem[2*k], "round %d from rank %d", round, k)
				}
			} else {
				r.NoError(w.Start(zero, 0))
				r.NoError(Put(w, []int32{int32(100*round + me)}, 0, 2*me))
				r.ErrorIs(Put(w, []int32{1}, me, 0), ErrRMASync, "target outside the start group")
				r.NoError(w.Complete())
			}
		}
		r.ErrorIs(w.Complete(), ErrRMASync)
		r.ErrorIs(w.Wait(), ErrRMASync)
		_, err = w.Test()
		r.ErrorIs(err, ErrRMASync)
		r.NoError(w.Free())
	})
}

// GetAccumulate, its request form and the other request-based operations
// (MPI-4.1 §12.3.5): the old values come back, large ranges in pieces, and
// the requests complete with the data in place.
func TestRMAGetAccumulateAndRequests_MPI41_12_3_5(t *testing.T) {
	eachNetwork(t, 2, func(r *rk, c *Comm) {
		me := c.Rank()
		other := 1 - me
		const k = 5000 // past one medium request on every network
		w, mem, err := WinAllocate[int64](c, k, 8)
		r.NoError(err)
		for i := range mem {
			mem[i] = int64(me*1_000_000 + i)
		}
		r.NoError(c.Barrier())
		r.NoError(w.Lock(LockExclusive, other, 0))
		add := make([]int64, k)
		for i := range add {
			add[i] = 1
		}
		old := make([]int64, k)
		r.NoError(GetAccumulate(w, add, old, other, 0, Sum[int64]()))
		r.NoError(w.Flush(other))
		for i := range old {
			r.Equal(int64(other*1_000_000+i), old[i], "old %d", i)
		}
		now := make([]int64, 3)
		req, err := RgetAccumulate(w, nil, now, other, 10, NoOp[int64]())
		r.NoError(err)
		_, err = req.Wait()
		r.NoError(err)
		r.Equal([]int64{int64(other*1_000_000 + 11), int64(other*1_000_000 + 12), int64(other*1_000_000 + 13)}, now)
		r.ErrorIs(GetAccumulate(w, []int64{1}, make([]int64, 2), other, 0, Sum[int64]()), ErrCount)

		rp, err := Rput(w, []int64{-7, -8}, other, 0)
		r.NoError(err)
		r.NoError(w.Flush(other)) // a put and an accumulate to one place are not ordered (MPI-4.1 §12.7.1)
		ra, err := Raccumulate(w, []int64{10}, other, 1, Sum[int64]())
		r.NoError(err)
		got := make([]int64, 2)
		r.NoError(w.Flush(other))
		rg, err := Rget(w, got, other, 0)
		r.NoError(err)
		r.NoError(Waitall([]Request{rp, ra, rg}, nil))
		r.Equal([]int64{-7, 2}, got)
		r.NoError(w.Unlock(other))
		_, err = Rput(w, []int64{1}, other, 0)
		r.ErrorIs(err, ErrRMASync, "request forms need a passive-target epoch")
		r.NoError(w.Free())
	})
}

// Shared-memory windows (MPI-4.1 §12.2.3): parts follow one another, loads
// and stores reach the other ranks' parts directly, and the window works for
// Put and synchronization as any other.
func TestRMASharedWindow_MPI41_12_2_3(t *testing.T) {
	eachNetwork(t, 3, func(r *rk, c *Comm) {
		node, err := c.SplitType(CommTypeShared, c.Rank())
		r.NoError(err)
		n, me := node.Size(), node.Rank()                       // the mixed networks emulate two nodes
		w, mine, err := WinAllocateShared[int32](node, 4+me, 4) // parts of different sizes
		r.NoError(err)
		r.Len(mine, 4+me)
		for i := range mine {
			mine[i] = int32(100*me + i)
		}
		r.NoError(node.Barrier())
		first, _, err := WinSharedQuery[int32](w, ProcNull)
		r.NoError(err)
		r.Len(first, 4)
		for q := range n {
			part, unit, err := WinSharedQuery[int32](w, q)
			r.NoError(err)
			r.Equal(4, unit)
			r.Len(part, 4+q)
			for i, v := range part {
				r.Equal(int32(100*q+i), v)
			}
		}
		// Contiguous: rank q's part starts where rank q-1's ends.
		if n > 1 {
			p0, _, _ := WinSharedQuery[int32](w, 0)
			p1, _, _ := WinSharedQuery[int32](w, 1)
			r.Equal(uintptr(unsafe.Pointer(&p0[0]))+4*4, uintptr(unsafe.Pointer(&p1[0])))
		}
		r.NoError(node.Barrier())
		r.NoError(w.Fence(0))
		r.NoError(Put(w, []int32{-1}, (me+1)%n, 0))
		r.NoError(w.Fence(ModeNosucceed))
		r.Equal(int32(-1), mine[0])
		_, _, err = WinSharedQuery[int32](w, n)
		r.ErrorIs(err, ErrRank)
		plainWin, _, err := WinAllocate[int32](node, 1, 4)
		r.NoError(err)
		_, _, err = WinSharedQuery[int32](plainWin, 0)
		r.ErrorIs(err, ErrWin)
		r.NoError(plainWin.Free())
		r.NoError(w.Free())
		_, _, err = WinSharedQuery[int32](w, 0)
		r.ErrorIs(err, ErrWin)
		_, _, err = WinAllocateShared[int32](node, -1, 4)
		r.ErrorIs(err, ErrSize)
		r.NoError(node.Free())
	})
}

// Dynamic windows (MPI-4.1 §12.2.4): regions attached while the window
// lives, named by the addresses WinAttach returns; the target checks every
// access, so one outside what is attached (or after WinDetach) fails with
// ErrRMARange instead of landing.
func TestRMADynamicWindow_MPI41_12_2_4(t *testing.T) {
	eachNetwork(t, 2, func(r *rk, c *Comm) {
		me := c.Rank()
		other := 1 - me
		w, err := WinCreateDynamic(c)
		r.NoError(err)
		region := make([]int64, 3000) // past one medium request
		disp, err := WinAttach(w, region)
		r.NoError(err)
		_, err = WinAttach(w, region[10:20])
		r.ErrorIs(err, ErrRMAAttach, "overlap")
		_, err = WinAttach(w, region[:0])
		r.ErrorIs(err, ErrRMAAttach, "empty")
		addrs := make([]int, 2)
		r.NoError(Allgather(c, []int{disp}, addrs))

		r.NoError(w.Lock(LockExclusive, other, 0))
		src := make([]int64, len(region))
		for i := range src {
			src[i] = int64(me*10_000 + i)
		}
		r.NoError(Put(w, src, other, addrs[other]))
		r.NoError(Accumulate(w, []int64{5}, other, addrs[other]+8, Sum[int64]()))
		r.NoError(w.Flush(other))
		got := make([]int64, 4)
		r.NoError(Get(w, got, other, addrs[other]))
		r.NoError(w.Flush(other))
		r.Equal([]int64{int64(me * 10_000), int64(me*10_000 + 1 + 5), int64(me*10_000 + 2), int64(me*10_000 + 3)}, got)
		r.NoError(Put(w, src[:2], other, addrs[other]+8*len(region)-8)) // one element past the end
		r.ErrorIs(w.Flush(other), ErrRMARange)
		r.NoError(w.Unlock(other))
		r.NoError(c.Barrier())
		r.Equal(int64(other*10_000+len(region)-1), region[len(region)-1], "the refused put left the region alone")

		r.NoError(WinDetach(w, region))
		r.ErrorIs(WinDetach(w, region), ErrRMAAttach)
		r.NoError(c.Barrier())
		r.NoError(w.Lock(LockShared, other, 0))
		r.NoError(Put(w, src[:1], other, addrs[other]))
		r.ErrorIs(w.Unlock(other), ErrRMARange, "detached")
		r.NoError(w.Free())

		plain, _, err := WinAllocate[int64](c, 1, 8)
		r.NoError(err)
		_, err = WinAttach(plain, region)
		r.ErrorIs(err, ErrRMAFlavor)
		r.NoError(plain.Free())
	})
}

// WinAllocate puts the window's memory of a node's ranks in one mapping, and
// Put and Get between them are copies; across nodes (the mixed networks),
// and with AMGO_RMA_SHM=0, they go through the network. Both give the same
// answers.
func TestRMAAllocateNodeMapping_MPI41_12_2_2(t *testing.T) {
	for _, env := range []string{"", "0"} {
		t.Run("AMGO_RMA_SHM="+env, func(t *testing.T) {
			t.Setenv(EnvRMAShm, env)
			eachNetwork(t, 3, func(r *rk, c *Comm) {
				n, me := c.Size(), c.Rank()
				w, mem, err := WinAllocate[int32](c, 2000, 4)
				r.NoError(err)
				r.Len(mem, 2000)
				mates := 0 // the ranks of this rank's node, itself included
				for q := range n {
					if c.p.ep.Node(c.world(q)) == c.p.ep.Node(c.world(me)) {
						mates++
					}
				}
				for q := range n {
					sameNode := c.p.ep.Node(c.world(q)) == c.p.ep.Node(c.world(me))
					// A rank's own memory is always local; its node mates' when mapped.
					r.Equal(q == me || env == "" && sameNode && mates > 1, w.local != nil && w.local[q] != nil, "rank %d", q)
				}
				src := make([]int32, 2000)
				for i := range src {
					src[i] = int32(me*10000 + i)
				}
				r.NoError(w.Fence(0))
				r.NoError(Put(w, src, (me+1)%n, 0))
				r.NoError(w.Fence(0))
				left := (me + n - 1) % n
				for i := range mem {
					r.Equal(int32(left*10000+i), mem[i])
				}
				got := make([]int32, 7)
				r.NoError(Get(w, got, left, 3))
				r.NoError(w.Fence(ModeNosucceed))
				r.Equal(int32(((left+n-1)%n)*10000+3), got[0])
				r.NoError(w.Free())
			})
		})
	}
}

// One-sided operations with derived datatypes (MPI-4.1 §12.3): a strided
// column put, gathered back and accumulated, through the node mapping, a
// created window (the network) and a dynamic one; sides of different sizes
// and mixed element kinds are ErrType.
func TestRMATyped_MPI41_12_3(t *testing.T) {
	eachNetwork(t, 2, func(r *rk, c *Comm) {
		me := c.Rank()
		other := 1 - me
		const rows = 3000                           // a column of 3000 rows: past one medium request
		col, err := TypeVector(rows, 1, 4, Float64) // every fourth float64
		r.NoError(err)
		r.NoError(col.Commit())
		alloc, amem, err := WinAllocate[float64](c, 4*rows, 8)
		r.NoError(err)
		cmem := make([]float64, 4*rows)
		created, err := WinCreate(c, cmem, 8)
		r.NoError(err)
		dyn, err := WinCreateDynamic(c)
		r.NoError(err)
		dmem := make([]float64, 4*rows)
		disp, err := WinAttach(dyn, dmem)
		r.NoError(err)
		addrs := make([]int, 2)
		r.NoError(Allgather(c, []int{disp}, addrs))
		src := make([]float64, rows)
		for i := range src {
			src[i] = float64(me*100000 + i)
		}
		for k, w := range []*Win{alloc, created, dyn} {
			mem := [][]float64{amem, cmem, dmem}[k]
			base := 1 // column 1
			if w == dyn {
				base = addrs[other] + 8
			}
			r.NoError(w.Fence(0))
			r.NoError(PutTyped(w, src, rows, Float64, other, base, 1, col))
			r.NoError(w.Fence(0))
			for i := range rows {
				r.Equal(float64(other*100000+i), mem[4*i+1], "window %d row %d", k, i)
				r.Equal(float64(0), mem[4*i], "window %d row %d untouched", k, i)
			}
			back := make([]float64, 2*rows)
			every2, err := TypeVector(rows, 1, 2, Float64)
			r.NoError(err)
			r.NoError(every2.Commit())
			r.NoError(GetTyped(w, back, 1, every2, other, base, 1, col))
			r.NoError(w.Fence(0))
			for i := range rows {
				r.Equal(float64(me*100000+i), back[2*i], "window %d get row %d", k, i)
			}
			r.NoError(AccumulateTyped(w, src, rows, Float64, other, base, 1, col, Sum[float64]()))
			r.NoError(w.Fence(0))
			for i := range rows {
				r.Equal(float64(2*(other*100000+i)), mem[4*i+1], "window %d acc row %d", k, i)
			}
			// GetAccumulateTyped: the old column comes back into every other
			// element; NoOp reads atomically.
			r.NoError(w.Fence(0)) // both have read their windows
			old := make([]float64, 2*rows)
			r.NoError(GetAccumulateTyped(w, src, rows, Float64, old, 1, every2, other, base, 1, col, Sum[float64]()))
			r.NoError(w.Fence(0))
			read := make([]float64, rows)
			r.NoError(GetAccumulateTyped(w, nil, 0, Float64, read, rows, Float64, other, base, 1, col, NoOp[float64]()))
			r.NoError(w.Fence(0))
			for i := range rows {
				r.Equal(float64(2*(me*100000+i)), old[2*i], "window %d getacc row %d", k, i)
				r.Equal(float64(3*(me*100000+i)), read[i], "window %d noop row %d", k, i)
				r.Equal(float64(3*(other*100000+i)), mem[4*i+1], "window %d getacc row %d at the target", k, i)
			}
			r.ErrorIs(GetAccumulateTyped(w, src, rows-1, Float64, old, 1, every2, other, base, 1, col, Sum[float64]()), ErrType, "sizes differ")

			// The request forms, in a passive-target epoch: replace the
			// column, read it back, add to it, add again reading the old.
			r.NoError(w.Fence(ModeNosucceed))
			r.NoError(w.Lock(LockShared, other, 0))
			var reqs []Request
			add := func(q Request, err error) {
				r.NoError(err)
				reqs = append(reqs, q)
			}
			add(RputTyped(w, src, rows, Float64, other, base, 1, col))
			r.NoError(w.Flush(other))
			got := make([]float64, rows)
			add(RgetTyped(w, got, rows, Float64, other, base, 1, col))
			r.NoError(Waitall(reqs, nil))
			add(RaccumulateTyped(w, src, rows, Float64, other, base, 1, col, Sum[float64]()))
			r.NoError(w.Flush(other))
			prev := make([]float64, 2*rows)
			add(RgetAccumulateTyped(w, src, rows, Float64, prev, 1, every2, other, base, 1, col, Sum[float64]()))
			r.NoError(Waitall(reqs, nil))
			r.NoError(w.Unlock(other))
			r.NoError(c.Barrier())
			for i := range rows {
				v := float64(me*100000 + i)
				r.Equal(v, got[i], "window %d rget row %d", k, i)
				r.Equal(2*v, prev[2*i], "window %d rgetacc row %d", k, i)
				r.Equal(float64(3*(other*100000+i)), mem[4*i+1], "window %d requests row %d at the target", k, i)
			}
			r.NoError(w.Fence(0))
			r.ErrorIs(PutTyped(w, src, rows-1, Float64, other, base, 1, col), ErrType, "sizes differ")
			r.ErrorIs(AccumulateTyped(w, []int64{1}, 1, Int64, other, base, 1, Float64, Sum[int64]()), ErrType, "kinds differ")
			r.NoError(w.Fence(ModeNosucceed))
		}
		r.NoError(alloc.Free())
		r.NoError(created.Free())
		r.NoError(dyn.Free())
	})
}

// Exclusive writers and shared readers of one target, mixed: a reader never
// sees a half-done write, the writes' count is exact (MPI-4.1 §12.5.3). In
// a node mapping node mates take the lock in its lock-state word while
// other nodes queue at the target's handler; this mixes both.
func TestRMALockSharedExclusiveMixed_MPI41_12_5_3(t *testing.T) {
	eachNetwork(t, 4, func(r *rk, c *Comm) {
		n := c.Size()
		const rounds = 40
		w, mem, err := WinAllocate[int64](c, 2, 8)
		r.NoError(err)
		for i := range rounds {
			var v [2]int64
			if i%2 == 0 {
				r.NoError(w.Lock(LockExclusive, 0, 0))
				r.NoError(Get(w, v[:], 0, 0))
				r.NoError(w.Flush(0))
				v[0]++
				v[1]++
				r.NoError(Put(w, v[:1], 0, 0))
				r.NoError(w.Flush(0)) // the pair is torn in between
				r.NoError(Put(w, v[1:], 0, 1))
			} else {
				r.NoError(w.Lock(LockShared, 0, 0))
				r.NoError(Get(w, v[:], 0, 0))
				r.NoError(w.Flush(0))
				r.Equal(v[0], v[1], "a shared holder saw a write under way")
			}
			r.NoError(w.Unlock(0))
		}
		r.NoError(c.Barrier())
		if c.Rank() == 0 {
			r.Equal([]int64{int64(n * rounds / 2), int64(n * rounds / 2)}, mem)
		}
		r.NoError(w.Free())
	})
}

// The lock-state word: exclusive excludes all, shared holders count, and
// direct takes and releases fail while requests are queued.
func TestLockStateWord(t *testing.T) {
	var ls uint32
	require.True(t, tryLockState(&ls, LockShared, true))
	require.True(t, tryLockState(&ls, LockShared, true))
	require.False(t, tryLockState(&ls, LockExclusive, false))
	require.True(t, unlockState(&ls, true))
	require.True(t, unlockState(&ls, true))
	require.Equal(t, uint32(0), ls)
	require.True(t, tryLockState(&ls, LockExclusive, true))
	require.False(t, tryLockState(&ls, LockShared, false))
	require.False(t, tryLockState(&ls, LockExclusive, false))
	ls |= lockQueued
	require.False(t, unlockState(&ls, true), "a direct release while requests are queued")
	require.Equal(t, uint32(lockExcl|lockQueued), ls, "a refused release changes nothing")
	require.True(t, unlockState(&ls, false))
	require.False(t, tryLockState(&ls, LockShared, true), "a direct take while requests are queued")
	require.True(t, tryLockState(&ls, LockShared, false), "the target grants its queue")
	require.Equal(t, uint32(lockQueued|1), ls)
}
