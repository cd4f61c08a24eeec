package mpiam

import (
	"fmt"

	"github.com/amgo-hpc/amgo/handlers"
	"github.com/amgo-hpc/amgo/mpiam/internal/proto"
	"github.com/amgo-hpc/amgo/mpiam/internal/sched"
)

// Nonblocking collectives (MPI-4.1 §6.12). Each call takes its place in the
// communicator's order of collective calls, checks its arguments (errors are
// returned at once), builds the operation's schedule and posts its first
// round (coll_sched.go); the returned request completes when the operation
// has, after every earlier nonblocking collective on the communicator (Wait,
// Test and the multiple-completion functions accept it). Buffers must not be
// touched until then. Cancel has no effect on these requests. Buffers, counts
// and in-place conventions are those of the blocking calls. A nonblocking
// collective matches only the same nonblocking collective on the other
// ranks (MPI-4.1 §6.12), except that Ibarrier and Barrier match each other.

// barrierTag is the tag base of a node-level barrier of epoch n.x.epoch,
// shared with the blocking Barrier (barrierNodes).
func (n *nbc) barrierTag() int {
	return barrierTags + int(n.x.epoch%(1<<20))<<8
}

// barrierSchedule is the dissemination barrier of n over active messages
// (as Barrier: round r sends one message and waits for the round-r count to
// pass n's epoch), or the node-level barrier over messages. The steps read
// n's epoch when they run, so a persistent barrier's schedule serves every
// Start.
func (n *nbc) barrierSchedule() *sched.Schedule {
	var b sched.Builder
	c := n.x.c
	p := c.p
	if c.size == 1 {
		return b.Schedule()
	}
	if l := n.x.nodeLevels(); l != nil {
		n.x.tag = n.barrierTag()
		node := sched.Group{Ranks: l.node.ranks, Me: l.node.me, Size: len(l.node.ranks)}
		if l.node.me != 0 {
			b.Send(l.node.ranks[0], 0, b.Temp(1))
			b.Fence()
		} else {
			for i := 1; i < len(l.node.ranks); i++ {
				b.Recv(l.node.ranks[i], 0, b.Temp(1))
			}
			b.Fence()
			ls, me := len(l.leaders.ranks), l.leaders.me
			for r, dist := 0, 1; dist < ls; r, dist = r+1, dist*2 {
				b.Send(l.leaders.ranks[(me+dist)%ls], leaderSteps+r, b.Temp(1))
				b.Recv(l.leaders.ranks[(me-dist+ls)%ls], leaderSteps+r, b.Temp(1))
				b.Fence()
			}
		}
		sched.Bcast(&b, node, b.Temp(1), 0, node2Steps)
		return b.Schedule()
	}
	var bar *barrierCounts
	b.Call(func() error {
		bar = cachedByContext(c, &c.bar, &p.barrierCounts)
		return p.collFailed(c)
	})
	for r, dist := 0, 1; dist < c.size; r, dist = r+1, dist*2 {
		if r > 0 && n.x.pb != nil {
			b.Call(func() error { n.x.observeBarrierPB(bar, r-1); return nil })
		}
		to := c.world((c.rank + dist) % c.size)
		b.Call(func() error {
			var buf [proto.BarrierArgs]uint64
			var pb handlers.Piggyback
			if n.x.pb != nil {
				pb.Value, _ = n.x.outgoing()
				pb.Set = true
			}
			err := p.ep.RequestShortWith(to, hBarrier, pb, (&proto.Barrier{Context: c.ctx, Round: uint32(r)}).Append(buf[:0])...)
			if err != nil {
				return p.netErr(c, to, fmt.Sprintf("barrier on communicator %d", c.ctx), err)
			}
			return nil
		})
		b.Until(func() bool { return bar.n[r].Load() > n.x.epoch })
		b.Fence()
		if dist*2 >= c.size && n.x.pb != nil {
			b.Call(func() error { n.x.observeBarrierPB(bar, r); return nil })
		}
	}
	return b.Schedule()
}

