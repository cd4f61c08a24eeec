package mpiam

import (
	"fmt"
	"sync/atomic"

	"github.com/amgo-hpc/amgo/handlers"
	"github.com/amgo-hpc/amgo/mpiam/internal/proto"
)

// Small allreduces over active messages.
//
// An Allreduce of at most allreduceAMMax bytes with a commutative operation,
// on a communicator that runs its collectives flat (one node, or a
// communicator too small for the two-level algorithms), is recursive
// doubling (with the fold-in and fold-out of a size that is not a power of
// two, as allreduceRecursiveDoubling) whose every message is a medium active
// message: the handler copies the data into a slot of the rank's state for
// (communicator, step), and the waiting rank combines it from there. No
// envelope, no matching, no receive request, no unexpected list: the
// barrier's scheme (coll_am.go) with data.
//
// Slots. The calls are numbered per communicator (every rank calls its
// blocking collectives on a communicator in the same order, MPI-4.1 §6.14),
// and the messages carry that number. In a given step a rank always hears
// from the same partner, messages from one rank arrive in order, and a
// partner can be at most one call ahead in that step: it cannot finish call
// e+1 without this rank's messages of e+1, which this rank sends only after
// it has consumed step s of call e. So two slots per step, by the parity of
// the call's number, hold every message that can be outstanding. A message
// that finds its slot taken all the same (the argument failed) waits in an
// overflow list rather than being lost, and moves into the slot when it
// frees.

// allreduceAMMax is the largest Allreduce, in bytes, that runs over active
// messages; larger ones use the point-to-point algorithms.
const allreduceAMMax = 256

// arMaxOver bounds the overflow list of one communicator's state: a
// partner that follows the protocol never fills it.
const arMaxOver = 64

// arSlot holds one partner's data of one step of one call.
type arSlot struct {
	// ready is the call's number plus one while the slot holds its data,
	// 0 while free. The handler stores it after the data (under p.mu); the
	// waiter polls it, then takes the data under p.mu.
	ready atomic.Uint64
	n     int
	pb    handlers.Piggyback // the tool value the message carried, if any
	data  [allreduceAMMax]byte
}

// arMsg is a message that found its slot taken.
type arMsg struct {
	step  int
	epoch uint64
	pb    handlers.Piggyback
	data  []byte
}

// arState is a rank's allreduce slots on one communicator, by step (grown
// as steps are first used; a slot never moves once made) and call parity.
// p.mu guards steps' growth, the data and over.
type arState struct {
	steps []*[2]arSlot
	over  []arMsg
}

// slotLocked returns the slot of step for call epoch, growing the steps.
// p.mu held.
func (s *arState) slotLocked(step int, epoch uint64) *arSlot {
	for len(s.steps) <= step {
		s.steps = append(s.steps, new([2]arSlot))
	}
	return &s.steps[step][epoch&1]
}

// putLocked files data for (step, epoch); false: its slot is taken and the
// overflow list full (a partner that breaks the protocol). p.mu held.
func (s *arState) putLocked(step int, epoch uint64, data []byte, pb handlers.Piggyback) bool {
	sl := s.slotLocked(step, epoch)
	if sl.ready.Load() != 0 {
		if len(s.over) >= arMaxOver {
			return false
		}
		s.over = append(s.over, arMsg{step: step, epoch: epoch, pb: pb, data: append([]byte(nil), data...)})
		return true
	}
	sl.n, sl.pb = copy(sl.data[:], data), pb
	sl.ready.Store(epoch + 1)
	return true
}

// takeLocked copies the data of (step, epoch), which is ready, into dst,
// frees the slot and moves a waiting overflow message in. p.mu held.
func (s *arState) takeLocked(step int, epoch uint64, dst []byte) (int, handlers.Piggyback) {
	sl := s.slotLocked(step, epoch)
	n, pb := copy(dst, sl.data[:sl.n]), sl.pb
	sl.ready.Store(0)
	for i, m := range s.over {
		if m.step == step && m.epoch&1 == epoch&1 {
			s.over = append(s.over[:i], s.over[i+1:]...)
			s.putLocked(m.step, m.epoch, m.data, m.pb)
			break
		}
	}
	return n, pb
}

