// Command ampingpong measures Active Messages ping-pong between ranks 0 and 1:
// half round-trip latency and the bandwidth it implies, per message size, in
// the OSU Micro-Benchmarks column layout.
//
//	amrun -n 2 ./ampingpong -k short            # 0..16 arguments (sizes 0..128 bytes)
//	amrun -n 2 ./ampingpong -k medium           # RequestMedium, reply short
//	amrun -n 2 ./ampingpong -k store -m 4194304 # Store there, Store back
//
// Short and medium use request and reply (the handler replies at once, GASNet
// testam's ping-pong); store has no reply of that size, so rank 1 stores back
// once rank 0's store has landed.
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
	"sync/atomic"
	"time"

	"github.com/amgo-hpc/amgo/am"
	"github.com/amgo-hpc/amgo/bench/internal/osu"
	"github.com/amgo-hpc/amgo/handlers"
)

const (
	hPing handlers.Index = 1 + iota
	hPong
	hAddr
	hStored
)

func main() {
	kind := flag.String("k", "medium", "message kind: short, medium or store")
	opts := osu.Options{MinSize: 0, MaxSize: 0, Iters: 10000, Warmup: 1000}
	osu.Register(flag.CommandLine, &opts)
	cpuprofile := flag.String("cpuprofile", "", "write rank 0's CPU profile to this file")
	flag.Parse()
	if *cpuprofile != "" && os.Getenv("PMI_RANK") == "0" {
		f, err := os.Create(*cpuprofile)
		if err == nil && pprof.StartCPUProfile(f) == nil {
			defer pprof.StopCPUProfile()
		}
	}
	err := am.Run(am.Config{}, func(ep *am.Endpoint) error { return run(ep, *kind, opts) })
	if err != nil {
		fmt.Fprintln(os.Stderr, "ampingpong:", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

func run(ep *am.Endpoint, kind string, o osu.Options) error {
	if ep.Size() != 2 {
		return fmt.Errorf("needs exactly 2 ranks, job has %d", ep.Size())
	}
	var pongs atomic.Int64
	var peerAddr atomic.Uint64
	args := make([]uint64, 16)
	reg := []handlers.Entry{
		{Index: hPing, Name: "ping", NArgs: handlers.AnyArgs, Fn: func(tok *handlers.Token, _ []uint64, _ []byte) { _ = tok.ReplyShort(hPong) }},
		{Index: hPong, Name: "pong", NArgs: 0, Fn: func(*handlers.Token, []uint64, []byte) { pongs.Add(1) }},
		{Index: hAddr, Name: "segment-address", NArgs: 1, Fn: func(_ *handlers.Token, a []uint64, _ []byte) { peerAddr.Store(a[0]) }},
		{Index: hStored, Name: "stored", NArgs: 0, Fn: func(*handlers.Token, []uint64, []byte) { pongs.Add(1) }},
	}
	for _, e := range reg {
		if _, err := ep.Register(e); err != nil {
			return err
		}
	}
	switch kind {
	case "short":
		o.MinSize, o.MaxSize = min(o.MinSize, 128), 128
		if o.MinSize == 0 && o.MaxSize == 128 {
			o.MinSize = 0
		}
	case "medium":
		if o.MaxSize == 0 {
			o.MaxSize = 1 << 13
		}
		o.MaxSize = min(o.MaxSize, ep.MaxMedium())
	case "store":
		if o.MaxSize == 0 {
			o.MaxSize = 4 << 20
		}
	default:
		return fmt.Errorf("unknown kind %q (short, medium, store)", kind)
	}
	peer := 1 - ep.Rank()
	buf := make([]byte, max(o.MaxSize, 1))
	var seg am.Segment
	if kind == "store" {
		var err error
		if seg, err = ep.RegisterSegment(make([]byte, max(o.MaxSize, 1))); err != nil {
			return err
		}
		if err := ep.RequestShort(peer, hAddr, seg.Addr); err != nil {
			return err
		}
		if err := ep.PollUntil(func() bool { return peerAddr.Load() != 0 }); err != nil {
			return err
		}
	}
	if err := ep.Barrier(); err != nil {
		return err
	}
	if ep.Rank() == 0 {
		osu.Header(os.Stdout, fmt.Sprintf("amgo AM %s ping-pong over %s", kind, ep.Transport().Caps().Name),
			"Latency (us)", "Bandwidth (MB/s)")
	}
	var seen int64
	wait := func() error {
		seen++
		want := seen
		return ep.PollUntil(func() bool { return pongs.Load() >= want })
	}
	for _, size := range o.Sizes() {
		if kind == "short" && size%8 != 0 {
			continue
		}
		var start time.Time
		for i := 0; i < o.Warmup+o.Iters; i++ {
			if i == o.Warmup {
				start = time.Now()
			}
			var err error
			switch {
			case kind == "store" && ep.Rank() == 1:
				if err = wait(); err == nil {
					err = ep.Store(peer, hStored, peerAddr.Load(), buf[:size])
				}
			case kind == "store":
				if err = ep.Store(peer, hStored, peerAddr.Load(), buf[:size]); err == nil {
					err = wait()
				}
			case ep.Rank() == 1:
				continue // its handlers answer inside the barrier's polling
			case kind == "short":
				if err = ep.RequestShort(peer, hPing, args[:size/8]...); err == nil {
					err = wait()
				}
			default:
				if err = ep.RequestMedium(peer, hPing, buf[:size]); err == nil {
					err = wait()
				}
			}
			if err != nil {
				return err
			}
		}
		if ep.Rank() == 0 {
			lat := time.Since(start).Seconds() / float64(o.Iters) / 2
			osu.Row(os.Stdout, size, lat*1e6, float64(size)/lat/1e6)
		}
	}
	return ep.Barrier()
}
