package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/amgo-hpc/amgo/bench/internal/osu"
	"github.com/amgo-hpc/amgo/mpiam"
)

// Tags of the point-to-point tests.
const (
	tagData = 1
	tagAck  = 2
)

// thread is the level of thread support the MPI tests declare (-thread):
// single, as OSU's C programs do by calling MPI_Init, unless asked.
var thread = mpiam.ThreadSingle

// mpiConfig is the configuration the MPI tests run with.
func mpiConfig() mpiam.Config { return mpiam.Config{Thread: thread} }

// parse parses a subcommand's flags with OSU's options o (defaults in o).
func parse(name string, args []string, o *osu.Options, extra func(fs *flag.FlagSet)) error {
	fs := flag.NewFlagSet("osu "+name, flag.ContinueOnError)
	osu.Register(fs, o)
	fs.Func("thread", "level of thread support declared: single (the default, MPI_Init's), funneled, serialized or multiple", func(s string) error {
		for l := mpiam.ThreadSingle; l <= mpiam.ThreadMultiple; l++ {
			if l.String() == s {
				thread = l
				return nil
			}
		}
		return fmt.Errorf("unknown thread level %q", s)
	})
	if extra != nil {
		extra(fs)
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if o.Window < 1 {
		return fmt.Errorf("window -W must be at least 1")
	}
	return nil
}

func needRanks(world *mpiam.Comm, n int, even bool) error {
	if world.Size() < n {
		return fmt.Errorf("needs at least %d ranks, job has %d", n, world.Size())
	}
	if even && world.Size()%2 != 0 {
		return fmt.Errorf("needs an even number of ranks, job has %d", world.Size())
	}
	return nil
}

// runLatency is osu_latency: rank 0 sends, rank 1 receives and sends back;
// one-way latency = elapsed / (2 * iterations). Ranks above 1 only take part in
// the barriers.
func runLatency(args []string) error {
	o := osu.LatencyOptions()
	layout := ""
	if err := parse("latency", args, &o, func(fs *flag.FlagSet) {
		fs.StringVar(&layout, "d", "", "datatype of the message: vector (every other float64 of a buffer twice the size: a strided column, packed on the way)")
	}); err != nil {
		return err
	}
	if layout != "" && layout != "vector" {
		return fmt.Errorf("-d %s: the datatypes are vector", layout)
	}
	return mpiam.Run(mpiConfig(), func(world *mpiam.Comm) error {
		if err := needRanks(world, 2, false); err != nil {
			return err
		}
		me := world.Rank()
		if me == 0 {
			title := "amgo MPI Latency Test over " + network(world)
			if layout != "" {
				title += " (" + layout + " datatype)"
			}
			osu.Header(os.Stdout, title, "Latency (us)")
		}
		sbuf, rbuf := osu.Buffer(o.MaxSize), osu.Buffer(o.MaxSize)
		for i := range sbuf {
			sbuf[i] = 'a'
		}
		var sv, rv []float64
		if layout == "vector" {
			sv, rv = make([]float64, 2*o.MaxSize/8+2), make([]float64, 2*o.MaxSize/8+2)
		}
		for _, size := range o.Sizes() {
			iters, warmup := o.Counts(size)
			if layout == "vector" && size < 8 {
				continue
			}
			send := func(dst int) error { return mpiam.Send(world, sbuf[:size], dst, tagData) }
			recv := func(src int) error { _, err := mpiam.Recv(world, rbuf[:size], src, tagData); return err }
			if layout == "vector" {
				vec, err := mpiam.TypeVector(size/8, 1, 2, mpiam.Float64)
				if err != nil {
					return err
				}
				if err := vec.Commit(); err != nil {
					return err
				}
				send = func(dst int) error { return mpiam.SendTyped(world, sv, 1, vec, dst, tagData) }
				recv = func(src int) error { _, err := mpiam.RecvTyped(world, rv, 1, vec, src, tagData); return err }
			}
			if err := world.Barrier(); err != nil {
				return err
			}
			var start time.Time
			for i := 0; i < iters+warmup && me < 2; i++ {
				if i == warmup {
					start = time.Now()
				}
				if me == 0 {
					if err := send(1); err != nil {
						return err
					}
					if err := recv(1); err != nil {
						return err
					}
				} else {
					if err := recv(0); err != nil {
						return err
					}
					if err := send(0); err != nil {
						return err
					}
				}
			}
			if me == 0 {
				osu.Row(os.Stdout, size, time.Since(start).Seconds()*1e6/float64(2*iters))
			}
		}
		return world.Barrier()
	})
}

// window posts one window of sends or receives of size bytes with peer (the
// inner loop of osu_bw, osu_bibw, osu_mbw_mr); the caller waits for reqs.
type window struct {
	reqs []mpiam.Request
}

// recvBuffers are the receive buffers of a window: as in OSU, every receive
// of a window goes into the same buffer (amgo counts the registrations of one
// rendezvous receive buffer, so pending receives may share it).
type recvBuffers struct {
	shared []byte
}

func newRecvBuffers(maxSize, win int) *recvBuffers {
	return &recvBuffers{shared: fill(maxSize, 'r')}
}

func (rb *recvBuffers) slot(j, size int) []byte {
	return rb.shared[:size]
}

func (w *window) post(send bool, c *mpiam.Comm, sbuf []byte, rb *recvBuffers, n, size, peer int) error {
	w.reqs = w.reqs[:0]
	for j := 0; j < n; j++ {
		var r mpiam.Request
		var err error
		if send {
			r, err = mpiam.Isend(c, sbuf[:size], peer, tagData)
		} else {
			r, err = mpiam.Irecv(c, rb.slot(j, size), peer, tagData)
		}
		if err != nil {
			return err
		}
		w.reqs = append(w.reqs, r)
	}
	return nil
}

// streamPair runs one size of osu_bw / osu_mbw_mr between sender and receiver:
// per iteration the sender posts a window of Isends and waits for them, the
// receiver posts a window of Irecvs, waits, and returns a 4-byte ack. It returns
// the sender's timed seconds (0 on the receiver).
func streamPair(c *mpiam.Comm, sender bool, peer int, sbuf []byte, rbuf *recvBuffers, size, iters, warmup, win int) (float64, error) {
	var w window
	ack := make([]byte, 4)
	var start time.Time
	for i := 0; i < iters+warmup; i++ {
		if i == warmup {
			start = time.Now()
		}
		if sender {
			if err := w.post(true, c, sbuf, nil, win, size, peer); err != nil {
				return 0, err
			}
			if err := mpiam.Waitall(w.reqs, nil); err != nil {
				return 0, err
			}
			if _, err := mpiam.Recv(c, ack, peer, tagAck); err != nil {
				return 0, err
			}
		} else {
			if err := w.post(false, c, nil, rbuf, win, size, peer); err != nil {
				return 0, err
			}
			if err := mpiam.Waitall(w.reqs, nil); err != nil {
				return 0, err
			}
			if err := mpiam.Send(c, ack, peer, tagAck); err != nil {
				return 0, err
			}
		}
	}
	if !sender {
		return 0, nil
	}
	return time.Since(start).Seconds(), nil
}

// runBW is osu_bw between ranks 0 (sender) and 1 (receiver):
// MB/s = size * iterations * window / time / 1e6.
func runBW(args []string) error {
	return runPairBandwidth("bw", "amgo MPI Bandwidth Test over ", args, 1, func() pairMeasure {
		return func(world *mpiam.Comm, me int, sbuf []byte, rbuf *recvBuffers, size, iters, warmup, win int) (float64, error) {
			return streamPair(world, me == 0, 1-me, sbuf, rbuf, size, iters, warmup, win)
		}
	})
}

// runBiBW is osu_bibw: ranks 0 and 1 each post a window of Irecvs and a window
// of Isends and wait for all; MB/s = 2 * size * iterations * window / time / 1e6.
func runBiBW(args []string) error {
	return runPairBandwidth("bibw", "amgo MPI Bi-Directional Bandwidth Test over ", args, 2, func() pairMeasure {
		var rw, sw window // this rank's (goroutine ranks share the process)
		var all []mpiam.Request
		return func(world *mpiam.Comm, me int, sbuf []byte, rbuf *recvBuffers, size, iters, warmup, win int) (float64, error) {
			var start time.Time
			for i := 0; i < iters+warmup; i++ {
				if i == warmup {
					start = time.Now()
				}
				if err := rw.post(false, world, nil, rbuf, win, size, 1-me); err != nil {
					return 0, err
				}
				if err := sw.post(true, world, sbuf, nil, win, size, 1-me); err != nil {
					return 0, err
				}
				all = append(append(all[:0], sw.reqs...), rw.reqs...)
				if err := mpiam.Waitall(all, nil); err != nil {
					return 0, err
				}
			}
			return time.Since(start).Seconds(), nil
		}
	})
}

// pairMeasure runs one size of a two-rank bandwidth test on rank me (0 or 1)
// and returns rank 0's elapsed seconds.
type pairMeasure func(world *mpiam.Comm, me int, sbuf []byte, rbuf *recvBuffers, size, iters, warmup, win int) (float64, error)

// runPairBandwidth runs a two-rank OSU bandwidth test: the options and
// header, then for every size a barrier and measure on ranks 0 and 1 (ranks
// above wait at the barriers), and rank 0's row of MB/s = dirs * size *
// iterations * window / rank 0's seconds / 1e6. newMeasure makes each rank's
// measure (goroutine ranks share the process, so state must be per rank).
func runPairBandwidth(name, title string, args []string, dirs float64, newMeasure func() pairMeasure) error {
	o := osu.BandwidthOptions()
	if err := parse(name, args, &o, nil); err != nil {
		return err
	}
	return mpiam.Run(mpiConfig(), func(world *mpiam.Comm) error {
		if err := needRanks(world, 2, false); err != nil {
			return err
		}
		me := world.Rank()
		if me == 0 {
			osu.Header(os.Stdout, title+network(world), "Bandwidth (MB/s)")
		}
		sbuf, rbuf := fill(o.MaxSize, 's'), newRecvBuffers(o.MaxSize, o.Window)
		measure := newMeasure()
		for _, size := range o.Sizes() {
			iters, warmup := o.Counts(size)
			if err := world.Barrier(); err != nil {
				return err
			}
			if me > 1 {
				continue
			}
			el, err := measure(world, me, sbuf, rbuf, size, iters, warmup, o.Window)
			if err != nil {
				return err
			}
			if me == 0 {
				osu.Row(os.Stdout, size, dirs*float64(size)*float64(iters)*float64(o.Window)/el/1e6)
			}
		}
		return world.Barrier()
	})
}

// runMBWMR is osu_mbw_mr: n/2 pairs (i, i+n/2) stream at once, rank i sending;
// the figures are the aggregate: MB/s = pairs * size * iterations * window /
// (slowest sender's time) / 1e6, and Messages/s = MB/s * 1e6 / size.
func runMBWMR(args []string) error {
	o := osu.BandwidthOptions()
	if err := parse("mbw_mr", args, &o, nil); err != nil {
		return err
	}
	return mpiam.Run(mpiConfig(), func(world *mpiam.Comm) error {
		if err := needRanks(world, 2, true); err != nil {
			return err
		}
		me, n := world.Rank(), world.Size()
		pairs := n / 2
		sender := me < pairs
		peer := me + pairs
		if !sender {
			peer = me - pairs
		}
		if me == 0 {
			fmt.Printf("# amgo MPI Multiple Bandwidth / Message Rate Test over %s\n", network(world))
			fmt.Printf("# [ pairs: %d ] [ window size: %d ]\n", pairs, o.Window)
			osu.Columns(os.Stdout, "MB/s", "Messages/s")
		}
		sbuf, rbuf := fill(o.MaxSize, 's'), newRecvBuffers(o.MaxSize, o.Window)
		times := make([]float64, 1)
		for _, size := range o.Sizes() {
			iters, warmup := o.Counts(size)
			if err := world.Barrier(); err != nil {
				return err
			}
			el, err := streamPair(world, sender, peer, sbuf, rbuf, size, iters, warmup, o.Window)
			if err != nil {
				return err
			}
			// Rank 0 collects the senders' times (the slowest one counts).
			slowest := el
			if me == 0 {
				for r := 1; r < pairs; r++ {
					if _, err := mpiam.Recv(world, times, r, tagAck); err != nil {
						return err
					}
					slowest = max(slowest, times[0])
				}
				mbs := float64(pairs) * float64(size) * float64(iters) * float64(o.Window) / slowest / 1e6
				osu.Row(os.Stdout, size, mbs, mbs*1e6/float64(max(size, 1)))
			} else if sender {
				times[0] = el
				if err := mpiam.Send(world, times, 0, tagAck); err != nil {
					return err
				}
			}
		}
		return world.Barrier()
	})
}

// fill returns a page-aligned buffer of max(n, 1) bytes, each c.
func fill(n int, c byte) []byte {
	b := osu.Buffer(max(n, 1))
	for i := range b {
		b[i] = c
	}
	return b
}