// Ibarrier starts a barrier (MPI_Ibarrier): the request completes once every
// rank of c has called Ibarrier. As MPI-4.1 §6.12 has it, a nonblocking
// barrier matches the other ranks' nonblocking barriers, not Barrier or a
// started BarrierInit (over messages it happens to match those too; through
// the communicator's shared area, which a one-node communicator uses once
// its first blocking collective has made it, it does not). Errors: ErrComm.
func (c *Comm) Ibarrier() (Request, error) {
	if a := c.directArea(0); a != nil {
		if h, ok := c.startAreaNB(a, CallIbarrier, shmNBOp{kind: nbBarrier}, nil); ok {
			return h, nil
		}
	}
	if c.readyArea() != nil && c.size >= 2 {
		// Through the area, on a schedule kept for the next call.
		key := keyOf[byte](CallIbarrier, nil, nil, nil, 0).onArea(c)
		return c.startSchedKey(key, CallIbarrier, AnySource, 0, ibarrierAreaSched, sigCheck{})
	}
	start := func() (Request, error) {
		x, err := c.startColl(CallIbarrier, true)
		if err != nil {
			return Request{}, err
		}
		n := newNBC(x, CallIbarrier, AnySource, 0, nil)
		n.setSchedule(n.barrierSchedule())
		h := n.h
		n.begin()
		return h, nil
	}
	if c.hooked() {
		return c.p.hookReq(&Event{Call: CallIbarrier, Comm: c, Peer: AnySource}, start)
	}
	return start()
}

// ibarrierAreaSched builds Ibarrier through the communicator's shared area,
// which Ibarrier found ready.
func ibarrierAreaSched(x coll, b *sched.Builder) error {
	a := shmNBArea(x, true, 0)
	if a == nil {
		return fmt.Errorf("%w: Ibarrier: the shared area of communicator %d is gone", ErrOther, x.c.ctx)
	}
	shmIbarrierSched(b, a)
	return nil
}

// BarrierInit makes a persistent barrier request (MPI_Barrier_init,
// MPI-4.1 §6.13): each Start begins a barrier, which matches a started
// BarrierInit on the other ranks (and, being a barrier over messages,
// Barrier and an Ibarrier over messages too). Errors: ErrComm.
func (c *Comm) BarrierInit() (Request, error) {
	x, err := c.startColl(CallBarrierInit, true)
	if err != nil {
		return Request{}, err
	}
	n := newNBC(x, CallBarrierInit, AnySource, 0, nil)
	n.setSchedule(n.barrierSchedule())
	n.persistent, n.req.persistent = true, true
	return n.h, nil
}

// bcastSched builds Bcast's schedule: a binomial tree, or a scatter and a
// ring allgather from AMGO_BCAST_LARGE bytes on 4 or more ranks.
func bcastSched[T any](buf []T, root int) func(x coll, b *sched.Builder) error {
	return func(x coll, b *sched.Builder) error { return buildBcast(x, b, buf, root, false) }
}

// ibcastSched is bcastSched for a one-shot Ibcast, which may go through the
// communicator's shared area (coll_shm_nb.go).
func ibcastSched[T any](buf []T, root int) func(x coll, b *sched.Builder) error {
	return func(x coll, b *sched.Builder) error { return buildBcast(x, b, buf, root, true) }
}

// buildBcast builds a broadcast's schedule; through the shared area when
// shm and the area exists.
func buildBcast[T any](x coll, b *sched.Builder, buf []T, root int, shm bool) error {
	if err := checkRoot(x.c, root); err != nil {
		return err
	}
	rb := raw(buf)
	if a := shmNBArea(x, shm, len(rb)); a != nil && len(rb) > 0 {
		shmIbcastSched(b, a, rb, root)
		return nil
	}
	if l := x.nodeLevels(); l != nil && len(rb) > 0 {
		bcastNodesSched(b, x, rb, root, l)
		return nil
	}
	if len(rb) >= bcastLarge && x.size() >= 4 {
		sched.BcastScatterAllgather(b, x.group(), rb, root, 0)
	} else {
		sched.Bcast(b, x.group(), rb, root, 0)
	}
	return nil
}

// Ibcast starts a broadcast (MPI_Ibcast); see Bcast. Errors at the call:
// ErrComm, ErrRoot, ErrType.
func Ibcast[T any](c *Comm, buf []T, root int) (Request, error) {
	if err := plain[T](); err != nil {
		return Request{}, err
	}
	if rb := raw(buf); len(rb) > 0 {
		if a := c.directArea(len(rb)); a != nil && root >= 0 && root < c.size {
			if h, ok := c.startAreaNB(a, CallIbcast, shmNBOp{kind: nbBcast, root: root, recv: rb}, nil); ok {
				return h, nil
			}
		}
	}
	key, chk := keyOf[T](CallIbcast, buf, nil, nil, root).onArea(c), sigCheckOf[T](c, CallIbcast, len(buf))
	if !c.hooked() {
		return c.startSchedUnhooked(key, CallIbcast, root, len(raw(buf)), ibcastSched(buf, root), chk)
	}
	return c.startSchedKey(key, CallIbcast, root, len(raw(buf)), ibcastSched(buf, root), chk)
}

