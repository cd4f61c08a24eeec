// Command ring passes a token around all ranks of an MPI job over mpiam.
//
// Phase 1 (Send/Recv): rank 0 starts a token at 0; every rank receives it from
// its left neighbour, adds rank+1 and sends it to its right neighbour, for a
// number of laps; rank 0 checks that the token holds laps*n*(n+1)/2.
//
// Phase 2 (Sendrecv): all ranks shift values to the right at the same time,
// n-1 times, each adding what it receives to its own sum, so that every rank
// ends with the sum over all ranks of rank+1 (an allreduce by ring shifts);
// the ranks' results are then sent to rank 0, which checks them all.
//
//	amrun -n 4 ./ring                        # four processes over shared memory
//	amrun -n 3 --transport loop ./ring -laps 1000
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/amgo-hpc/amgo/mpiam"
)

const (
	tagToken = 1
	tagShift = 2
	tagSum   = 3
)

func main() {
	laps := flag.Int("laps", 100, "times the token goes round")
	flag.Parse()
	if *laps < 1 {
		fmt.Fprintln(os.Stderr, "ring: -laps must be at least 1")
		os.Exit(2)
	}
	err := mpiam.Run(mpiam.Config{}, func(world *mpiam.Comm) error { return ring(world, *laps) })
	if err != nil {
		fmt.Fprintln(os.Stderr, "ring:", err)
		os.Exit(1)
	}
}

func ring(world *mpiam.Comm, laps int) error {
	n, me := world.Size(), world.Rank()
	next, prev := (me+1)%n, (me-1+n)%n
	perLap := int64(n) * int64(n+1) / 2

	// Phase 1: one token, passed with blocking Send and Recv.
	token := []int64{0}
	for lap := 0; lap < laps; lap++ {
		if me == 0 {
			token[0] += 1 // rank 0's contribution, rank+1
			if err := mpiam.Send(world, token, next, tagToken); err != nil {
				return err
			}
			if _, err := mpiam.Recv(world, token, prev, tagToken); err != nil {
				return err
			}
			continue
		}
		st, err := mpiam.Recv(world, token, prev, tagToken)
		if err != nil {
			return err
		}
		if st.Source != prev || mpiam.GetCount[int64](st) != 1 {
			return fmt.Errorf("rank %d: token from %d with %d bytes", me, st.Source, st.Bytes)
		}
		token[0] += int64(me + 1)
		if err := mpiam.Send(world, token, next, tagToken); err != nil {
			return err
		}
	}
	if me == 0 {
		if want := perLap * int64(laps); token[0] != want {
			return fmt.Errorf("send/recv ring: token %d after %d laps, want %d", token[0], laps, want)
		}
		fmt.Printf("ring: Send/Recv: %d ranks, %d laps: token %d\n", n, laps, token[0])
	}

	// Phase 2: every rank shifts a value to the right with Sendrecv, n-1 times.
	out, in := []int64{int64(me + 1)}, []int64{0}
	sum := out[0]
	for step := 1; step < n; step++ {
		st, err := mpiam.Sendrecv(world, out, next, tagShift, in, prev, tagShift)
		if err != nil {
			return err
		}
		if st.Source != prev {
			return fmt.Errorf("rank %d: shift from %d, want %d", me, st.Source, prev)
		}
		sum += in[0]
		out[0] = in[0]
	}
	if me != 0 {
		return mpiam.Send(world, []int64{sum}, 0, tagSum)
	}
	bad := 0
	got := []int64{sum}
	for r := 0; r < n; r++ {
		if r > 0 {
			if _, err := mpiam.Recv(world, got, r, tagSum); err != nil {
				return err
			}
		}
		if got[0] != perLap {
			fmt.Printf("ring: rank %d has sum %d, want %d\n", r, got[0], perLap)
			bad++
		}
	}
	if bad > 0 {
		return fmt.Errorf("sendrecv ring: %d of %d ranks have a wrong sum", bad, n)
	}
	fmt.Printf("ring: Sendrecv: %d ranks, %d shifts: every rank has %d\n", n, n-1, perLap)
	fmt.Println("ring: OK")
	return nil
}
