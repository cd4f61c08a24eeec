// Command am-pingpong bounces a short request and a medium request between
// ranks 0 and 1 of a job and reports the half round-trip time of each: the
// request runs a handler at rank 1 that replies at once, and the reply's handler
// at rank 0 counts it (GASNet testam's ping-pong).
//
//	amrun -n 2 ./am-pingpong            # two processes over shared memory
//	amrun -n 2 --transport loop ./am-pingpong   # two goroutine ranks
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/amgo-hpc/amgo/am"
	"github.com/amgo-hpc/amgo/am/job"
	"github.com/amgo-hpc/amgo/handlers"
)

const (
	hPing handlers.Index = 1 + iota
	hPong
	hPingMedium
	hPongMedium
)

func main() {
	iters := flag.Int("i", 10000, "round trips per message kind")
	size := flag.Int("s", 1024, "medium payload in bytes")
	flag.Parse()
	err := job.Run(am.Config{}, func(ep *am.Endpoint) error { return pingpong(ep, *iters, *size) })
	if err != nil {
		fmt.Fprintln(os.Stderr, "am-pingpong:", err)
		os.Exit(1)
	}
}

func pingpong(ep *am.Endpoint, iters, size int) error {
	if ep.Size() < 2 {
		return fmt.Errorf("needs at least 2 ranks, job has %d", ep.Size())
	}
	var pongs atomic.Int64
	var bad atomic.Int64
	payload := bytes.Repeat([]byte{0xA5}, size)
	reg := []handlers.Entry{
		{Index: hPing, Name: "ping", NArgs: 1, Fn: func(tok *handlers.Token, a []uint64, _ []byte) {
			_ = tok.ReplyShort(hPong, a[0]+1)
		}},
		{Index: hPong, Name: "pong", NArgs: 1, Fn: func(_ *handlers.Token, a []uint64, _ []byte) {
			if int64(a[0]) != pongs.Load()+1 {
				bad.Add(1)
			}
			pongs.Add(1)
		}},
		{Index: hPingMedium, Name: "ping-medium", NArgs: 0, Fn: func(tok *handlers.Token, _ []uint64, p []byte) {
			if !bytes.Equal(p, payload) {
				bad.Add(1)
			}
			_ = tok.ReplyShort(hPongMedium)
		}},
		{Index: hPongMedium, Name: "pong-medium", NArgs: 0, Fn: func(*handlers.Token, []uint64, []byte) { pongs.Add(1) }},
	}
	for _, e := range reg {
		if _, err := ep.Register(e); err != nil {
			return err
		}
	}
	if err := ep.Barrier(); err != nil {
		return err
	}
	if ep.Rank() == 0 {
		start := time.Now()
		for i := 0; i < iters; i++ {
			if err := ep.RequestShort(1, hPing, uint64(i)); err != nil {
				return err
			}
			want := int64(i + 1)
			if err := ep.PollUntil(func() bool { return pongs.Load() == want }); err != nil {
				return err
			}
		}
		short := time.Since(start)
		pongs.Store(0)
		start = time.Now()
		for i := 0; i < iters; i++ {
			if err := ep.RequestMedium(1, hPingMedium, payload); err != nil {
				return err
			}
			want := int64(i + 1)
			if err := ep.PollUntil(func() bool { return pongs.Load() == want }); err != nil {
				return err
			}
		}
		medium := time.Since(start)
		fmt.Printf("# amgo AM ping-pong over %s, %d ranks, %d round trips\n", ep.Transport().Caps().Name, ep.Size(), iters)
		fmt.Printf("short (1 arg)       %10.3f us half round trip\n", us(short, iters))
		fmt.Printf("medium (%5d bytes) %10.3f us half round trip\n", size, us(medium, iters))
	}
	if err := ep.Barrier(); err != nil {
		return err
	}
	if bad.Load() != 0 {
		return fmt.Errorf("rank %d saw %d wrong messages", ep.Rank(), bad.Load())
	}
	if ep.Rank() == 0 {
		fmt.Println("ping-pong: OK")
	}
	return nil
}

func us(d time.Duration, iters int) float64 {
	return float64(d.Nanoseconds()) / float64(iters) / 2 / 1000
}
