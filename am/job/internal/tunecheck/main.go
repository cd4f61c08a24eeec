// Command tunecheck reports what a rank looks like once job.Open returns:
// its timer slack and the CPUs it may run on, one line per rank
// ("tunecheck: rank R slack NS cpus LIST"). The am/job tests start it under
// MPICH's mpiexec, which neither binds ranks nor sets their slack.
package main

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/amgo-hpc/amgo/am"
	"github.com/amgo-hpc/amgo/am/job"
)

func main() {
	ep, err := job.Open(am.Config{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "tunecheck:", err)
		os.Exit(1)
	}
	slack, _ := unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0)
	var set unix.CPUSet
	_ = unix.SchedGetaffinity(0, &set)
	var cpus []int
	for c := 0; c < len(set)*64; c++ {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	fmt.Printf("tunecheck: rank %d slack %d cpus %v\n", ep.Rank(), slack, cpus)
	if err := ep.Finalize(); err != nil {
		fmt.Fprintln(os.Stderr, "tunecheck:", err)
		os.Exit(1)
	}
}
