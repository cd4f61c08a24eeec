// Command rmacheck runs one-sided communication with known answers as real
// processes: fence rings of puts and gets, accumulates from every rank, a
// FetchAndOp counter under locks, generalized active target, and a
// shared-memory window per node whose parts the node's ranks load and store
// directly. `amrun -n 4 rmacheck` prints "rmacheck: N ranks: OK".
package main

import (
	"fmt"
	"os"
	"slices"

	"github.com/amgo-hpc/amgo/mpiam"
)

func main() {
	if err := mpiam.Run(mpiam.Config{}, check); err != nil {
		fmt.Fprintln(os.Stderr, "rmacheck:", err)
		os.Exit(1)
	}
}

func check(c *mpiam.Comm) error {
	for _, f := range []func(*mpiam.Comm) error{fenceRing, counter, pscw, shared} {
		if err := f(c); err != nil {
			return err
		}
	}
	if c.Rank() == 0 {
		fmt.Printf("rmacheck: %d ranks: OK\n", c.Size())
	}
	return nil
}

// fenceRing puts 64 KiB into the right neighbour's window, gets it back from
// the left one's, and accumulates every rank's number into rank 0's.
func fenceRing(c *mpiam.Comm) error {
	n, me := c.Size(), c.Rank()
	const k = 8192
	w, mem, err := mpiam.WinAllocate[int64](c, k+1, 8)
	if err != nil {
		return err
	}
	src := make([]int64, k)
	for i := range src {
		src[i] = int64(me*k + i)
	}
	if err := w.Fence(0); err != nil {
		return err
	}
	if err := mpiam.Put(w, src, (me+1)%n, 0); err != nil {
		return err
	}
	if err := mpiam.Accumulate(w, []int64{int64(me + 1)}, 0, k, mpiam.Sum[int64]()); err != nil {
		return err
	}
	if err := w.Fence(0); err != nil {
		return err
	}
	left := (me + n - 1) % n
	for i := range k {
		if mem[i] != int64(left*k+i) {
			return fmt.Errorf("fence ring: element %d is %d, want %d", i, mem[i], left*k+i)
		}
	}
	if me == 0 && mem[k] != int64(n*(n+1)/2) {
		return fmt.Errorf("fence accumulate: %d, want %d", mem[k], n*(n+1)/2)
	}
	got := make([]int64, k)
	if err := mpiam.Get(w, got, left, 0); err != nil {
		return err
	}
	if err := w.Fence(mpiam.ModeNosucceed); err != nil {
		return err
	}
	ll := (left + n - 1) % n
	for i := range k {
		if got[i] != int64(ll*k+i) {
			return fmt.Errorf("fence get: element %d is %d, want %d", i, got[i], ll*k+i)
		}
	}
	return w.Free()
}

// counter: every rank takes 50 numbers from a FetchAndOp counter at the last
// rank; together they are 0 .. 50n-1, each once.
func counter(c *mpiam.Comm) error {
	n, me := c.Size(), c.Rank()
	const rounds = 50
	w, _, err := mpiam.WinAllocate[int64](c, 1, 8)
	if err != nil {
		return err
	}
	got := make([]int64, rounds)
	for i := range got {
		if err := w.Lock(mpiam.LockShared, n-1, 0); err != nil {
			return err
		}
		if err := mpiam.FetchAndOp(w, 1, &got[i], n-1, 0, mpiam.Sum[int64]()); err != nil {
			return err
		}
		if err := w.Unlock(n - 1); err != nil {
			return err
		}
	}
	all := make([]int64, n*rounds)
	if err := mpiam.Gather(c, got, all, 0); err != nil {
		return err
	}
	if me == 0 {
		slices.Sort(all)
		for i, v := range all {
			if v != int64(i) {
				return fmt.Errorf("counter: the %dth number taken is %d", i, v)
			}
		}
	}
	return w.Free()
}

// pscw: rank 0 exposes its window to the others, which put their numbers.
func pscw(c *mpiam.Comm) error {
	n, me := c.Size(), c.Rank()
	w, mem, err := mpiam.WinAllocate[int32](c, n, 4)
	if err != nil {
		return err
	}
	g, err := w.Group()
	if err != nil {
		return err
	}
	if me == 0 {
		others, err := g.Excl([]int{0})
		if err != nil {
			return err
		}
		if err := w.Post(others, 0); err != nil {
			return err
		}
		if err := w.Wait(); err != nil {
			return err
		}
		for r := 1; r < n; r++ {
			if mem[r] != int32(10*r) {
				return fmt.Errorf("pscw: rank %d's element is %d", r, mem[r])
			}
		}
	} else {
		zero, err := g.Incl([]int{0})
		if err != nil {
			return err
		}
		if err := w.Start(zero, 0); err != nil {
			return err
		}
		if err := mpiam.Put(w, []int32{int32(10 * me)}, 0, me); err != nil {
			return err
		}
		if err := w.Complete(); err != nil {
			return err
		}
	}
	return w.Free()
}

// shared: the ranks of each node allocate a shared window; each stores into
// its own part, and after a barrier reads every other part of its node
// directly.
func shared(c *mpiam.Comm) error {
	node, err := c.SplitType(mpiam.CommTypeShared, c.Rank())
	if err != nil {
		return err
	}
	nn, me := node.Size(), node.Rank()
	const k = 1000
	w, mine, err := mpiam.WinAllocateShared[int64](node, k, 8)
	if err != nil {
		return err
	}
	for i := range mine {
		mine[i] = int64(c.Rank()*k + i)
	}
	if err := node.Barrier(); err != nil { // the barrier orders the stores before the loads (MPI-4.1 §12.7 example 12.21's pattern)
		return err
	}
	if err := w.Sync(); err != nil {
		return err
	}
	for r := range nn {
		part, unit, err := mpiam.WinSharedQuery[int64](w, r)
		if err != nil {
			return err
		}
		if unit != 8 || len(part) != k {
			return fmt.Errorf("shared: rank %d's part: %d elements, unit %d", r, len(part), unit)
		}
		g, err := node.Group()
		if err != nil {
			return err
		}
		world, err := c.Group()
		if err != nil {
			return err
		}
		wr, err := g.TranslateRanks([]int{r}, world)
		if err != nil {
			return err
		}
		for i, v := range part {
			if v != int64(wr[0]*k+i) {
				return fmt.Errorf("shared: node rank %d (world %d) reads %d at %d of node rank %d", me, c.Rank(), v, i, r)
			}
		}
	}
	if err := w.Free(); err != nil {
		return err
	}
	return node.Free()
}