// BcastInit makes a persistent broadcast request (MPI_Bcast_init, MPI-4.1
// §6.13); errors as Ibcast's.
func BcastInit[T any](c *Comm, buf []T, root int) (Request, error) {
	if err := plain[T](); err != nil {
		return Request{}, err
	}
	return c.initSched(CallBcastInit, root, len(raw(buf)), checkedSched[T](c, CallIbcast, len(buf), bcastSched(buf, root)))
}

// reduceSched builds Reduce's schedule: a binomial tree.
func reduceSched[T any](send, recv []T, op Op[T], root int) func(x coll, b *sched.Builder) error {
	return func(x coll, b *sched.Builder) error {
		if err := checkRoot(x.c, root); err != nil {
			return err
		}
		send := send
		if x.rank() == root {
			if send == nil {
				send = recv
			}
			if len(recv) != len(send) {
				return fmt.Errorf("%w: Reduce of %d elements into a receive buffer of %d", ErrCount, len(send), len(recv))
			}
		}
		if l := x.nodeLevels(); l != nil && (op.Commutative || l.contiguous) {
			reduceNodesSched(b, x, raw(send), raw(recv), reduction(op), root, l)
			return nil
		}
		sched.Reduce(b, x.group(), raw(send), raw(recv), reduction(op), root, 0)
		return nil
	}
}

// Ireduce starts a reduction to root (MPI_Ireduce); see Reduce. Errors at
// the call: ErrComm, ErrRoot, ErrType, ErrCount.
func Ireduce[T any](c *Comm, send, recv []T, op Op[T], root int) (Request, error) {
	if err := plain[T](); err != nil {
		return Request{}, err
	}
	return c.startSchedKey(keyOf(CallIreduce, send, recv, &op, root), CallIreduce, root, len(raw(send)), reduceSched(send, recv, op, root), sigCheckOf[T](c, CallIreduce, max(len(send), len(recv)*btoi(send == nil))))
}

// ReduceInit makes a persistent reduction request (MPI_Reduce_init,
// MPI-4.1 §6.13); errors as Ireduce's.
func ReduceInit[T any](c *Comm, send, recv []T, op Op[T], root int) (Request, error) {
	if err := plain[T](); err != nil {
		return Request{}, err
	}
	return c.initSched(CallReduceInit, root, len(raw(send)), checkedSched[T](c, CallIreduce, max(len(send), len(recv)*btoi(send == nil)), reduceSched(send, recv, op, root)))
}

// allreduceSched builds Allreduce's schedule: recursive doubling, the ring
// from AMGO_ALLREDUCE_RING bytes (commutative operations, at least one
// element per rank), Reduce then Bcast for non-commutative operations.
func allreduceSched[T any](send, recv []T, op Op[T]) func(x coll, b *sched.Builder) error {
	return func(x coll, b *sched.Builder) error { return buildAllreduce(x, b, send, recv, op, false) }
}

// iallreduceSched is allreduceSched for a one-shot Iallreduce, which may go
// through the communicator's shared area (coll_shm_nb.go).
func iallreduceSched[T any](send, recv []T, op Op[T]) func(x coll, b *sched.Builder) error {
	return func(x coll, b *sched.Builder) error { return buildAllreduce(x, b, send, recv, op, true) }
}

// buildAllreduce builds an allreduce's schedule; through the shared area
// when shm and the area exists.
func buildAllreduce[T any](x coll, b *sched.Builder, send, recv []T, op Op[T], shm bool) error {
	if send == nil {
		send = recv
	}
	if len(recv) != len(send) {
		return fmt.Errorf("%w: Allreduce of %d elements into a receive buffer of %d", ErrCount, len(send), len(recv))
	}
	red := reduction(op)
	if a := shmNBArea(x, shm, len(raw(recv))); a != nil {
		shmIallreduceSched(b, a, raw(send), raw(recv), red)
		return nil
	}
	if l := x.nodeLevels(); l != nil && (op.Commutative || l.contiguous) {
		allreduceNodesSched(b, raw(send), raw(recv), red, l)
		return nil
	}
	if op.Commutative && len(raw(recv)) >= iallreduceRing && len(recv) >= x.size() {
		sched.AllreduceRing(b, x.group(), raw(send), raw(recv), red, 0)
	} else {
		sched.Allreduce(b, x.group(), raw(send), raw(recv), red, 0)
	}
	return nil
}

