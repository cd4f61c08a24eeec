package main

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/amgo-hpc/amgo/am"
	"github.com/amgo-hpc/amgo/am/job"
	"github.com/amgo-hpc/amgo/bench/internal/ambench"
	"github.com/amgo-hpc/amgo/bench/internal/osu"
	"github.com/amgo-hpc/amgo/flowctl"
	"github.com/amgo-hpc/amgo/mpiam"
)

// runLatencyMT is osu_latency_mt with goroutines for threads: -t pairs of
// goroutines, goroutine g of rank 0 ping-pongs with goroutine g of rank 1 on
// its own tag, all at once; the row is the mean of the goroutines' one-way
// latencies. The goroutines share their rank's endpoint (MPI_THREAD_MULTIPLE).
func runLatencyMT(args []string) error {
	o := osu.LatencyOptions()
	threads := 2
	err := parse("latency_mt", args, &o, func(fs *flag.FlagSet) {
		fs.Func("t", "goroutines per rank, N or N:N (default 2)", func(s string) error {
			a, b, ok := strings.Cut(s, ":")
			n, err := strconv.Atoi(a)
			if ok && b != a {
				return fmt.Errorf("-t %s: sender and receiver counts must be equal (one tag per pair)", s)
			}
			if err != nil || n < 1 {
				return fmt.Errorf("bad goroutine count %q", s)
			}
			threads = n
			return nil
		})
	})
	if err != nil {
		return err
	}
	// Goroutines call at once: osu_latency_mt's MPI_THREAD_MULTIPLE.
	return mpiam.Run(mpiam.Config{Thread: mpiam.ThreadMultiple}, func(world *mpiam.Comm) error {
		if err := needRanks(world, 2, false); err != nil {
			return err
		}
		me := world.Rank()
		if me == 0 {
			fmt.Printf("# amgo MPI Multi-threaded Latency Test over %s\n", network(world))
			fmt.Printf("# Number of Sender threads: %d\n# Number of Receiver threads: %d\n", threads, threads)
			osu.Columns(os.Stdout, "Latency (us)")
		}
		type bufs struct{ s, r []byte }
		b := make([]bufs, threads)
		for g := range b {
			b[g] = bufs{fill(o.MaxSize, 's'), fill(o.MaxSize, 'r')}
		}
		lat := make([]float64, threads)
		errs := make([]error, threads)
		for _, size := range o.Sizes() {
			iters, warmup := o.Counts(size)
			if err := world.Barrier(); err != nil {
				return err
			}
			if me > 1 {
				continue
			}
			var wg sync.WaitGroup
			for g := 0; g < threads; g++ {
				wg.Add(1)
				go func(g int) {
					defer wg.Done()
					tag, peer, s, r := 100+g, 1-me, b[g].s[:size], b[g].r[:size]
					var start time.Time
					for i := 0; i < iters+warmup; i++ {
						if i == warmup {
							start = time.Now()
						}
						var err error
						if me == 0 {
							if err = mpiam.Send(world, s, peer, tag); err == nil {
								_, err = mpiam.Recv(world, r, peer, tag)
							}
						} else {
							if _, err = mpiam.Recv(world, r, peer, tag); err == nil {
								err = mpiam.Send(world, s, peer, tag)
							}
						}
						if err != nil {
							errs[g] = err
							return
						}
					}
					lat[g] = time.Since(start).Seconds() * 1e6 / float64(2*iters)
				}(g)
			}
			wg.Wait()
			for _, err := range errs {
				if err != nil {
					return err
				}
			}
			if me == 0 {
				var sum float64
				for _, l := range lat {
					sum += l
				}
				osu.Row(os.Stdout, size, sum/float64(threads))
			}
		}
		return world.Barrier()
	})
}

// matchReservation bounds what one queued eager message of up to 64 bytes
// takes at the receiver: per-peer buffer space (header, arguments, payload
// and the reply reserve, rounded to flowctl's granule), and its cost against
// the unexpected limit (payload and record).
const matchReservation = 512

