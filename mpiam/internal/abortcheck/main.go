// Command abortcheck ends its job with Abort: the mpiam tests launch it with
// amrun (with --trace) over loop, shm and tcp. Every rank exchanges one
// message with its neighbours and passes a barrier; then the last rank calls Abort(7) while the
// others wait in a Barrier it never joins. The job must end with status 7,
// say first that the rank aborted, and leave a readable trace of every rank.
package main

import (
	"fmt"
	"os"

	"github.com/amgo-hpc/amgo/mpiam"
)

func main() {
	err := mpiam.Run(mpiam.Config{}, func(w *mpiam.Comm) error {
		n, me := w.Size(), w.Rank()
		out, in := []int64{int64(me)}, make([]int64, 1)
		if _, err := mpiam.Sendrecv(w, out, (me+1)%n, 1, in, (me+n-1)%n, 1); err != nil {
			return err
		}
		if err := w.Barrier(); err != nil { // every ring message has arrived
			return err
		}
		if me == n-1 {
			return w.Abort(7)
		}
		return w.Barrier()
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "abortcheck:", err)
		os.Exit(1)
	}
}