// Iallreduce starts an allreduce (MPI_Iallreduce); see Allreduce. Errors at
// the call: ErrComm, ErrType, ErrCount.
func Iallreduce[T any](c *Comm, send, recv []T, op Op[T]) (Request, error) {
	if err := plain[T](); err != nil {
		return Request{}, err
	}
	if (send == nil || len(send) == len(recv)) && op.Fn != nil {
		if a := c.directArea(len(raw(recv))); a != nil {
			s := send
			if s == nil {
				s = recv // published before recv is written
			}
			o := shmNBOp{kind: nbAllreduce, send: raw(s), recv: raw(recv)}
			if h, ok := c.startAreaNB(a, CallIallreduce, o, func(a *shmColl) *sched.Reduction { return directRed(a, &op) }); ok {
				return h, nil
			}
		}
	}
	key, chk := keyOf(CallIallreduce, send, recv, &op, 0).onArea(c), sigCheckOf[T](c, CallIallreduce, len(recv))
	if !c.hooked() {
		return c.startSchedUnhooked(key, CallIallreduce, AnySource, len(raw(recv)), iallreduceSched(send, recv, op), chk)
	}
	return c.startSchedKey(key, CallIallreduce, AnySource, len(raw(recv)), iallreduceSched(send, recv, op), chk)
}

// AllreduceInit makes a persistent allreduce request (MPI_Allreduce_init,
// MPI-4.1 §6.13); errors as Iallreduce's.
func AllreduceInit[T any](c *Comm, send, recv []T, op Op[T]) (Request, error) {
	if err := plain[T](); err != nil {
		return Request{}, err
	}
	return c.initSched(CallAllreduceInit, AnySource, len(raw(recv)), checkedSched[T](c, CallIallreduce, len(recv), allreduceSched(send, recv, op)))
}

// gatherSched builds Gather's (v false) or Gatherv's schedule: linear.
func gatherSched[T any](send, recv []T, counts, displs []int, root int, v bool) func(x coll, b *sched.Builder) error {
	return func(x coll, b *sched.Builder) error {
		if err := checkRoot(x.c, root); err != nil {
			return err
		}
		p, me := x.size(), x.rank()
		if l := x.nodeLevels(); l != nil && !v && len(send) > 0 && me != root {
			gatherNodesSched(b, x, raw(send), nil, len(raw(send)), root, l)
			return nil
		}
		if me != root {
			sched.Gatherv(b, x.group(), raw(send), nil, nil, nil, root, 0)
			return nil
		}
		what := "Gather"
		counts, displs := counts, displs
		if !v {
			if len(recv)%p != 0 {
				return fmt.Errorf("%w: Gather receive buffer of %d elements for %d ranks", ErrCount, len(recv), p)
			}
			counts, displs = evenBlocks(p, len(recv)/p)
		} else {
			what = "Gatherv"
			if err := checkV(p, len(recv), counts, displs, what); err != nil {
				return err
			}
		}
		if send != nil && len(send) != counts[me] {
			return fmt.Errorf("%w: %s of %d elements into a block of %d", ErrCount, what, len(send), counts[me])
		}
		bc, bd := elemCounts[T](counts, displs)
		if l := x.nodeLevels(); l != nil && !v && bc[me] > 0 {
			rb := raw(recv)
			own := raw(send)
			if send == nil {
				own = rb[bd[me] : bd[me]+bc[me]]
			}
			gatherNodesSched(b, x, own, rb, bc[me], root, l)
			return nil
		}
		sched.Gatherv(b, x.group(), raw(send), raw(recv), bc, bd, root, 0)
		return nil
	}
}

// Igather starts a gather (MPI_Igather); see Gather. Errors at the call:
// ErrComm, ErrRoot, ErrType, ErrCount.
func Igather[T any](c *Comm, send, recv []T, root int) (Request, error) {
	if err := plain[T](); err != nil {
		return Request{}, err
	}
	return c.startSchedKey(keyOf(CallIgather, send, recv, nil, root), CallIgather, root, len(raw(send)), gatherSched(send, recv, nil, nil, root, false), sigCheckOf[T](c, CallIgather, rootBlock(c, root, len(send), len(recv))))
}

