// Command abortcheck is a job that goes wrong, for the mpiam tests, which
// launch it with amrun over loop, shm and tcp.
//
// Usage: abortcheck [hang [single]]
//
// Without an argument, every rank exchanges one message with its neighbours
// and passes a barrier; then the last rank calls Abort(7) while the others
// wait in a Barrier it never joins. The job must end with status 7, say first
// that the rank aborted, and leave a readable trace of every rank (--trace).
//
// With "hang", the program is erroneous and never ends: rank 0 waits for a
// message with tag 5 that rank 1 never sends, rank 1 waits in a Bcast of 800
// bytes from root 0 that rank 0 never calls, and the others in a Barrier.
// amrun --timeout must have each rank print what it waits for; with
// "single" the ranks run at ThreadSingle (collectives under way are still
// listed, without a lock).
package main

import (
	"fmt"
	"os"

	"github.com/amgo-hpc/amgo/mpiam"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "hang" {
		cfg := mpiam.Config{}
		if len(os.Args) > 2 && os.Args[2] == "single" {
			cfg.Thread = mpiam.ThreadSingle
		}
		hang(cfg)
		return
	}
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

func hang(cfg mpiam.Config) {
	err := mpiam.Run(cfg, func(w *mpiam.Comm) error {
		switch w.Rank() {
		case 0:
			_, err := mpiam.Recv(w, make([]int64, 1), 1, 5)
			return err
		case 1:
			return mpiam.Bcast(w, make([]int64, 100), 0)
		default:
			return w.Barrier()
		}
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "abortcheck:", err)
		os.Exit(1)
	}
}
