// Command nodecheck checks that the loss of a whole node is reported to the
// ranks of the other nodes: the mpiam tests run it across an emulated
// cluster and kill the last node while the job runs. After an exchange that
// connects every pair, the ranks of the last rank's node (by host name)
// wait for a message that never comes, and the others enter an Allreduce
// that the lost ranks never join. Rank 0 prints "nodecheck: ready" when
// everyone is in place; each survivor then prints "nodecheck: rank R:
// ErrProcFailed rank V lost=true|false: <error>" (V one of the lost node's
// ranks) and exits 0 without finalizing. SIGTERM from the launcher is
// ignored so that survivors report.
package main

import (
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"os/signal"
	"syscall"

	"github.com/amgo-hpc/amgo/mpiam"
)

func main() {
	signal.Ignore(syscall.SIGTERM)
	w, err := mpiam.Init(mpiam.Config{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "nodecheck: init:", err)
		os.Exit(1)
	}
	if err := run(w); err != nil {
		fmt.Fprintf(os.Stderr, "nodecheck: rank %d: %v\n", w.Rank(), err)
		os.Exit(1)
	}
	os.Exit(0)
}

func run(w *mpiam.Comm) error {
	n, me := w.Size(), w.Rank()
	host, _ := os.Hostname()
	h := fnv.New64a()
	h.Write([]byte(host))
	hosts := make([]int64, n)
	if err := mpiam.Allgather(w, []int64{int64(h.Sum64() >> 1)}, hosts); err != nil {
		return err
	}
	lost := map[int]bool{}
	for r, v := range hosts {
		if v == hosts[n-1] {
			lost[r] = true
		}
	}
	if len(lost) == n {
		return fmt.Errorf("every rank is on one node (%s)", host)
	}
	// Connect every pair: a ring shift and an Allreduce.
	out, in := make([]byte, 64<<10), make([]byte, 64<<10)
	if _, err := mpiam.Sendrecv(w, out, (me+1)%n, 1, in, (me+n-1)%n, 1); err != nil {
		return err
	}
	if err := w.Barrier(); err != nil {
		return err
	}
	if me == 0 {
		fmt.Println("nodecheck: ready")
	}
	if lost[me] {
		_, err := mpiam.Recv(w, make([]byte, 8), mpiam.AnySource, 99)
		return fmt.Errorf("the lost node's rank returned from its wait: %v", err)
	}
	sum := make([]int64, 1)
	err := mpiam.Allreduce(w, []int64{1}, sum, mpiam.Sum[int64]())
	var pe *mpiam.ProcFailedError
	if !errors.As(err, &pe) {
		return fmt.Errorf("the Allreduce after the node was lost: %v", err)
	}
	fmt.Printf("nodecheck: rank %d: ErrProcFailed rank %d lost=%v: %v\n", me, pe.Rank, lost[pe.Rank], err)
	return nil
}
