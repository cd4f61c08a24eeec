package mpiam_test

import (
	"fmt"

	"github.com/amgo-hpc/amgo/mpiam"
)

// Four ranks (goroutines of this process, as RunLocal runs them) pass their
// rank around a ring with Sendrecv and add up what they received.
func Example() {
	err := mpiam.RunLocal(4, mpiam.Config{}, func(world *mpiam.Comm) error {
		me, n := world.Rank(), world.Size()
		out, in := []int64{int64(me)}, make([]int64, 1)
		if _, err := mpiam.Sendrecv(world, out, (me+1)%n, 0, in, (me+n-1)%n, 0); err != nil {
			return err
		}
		sum := make([]int64, 1)
		if err := mpiam.Allreduce(world, in, sum, mpiam.Sum[int64]()); err != nil {
			return err
		}
		if me == 0 {
			fmt.Printf("rank 0 received %d from its left neighbour; the ranks sum to %d\n", in[0], sum[0])
		}
		return nil
	})
	if err != nil {
		fmt.Println(err)
	}
	// Output:
	// rank 0 received 3 from its left neighbour; the ranks sum to 6
}

// A receive buffer too small for its message fails with an error of class
// MPI_ERR_TRUNCATE, which errors.Is recognizes.
func ExampleRecv_truncation() {
	err := mpiam.RunLocal(2, mpiam.Config{}, func(world *mpiam.Comm) error {
		if world.Rank() == 0 {
			return mpiam.Send(world, []byte("hello, world"), 1, 3)
		}
		_, err := mpiam.Recv(world, make([]byte, 5), 0, 3)
		fmt.Println("class:", mpiam.ErrorClass(err) == mpiam.ClassTruncate)
		return nil
	})
	if err != nil {
		fmt.Println(err)
	}
	// Output:
	// class: true
}

// Six ranks on a 3 x 2 grid chosen by DimsCreate, periodic along the first
// dimension: each exchanges a halo with its neighbors along it, found by
// CartShift, in one Sendrecv.
func ExampleComm_CartCreate() {
	err := mpiam.RunLocal(6, mpiam.Config{}, func(world *mpiam.Comm) error {
		dims := []int{0, 0}
		if err := mpiam.DimsCreate(world.Size(), dims); err != nil {
			return err
		}
		grid, err := world.CartCreate(dims, []bool{true, false}, false)
		if err != nil {
			return err
		}
		defer grid.Free()
		below, above, err := grid.CartShift(0, 1)
		if err != nil {
			return err
		}
		_, _, coords, err := grid.CartGet()
		if err != nil {
			return err
		}
		halo := make([]int64, 1)
		if _, err := mpiam.Sendrecv(grid, []int64{int64(coords[0])}, above, 0, halo, below, 0); err != nil {
			return err
		}
		if grid.Rank() == 0 {
			fmt.Printf("grid %v; rank 0 at %v got row %d's halo\n", dims, coords, halo[0])
		}
		return nil
	})
	if err != nil {
		fmt.Println(err)
	}
	// Output:
	// grid [3 2]; rank 0 at [0 0] got row 2's halo
}

// Each of three ranks posts a receive from every other rank and sends to
// every other rank without blocking, then completes all of them with
// Waitall. Requests are values: a slice of them is the window, Waitall sets
// every completed one to the null Request (the zero value), and IsNull
// tells it from an active one.
func ExampleWaitall() {
	err := mpiam.RunLocal(3, mpiam.Config{}, func(world *mpiam.Comm) error {
		me, n := world.Rank(), world.Size()
		in := make([]int32, n)
		out := []int32{int32(10 * me)}
		var reqs []mpiam.Request
		for peer := range n {
			if peer == me {
				continue
			}
			r, err := mpiam.Irecv(world, in[peer:peer+1], peer, 7)
			if err != nil {
				return err
			}
			s, err := mpiam.Isend(world, out, peer, 7)
			if err != nil {
				return err
			}
			reqs = append(reqs, r, s)
		}
		if err := mpiam.Waitall(reqs, nil); err != nil {
			return err
		}
		if me == 0 {
			fmt.Println("rank 0 received", in[1:], "null afterwards:", reqs[0].IsNull() && reqs[0] == mpiam.Request{})
		}
		return nil
	})
	if err != nil {
		fmt.Println(err)
	}
	// Output:
	// rank 0 received [10 20] null afterwards: true
}
