package am_test

import (
	"fmt"
	"sync/atomic"

	"github.com/amgo-hpc/amgo/am"
	"github.com/amgo-hpc/amgo/am/transport/loop"
	"github.com/amgo-hpc/amgo/handlers"
)

// Two ranks (goroutines of this process, on the loop network) and one
// handler: rank 0 asks
// rank 1 to add two numbers, and rank 1's handler answers with a reply, which
// needs no credit of its own.
func Example() {
	const hAdd, hSum handlers.Index = 1, 2
	trs, err := loop.NewJob(2, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	err = am.RunJob(trs, am.Config{}, func(ep *am.Endpoint) error {
		var sum atomic.Int64
		var got atomic.Bool
		entries := []handlers.Entry{
			{Index: hAdd, Name: "add", NArgs: 2, Fn: func(tok *handlers.Token, a []uint64, _ []byte) {
				_ = tok.ReplyShort(hSum, a[0]+a[1]) // a handler may reply once
			}},
			{Index: hSum, Name: "sum", NArgs: 1, Fn: func(_ *handlers.Token, a []uint64, _ []byte) {
				sum.Store(int64(a[0]))
				got.Store(true)
			}},
		}
		for _, e := range entries {
			if _, err := ep.Register(e); err != nil {
				return err
			}
		}
		if err := ep.Barrier(); err != nil { // every rank has its handlers
			return err
		}
		if ep.Rank() == 0 {
			if err := ep.RequestShort(1, hAdd, 40, 2); err != nil {
				return err
			}
			if err := ep.PollUntil(got.Load); err != nil {
				return err
			}
			fmt.Println("rank 1 says 40 + 2 =", sum.Load())
		}
		return nil
	})
	if err != nil {
		fmt.Println(err)
	}
	// Output:
	// rank 1 says 40 + 2 = 42
}