// runMatch measures exact matching behind a long unexpected list. For each
// list length Q (powers of ten up to -q): ranks 1..n-1 (the sources) send Q
// messages between them to rank 0, each source on its own distinct tags, and
// tell rank 0 on a second communicator that they have; so all Q sit in rank 0's
// unexpected list. Then, -i times (after -x untimed), rank 0 times one
// Recv(source n-1, its last tag): the newest message, behind every other one.
// Untimed, the source sends that message again, so that the list is back to
// Q messages with the wanted one last. The row is the mean time of that Recv.
//
// MPI does not promise to buffer Q standard-mode sends that no receive
// matches (MPI-4.1 §3.4): past its unexpected limit (mpiam.EnvUnexpectedLimit)
// a receiver has its sources send by rendezvous, whose sends then wait for
// receives this test posts only after them. So the test raises the limit to
// what -q needs, unless the environment sets it.
func runMatch(args []string) error {
	o := osu.Options{MinSize: 8, MaxSize: 8, Iters: 200, Warmup: 10, Window: 1}
	queued := 10000
	err := parse("match", args, &o, func(fs *flag.FlagSet) {
		fs.IntVar(&queued, "q", queued, "largest number of unexpected messages")
	})
	if err != nil {
		return err
	}
	if o.MaxSize > 64 || queued < 1 {
		return fmt.Errorf("needs -m up to 64 bytes (eager) and -q >= 1")
	}
	var lengths []int
	for q := 1; q <= queued; q *= 10 {
		lengths = append(lengths, q)
	}
	if lengths[len(lengths)-1] != queued {
		lengths = append(lengths, queued)
	}
	// Every source must be able to leave its share queued at rank 0, and more.
	perSource := queued + 16
	cfg := mpiam.Config{Thread: thread, AM: am.Config{BufferBytes: flowctl.RoundUp(perSource*matchReservation + 64<<10)}}
	if os.Getenv(mpiam.EnvUnexpectedLimit) == "" {
		if err := os.Setenv(mpiam.EnvUnexpectedLimit, strconv.Itoa(perSource*matchReservation)); err != nil {
			return err
		}
	}
	size := o.MaxSize
	return mpiam.Run(cfg, func(world *mpiam.Comm) error {
		if err := needRanks(world, 2, false); err != nil {
			return err
		}
		ctl, err := world.Dup()
		if err != nil {
			return err
		}
		me, n := world.Rank(), world.Size()
		sources := n - 1
		target := n - 1
		if me == 0 {
			fmt.Printf("# amgo MPI Unexpected-list Match Test over %s\n", network(world))
			fmt.Printf("# [ sources: %d ] [ message size: %d ] rows: messages in the unexpected list\n", sources, size)
			osu.KeyColumns(os.Stdout, "# Queued", "Latency (us)")
		}
		buf := fill(size, 'm')
		token := make([]byte, 1)
		for _, q := range lengths {
			if err := world.Barrier(); err != nil {
				return err
			}
			// Source s sends messages s-1, s-1+sources, ... of the q, on tags 1000, 1001, ...
			mine := 0
			if me > 0 {
				for k := me - 1; k < q; k += sources {
					if err := mpiam.Send(world, buf, 0, 1000+mine); err != nil {
						return err
					}
					mine++
				}
				if err := mpiam.Send(ctl, token, 0, tagAck); err != nil {
					return err
				}
			} else {
				for s := 1; s <= sources; s++ {
					if _, err := mpiam.Recv(ctl, token, mpiam.AnySource, tagAck); err != nil {
						return err
					}
				}
			}
			// The wanted message: the target's last one (rank n-1 sent at least one when q >= sources).
			wantTag := 1000 + (q-target+sources)/sources - 1
			if q < target {
				target = 1 // few messages: source 1 sent the last of them
				wantTag = 1000
			}
			var total time.Duration
			for i := 0; i < o.Warmup+o.Iters; i++ {
				switch me {
				case 0:
					t0 := osu.Now()
					if _, err := mpiam.Recv(world, buf, target, wantTag); err != nil {
						return err
					}
					if i >= o.Warmup {
						total += osu.Now() - t0
					}
					if err := mpiam.Send(ctl, token, target, tagData); err != nil {
						return err
					}
					if _, err := mpiam.Recv(ctl, token, target, tagAck); err != nil {
						return err
					}
				case target:
					if _, err := mpiam.Recv(ctl, token, 0, tagData); err != nil {
						return err
					}
					if err := mpiam.Send(world, buf, 0, wantTag); err != nil {
						return err
					}
					if err := mpiam.Send(ctl, token, 0, tagAck); err != nil {
						return err
					}
				}
			}
			if me == 0 {
				// Empty the list, then report.
				for k := 0; k < q; k++ {
					if _, err := mpiam.Recv(world, buf, mpiam.AnySource, mpiam.AnyTag); err != nil {
						return err
					}
				}
				osu.Row(os.Stdout, q, total.Seconds()*1e6/float64(o.Iters))
			}
			target = n - 1
		}
		if err := world.Barrier(); err != nil {
			return err
		}
		return ctl.Free()
	})
}

// runAM is the Active Messages benchmark of bench/internal/ambench.
func runAM(args []string) error {
	bw := slices.Contains(args, "-bw") || slices.Contains(args, "--bw")
	o := osu.LatencyOptions()
	if bw {
		o = osu.BandwidthOptions()
	}
	o.MaxSize = 0 // the kind's default unless -m says otherwise
	kind := "short"
	err := parse("am", args, &o, func(fs *flag.FlagSet) {
		fs.StringVar(&kind, "k", kind, "message kind: "+strings.Join(ambench.Kinds, ", "))
		fs.Bool("bw", false, "windowed bandwidth (-W window) instead of ping-pong")
	})
	if err != nil {
		return err
	}
	return job.Run(am.Config{}, func(ep *am.Endpoint) error { return ambench.Run(ep, kind, bw, o, os.Stdout) })
}