// onAllreduceAM files an allreduce message: a[0] is the communicator's
// context and the step (proto.AllreduceAM), a[1] the call's number.
func (p *proc) onAllreduceAM(tok *handlers.Token, a []uint64, payload []byte) {
	m, err := proto.ParseAllreduceAM(a, len(payload), allreduceAMMax)
	if err != nil {
		p.dropped(fmt.Errorf("from rank %d: %w", tok.Source(), err))
		return
	}
	var pb handlers.Piggyback
	pb.Value, pb.Set = tok.Piggyback()
	p.mu.Lock()
	ok := byContextLocked(&p.arStates, m.Context).putLocked(int(m.Step), m.Call, payload, pb)
	p.mu.Unlock()
	if !ok {
		p.dropped(fmt.Errorf("from rank %d: allreduce message for communicator %d, step %d, call %d: its slot and the overflow list are full",
			tok.Source(), m.Context, m.Step, m.Call))
	}
}

// allreduceAMOK reports whether collective call x may reduce nb bytes with
// op over active messages.
func allreduceAMOK[T any](x coll, nb int, op Op[T]) bool {
	return x.v == nil && op.Commutative && nb <= allreduceAMMax && x.c.size > 1
}

// allreduceAM is the Allreduce of buf (in place) over active messages.
func allreduceAM[T any](x coll, buf []T, op Op[T]) error {
	c := x.c
	p := c.p
	st := cachedByContext(c, &c.ar, &p.arStates)
	if err := p.collFailed(c); err != nil {
		return err
	}
	epoch := c.arCalls.Add(1) - 1
	tmp, h := tempBuf[T](x, len(buf))
	defer x.putTemp(h)
	data, in := raw(buf), raw(tmp)
	send := func(to, step int) error {
		w := c.world(to)
		a0, a1 := proto.AllreduceAM{Context: c.ctx, Step: uint32(step), Call: epoch}.Args()
		var pb handlers.Piggyback
		if x.pb != nil {
			pb.Value, pb.Set = x.outgoing()
		}
		if err := p.ep.RequestMediumWith(w, hAllreduce, data, pb, a0, a1); err != nil {
			return p.netErr(c, w, fmt.Sprintf("allreduce on communicator %d", c.ctx), err)
		}
		return nil
	}
	recv := func(step int) error {
		p.mu.Lock()
		sl := st.slotLocked(step, epoch)
		p.mu.Unlock()
		want := epoch + 1
		if err := p.waitColl(c, func() bool { return sl.ready.Load() == want }); err != nil {
			return err
		}
		p.mu.Lock()
		_, pb := st.takeLocked(step, epoch, in)
		p.mu.Unlock()
		x.observe(Status{Piggyback: pb.Value, HasPiggyback: pb.Set})
		return nil
	}
	n, me := c.size, c.rank
	pof2, log := 1, 0
	for pof2*2 <= n {
		pof2, log = pof2*2, log+1
	}
	rem := n - pof2
	foldOut := log + 1 // the step after the doubling steps 1..log
	// Fold-in (step 0): of the first 2·rem ranks, each even one hands its
	// data to the odd one above it and sits out until the fold-out.
	nr := me - rem
	if me < 2*rem {
		if me%2 == 0 {
			if err := send(me+1, 0); err != nil {
				return err
			}
			if err := recv(foldOut); err != nil {
				return err
			}
			copy(data, in)
			return nil
		}
		if err := recv(0); err != nil {
			return err
		}
		op.Fn(tmp, buf) // the lower rank's data first
		nr = me / 2
	}
	// Doubling: steps 1, 2, ...
	step := 1
	for mask := 1; mask < pof2; mask, step = mask<<1, step+1 {
		partner := realRank(nr^mask, rem)
		if err := send(partner, step); err != nil {
			return err
		}
		if err := recv(step); err != nil {
			return err
		}
		combine(op, buf, tmp, nr^mask < nr)
	}
	// Fold-out (the last step): the result back to the rank that sat out.
	if me < 2*rem {
		return send(me-1, foldOut)
	}
	return nil
}