// GatherInit makes a persistent gather request (MPI_Gather_init, MPI-4.1
// §6.13); errors as Igather's.
func GatherInit[T any](c *Comm, send, recv []T, root int) (Request, error) {
	if err := plain[T](); err != nil {
		return Request{}, err
	}
	return c.initSched(CallGatherInit, root, len(raw(send)), checkedSched[T](c, CallIgather, rootBlock(c, root, len(send), len(recv)), gatherSched(send, recv, nil, nil, root, false)))
}

// Igatherv starts a Gatherv (MPI_Igatherv); errors as Igather's.
func Igatherv[T any](c *Comm, send, recv []T, counts, displs []int, root int) (Request, error) {
	if err := plain[T](); err != nil {
		return Request{}, err
	}
	return c.startSched(CallIgatherv, root, len(raw(send)), gatherSched(send, recv, counts, displs, root, true))
}

// scatterSched builds Scatter's (v false) or Scatterv's schedule: linear.
func scatterSched[T any](send []T, counts, displs []int, recv []T, root int, v bool) func(x coll, b *sched.Builder) error {
	return func(x coll, b *sched.Builder) error {
		if err := checkRoot(x.c, root); err != nil {
			return err
		}
		p, me := x.size(), x.rank()
		if me != root {
			sched.Scatterv(b, x.group(), nil, nil, nil, raw(recv), root, 0)
			return nil
		}
		what := "Scatter"
		counts, displs := counts, displs
		if !v {
			if len(send)%p != 0 {
				return fmt.Errorf("%w: Scatter send buffer of %d elements for %d ranks", ErrCount, len(send), p)
			}
			counts, displs = evenBlocks(p, len(send)/p)
		} else {
			what = "Scatterv"
			if err := checkV(p, len(send), counts, displs, what); err != nil {
				return err
			}
		}
		if recv != nil && len(recv) != counts[me] {
			return fmt.Errorf("%w: %s of a block of %d elements into %d", ErrCount, what, counts[me], len(recv))
		}
		bc, bd := elemCounts[T](counts, displs)
		sched.Scatterv(b, x.group(), raw(send), bc, bd, raw(recv), root, 0)
		return nil
	}
}

// Iscatter starts a scatter (MPI_Iscatter); see Scatter. Errors at the
// call: ErrComm, ErrRoot, ErrType, ErrCount.
func Iscatter[T any](c *Comm, send, recv []T, root int) (Request, error) {
	if err := plain[T](); err != nil {
		return Request{}, err
	}
	return c.startSchedKey(keyOf(CallIscatter, send, recv, nil, root), CallIscatter, root, len(raw(recv)), scatterSched(send, nil, nil, recv, root, false), sigCheckOf[T](c, CallIscatter, rootBlock(c, root, len(recv), len(send))))
}

// ScatterInit makes a persistent scatter request (MPI_Scatter_init,
// MPI-4.1 §6.13); errors as Iscatter's.
func ScatterInit[T any](c *Comm, send, recv []T, root int) (Request, error) {
	if err := plain[T](); err != nil {
		return Request{}, err
	}
	return c.initSched(CallScatterInit, root, len(raw(recv)), checkedSched[T](c, CallIscatter, rootBlock(c, root, len(recv), len(send)), scatterSched(send, nil, nil, recv, root, false)))
}

// Iscatterv starts a Scatterv (MPI_Iscatterv); errors as Iscatter's.
func Iscatterv[T any](c *Comm, send []T, counts, displs []int, recv []T, root int) (Request, error) {
	if err := plain[T](); err != nil {
		return Request{}, err
	}
	return c.startSched(CallIscatterv, root, len(raw(recv)), scatterSched(send, counts, displs, recv, root, true))
}

// allgatherSched builds Allgather's (v false) or Allgatherv's schedule:
// recursive doubling for power-of-two sizes up to AMGO_ALLGATHER_RD bytes
// in total, the ring otherwise.
func allgatherSched[T any](send, recv []T, counts, displs []int, v bool) func(x coll, b *sched.Builder) error {
	return func(x coll, b *sched.Builder) error {
		p, me := x.size(), x.rank()
		what := "Allgather"
		counts, displs := counts, displs
		if !v {
			if len(recv)%p != 0 {
				return fmt.Errorf("%w: Allgather receive buffer of %d elements for %d ranks", ErrCount, len(recv), p)
			}
			counts, displs = evenBlocks(p, len(recv)/p)
		} else {
			what = "Allgatherv"
			if err := checkV(p, len(recv), counts, displs, what); err != nil {
				return err
			}
		}
		if send != nil && len(send) != counts[me] {
			return fmt.Errorf("%w: %s of %d elements into a block of %d", ErrCount, what, len(send), counts[me])
		}
		rb := raw(recv)
		if l := x.nodeLevels(); l != nil && !v && counts[me] > 0 {
			k := len(rb) / p
			if send != nil {
				b.Copy(rb[me*k:(me+1)*k], raw(send))
			}
			allgatherNodesSched(b, x, rb, k, l)
			return nil
		}
		if !v && p&(p-1) == 0 && len(rb) <= allgatherRD {
			sched.AllgatherRecursiveDoubling(b, x.group(), raw(send), rb, len(rb)/p, 0)
			return nil
		}
		bc, bd := elemCounts[T](counts, displs)
		sched.AllgatherRing(b, x.group(), raw(send), rb, bc, bd, 0)
		return nil
	}
}

