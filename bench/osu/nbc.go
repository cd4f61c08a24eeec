package main

import (
	"os"
	"time"

	"github.com/amgo-hpc/amgo/bench/internal/osu"
	"github.com/amgo-hpc/amgo/mpiam"
)

// The nonblocking collective tests of OSU (osu_iallreduce, osu_ialltoall,
// osu_ibcast, osu_ibarrier), with their four columns (osu_ibarrier: one row,
// size 0). For each size every rank first
// times the operation started and waited for at once: the pure
// communication time t. Then it times the operation started, followed by
// t of computation (a busy loop that makes no MPI call), then waited for:
// the overall time and the computation's. Rows average each column over the
// ranks, and Overlap(%) is max(0, 100 − (overall − compute)/t·100): 100
// when the operation completed entirely behind the computation, 0 when none
// of it did.

func init() {
	benches["iallreduce"] = bench{"MPI_Iallreduce latency and overlap (osu_iallreduce)", func(a []string) error { return runNBC("iallreduce", a) }}
	benches["ialltoall"] = bench{"MPI_Ialltoall latency and overlap (osu_ialltoall)", func(a []string) error { return runNBC("ialltoall", a) }}
	benches["ibcast"] = bench{"MPI_Ibcast latency and overlap (osu_ibcast)", func(a []string) error { return runNBC("ibcast", a) }}
	benches["ibarrier"] = bench{"MPI_Ibarrier latency and overlap (osu_ibarrier)", func(a []string) error { return runNBC("ibarrier", a) }}
}

// compute spins for d without calling MPI (OSU's dummy computation).
func compute(d time.Duration) {
	for t0 := time.Now(); time.Since(t0) < d; {
	}
}

func runNBC(name string, args []string) error {
	o := collOptions(name[1:])
	if err := parse(name, args, &o, nil); err != nil {
		return err
	}
	return mpiam.Run(mpiConfig(), func(world *mpiam.Comm) error {
		n, me := world.Size(), world.Rank()
		titles := map[string]string{"iallreduce": "Non-blocking Allreduce", "ialltoall": "Non-blocking All-to-All Personalized Exchange",
			"ibcast": "Non-blocking Broadcast", "ibarrier": "Non-blocking Barrier"}
		if me == 0 {
			osu.Header(os.Stdout, "amgo MPI "+titles[name]+" Latency Test over "+network(world),
				"Overall(us)", "Compute(us)", "Pure Comm.(us)", "Overlap(%)")
		}
		maxSize := max(o.MaxSize, 4)
		var sendF, recvF []float32
		var sendB, recvB []byte
		switch name {
		case "iallreduce":
			sendF, recvF = make([]float32, maxSize/4), make([]float32, maxSize/4)
		case "ialltoall":
			sendB, recvB = fill(maxSize*n, 's'), osu.Buffer(maxSize*n)
		default:
			sendB = fill(maxSize, 'b')
		}
		start := func(size int) (mpiam.Request, error) {
			switch name {
			case "iallreduce":
				return mpiam.Iallreduce(world, sendF[:size/4], recvF[:size/4], mpiam.Sum[float32]())
			case "ialltoall":
				return mpiam.Ialltoall(world, sendB[:size*n], recvB[:size*n])
			case "ibarrier":
				return world.Ibarrier()
			}
			return mpiam.Ibcast(world, sendB[:size], 0)
		}
		sizes := o.Sizes()
		if name == "ibarrier" {
			sizes = []int{0}
		}
		for _, size := range sizes {
			if name == "iallreduce" && size < 4 {
				continue
			}
			iters, warmup := o.Counts(size)
			var pure, overall, busy time.Duration
			for pass := range 2 {
				if err := world.Barrier(); err != nil {
					return err
				}
				target := pure / time.Duration(iters)
				for i := 0; i < iters+warmup; i++ {
					t0 := osu.Now()
					req, err := start(size)
					if err != nil {
						return err
					}
					var c time.Duration
					if pass == 1 {
						c0 := osu.Now()
						compute(target)
						c = osu.Now() - c0
					}
					if _, err := req.Wait(); err != nil {
						return err
					}
					if i < warmup {
						continue
					}
					if pass == 0 {
						pure += osu.Now() - t0
					} else {
						overall += osu.Now() - t0
						busy += c
					}
				}
			}
			us := func(d time.Duration) float64 { return d.Seconds() * 1e6 / float64(iters) }
			mine := []float64{us(overall), us(busy), us(pure)}
			sum := make([]float64, 3)
			if err := mpiam.Reduce(world, mine, sum, mpiam.Sum[float64](), 0); err != nil {
				return err
			}
			if me == 0 {
				for i := range sum {
					sum[i] /= float64(n)
				}
				overlap := 0.0
				if sum[2] > 0 {
					overlap = max(0, 100-(sum[0]-sum[1])/sum[2]*100)
				}
				osu.Row(os.Stdout, size, sum[0], sum[1], sum[2], overlap)
			}
		}
		return world.Barrier()
	})
}
