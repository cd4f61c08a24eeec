package am

import (
	"sync"
	"sync/atomic"

	"github.com/amgo-hpc/amgo/handlers"
)

// Reserved handler indices of package am (above handlers.MaxClientIndex).
const (
	barrierHandler handlers.Index = 255
)

// maxBarrierRounds bounds ceil(log2(size)) for the dissemination barrier.
const maxBarrierRounds = 32

type barrierState struct {
	mu      sync.Mutex // one barrier at a time per endpoint
	epoch   uint64
	arrived [2][maxBarrierRounds]atomic.Uint32
}

func (ep *Endpoint) registerInternal() error {
	_, err := ep.table.RegisterReserved(handlers.Entry{
		Index: barrierHandler, Name: "am.barrier", NArgs: 2,
		Fn: func(tok *handlers.Token, args []uint64, _ []byte) {
			epoch, round := args[0], args[1]
			if round < maxBarrierRounds {
				ep.bar.arrived[epoch&1][round].Add(1)
			}
		},
	})
	return err
}

// Barrier blocks until every rank of the job has entered it (a dissemination
// barrier over short requests: ceil(log2 n) rounds, one message per rank per
// round; Hensgen, Finkel and Manber 1988). It polls while it waits. Errors:
// ErrClosed, a *PeerError (ErrPeerDead) naming a rank that died, network errors.
func (ep *Endpoint) Barrier() error {
	b := &ep.bar
	b.mu.Lock()
	defer b.mu.Unlock()
	epoch := b.epoch
	b.epoch++
	slot := &b.arrived[epoch&1]
	for round, dist := 0, 1; dist < ep.size; round, dist = round+1, dist*2 {
		to := (ep.rank + dist) % ep.size
		if err := ep.requestShort(to, barrierHandler, []uint64{epoch, uint64(round)}); err != nil {
			return err
		}
		r := round
		if err := ep.PollUntil(func() bool { return slot[r].Load() > 0 }); err != nil {
			return err
		}
		slot[r].Add(^uint32(0))
	}
	return nil
}