// Iallgather starts an allgather (MPI_Iallgather); see Allgather. Errors at
// the call: ErrComm, ErrType, ErrCount.
func Iallgather[T any](c *Comm, send, recv []T) (Request, error) {
	if err := plain[T](); err != nil {
		return Request{}, err
	}
	return c.startSchedKey(keyOf(CallIallgather, send, recv, nil, 0), CallIallgather, AnySource, len(raw(send)), allgatherSched(send, recv, nil, nil, false), sigCheckOf[T](c, CallIallgather, perRank(c, len(recv))))
}

// AllgatherInit makes a persistent allgather request (MPI_Allgather_init,
// MPI-4.1 §6.13); errors as Iallgather's.
func AllgatherInit[T any](c *Comm, send, recv []T) (Request, error) {
	if err := plain[T](); err != nil {
		return Request{}, err
	}
	return c.initSched(CallAllgatherInit, AnySource, len(raw(send)), checkedSched[T](c, CallIallgather, perRank(c, len(recv)), allgatherSched(send, recv, nil, nil, false)))
}

// Iallgatherv starts an Allgatherv (MPI_Iallgatherv); errors as Iallgather's.
func Iallgatherv[T any](c *Comm, send, recv []T, counts, displs []int) (Request, error) {
	if err := plain[T](); err != nil {
		return Request{}, err
	}
	return c.startSched(CallIallgatherv, AnySource, len(raw(send)), allgatherSched(send, recv, counts, displs, true))
}

// alltoallSched builds Alltoall's (rcounts nil) or Alltoallv's schedule:
// every message posted at once. In place (nil send), the send side is a copy
// of recv taken when the operation starts.
// ialltoallSched is a one-shot Ialltoall's schedule: through the
// communicator's shared area when it exists and every rank's send buffer
// fits a slot (coll_shm_nb.go), else alltoallSched's.
func ialltoallSched[T any](send, recv []T) func(x coll, b *sched.Builder) error {
	return func(x coll, b *sched.Builder) error {
		p := x.size()
		if a := shmNBArea(x, true, len(raw(recv))); a != nil && len(recv)%p == 0 && (send == nil || len(send) == len(recv)) {
			rb := raw(recv)
			sb := raw(send)
			if send == nil {
				sb = rb // published before anything is written to recv
			}
			shmIalltoallSched(b, a, sb, rb, len(rb)/p)
			return nil
		}
		return alltoallSched(send, nil, nil, recv, nil, nil)(x, b)
	}
}

func alltoallSched[T any](send []T, scounts, sdispls []int, recv []T, rcounts, rdispls []int) func(x coll, b *sched.Builder) error {
	return func(x coll, b *sched.Builder) error {
		p := x.size()
		what := "Alltoallv"
		scounts, sdispls, rcounts, rdispls := scounts, sdispls, rcounts, rdispls
		if rcounts == nil {
			what = "Alltoall"
			if len(recv)%p != 0 || send != nil && len(send) != len(recv) {
				return fmt.Errorf("%w: Alltoall of %d elements into %d for %d ranks", ErrCount, len(send), len(recv), p)
			}
			rcounts, rdispls = evenBlocks(p, len(recv)/p)
			scounts, sdispls = rcounts, rdispls
		} else if send == nil {
			scounts, sdispls = rcounts, rdispls
		}
		if err := checkV(p, len(recv), rcounts, rdispls, what); err != nil {
			return err
		}
		rb := raw(recv)
		sb := raw(send)
		if send == nil {
			sb = b.Temp(len(rb))
			b.Copy(sb, rb)
			b.Fence()
		} else if err := checkV(p, len(send), scounts, sdispls, what); err != nil {
			return err
		}
		bsc, bsd := elemCounts[T](scounts, sdispls)
		brc, brd := elemCounts[T](rcounts, rdispls)
		sched.Alltoallv(b, x.group(), sb, bsc, bsd, rb, brc, brd, 0)
		return nil
	}
}

