// Command collcheck runs every collective with known answers, on the world
// communicator and on a split one while point-to-point traffic flows, as real
// processes: `amrun -n 4 collcheck` prints "collcheck: N ranks: OK".
package main

import (
	"fmt"
	"os"

	"github.com/amgo-hpc/amgo/mpiam"
)

func main() {
	err := mpiam.Run(mpiam.Config{}, check)
	if err != nil {
		fmt.Fprintln(os.Stderr, "collcheck:", err)
		os.Exit(1)
	}
}

func check(w *mpiam.Comm) error {
	for _, c := range []func(*mpiam.Comm) error{checkAll, func(w *mpiam.Comm) error {
		sub, err := w.Split(w.Rank()%2, w.Rank())
		if err != nil {
			return err
		}
		// Point-to-point on the parent with the same tag while the split runs collectives.
		n, me := w.Size(), w.Rank()
		r, err := mpiam.Irecv(w, make([]int, 1), (me+n-1)%n, 0)
		if err != nil {
			return err
		}
		if err := mpiam.Send(w, []int{me}, (me+1)%n, 0); err != nil {
			return err
		}
		if err := checkAll(sub); err != nil {
			return fmt.Errorf("split: %w", err)
		}
		_, err = r.Wait()
		return err
	}} {
		if err := c(w); err != nil {
			return err
		}
	}
	if w.Rank() == 0 {
		fmt.Printf("collcheck: %d ranks: OK\n", w.Size())
	}
	return nil
}

func checkAll(c *mpiam.Comm) error {
	n, me := c.Size(), c.Rank()
	for _, m := range []int{1, 5000, 200000} {
		buf := make([]float64, m)
		if me == 0 {
			for i := range buf {
				buf[i] = float64(i)
			}
		}
		if err := mpiam.Bcast(c, buf, 0); err != nil {
			return err
		}
		for i := range buf {
			if buf[i] != float64(i) {
				return fmt.Errorf("bcast %d: %v at %d", m, buf[i], i)
			}
		}
		send := make([]float64, m)
		for i := range send {
			send[i] = float64(me + i)
		}
		sum := make([]float64, m)
		if err := mpiam.Allreduce(c, send, sum, mpiam.Sum[float64]()); err != nil {
			return err
		}
		for i := range sum {
			if want := float64(n*(n-1)/2 + n*i); sum[i] != want {
				return fmt.Errorf("allreduce %d: %v at %d, want %v", m, sum[i], i, want)
			}
		}
	}
	all := make([]int, n)
	if err := mpiam.Allgather(c, []int{me * 3}, all); err != nil {
		return err
	}
	for r := range all {
		if all[r] != 3*r {
			return fmt.Errorf("allgather: %v", all)
		}
	}
	a2a := make([]int, n)
	out := make([]int, n)
	for j := range a2a {
		a2a[j] = me*100 + j
	}
	if err := mpiam.Alltoall(c, a2a, out); err != nil {
		return err
	}
	for i := range out {
		if out[i] != i*100+me {
			return fmt.Errorf("alltoall: %v", out)
		}
	}
	sc := []int{0}
	if err := mpiam.Scan(c, []int{me + 1}, sc, mpiam.Sum[int]()); err != nil {
		return err
	}
	if sc[0] != (me+1)*(me+2)/2 {
		return fmt.Errorf("scan: %v", sc)
	}
	g := make([]int, n)
	if err := mpiam.Gather(c, []int{me}, g, n-1); err != nil {
		return err
	}
	part := []int{-1}
	if err := mpiam.Scatter(c, g, part, n-1); err != nil {
		return err
	}
	if part[0] != me {
		return fmt.Errorf("gather/scatter: %v", part)
	}
	r, err := c.Ibarrier()
	if err != nil {
		return err
	}
	if _, err := r.Wait(); err != nil {
		return err
	}
	return c.Barrier()
}
