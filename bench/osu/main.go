// Command osu is amgo's port of the OSU Micro-Benchmarks 7.2 point-to-point
// tests: one command with a subcommand per benchmark, each taking OSU's options
// and printing OSU's layout (the "# OSU MPI ..." title becomes "# amgo ...";
// the column header and row formats are OSU's), so that the figures can be
// laid beside Open MPI's and MPICH's (bench/ref, bench/harness). Every MPI test
// runs through mpiam.Run, over whatever network amrun chose:
//
//	amrun -n 2 [--transport loop|shm|tcp] osu latency    [-m min:max] [-i n] [-x n]
//	amrun -n 2 osu bw         [-m ...] [-i n] [-x n] [-W window]
//	amrun -n 2 osu bibw       [-m ...] [-i n] [-x n] [-W window]
//	amrun -n 4 osu mbw_mr     [-m ...] [-i n] [-x n] [-W window]   pairs (i, i+n/2)
//	amrun -n 2 osu latency_mt [-m ...] [-i n] [-x n] [-t threads]  goroutine pairs, one tag each
//	amrun -n 2 osu match      [-q queued] [-i n] [-x n]            exact match behind an unexpected list
//	amrun -n 2 osu am         [-k short|medium|store] [-bw] [-m ...] [-i n] [-x n] [-W window]
//	amrun -n N osu allreduce|bcast|alltoall|barrier [-m ...] [-i n] [-x n]   collectives, average over ranks
//
// Defaults are OSU's: latency tests 0..4 MiB, 10000 iterations (100 warm-up)
// up to 8 KiB and 1000 (10) above; bandwidth tests 1..4 MiB, window 64, 100
// iterations (10) up to 8 KiB and 20 (2) above. -i and -x set one count for
// every size. Send and receive buffers are separate, as in OSU. docs/performance.md
// says what each test measures.
//
// With OSU_CPUPROFILE=prefix in its environment each rank writes a CPU
// profile of its run to prefix.<pid> (runtime/pprof): bench/pgo.sh makes
// this directory's default.pgo, the profile Go's profile-guided optimization
// builds osu with, from such profiles.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/amgo-hpc/amgo/mpiam"
)

// bench is one subcommand: it parses its arguments and runs.
type bench struct {
	help string
	run  func(args []string) error
}

var benches = map[string]bench{
	"latency":    {"ping-pong latency (osu_latency)", runLatency},
	"bw":         {"windowed unidirectional bandwidth (osu_bw)", runBW},
	"bibw":       {"windowed bidirectional bandwidth (osu_bibw)", runBiBW},
	"mbw_mr":     {"multi-pair bandwidth and message rate (osu_mbw_mr)", runMBWMR},
	"latency_mt": {"multi-goroutine ping-pong latency (osu_latency_mt)", runLatencyMT},
	"match":      {"latency of an exact-match receive behind a long unexpected list", runMatch},
	"am":         {"Active Messages short/medium/store latency and bandwidth", runAM},
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: amrun -n N osu <benchmark> [options]   (osu <benchmark> -h for its options)")
	names := make([]string, 0, len(benches))
	for n := range benches {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(os.Stderr, "  %-11s %s\n", n, benches[n].help)
	}
}

func main() {
	if len(os.Args) < 2 || strings.HasPrefix(os.Args[1], "-") {
		usage()
		os.Exit(2)
	}
	b, ok := benches[os.Args[1]]
	if !ok {
		fmt.Fprintf(os.Stderr, "osu: unknown benchmark %q\n", os.Args[1])
		usage()
		os.Exit(2)
	}
	if prefix := os.Getenv("OSU_CPUPROFILE"); prefix != "" {
		stop, err := startProfile(prefix + "." + strconv.Itoa(os.Getpid()))
		if err != nil {
			fmt.Fprintf(os.Stderr, "osu: %v\n", err)
			os.Exit(1)
		}
		defer stop()
	}
	if err := b.run(os.Args[2:]); err != nil {
		if errors.Is(err, flag.ErrHelp) { // the flag package has printed the usage
			os.Exit(0)
		}
		fmt.Fprintf(os.Stderr, "osu %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

// startProfile starts a CPU profile written to path and returns the function
// that ends it.
func startProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("CPU profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("CPU profile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}

// network names the networks that carry this rank's messages to the others
// ("shm", "shm+tcp" for a job over two nodes), for titles.
func network(world *mpiam.Comm) string {
	var nets []string
	for r := range world.Size() {
		if r == world.Rank() {
			continue
		}
		if n := world.Network(r); n != "" && !slices.Contains(nets, n) {
			nets = append(nets, n)
		}
	}
	if len(nets) == 0 {
		return "loop"
	}
	return strings.Join(nets, "+")
}