// Ialltoall starts an all-to-all exchange (MPI_Ialltoall); see Alltoall.
// Errors at the call: ErrComm, ErrType, ErrCount.
func Ialltoall[T any](c *Comm, send, recv []T) (Request, error) {
	if err := plain[T](); err != nil {
		return Request{}, err
	}
	if a := c.directArea(len(raw(recv))); a != nil && len(recv)%c.size == 0 && (send == nil || len(send) == len(recv)) {
		rb, sb := raw(recv), raw(send)
		if send == nil {
			sb = rb // published before anything is written to recv
		}
		if h, ok := c.startAreaNB(a, CallIalltoall, shmNBOp{kind: nbAlltoall, send: sb, recv: rb, blk: len(rb) / c.size}, nil); ok {
			return h, nil
		}
	}
	key, chk := keyOf(CallIalltoall, send, recv, nil, 0).onArea(c), sigCheckOf[T](c, CallIalltoall, perRank(c, len(recv)))
	if !c.hooked() {
		return c.startSchedUnhooked(key, CallIalltoall, AnySource, len(raw(send)), ialltoallSched(send, recv), chk)
	}
	return c.startSchedKey(key, CallIalltoall, AnySource, len(raw(send)), ialltoallSched(send, recv), chk)
}

// AlltoallInit makes a persistent all-to-all request (MPI_Alltoall_init,
// MPI-4.1 §6.13); errors as Ialltoall's.
func AlltoallInit[T any](c *Comm, send, recv []T) (Request, error) {
	if err := plain[T](); err != nil {
		return Request{}, err
	}
	return c.initSched(CallAlltoallInit, AnySource, len(raw(send)), checkedSched[T](c, CallIalltoall, perRank(c, len(recv)), alltoallSched(send, nil, nil, recv, nil, nil)))
}

// Ialltoallv starts an Alltoallv (MPI_Ialltoallv); errors as Ialltoall's. A
// nil send means in place (rcounts and rdispls describe both sides).
func Ialltoallv[T any](c *Comm, send []T, scounts, sdispls []int, recv []T, rcounts, rdispls []int) (Request, error) {
	if err := plain[T](); err != nil {
		return Request{}, err
	}
	if rcounts == nil {
		rcounts = []int{} // not Alltoall's form: checkV reports the missing counts
	}
	return c.startSched(CallIalltoallv, AnySource, len(raw(send)), alltoallSched(send, scounts, sdispls, recv, rcounts, rdispls))
}

// reduceScatterSched builds ReduceScatter's schedule (counts in elements;
// nil counts: blocks of len(recv) elements, ReduceScatterBlock).
func reduceScatterSched[T any](send, recv []T, counts []int, op Op[T]) func(x coll, b *sched.Builder) error {
	return func(x coll, b *sched.Builder) error {
		p, me := x.size(), x.rank()
		what := "ReduceScatter"
		counts := counts
		if counts == nil {
			what = "ReduceScatterBlock"
			k := len(recv)
			if send == nil {
				if k%p != 0 {
					return fmt.Errorf("%w: in-place ReduceScatterBlock of %d elements for %d ranks", ErrCount, k, p)
				}
				k /= p
			}
			counts, _ = evenBlocks(p, k)
		}
		if len(counts) != p {
			return fmt.Errorf("%w: %s needs %d counts, got %d", ErrCount, what, p, len(counts))
		}
		total := 0
		for i, n := range counts {
			if n < 0 {
				return fmt.Errorf("%w: %s count %d of rank %d", ErrCount, what, n, i)
			}
			total += n
		}
		rb := raw(recv)
		sb := raw(send)
		if send == nil {
			if len(recv) < total {
				return fmt.Errorf("%w: in-place %s of %d elements in a buffer of %d", ErrCount, what, total, len(recv))
			}
			sb = b.Temp(len(raw(recv[:total])))
			b.Copy(sb, raw(recv[:total]))
			b.Fence()
		} else if len(send) != total {
			return fmt.Errorf("%w: %s of %d elements where the counts sum to %d", ErrCount, what, len(send), total)
		}
		if len(recv) < counts[me] {
			return fmt.Errorf("%w: %s block of %d elements into a buffer of %d", ErrCount, what, counts[me], len(recv))
		}
		bc, _ := elemCounts[T](counts, nil)
		sched.ReduceScatter(b, x.group(), sb, rb[:bc[me]], bc, reduction(op), 0)
		return nil
	}
}

