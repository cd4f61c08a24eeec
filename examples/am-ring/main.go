// Command am-ring passes a token around all ranks of a job: each rank adds its
// rank to a medium payload's counter and forwards it to the next rank, for a
// number of laps; rank 0 checks the sum. It exercises requests between every
// neighbour pair and handlers that only record (the forwarding happens outside
// the handler, as AM's rules require).
//
//	amrun -n 4 ./am-ring
package main

import (
	"encoding/binary"
	"flag"
	"fmt"
	"os"
	"sync/atomic"

	"github.com/amgo-hpc/amgo/am"
	"github.com/amgo-hpc/amgo/am/job"
	"github.com/amgo-hpc/amgo/handlers"
)

const hToken handlers.Index = 1

func main() {
	laps := flag.Int("laps", 100, "times the token goes round")
	flag.Parse()
	err := job.Run(am.Config{}, func(ep *am.Endpoint) error { return ring(ep, *laps) })
	if err != nil {
		fmt.Fprintln(os.Stderr, "am-ring:", err)
		os.Exit(1)
	}
}

func ring(ep *am.Endpoint, laps int) error {
	var arrived atomic.Int64 // tokens received
	var value atomic.Uint64  // the last token's counter
	_, err := ep.Register(handlers.Entry{Index: hToken, Name: "token", NArgs: 1, Fn: func(_ *handlers.Token, a []uint64, p []byte) {
		value.Store(binary.LittleEndian.Uint64(p) + a[0]*0)
		arrived.Add(1)
	}})
	if err != nil {
		return err
	}
	if err := ep.Barrier(); err != nil {
		return err
	}
	n, me := ep.Size(), ep.Rank()
	next := (me + 1) % n
	buf := make([]byte, 64)
	send := func(v uint64, lap int) error {
		binary.LittleEndian.PutUint64(buf, v)
		return ep.RequestMedium(next, hToken, buf, uint64(lap))
	}
	for lap := 0; lap < laps; lap++ {
		if me == 0 {
			var v uint64
			if lap > 0 {
				v = value.Load()
			}
			if err := send(v, lap); err != nil {
				return err
			}
		}
		want := int64(lap + 1)
		if err := ep.PollUntil(func() bool { return arrived.Load() == want }); err != nil {
			return err
		}
		if me != 0 {
			if err := send(value.Load()+uint64(me), lap); err != nil {
				return err
			}
		}
	}
	if me == 0 {
		perLap := uint64(n * (n - 1) / 2)
		want := perLap * uint64(laps)
		if got := value.Load(); got != want {
			return fmt.Errorf("ring sum %d, want %d", got, want)
		}
		fmt.Printf("ring: %d ranks, %d laps over %s: sum %d: OK\n", n, laps, ep.Transport().Caps().Name, want)
	}
	return nil
}
