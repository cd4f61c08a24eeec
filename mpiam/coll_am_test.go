package mpiam

import (
	"fmt"
	"math/rand"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// No rank leaves a barrier before every rank has entered it, over every
// network, when ranks arrive in a seeded random order, mix Barrier with
// Ibarrier, keep two Ibarriers in flight at once, and a rank's next barrier's
// messages overtake the current one's (coll_am.go).
func TestBarrierSeparatesPhases(t *testing.T) {
	const rounds = 40
	for _, n := range []int{2, 3, 5} {
		counts := map[string]*[rounds][2]atomic.Int32{}
		for _, nw := range networks {
			counts[nw] = new([rounds][2]atomic.Int32)
		}
		eachNetwork(t, n, func(r *rk, w *Comm) {
			entered := counts[r.net]
			rng := rand.New(rand.NewSource(int64(7*n + w.Rank()))) // replayable arrival order
			for i := 0; i < rounds; i++ {
				if rng.Intn(3) == 0 {
					time.Sleep(time.Duration(rng.Intn(200)) * time.Microsecond)
				}
				switch {
				case i%5 == 4: // two Ibarriers in flight at once
					entered[i][0].Add(1)
					a, err := w.Ibarrier()
					r.NoError(err)
					entered[i][1].Add(1)
					b, err := w.Ibarrier()
					r.NoError(err)
					_, err = b.Wait()
					r.NoError(err)
					r.EqualValues(n, entered[i][1].Load(), "second of two Ibarriers, phase %d", i)
					_, err = a.Wait()
					r.NoError(err)
					r.EqualValues(n, entered[i][0].Load(), "first of two Ibarriers, phase %d", i)
				case i%3 == 0: // an Ibarrier (blocking and nonblocking collectives do not match: MPI-4.1 §6.12)
					entered[i][0].Add(1)
					req, err := w.Ibarrier()
					r.NoError(err)
					_, err = req.Wait()
					r.NoError(err)
					r.EqualValues(n, entered[i][0].Load(), "Ibarrier, phase %d", i)
				default:
					entered[i][0].Add(1)
					r.NoError(w.Barrier())
					r.EqualValues(n, entered[i][0].Load(), "Barrier, phase %d", i)
				}
			}
		})
	}
}

// A malformed barrier message (an odd context, a round past the last) is
// dropped and counted; barriers go on.
func TestBarrierMalformedMessage(t *testing.T) {
	eachNetwork(t, 2, func(r *rk, w *Comm) {
		p := w.p
		peer := 1 - w.Rank()
		r.NoError(p.ep.RequestShort(peer, hBarrier, 1, 0))
		r.NoError(p.ep.RequestShort(peer, hBarrier, 0, maxBarrierRounds))
		r.NoError(w.Barrier())
		r.NoError(p.waitFor(func() bool { return p.drops.Load() >= 2 }))
		r.NoError(w.Barrier())
		r.EqualValues(2, p.drops.Load())
	})
}

// A communicator's barriers are separate from its parent's: a barrier on a
// split communicator and one on the world do not complete each other.
func TestBarrierPerCommunicator(t *testing.T) {
	const n = 4
	var phase atomic.Int32
	require.NoError(t, RunLocal(n, Config{}, func(w *Comm) error {
		half, err := w.Split(w.Rank()%2, w.Rank())
		if err != nil {
			return err
		}
		for i := 0; i < 20; i++ {
			if err := half.Barrier(); err != nil {
				return err
			}
			phase.Add(1)
			if err := w.Barrier(); err != nil {
				return err
			}
			if got := phase.Load(); got < int32(n*(i+1)) {
				return fmt.Errorf("world barrier %d left with %d ranks past the half barrier", i, got)
			}
			if err := w.Barrier(); err != nil {
				return err
			}
		}
		return half.Free()
	}))
}

// Ibarriers started at once on a fresh communicator, on every rank.
func TestIbarriersAtOnceOnNewComm(t *testing.T) {
	require.NoError(t, RunLocal(3, Config{}, func(w *Comm) error {
		d, err := w.Dup()
		if err != nil {
			return err
		}
		reqs := make([]Request, 4)
		for i := range reqs {
			if reqs[i], err = d.Ibarrier(); err != nil {
				return err
			}
		}
		if err := Waitall(reqs, nil); err != nil {
			return err
		}
		return d.Free()
	}))
}

// A piggybacking tool attached on one rank only changes nothing for the
// others: barriers still meet (the value rides in the active message's header
// where there is one).
func TestBarrierWithToolOnOneRank(t *testing.T) {
	require.NoError(t, RunLocal(3, Config{}, func(w *Comm) error {
		if w.Rank() == 0 {
			if err := w.AddTool(&recorder{value: 7}); err != nil {
				return err
			}
		}
		for i := 0; i < 10; i++ {
			if err := w.Barrier(); err != nil {
				return err
			}
		}
		return nil
	}))
}
