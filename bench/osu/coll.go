package main

import (
	"os"
	"time"

	"github.com/amgo-hpc/amgo/bench/internal/osu"
	"github.com/amgo-hpc/amgo/mpiam"
)

// The collective tests of OSU (osu_allreduce, osu_bcast, osu_alltoall,
// osu_barrier): every rank times iterations of the collective between two
// barriers, and the row is the average over the ranks of the mean time per
// call, in microseconds (OSU's "Avg Latency(us)"). Sizes are the bytes of
// each rank's contribution (float32 elements for allreduce, as OSU uses
// MPI_FLOAT; bytes for bcast; bytes per destination for alltoall). osu_barrier
// prints its figure alone; here it is one row of size 0, so that every test
// parses alike.

func init() {
	benches["allreduce"] = bench{"MPI_Allreduce latency (osu_allreduce)", func(a []string) error { return runColl("allreduce", a) }}
	benches["bcast"] = bench{"MPI_Bcast latency (osu_bcast)", func(a []string) error { return runColl("bcast", a) }}
	benches["alltoall"] = bench{"MPI_Alltoall latency (osu_alltoall)", func(a []string) error { return runColl("alltoall", a) }}
	benches["barrier"] = bench{"MPI_Barrier latency (osu_barrier)", func(a []string) error { return runColl("barrier", a) }}
}

// collOptions are OSU's collective defaults: sizes 1 B .. 1 MiB (4 B .. for
// allreduce), 1000 iterations (100 warm-up) up to 8 KiB, 100 (10) above.
func collOptions(name string) osu.Options {
	o := osu.Options{MinSize: 1, MaxSize: 1 << 20, Iters: 1000, Warmup: 100, ItersLarge: 100, WarmupLarge: 10, Window: 1}
	if name == "allreduce" {
		o.MinSize = 4
	}
	return o
}

func runColl(name string, args []string) error {
	o := collOptions(name)
	if err := parse(name, args, &o, nil); err != nil {
		return err
	}
	return mpiam.Run(mpiConfig(), func(world *mpiam.Comm) error {
		n, me := world.Size(), world.Rank()
		titles := map[string]string{"allreduce": "Allreduce", "bcast": "Broadcast", "alltoall": "All-to-All Personalized Exchange", "barrier": "Barrier"}
		if me == 0 {
			title := "amgo MPI " + titles[name] + " Latency Test over " + network(world)
			osu.Header(os.Stdout, title, "Avg Latency(us)") // barrier: one row, size 0
		}
		sizes := o.Sizes()
		if name == "barrier" {
			sizes = []int{0}
		}
		maxSize := max(o.MaxSize, 4)
		var sendF, recvF []float32
		var sendB, recvB []byte
		switch name {
		case "allreduce":
			sendF, recvF = make([]float32, maxSize/4), make([]float32, maxSize/4)
		case "alltoall":
			sendB, recvB = fill(maxSize*n, 's'), osu.Buffer(maxSize*n)
		default:
			sendB = fill(maxSize, 'b')
		}
		for _, size := range sizes {
			if name == "allreduce" && size < 4 {
				continue
			}
			iters, warmup := o.Counts(size)
			if err := world.Barrier(); err != nil {
				return err
			}
			var elapsed time.Duration
			for i := 0; i < iters+warmup; i++ {
				t0 := osu.Now()
				var err error
				switch name {
				case "allreduce":
					err = mpiam.Allreduce(world, sendF[:size/4], recvF[:size/4], mpiam.Sum[float32]())
				case "bcast":
					err = mpiam.Bcast(world, sendB[:size], 0)
				case "alltoall":
					err = mpiam.Alltoall(world, sendB[:size*n], recvB[:size*n])
				case "barrier":
					err = world.Barrier()
				}
				if err != nil {
					return err
				}
				if i >= warmup {
					elapsed += osu.Now() - t0
				}
			}
			mine := []float64{elapsed.Seconds() * 1e6 / float64(iters)}
			avg := []float64{0}
			if err := mpiam.Reduce(world, mine, avg, mpiam.Sum[float64](), 0); err != nil {
				return err
			}
			if me == 0 {
				osu.Row(os.Stdout, size, avg[0]/float64(n))
			}
		}
		return world.Barrier()
	})
}
