// Package ambench is amgo's Active Messages microbenchmark, shared by the
// commands bench/ampingpong and `osu am`: ping-pong latency (and the
// bandwidth it implies) and windowed streaming bandwidth between ranks 0 and 1
// for the three AM kinds, in the OSU layout of bench/internal/osu.
//
//   - short: RequestShort with size/8 arguments (sizes 0..128 bytes), the
//     handler replies short at once (GASNet testam's ping-pong);
//   - medium: RequestMedium with a payload of size bytes (at most MaxMedium),
//     the handler replies short;
//   - store: Store of size bytes into a segment that the peer registered; for
//     the ping-pong rank 1 stores back once rank 0's store has landed, for
//     bandwidth the store's handler replies short.
//
// Bandwidth mode (BW) sends Window requests, then waits for their Window
// replies, Iters times, as osu_bw does with Isend/Waitall.
package ambench

import (
	"fmt"
	"io"
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
	hStoredAck
)

// Kinds are the AM message kinds Run accepts.
var Kinds = []string{"short", "medium", "store"}

// Run runs the benchmark of kind ("short", "medium" or "store") on ep, a rank
// of a job of exactly 2 ranks; rank 0 writes the results to w. With bw false it
// is a ping-pong (columns latency and bandwidth); with bw true a windowed
// stream (column bandwidth). A MaxSize of 0 picks the kind's default: 128 for
// short, 8 KiB for medium (capped at MaxMedium), 4 MiB for store.
func Run(ep *am.Endpoint, kind string, bw bool, o osu.Options, w io.Writer) error {
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
		{Index: hStoredAck, Name: "stored-ack", NArgs: 0, Fn: func(tok *handlers.Token, _ []uint64, _ []byte) { _ = tok.ReplyShort(hPong) }},
	}
	for _, e := range reg {
		if _, err := ep.Register(e); err != nil {
			return err
		}
	}
	switch kind {
	case "short":
		o.MaxSize = 128
		o.MinSize = min(o.MinSize, 128)
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
	if o.Window < 1 {
		o.Window = 1
	}
	peer := 1 - ep.Rank()
	buf := make([]byte, max(o.MaxSize, 1))
	if kind == "store" {
		seg, err := ep.RegisterSegment(make([]byte, max(o.MaxSize, 1)))
		if err != nil {
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
	net := ep.Transport().Caps().Name
	if ep.Rank() == 0 {
		if bw {
			fmt.Fprintf(w, "# amgo AM %s Bandwidth Test over %s\n", kind, net)
			fmt.Fprintf(w, "# [ window size: %d ]\n", o.Window)
			osu.Columns(w, "Bandwidth (MB/s)")
		} else {
			osu.Header(w, fmt.Sprintf("amgo AM %s ping-pong over %s", kind, net), "Latency (us)", "Bandwidth (MB/s)")
		}
	}
	var seen int64
	waitFor := func(n int64) error {
		seen += n
		want := seen
		return ep.PollUntil(func() bool { return pongs.Load() >= want })
	}
	send := func(size int) error {
		switch kind {
		case "short":
			return ep.RequestShort(peer, hPing, args[:size/8]...)
		case "medium":
			return ep.RequestMedium(peer, hPing, buf[:size])
		}
		h := hStored
		if bw {
			h = hStoredAck
		}
		return ep.Store(peer, h, peerAddr.Load(), buf[:size])
	}
	for _, size := range o.Sizes() {
		if kind == "short" && size%8 != 0 {
			continue
		}
		iters, warmup := o.Counts(size)
		var start time.Time
		for i := 0; i < warmup+iters; i++ {
			if i == warmup {
				start = time.Now()
			}
			var err error
			switch {
			case bw && ep.Rank() == 1, !bw && kind != "store" && ep.Rank() == 1:
				continue // its handlers answer inside the barrier's polling
			case bw:
				for j := 0; j < o.Window && err == nil; j++ {
					err = send(size)
				}
				if err == nil {
					err = waitFor(int64(o.Window))
				}
			case ep.Rank() == 1: // store ping-pong: wait, then store back
				if err = waitFor(1); err == nil {
					err = send(size)
				}
			default:
				if err = send(size); err == nil {
					err = waitFor(1)
				}
			}
			if err != nil {
				return err
			}
		}
		if ep.Rank() == 0 {
			el := time.Since(start).Seconds()
			if bw {
				osu.Row(w, size, float64(size)*float64(iters)*float64(o.Window)/el/1e6)
			} else {
				lat := el / float64(iters) / 2
				osu.Row(w, size, lat*1e6, float64(size)/lat/1e6)
			}
		}
	}
	return ep.Barrier()
}