// ReduceScatter combines every rank's send (the sum of counts elements)
// with op and leaves block i (counts[i] elements, in order) of the result in
// rank i's recv (MPI_Reduce_scatter, MPI-4.1 §6.10.1): around a ring for
// commutative operations ((p−1)·(α + nβ/p + nγ/p)), Reduce to rank 0 and
// Scatterv otherwise. A nil send means in place: recv holds all blocks on
// entry and this rank's block in its first counts[rank] elements on return.
// It runs on the schedule engine. Errors: ErrComm, ErrType, ErrCount,
// ErrTruncate.
func ReduceScatter[T any](c *Comm, send, recv []T, counts []int, op Op[T]) error {
	if err := plain[T](); err != nil {
		return err
	}
	if counts == nil {
		counts = []int{}
	}
	return c.runSched(CallReduceScatter, AnySource, len(raw(send)), reduceScatterSched(send, recv, counts, op))
}

// IreduceScatter starts a ReduceScatter (MPI_Ireduce_scatter); errors at the
// call: ErrComm, ErrType, ErrCount.
func IreduceScatter[T any](c *Comm, send, recv []T, counts []int, op Op[T]) (Request, error) {
	if err := plain[T](); err != nil {
		return Request{}, err
	}
	if counts == nil {
		counts = []int{}
	}
	return c.startSched(CallIreduceScatter, AnySource, len(raw(send)), reduceScatterSched(send, recv, counts, op))
}

// IreduceScatterBlock starts a ReduceScatterBlock
// (MPI_Ireduce_scatter_block); errors as IreduceScatter's.
func IreduceScatterBlock[T any](c *Comm, send, recv []T, op Op[T]) (Request, error) {
	if err := plain[T](); err != nil {
		return Request{}, err
	}
	return c.startSchedKey(keyOf(CallIreduceScatterBlock, send, recv, &op, 0), CallIreduceScatterBlock, AnySource, len(raw(send)), reduceScatterSched(send, recv, nil, op), sigCheckOf[T](c, CallIreduceScatterBlock, len(recv)/max(1, c.sizeIf(send == nil))))
}

// ReduceScatterBlockInit makes a persistent ReduceScatterBlock request
// (MPI_Reduce_scatter_block_init, MPI-4.1 §6.13); errors as
// IreduceScatter's.
func ReduceScatterBlockInit[T any](c *Comm, send, recv []T, op Op[T]) (Request, error) {
	if err := plain[T](); err != nil {
		return Request{}, err
	}
	return c.initSched(CallReduceScatterBlockInit, AnySource, len(raw(send)), checkedSched[T](c, CallIreduceScatterBlock, len(recv)/max(1, c.sizeIf(send == nil)), reduceScatterSched(send, recv, nil, op)))
}

// scanSched builds Scan's or Exscan's schedule: recursive doubling.
func scanSched[T any](send, recv []T, op Op[T], exclusive bool) func(x coll, b *sched.Builder) error {
	return func(x coll, b *sched.Builder) error {
		send := send
		if send == nil {
			send = recv
		}
		if len(send) != len(recv) {
			return fmt.Errorf("%w: scan of %d elements into a buffer of %d", ErrCount, len(send), len(recv))
		}
		sched.Scan(b, x.group(), raw(send), raw(recv), reduction(op), exclusive, 0)
		return nil
	}
}

// Iscan starts an inclusive prefix reduction (MPI_Iscan); see Scan. Errors
// at the call: ErrComm, ErrType, ErrCount.
func Iscan[T any](c *Comm, send, recv []T, op Op[T]) (Request, error) {
	if err := plain[T](); err != nil {
		return Request{}, err
	}
	return c.startSchedKey(keyOf(CallIscan, send, recv, &op, 0), CallIscan, AnySource, len(raw(recv)), scanSched(send, recv, op, false), sigCheckOf[T](c, CallIscan, len(recv)))
}

// Iexscan starts an exclusive prefix reduction (MPI_Iexscan); see Exscan;
// errors as Iscan's.
func Iexscan[T any](c *Comm, send, recv []T, op Op[T]) (Request, error) {
	if err := plain[T](); err != nil {
		return Request{}, err
	}
	return c.startSchedKey(keyOf(CallIexscan, send, recv, &op, 0), CallIexscan, AnySource, len(raw(recv)), scanSched(send, recv, op, true), sigCheckOf[T](c, CallIexscan, len(recv)))
}
