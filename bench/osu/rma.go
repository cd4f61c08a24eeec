package main

import (
	"flag"
	"fmt"
	"os"
	"time"
	"unsafe"

	"github.com/amgo-hpc/amgo/bench/internal/osu"
	"github.com/amgo-hpc/amgo/mpiam"
)

// The one-sided tests of the OSU Micro-Benchmarks (osu_put_latency,
// osu_get_latency, osu_put_bw, osu_get_bw, osu_acc_latency, osu_fop_latency,
// osu_cas_latency), rank 0 the origin and rank 1 the target, with the
// window made by WinCreate or WinAllocate (-w) and synchronized (-s) as:
//
//	flush  rank 0 locks rank 1 once (shared); each operation (a latency
//	       test) or window of operations (a bandwidth test) is followed by
//	       Flush; rank 1 waits in a barrier meanwhile
//	lock   each operation or window inside its own Lock/Unlock
//	fence  rank 0 operates, both fence; then rank 1 operates on rank 0,
//	       both fence (latency: the time of one half; bandwidth: rank 0
//	       alone operates between fences)
//	pscw   rank 1 posts, rank 0 starts, operates and completes, rank 1
//	       waits; then the other way (latency: one half; bandwidth: one way)
//
// Latency is the mean time per operation with its synchronization, in µs;
// bandwidth the bytes moved per second, MB/s. bench/ref/osu_ref.c does the
// same in C.
func init() {
	for _, t := range []struct{ name, help string }{
		{"put_latency", "MPI_Put latency (osu_put_latency)"},
		{"get_latency", "MPI_Get latency (osu_get_latency)"},
		{"put_bw", "MPI_Put bandwidth (osu_put_bw)"},
		{"get_bw", "MPI_Get bandwidth (osu_get_bw)"},
		{"acc_latency", "MPI_Accumulate latency (osu_acc_latency)"},
		{"fop_latency", "MPI_Fetch_and_op latency (osu_fop_latency)"},
		{"cas_latency", "MPI_Compare_and_swap latency (osu_cas_latency)"},
	} {
		name := t.name
		benches[name] = bench{t.help, func(a []string) error { return runRMA(name, a) }}
	}
}

func runRMA(name string, args []string) error {
	lat := name != "put_bw" && name != "get_bw"
	o := osu.BandwidthOptions()
	if lat {
		o = osu.LatencyOptions()
		o.MinSize = 1
	}
	switch name {
	case "acc_latency":
		o.MinSize = 4
	case "fop_latency", "cas_latency":
		o.MinSize, o.MaxSize = 8, 8
	}
	create, sync := "allocate", "flush"
	var busy time.Duration
	if err := parse(name, args, &o, func(fs *flag.FlagSet) {
		fs.StringVar(&create, "w", create, "window creation: create (WinCreate over the program's buffer) or allocate (WinAllocate)")
		fs.StringVar(&sync, "s", sync, "synchronization: flush, lock, fence or pscw")
		fs.DurationVar(&busy, "busy", 0, "flush and lock: the target computes this long without MPI calls per size instead of waiting in a barrier (progress at the target: AMGO_PROGRESS)")
	}); err != nil {
		return err
	}
	if create != "create" && create != "allocate" {
		return fmt.Errorf("-w %s: create or allocate", create)
	}
	if sync != "flush" && sync != "lock" && sync != "fence" && sync != "pscw" {
		return fmt.Errorf("-s %s: flush, lock, fence or pscw", sync)
	}
	return mpiam.Run(mpiConfig(), func(world *mpiam.Comm) error {
		if err := needRanks(world, 2, false); err != nil {
			return err
		}
		pair, err := world.Split(min(world.Rank()/2, 1), world.Rank()) // ranks 0 and 1 alone
		if err != nil {
			return err
		}
		if world.Rank() >= 2 {
			return world.Barrier()
		}
		r := &rmaRun{c: pair, me: pair.Rank(), name: name, kind: kindOf(name), sync: sync, lock: sync == "lock", lat: lat, o: o, busy: busy,
			sum32: mpiam.Sum[int32](), sum64: mpiam.Sum[int64]()}
		if err := r.window(create, max(o.MaxSize, 8)*max(o.Window, 1)); err != nil {
			return err
		}
		if r.me == 0 {
			unit := "Latency (us)"
			if !lat {
				unit = "Bandwidth (MB/s)"
			}
			osu.Header(os.Stdout, fmt.Sprintf("amgo MPI_%s Test over %s (window %s, synchronization %s)", name, network(world), create, sync), unit)
		}
		for _, size := range o.Sizes() {
			v, err := r.size(size)
			if err != nil {
				return err
			}
			if r.me == 0 {
				osu.Row(os.Stdout, size, v)
			}
		}
		if err := r.w.Free(); err != nil {
			return err
		}
		return world.Barrier()
	})
}

// rmaRun is one one-sided test between the two ranks of c.
type rmaRun struct {
	c        *mpiam.Comm
	me       int
	name     string
	kind     rmaKind // name, decoded once: op switches on it per operation
	sync     string
	lock     bool // sync == "lock"
	lat      bool
	o        osu.Options
	w        *mpiam.Win
	src, dst []byte
	peerG    mpiam.Group
	busy     time.Duration // the target's computation per size (-busy)
	old      int64         // a fetch operation's result: valid until the flush, so not on the stack (as the C program's static)
	// The operations, made once as C's MPI_SUM is a constant (each
	// Sum[T]() makes a function value).
	sum32 mpiam.Op[int32]
	sum64 mpiam.Op[int64]
}

