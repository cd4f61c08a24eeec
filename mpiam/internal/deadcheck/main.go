// Command deadcheck checks that a rank dying mid-job is reported to the others:
// the mpiam tests launch it with amrun over shm and tcp. The last rank takes
// part in an exchange and then calls os.Exit(3) while the others are blocked
// on it; every survivor must get ErrProcFailed naming it.
//
// Usage: deadcheck recv|allreduce|barrier
//
//	recv       rank 0 is blocked in Recv from the victim, rank 1 in Wait on an
//	           Irecv from it, the others in an AnySource Recv
//	allreduce  the survivors are blocked in an Allreduce the victim never joins
//	barrier    the survivors are blocked in a Barrier the victim never joins
//
// Each survivor prints one line, "deadcheck: rank R <call>: ErrProcFailed rank
// V at <unix ns>: <error>", checks that new operations with the victim fail at
// once, exchanges a message with the other survivors, and exits 0 without
// finalizing (a job with a failed rank cannot finalize). The victim prints "deadcheck: rank V exits at <unix ns>" first.
// SIGTERM, which amrun sends the survivors when the victim fails, is ignored
// so that they report; amrun's SIGKILL after its grace period still ends them.
package main

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/amgo-hpc/amgo/mpiam"
)

func main() {
	signal.Ignore(syscall.SIGTERM)
	if len(os.Args) != 2 || (os.Args[1] != "recv" && os.Args[1] != "allreduce" && os.Args[1] != "barrier") {
		fmt.Fprintln(os.Stderr, "usage: deadcheck recv|allreduce|barrier")
		os.Exit(2)
	}
	mode := os.Args[1]
	w, err := mpiam.Init(mpiam.Config{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "deadcheck: init:", err)
		os.Exit(1)
	}
	if err := run(w, mode); err != nil {
		fmt.Fprintf(os.Stderr, "deadcheck: rank %d: %v\n", w.Rank(), err)
		os.Exit(1)
	}
	os.Exit(0)
}

func run(w *mpiam.Comm, mode string) error {
	n, me := w.Size(), w.Rank()
	victim := n - 1
	if n < 3 {
		return fmt.Errorf("needs at least 3 ranks, has %d", n)
	}
	// An exchange every rank takes part in: a ring shift of eager and
	// rendezvous sizes, so that every pair is connected, then an Allreduce.
	for _, size := range []int{8, 256 << 10} {
		out := make([]byte, size)
		in := make([]byte, size)
		for i := range out {
			out[i] = byte(me + i)
		}
		to, from := (me+1)%n, (me+n-1)%n
		if _, err := mpiam.Sendrecv(w, out, to, 1, in, from, 1); err != nil {
			return fmt.Errorf("ring of %d bytes: %w", size, err)
		}
		for i := range in {
			if in[i] != byte(from+i) {
				return fmt.Errorf("ring of %d bytes: byte %d from rank %d is %d", size, i, from, in[i])
			}
		}
	}
	sum := make([]int64, 1)
	if err := mpiam.Allreduce(w, []int64{1}, sum, mpiam.Sum[int64]()); err != nil {
		return fmt.Errorf("allreduce: %w", err)
	}
	if sum[0] != int64(n) {
		return fmt.Errorf("allreduce: %d, want %d", sum[0], n)
	}
	if me == victim {
		// Give the others time to block on us, then die mid-exchange: a
		// rendezvous send to rank 0 is left half done.
		time.Sleep(100 * time.Millisecond)
		if _, err := mpiam.Isend(w, make([]byte, 1<<20), 0, 7); err != nil {
			return err
		}
		fmt.Printf("deadcheck: rank %d exits at %d\n", me, time.Now().UnixNano())
		os.Exit(3)
	}
	buf := make([]byte, 64)
	var call string
	switch {
	case mode == "allreduce":
		call = "Allreduce"
		err := mpiam.Allreduce(w, []int64{1}, sum, mpiam.Sum[int64]())
		if err := report(me, call, victim, err); err != nil {
			return err
		}
	case mode == "barrier":
		call = "Barrier"
		if err := report(me, call, victim, w.Barrier()); err != nil {
			return err
		}
	case me == 0:
		call = "Recv"
		_, err := mpiam.Recv(w, buf, victim, 5)
		if err := report(me, call, victim, err); err != nil {
			return err
		}
	case me == 1:
		call = "Wait"
		r, err := mpiam.Irecv(w, buf, victim, 5)
		if err != nil {
			return err
		}
		_, err = r.Wait()
		if err := report(me, call, victim, err); err != nil {
			return err
		}
	default:
		call = "RecvAnySource"
		_, err := mpiam.Recv(w, buf, mpiam.AnySource, 5)
		if err := report(me, call, victim, err); err != nil {
			return err
		}
	}
	// New operations with the dead rank fail at once.
	start := time.Now()
	if err := mpiam.Send(w, buf, victim, 6); !errors.Is(err, mpiam.ErrProcFailed) {
		return fmt.Errorf("send to the dead rank after the failure: %v", err)
	}
	if _, err := mpiam.Recv(w, buf, victim, 6); !errors.Is(err, mpiam.ErrProcFailed) {
		return fmt.Errorf("receive from the dead rank after the failure: %v", err)
	}
	if d := time.Since(start); d > time.Second {
		return fmt.Errorf("operations with the dead rank took %v to fail", d)
	}
	// The survivors still talk (and none exits before all have reported: an
	// exit would be one more failure): a gather to rank 0 and a release.
	if me == 0 {
		for r := 1; r < victim; r++ {
			if _, err := mpiam.Recv(w, buf, r, 8); err != nil {
				return fmt.Errorf("survivors' gather from rank %d: %w", r, err)
			}
		}
		for r := 1; r < victim; r++ {
			if err := mpiam.Send(w, buf, r, 9); err != nil {
				return fmt.Errorf("survivors' release of rank %d: %w", r, err)
			}
		}
		return nil
	}
	if err := mpiam.Send(w, buf, 0, 8); err != nil {
		return fmt.Errorf("survivors' gather: %w", err)
	}
	if _, err := mpiam.Recv(w, buf, 0, 9); err != nil {
		return fmt.Errorf("survivors' release: %w", err)
	}
	return nil
}

// report prints what a survivor's blocked call returned, or an error when it
// is not the failure of the victim.
func report(me int, call string, victim int, err error) error {
	at := time.Now().UnixNano()
	var pf *mpiam.ProcFailedError
	if !errors.As(err, &pf) || !errors.Is(err, mpiam.ErrProcFailed) {
		return fmt.Errorf("%s returned %v, want ErrProcFailed naming rank %d", call, err, victim)
	}
	fmt.Printf("deadcheck: rank %d %s: ErrProcFailed rank %d at %d: %v\n", me, call, pf.WorldRank, at, err)
	return nil
}
