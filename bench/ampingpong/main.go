// Command ampingpong measures Active Messages ping-pong between ranks 0 and 1:
// half round-trip latency and the bandwidth it implies, per message size, in
// the OSU Micro-Benchmarks column layout. It is `osu am` (bench/osu) kept under
// its old name; the benchmark itself is bench/internal/ambench.
//
//	amrun -n 2 ./ampingpong -k short            # 0..16 arguments (sizes 0..128 bytes)
//	amrun -n 2 ./ampingpong -k medium           # RequestMedium, reply short
//	amrun -n 2 ./ampingpong -k store -m 4194304 # Store there, Store back
//	amrun -n 2 ./ampingpong -k medium -bw       # windowed bandwidth (-W window)
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime/pprof"

	"github.com/amgo-hpc/amgo/am"
	"github.com/amgo-hpc/amgo/am/job"
	"github.com/amgo-hpc/amgo/bench/internal/ambench"
	"github.com/amgo-hpc/amgo/bench/internal/osu"
)

func main() {
	kind := flag.String("k", "medium", "message kind: short, medium or store")
	bw := flag.Bool("bw", false, "windowed bandwidth instead of ping-pong")
	opts := osu.Options{MinSize: 0, MaxSize: 0, Iters: 10000, Warmup: 1000, Window: osu.DefaultWindow}
	osu.Register(flag.CommandLine, &opts)
	cpuprofile := flag.String("cpuprofile", "", "write rank 0's CPU profile to this file")
	flag.Parse()
	if *cpuprofile != "" && os.Getenv("PMI_RANK") == "0" {
		f, err := os.Create(*cpuprofile)
		if err == nil && pprof.StartCPUProfile(f) == nil {
			defer pprof.StopCPUProfile()
		}
	}
	err := job.Run(am.Config{}, func(ep *am.Endpoint) error { return ambench.Run(ep, *kind, *bw, opts, os.Stdout) })
	if err != nil {
		fmt.Fprintln(os.Stderr, "ampingpong:", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}