// window makes the window of n bytes and the origin buffers.
func (r *rmaRun) window(create string, n int) error {
	var err error
	if create == "create" {
		r.w, err = mpiam.WinCreate(r.c, osu.Buffer(n), 1)
	} else {
		r.w, _, err = mpiam.WinAllocate[byte](r.c, n, 1)
	}
	if err != nil {
		return err
	}
	r.src, r.dst = osu.Buffer(n), osu.Buffer(n)
	for i := range r.src {
		r.src[i] = 'a'
	}
	g, err := r.w.Group()
	if err != nil {
		return err
	}
	r.peerG, err = g.Incl([]int{1 - r.me})
	return err
}

// rmaKind is a test's operation.
type rmaKind int

const (
	kindPut rmaKind = iota
	kindGet
	kindAcc
	kindFop
	kindCas
)

// kindOf is the operation of the test named name.
func kindOf(name string) rmaKind {
	switch name {
	case "put_latency", "put_bw":
		return kindPut
	case "get_latency", "get_bw":
		return kindGet
	case "acc_latency":
		return kindAcc
	case "fop_latency":
		return kindFop
	default: // cas_latency
		return kindCas
	}
}

// op issues the test's operation of size bytes to the other rank, at slot k
// of the window.
func (r *rmaRun) op(size, k int) error {
	peer, disp := 1-r.me, k*size
	switch r.kind {
	case kindPut:
		return mpiam.Put(r.w, r.src[disp:disp+size], peer, disp)
	case kindGet:
		return mpiam.Get(r.w, r.dst[disp:disp+size], peer, disp)
	case kindAcc:
		return mpiam.Accumulate(r.w, int32s(r.src[:size]), peer, 0, r.sum32)
	case kindFop:
		return mpiam.FetchAndOp(r.w, 1, &r.old, peer, 0, r.sum64)
	default:
		return mpiam.CompareAndSwap(r.w, 1, 0, &r.old, peer, 0)
	}
}

// int32s views b as int32s (osu.Buffer's memory is page-aligned).
func int32s(b []byte) []int32 {
	return unsafe.Slice((*int32)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/4)
}

// size runs the iterations of one size and returns rank 0's figure.
func (r *rmaRun) size(size int) (float64, error) {
	iters, warmup := r.o.Counts(size)
	ops := 1
	if !r.lat {
		ops = r.o.Window
	}
	if err := r.c.Barrier(); err != nil {
		return 0, err
	}
	var start time.Time
	var err error
	switch r.sync {
	case "flush", "lock":
		if r.me == 0 {
			if r.sync == "flush" {
				if err := r.w.Lock(mpiam.LockShared, 1, 0); err != nil {
					return 0, err
				}
			}
			for i := 0; i < iters+warmup && err == nil; i++ {
				if i == warmup {
					start = time.Now()
				}
				err = r.passiveRound(size, ops)
			}
			if r.sync == "flush" && err == nil {
				err = r.w.Unlock(1)
			}
		} else if r.busy > 0 {
			// The target computes without calling MPI: only a progress
			// goroutine (AMGO_PROGRESS) serves the origin meanwhile.
			for t0 := time.Now(); time.Since(t0) < r.busy; {
			}
		}
	case "fence":
		if err := r.w.Fence(0); err != nil {
			return 0, err
		}
		for i := 0; i < iters+warmup && err == nil; i++ {
			if i == warmup {
				start = time.Now()
			}
			err = r.fenceRound(size, ops)
		}
		if err == nil {
			err = r.w.Fence(mpiam.ModeNosucceed)
		}
	case "pscw":
		for i := 0; i < iters+warmup && err == nil; i++ {
			if i == warmup {
				start = time.Now()
			}
			err = r.pscwRound(size, ops)
		}
	}
	if err != nil {
		return 0, err
	}
	el := time.Since(start)
	if err := r.c.Barrier(); err != nil {
		return 0, err
	}
	half := 1.0
	if r.lat && (r.sync == "fence" || r.sync == "pscw") {
		half = 2 // both directions were timed
	}
	if r.lat {
		return el.Seconds() * 1e6 / (float64(iters) * half), nil
	}
	return float64(size) * float64(ops) * float64(iters) / el.Seconds() / 1e6, nil
}

// passiveRound is one iteration of flush or lock: ops operations, then
// Flush, or all inside Lock/Unlock.
func (r *rmaRun) passiveRound(size, ops int) error {
	if r.lock {
		if err := r.w.Lock(mpiam.LockShared, 1, 0); err != nil {
			return err
		}
	}
	for k := 0; k < ops; k++ {
		if err := r.op(size, k); err != nil {
			return err
		}
	}
	if r.lock {
		return r.w.Unlock(1)
	}
	return r.w.Flush(1)
}

// fenceRound: rank 0 operates, both fence; for latency rank 1 then
// operates, both fence.
func (r *rmaRun) fenceRound(size, ops int) error {
	for turn := 0; turn < 2; turn++ {
		if r.me == turn {
			for k := 0; k < ops; k++ {
				if err := r.op(size, k); err != nil {
					return err
				}
			}
		}
		if err := r.w.Fence(0); err != nil {
			return err
		}
		if !r.lat {
			return nil
		}
	}
	return nil
}

// pscwRound: rank 1 posts and waits while rank 0 starts, operates and
// completes; for latency then the other way.
func (r *rmaRun) pscwRound(size, ops int) error {
	for turn := 0; turn < 2; turn++ {
		if r.me == turn {
			if err := r.w.Start(r.peerG, 0); err != nil {
				return err
			}
			for k := 0; k < ops; k++ {
				if err := r.op(size, k); err != nil {
					return err
				}
			}
			if err := r.w.Complete(); err != nil {
				return err
			}
		} else {
			if err := r.w.Post(r.peerG, 0); err != nil {
				return err
			}
			if err := r.w.Wait(); err != nil {
				return err
			}
		}
		if !r.lat {
			return nil
		}
	}
	return nil
}
