// Command scale measures what a rank costs in memory as a job grows: it runs
// the README's program (a ring Sendrecv and an Allreduce) and then reports
// each rank's peak resident memory (VmHWM of /proc/self/status: the Go
// heap, stacks, and the pages of shared-memory rings this process touched),
// gathered at rank 0:
//
//	scale: ranks 64 processes 64 peak-rss-per-rank-MB avg 9.1 max 9.8 total-MB 582 wall-s 0.84
//
// In-process jobs (AMGO_TRANSPORT=loop) are one process: the figure is that
// process's peak divided by the ranks. bench/scale.sh runs it beside the
// same program in C under Open MPI and MPICH (bench/ref/scale.c).
package main

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/amgo-hpc/amgo/mpiam"
)

func main() {
	memprofile := flag.String("memprofile", "", "rank 0 writes a heap profile to `FILE` at the end")
	flag.Parse()
	start := time.Now()
	var once sync.Once
	err := mpiam.Run(mpiam.Config{}, func(world *mpiam.Comm) error {
		me, n := world.Rank(), world.Size()
		out, in := []float64{float64(me)}, make([]float64, 1)
		if _, err := mpiam.Sendrecv(world, out, (me+1)%n, 0, in, (me+n-1)%n, 0); err != nil {
			return err
		}
		sum := make([]float64, 1)
		if err := mpiam.Allreduce(world, in, sum, mpiam.Sum[float64]()); err != nil {
			return err
		}
		if want := float64(n) * float64(n-1) / 2; sum[0] != want {
			return fmt.Errorf("sum of ranks %v, want %v", sum[0], want)
		}
		hwm := []int64{peakRSS()}
		all := make([]int64, n)
		if err := mpiam.Gather(world, hwm, all, 0); err != nil {
			return err
		}
		if me != 0 {
			return nil
		}
		if *memprofile != "" {
			f, err := os.Create(*memprofile)
			if err != nil {
				return err
			}
			defer f.Close()
			if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
				return err
			}
		}
		once.Do(func() { report(all, time.Since(start)) })
		return nil
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "scale:", err)
		os.Exit(1)
	}
}

// report prints the figures; ranks of one process (the same peak) count
// once.
func report(all []int64, wall time.Duration) {
	n := len(all)
	var sum, hi int64
	procs := 0
	if os.Getenv("AMGO_LOOP_SIZE") != "" || os.Getenv("AMGO_TRANSPORT") == "loop" {
		procs, sum, hi = 1, all[0], all[0]/int64(n)
		fmt.Printf("scale: ranks %d processes %d peak-rss-per-rank-MB avg %.1f max %.1f total-MB %.0f wall-s %.2f\n",
			n, procs, float64(sum)/float64(n)/1e6, float64(hi)/1e6, float64(sum)/1e6, wall.Seconds())
		return
	}
	for _, v := range all {
		sum += v
		hi = max(hi, v)
	}
	fmt.Printf("scale: ranks %d processes %d peak-rss-per-rank-MB avg %.1f max %.1f total-MB %.0f wall-s %.2f\n",
		n, n, float64(sum)/float64(n)/1e6, float64(hi)/1e6, float64(sum)/1e6, wall.Seconds())
}

// peakRSS returns VmHWM in bytes, or 0 when /proc cannot tell.
func peakRSS() int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}
