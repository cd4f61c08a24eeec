package mpiam

import (
	"fmt"
	"math/bits"
	"os"
	"strconv"
	"sync"
	"unsafe"

	"github.com/amgo-hpc/amgo/mpiam/internal/sched"
)

// Collective operations (MPI-4.1 Chapter 6) over point-to-point messages on
// the communicator's collective context. Every rank of the communicator must
// call the same collectives in the same order. Buffers are slices of any
// fixed-size type without pointers (numbers, arrays and structs of them);
// counts are in elements. A nil send buffer means MPI_IN_PLACE where the
// standard allows it (documented per function). docs/collectives.md gives each
// algorithm and its cost.

// Tunable thresholds, in bytes, read once from the environment.
var (
	// bcastLarge: Bcast uses scatter + ring allgather from this many bytes (AMGO_BCAST_LARGE).
	bcastLarge = envBytes("AMGO_BCAST_LARGE", 64<<10)
	// allreduceRabenseifner: Allreduce uses reduce-scatter + allgather
	// (Rabenseifner) from this many bytes (AMGO_ALLREDUCE_RABENSEIFNER).
	allreduceRabenseifner = envBytes("AMGO_ALLREDUCE_RABENSEIFNER", 8<<10)
	// allreduceRing: Allreduce uses the ring algorithm from this many bytes (AMGO_ALLREDUCE_RING).
	allreduceRing = envBytes("AMGO_ALLREDUCE_RING", 1<<20)
	// iallreduceRing: the schedules of Iallreduce and AllreduceInit, which
	// have no Rabenseifner, use the ring from this many bytes
	// (AMGO_IALLREDUCE_RING).
	iallreduceRing = envBytes("AMGO_IALLREDUCE_RING", 128<<10)
	// alltoallBruck: Alltoall uses Bruck's algorithm up to this many bytes per block (AMGO_ALLTOALL_BRUCK).
	alltoallBruck = envBytes("AMGO_ALLTOALL_BRUCK", 256)
	// allgatherRD: Allgather uses recursive doubling (power-of-two sizes) up to
	// this many bytes in total (AMGO_ALLGATHER_RD); the ring above.
	allgatherRD = envBytes("AMGO_ALLGATHER_RD", 64<<10)
)

func envBytes(name string, def int) int {
	if v := os.Getenv(name); v != "" {
		if n, err := strconv.Atoi(v); err == nil && n >= 0 {
			return n
		}
	}
	return def
}

// coll is one collective call in progress: its communicator, its collective
// context and its tag base.
type coll struct {
	c     *Comm
	cc    *Comm
	tag   int
	pb    *collPB // piggyback bookkeeping when a tool attaches values; nil otherwise
	epoch uint64  // barriers: how many Barrier or Ibarrier calls on c came before this one
	// v, when set, is the group of c's ranks the algorithm runs over (a
	// node's ranks, or one leader per node: coll_node.go); the algorithms
	// see its ranks as 0..size()-1 and send and receive through peer.
	v *view
	// blocks: the exchange steps move an all-to-all's blocks, which nothing
	// in the algorithm computes (exchangeLimit).
	blocks bool
}

// view is a group of a communicator's ranks: ranks[i] is the i-th member's
// rank in the communicator, me this rank's index (-1: not a member).
type view struct {
	ranks []int
	me    int
}

// size is the number of ranks the algorithm runs over.
func (x coll) size() int {
	if x.v == nil {
		return x.c.size
	}
	return len(x.v.ranks)
}

// rank is this rank's place among them.
func (x coll) rank() int {
	if x.v == nil {
		return x.c.rank
	}
	return x.v.me
}

// peer is the communicator rank of the algorithm's rank i.
func (x coll) peer(i int) int {
	if x.v == nil {
		return i
	}
	return x.v.ranks[i]
}

// collPB tracks the largest tool value among the messages a rank received
// in one collective, and forwards it on the messages it sends, so that each
// participant learns the largest delay among the ranks it depends on
// (TAU's overhead compensation for collectives: Shende, Malony, Morris and
// Wolf, EuroPVM/MPI 2005).
type collPB struct {
	mu  sync.Mutex
	max uint64
	has bool
}

func (x coll) observe(st Status) {
	if x.pb == nil || !st.HasPiggyback {
		return
	}
	x.pb.mu.Lock()
	if !x.pb.has || st.Piggyback > x.pb.max {
		x.pb.max, x.pb.has = st.Piggyback, true
	}
	x.pb.mu.Unlock()
}

// outgoing is the value to send: the tool's current one or the largest seen.
func (x coll) outgoing() (uint64, bool) {
	v, _ := x.c.p.outgoingPB()
	x.pb.mu.Lock()
	defer x.pb.mu.Unlock()
	if x.pb.has && x.pb.max > v {
		return x.pb.max, true
	}
	return v, true
}

// status is the collective's completion status seen by tools.
func (x coll) status(err error) Status {
	st := Status{Source: AnySource, Tag: AnyTag, Err: err}
	if x.pb != nil {
		x.pb.mu.Lock()
		st.Piggyback, st.HasPiggyback = x.pb.max, x.pb.has
		x.pb.mu.Unlock()
	}
	return st
}

// runColl runs one collective call: it takes the call's place in c's order,
// then runs f, under the tools' hooks when tools are attached (the status they
// see carries the largest piggybacked value the rank received in the call).
func (c *Comm) runColl(call Call, peer, bytes int, f func(x coll) error) error {
	x, err := c.startColl(call, false)
	if err != nil {
		return err
	}
	defer c.p.collEnd(c.p.collBeginBlocking(call, c, peer, bytes))
	if !c.hooked() {
		return f(x)
	}
	e := Event{Call: call, Comm: c, Peer: peer, Bytes: bytes}
	c.p.around(&e, func(e *Event) {
		e.Err = f(x)
		e.Status = x.status(e.Err)
	})
	return e.Err
}

// startColl takes the next place in c's order of collective calls for a
// call of kind call; nb marks a nonblocking call, which gets a tag base of
// its own (collTag), where a blocking one uses blockingCollTag.
func (c *Comm) startColl(call Call, nb bool) (coll, error) {
	if err := c.valid(); err != nil {
		return coll{}, err
	}
	x := coll{c: c, cc: c.collective(), tag: blockingCollTag}
	if nb {
		x.tag = c.collTag()
	}
	if call == CallIbarrier {
		x.epoch = c.barriers.Add(1) - 1 // Barrier takes its own when it sends messages (coll.barrier)
	}
	if c.p.pbTool != nil {
		x.pb = new(collPB)
	}
	return x, nil
}

func (x coll) send(b []byte, dest, step int) error {
	return x.sendStep(b, dest, step, false)
}

// sendStep is send; exchange marks one step of an exchange, in which the peer
// sends to this rank at once (see sendPB).
func (x coll) sendStep(b []byte, dest, step int, exchange bool) error {
	dest = x.peer(dest)
	if x.pb == nil && !exchange {
		return x.cc.send(b, dest, x.tag+step, Standard)
	}
	pb, has := x.cc.p.outgoingPB()
	if x.pb != nil {
		pb, has = x.outgoing()
	}
	exLimit := 0
	if exchange {
		exLimit = x.cc.p.exchangeLimit(x.blocks)
	}
	return x.cc.sendPB(b, dest, x.tag+step, pb, has, exLimit)
}

func (x coll) recv(b []byte, src, step int) error {
	src = x.peer(src)
	st, err := x.cc.recv(b, src, x.tag+step)
	x.observe(st)
	if err == nil && st.Bytes != len(b) {
		err = fmt.Errorf("%w: collective step expected %d bytes from rank %d, got %d (arguments differ across ranks?)", ErrTruncate, len(b), src, st.Bytes)
	}
	return err
}

// sendrecv exchanges with two peers without deadlock: the receive is posted
// first.
func (x coll) sendrecv(sb []byte, dest int, rb []byte, src int, step int) error {
	cc := x.cc
	src = x.peer(src) // dest is mapped by sendStep
	if err := cc.checkRecv(src, x.tag+step); err != nil {
		return err
	}
	// A pooled request: it is complete, and referenced by nothing, once
	// wait returns.
	rr, _ := cc.newRecv(rb, src, x.tag+step, false)
	defer cc.p.states.put(rr)
	if err := cc.p.startRecv(rr); err != nil {
		return err
	}
	if err := x.sendStep(sb, dest, step, true); err != nil {
		_ = rr.cancel()
		_, _ = rr.wait()
		return err
	}
	st, err := rr.wait()
	x.observe(st)
	if err == nil && st.Bytes != len(rb) {
		err = fmt.Errorf("%w: collective step expected %d bytes from rank %d, got %d (arguments differ across ranks?)", ErrTruncate, len(rb), src, st.Bytes)
	}
	return err
}

// checkRoot checks that c is a valid communicator and root one of its ranks.
func checkRoot(c *Comm, root int) error {
	if err := c.valid(); err != nil {
		return err
	}
	if root < 0 || root >= c.size {
		return fmt.Errorf("%w: %d (communicator has %d ranks)", ErrRoot, root, c.size)
	}
	return nil
}

// Bcast sends root's buf to every rank's buf (MPI_Bcast): binomial tree below
// AMGO_BCAST_LARGE bytes, scatter + ring allgather above (van de Geijn).
func Bcast[T any](c *Comm, buf []T, root int) error {
	if err := plain[T](); err != nil {
		return err
	}
	if a := c.readyArea(); a != nil && uint(root) < uint(c.size) && len(buf) > 0 && smallColl(c, raw(buf)) {
		// The common case of a small Bcast on a communicator of one node:
		// through its shared area (coll_shm.go), with runColl's checks and
		// records but without its closure and deferral.
		id := c.p.collBeginBlocking(CallBcast, c, root, len(raw(buf)))
		err := a.bcast(c.areaColl(), raw(buf), root)
		c.p.collEnd(id)
		return err
	}
	if err := agreeType[T](c, CallBcast, len(buf)); err != nil {
		return err
	}
	return c.runColl(CallBcast, root, len(raw(buf)), func(x coll) error {
		if err := checkRoot(c, root); err != nil {
			return err
		}
		return x.bcast(raw(buf), root)
	})
}

// smallColl reports whether a blocking collective of b (per rank) on c,
// whose area is ready, may go straight to the area: c usable, b within one
// slot, no type checking (whose agreement is a collective of its own), no
// tool hooks and no piggybacked values. Bcast, Allreduce and Barrier then
// skip runColl's closure and deferral, not its checks and records.
func smallColl(c *Comm, b []byte) bool {
	return c.usable() && len(b) <= shmCollSlot && !c.checking() && !c.hooked() && c.p.pbTool == nil
}

// areaColl is the collective call of a blocking collective that goes
// straight to c's area (smallColl): runColl's startColl, for a call
// without tools.
func (c *Comm) areaColl() coll {
	return coll{c: c, cc: c.collective(), tag: blockingCollTag}
}

func (x coll) bcast(b []byte, root int) error {
	p := x.size()
	if p == 1 || len(b) == 0 {
		return nil
	}
	if x.v == nil && len(b) <= shmCollSlot {
		if a := x.c.shmArea(); a != nil {
			return a.bcast(x, b, root)
		}
	}
	if l := x.nodeLevels(); l != nil {
		return x.bcastNodes(b, root, l)
	}
	if len(b) < bcastLarge || p < 4 {
		return x.bcastBinomial(b, root, 0)
	}
	return x.bcastScatterAllgather(b, root)
}

// bcastBinomial: ceil(log2 p) rounds; cost log2(p)·(α + nβ).
func (x coll) bcastBinomial(b []byte, root, step int) error {
	p, me := x.size(), x.rank()
	vr := (me - root + p) % p
	mask := 1
	for ; mask < p; mask <<= 1 {
		if vr&mask != 0 {
			if err := x.recv(b, (vr-mask+root)%p, step); err != nil {
				return err
			}
			break
		}
	}
	for mask >>= 1; mask > 0; mask >>= 1 {
		if vr+mask < p {
			if err := x.send(b, (vr+mask+root)%p, step); err != nil {
				return err
			}
		}
	}
	return nil
}

// bcastScatterAllgather: a binomial scatter of p chunks, then a ring
// allgather; cost (log2 p + p - 1)·α + 2·(p-1)/p·nβ.
func (x coll) bcastScatterAllgather(b []byte, root int) error {
	p, me := x.size(), x.rank()
	n := len(b)
	vr := (me - root + p) % p
	chunk := (n + p - 1) / p
	span := func(i int) (int, int) { // bytes of chunk i
		lo := min(i*chunk, n)
		return lo, min(lo+chunk, n)
	}
	cur := 0
	if vr == 0 {
		cur = n
	}
	mask := 1
	for ; mask < p; mask <<= 1 {
		if vr&mask != 0 {
			lo := min(vr*chunk, n)
			hi := min((vr+mask)*chunk, n)
			if hi > lo {
				if err := x.recv(b[lo:hi], (vr-mask+root)%p, 1); err != nil {
					return err
				}
			}
			cur = hi - lo
			break
		}
	}
	for mask >>= 1; mask > 0; mask >>= 1 {
		if vr+mask < p {
			lo := min((vr+mask)*chunk, n)
			hi := min((vr+2*mask)*chunk, n, vr*chunk+cur)
			if hi > lo {
				if err := x.send(b[lo:hi], (vr+mask+root)%p, 1); err != nil {
					return err
				}
				cur -= hi - lo
			}
		}
	}
	// Ring allgather of the chunks, in relative ranks.
	left, right := (me-1+p)%p, (me+1)%p
	for i := 0; i < p-1; i++ {
		sl, sh := span((vr - i + p) % p)
		rl, rh := span((vr - i - 1 + p) % p)
		if err := x.sendrecv(b[sl:sh], right, b[rl:rh], left, 2); err != nil {
			return err
		}
	}
	return nil
}

// Reduce combines every rank's send with op into root's recv (MPI_Reduce):
// a binomial tree, combining in rank order (correct for non-commutative
// operations); cost log2(p)·(α + nβ + nγ). recv is used at root only. A nil
// send at root means in place (recv holds root's contribution).
func Reduce[T any](c *Comm, send, recv []T, op Op[T], root int) error {
	if err := plain[T](); err != nil {
		return err
	}
	if err := agreeType[T](c, CallReduce, max(len(send), len(recv)*btoi(send == nil))); err != nil {
		return err
	}
	return c.runColl(CallReduce, root, len(raw(send)), func(x coll) error {
		if err := checkRoot(c, root); err != nil {
			return err
		}
		return reduce(x, send, recv, op, root)
	})
}

func reduce[T any](x coll, send, recv []T, op Op[T], root int) error {
	if x.rank() == root && send == nil {
		send = recv
	}
	if x.rank() == root && len(recv) != len(send) {
		return fmt.Errorf("%w: Reduce of %d elements into a receive buffer of %d", ErrCount, len(send), len(recv))
	}
	if l := x.nodeLevels(); l != nil && (op.Commutative || l.contiguous) {
		return reduceNodes(x, send, recv, op, root, l)
	}
	return reduceBinomial(x, send, recv, op, root, 0)
}

// reduceBinomial leaves the result in recv at root. Ranks are taken relative
// to root for commutative operations, and in absolute order (result at rank 0,
// then moved to root) otherwise.
func reduceBinomial[T any](x coll, send, recv []T, op Op[T], root, step int) error {
	p, me := x.size(), x.rank()
	n := len(send)
	acc, ha := tempBuf[T](x, n)
	defer x.putTemp(ha)
	copyT(acc, send)
	if p == 1 {
		copyT(recv, acc)
		return nil
	}
	base := root
	if !op.Commutative {
		base = 0
	}
	vr := (me - base + p) % p
	tmp, ht := tempBuf[T](x, n)
	defer x.putTemp(ht)
	for mask := 1; mask < p; mask <<= 1 {
		if vr&mask != 0 {
			if err := x.send(raw(acc), (vr-mask+base)%p, step); err != nil {
				return err
			}
			break
		}
		if vr+mask < p {
			if err := x.recv(raw(tmp), (vr+mask+base)%p, step); err != nil {
				return err
			}
			// acc holds ranks [vr, vr+mask), tmp the next ones: acc ∘ tmp.
			op.Fn(acc, tmp)
			acc, tmp = tmp, acc
		}
	}
	if base == root {
		if me == root {
			copyT(recv, acc)
		}
		return nil
	}
	// Non-commutative with root != 0: rank 0 holds the result.
	switch me {
	case 0:
		return x.send(raw(acc), root, step+1)
	case root:
		return x.recv(raw(recv), 0, step+1)
	}
	return nil
}

// Allreduce combines every rank's send with op into every rank's recv
// (MPI_Allreduce). Commutative operations: recursive doubling below
// AMGO_ALLREDUCE_RABENSEIFNER bytes (log2(p)·(α + nβ + nγ)), Rabenseifner's
// reduce-scatter + allgather up to AMGO_ALLREDUCE_RING (2·log2(p)·α +
// 2·(p-1)/p·nβ + (p-1)/p·nγ), the ring above (2·(p-1)·α + 2·(p-1)/p·nβ);
// non-power-of-two sizes fold the extra ranks in first. Non-commutative
// operations: Reduce to rank 0 in rank order, then Bcast. A nil send means in
// place (recv holds the contribution).
func Allreduce[T any](c *Comm, send, recv []T, op Op[T]) error {
	if err := plain[T](); err != nil {
		return err
	}
	if a := c.readyArea(); a != nil && len(recv) > 0 && (send == nil || len(send) == len(recv)) && smallColl(c, raw(recv)) {
		// As Bcast's: a small Allreduce straight to the shared area.
		if send == nil {
			send = recv
		}
		id := c.p.collBeginBlocking(CallAllreduce, c, AnySource, len(raw(recv)))
		err := shmAllreduce(a, c.areaColl(), send, recv, op)
		c.p.collEnd(id)
		return err
	}
	if err := agreeType[T](c, CallAllreduce, len(recv)); err != nil {
		return err
	}
	return c.runColl(CallAllreduce, AnySource, len(raw(recv)), func(x coll) error {
		return allreduce(x, send, recv, op)
	})
}

func allreduce[T any](x coll, send, recv []T, op Op[T]) error {
	if send == nil {
		send = recv
	}
	if len(recv) != len(send) {
		return fmt.Errorf("%w: Allreduce of %d elements into a receive buffer of %d", ErrCount, len(send), len(recv))
	}
	p := x.size()
	if x.v == nil && p > 1 && len(raw(recv)) <= shmCollSlot {
		if a := x.c.shmArea(); a != nil {
			return shmAllreduce(a, x, send, recv, op)
		}
	}
	if l := x.nodeLevels(); l != nil && (op.Commutative || l.contiguous) {
		return allreduceNodes(x, send, recv, op, l)
	}
	if !op.Commutative {
		if err := reduceBinomial(x, send, recv, op, 0, 0); err != nil {
			return err
		}
		return x.bcastBinomial(raw(recv), 0, 2)
	}
	if len(recv) == 0 {
		return nil
	}
	inPlace := &send[0] == &recv[0]
	nb := len(raw(recv))
	amOK := allreduceAMOK(x, nb, op)
	if p > 1 && !inPlace && len(recv) >= p && !amOK {
		// Large vectors from a send buffer of their own: no copy into recv
		// first (allreduceRingAlg).
		switch {
		case nb >= allreduceRing:
			return allreduceRingAlg(x, send, recv, op)
		case nb >= allreduceRabenseifner && p&(p-1) == 0:
			return allreduceRabenseifnerAlg(x, send, recv, op)
		}
	}
	if !inPlace {
		copyT(recv, send)
	}
	if p == 1 {
		return nil
	}
	if amOK {
		return allreduceAM(x, recv, op)
	}
	switch {
	case nb >= allreduceRing && len(recv) >= p:
		return allreduceRingAlg(x, nil, recv, op)
	case nb >= allreduceRabenseifner && len(recv) >= p:
		return allreduceRabenseifnerAlg(x, nil, recv, op)
	}
	return allreduceRecursiveDoubling(x, recv, op)
}

// foldIn handles a non-power-of-two size: of the first 2·rem ranks, each even
// one sends its data to the odd one above it and sits out. It returns the
// rank's new rank among the p' = 2^floor(log2 p) active ones, or -1.
func foldIn[T any](x coll, buf []T, op Op[T], step int) (newRank, pof2, rem int, err error) {
	p, me := x.size(), x.rank()
	pof2 = 1 << (bits.Len(uint(p)) - 1)
	rem = p - pof2
	if me < 2*rem {
		if me%2 == 0 {
			return -1, pof2, rem, x.send(raw(buf), me+1, step)
		}
		tmp, h := tempBuf[T](x, len(buf))
		defer x.putTemp(h)
		if err := x.recv(raw(tmp), me-1, step); err != nil {
			return 0, 0, 0, err
		}
		op.Fn(tmp, buf) // the lower rank's data comes first
		return me / 2, pof2, rem, nil
	}
	return me - rem, pof2, rem, nil
}

// realRank maps a rank among the p' active ones back to the communicator.
func realRank(nr, rem int) int {
	if nr < rem {
		return nr*2 + 1
	}
	return nr + rem
}

// foldOut sends the result back to the ranks that sat out.
func foldOut[T any](x coll, buf []T, newRank, rem, step int) error {
	me := x.rank()
	if me < 2*rem {
		if me%2 == 0 {
			return x.recv(raw(buf), me+1, step)
		}
		return x.send(raw(buf), me-1, step)
	}
	_ = newRank
	return nil
}

// combine folds a partner's data tmp into buf (buf = tmp ∘ buf when the
// partner's rank is lower, else buf ∘ tmp, tmp clobbered), so that both
// partners compute the same bits whatever the operation's rounding.
func combine[T any](op Op[T], buf, tmp []T, partnerLower bool) {
	if partnerLower {
		op.Fn(tmp, buf)
		return
	}
	op.Fn(buf, tmp)
	copyT(buf, tmp)
}

func allreduceRecursiveDoubling[T any](x coll, buf []T, op Op[T]) error {
	nr, pof2, rem, err := foldIn(x, buf, op, 0)
	if err != nil {
		return err
	}
	if nr >= 0 {
		tmp, h := tempBuf[T](x, len(buf))
		defer x.putTemp(h)
		for mask := 1; mask < pof2; mask <<= 1 {
			partner := realRank(nr^mask, rem)
			if err := x.sendrecv(raw(buf), partner, raw(tmp), partner, 1); err != nil {
				return err
			}
			combine(op, buf, tmp, nr^mask < nr)
		}
	}
	return foldOut(x, buf, nr, rem, 2)
}

// tempBuf returns a scratch slice of n elements, contents undefined, from
// the process's pool of unexpected-message buffers (T holds no pointers, see
// plain), and the handle that putTemp gives back; a collective's temporaries
// then cost no allocation per call.
func tempBuf[T any](x coll, n int) ([]T, *[]byte) {
	var z T
	if n == 0 || unsafe.Sizeof(z) == 0 {
		return make([]T, n), nil
	}
	h := x.c.p.payloads.get(n * int(unsafe.Sizeof(z)))
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(*h))), n), h
}

// putTemp returns a tempBuf buffer to the pool; h may be nil.
func (x coll) putTemp(h *[]byte) {
	if h != nil {
		x.c.p.payloads.put(h)
	}
}

// allreduceRabenseifnerAlg: reduce-scatter by recursive halving, then
// allgather by recursive doubling, among the p' ranks after the fold. With
// send nil, buf holds this rank's data; otherwise (a power-of-two number of
// ranks only) send does, apart from buf, and is not copied into buf first:
// the first halving step sends its half straight from send and receives the
// partner's into buf, folding this rank's own half of send into it (see
// allreduceRingAlg).
func allreduceRabenseifnerAlg[T any](x coll, send, buf []T, op Op[T]) error {
	nr, pof2, rem := x.rank(), x.size(), 0
	if send == nil {
		var err error
		if nr, pof2, rem, err = foldIn(x, buf, op, 0); err != nil {
			return err
		}
	}
	if nr >= 0 {
		n := len(buf)
		tmp, h := tempBuf[T](x, n)
		defer x.putTemp(h)
		// Block i of pof2 blocks ends up reduced at new rank i.
		lo, hi := 0, pof2 // the range of blocks this rank is responsible for
		first := send != nil
		for mask := pof2 >> 1; mask > 0; mask >>= 1 {
			partner := nr ^ mask
			mid := lo + (hi-lo)/2
			var keepLo, keepHi, sendLo, sendHi int
			if nr&mask == 0 {
				keepLo, keepHi, sendLo, sendHi = lo, mid, mid, hi
			} else {
				keepLo, keepHi, sendLo, sendHi = mid, hi, lo, mid
			}
			sl, _ := sched.BlockSpan(n, pof2, sendLo)
			_, sh := sched.BlockSpan(n, pof2, sendHi-1)
			kl, _ := sched.BlockSpan(n, pof2, keepLo)
			_, kh := sched.BlockSpan(n, pof2, keepHi-1)
			if first {
				first = false
				if err := x.sendrecv(raw(send[sl:sh]), partner, raw(buf[kl:kh]), partner, 1); err != nil {
					return err
				}
				op.Fn(send[kl:kh], buf[kl:kh]) // commutative, as below
				lo, hi = keepLo, keepHi
				continue
			}
			if err := x.sendrecv(raw(buf[sl:sh]), realRank(partner, rem), raw(tmp[kl:kh]), realRank(partner, rem), 1); err != nil {
				return err
			}
			// The operation is commutative (allreduce sends the others to
			// reduceBinomial), so the partner's half goes first whichever
			// rank it is, with no copy back: each block is reduced on one
			// rank only, so every rank still gets the same bits.
			op.Fn(tmp[kl:kh], buf[kl:kh])
			lo, hi = keepLo, keepHi
		}
		// Allgather by recursive doubling: the owned range doubles each step.
		for mask := 1; mask < pof2; mask <<= 1 {
			partner := nr ^ mask
			size := hi - lo
			var plo, phi int
			if nr&mask == 0 {
				plo, phi = hi, hi+size
			} else {
				plo, phi = lo-size, lo
			}
			ml, _ := sched.BlockSpan(n, pof2, lo)
			_, mh := sched.BlockSpan(n, pof2, hi-1)
			pl, _ := sched.BlockSpan(n, pof2, plo)
			_, ph := sched.BlockSpan(n, pof2, phi-1)
			if err := x.sendrecv(raw(buf[ml:mh]), realRank(partner, rem), raw(buf[pl:ph]), realRank(partner, rem), 2); err != nil {
				return err
			}
			lo, hi = min(lo, plo), max(hi, phi)
		}
	}
	return foldOut(x, buf, nr, rem, 3)
}

// allreduceRingAlg: p-1 reduce-scatter steps around the ring, then p-1
// allgather steps; bandwidth-optimal for long vectors, any p. With send nil,
// buf holds this rank's data; otherwise send does, apart from buf, and is not
// copied into buf first: the first step sends its block straight from send,
// and each reduce-scatter step receives its block into buf and folds this
// rank's own block of send into it (buf = send ∘ buf: the operation is
// commutative). Besides the copy, what this saves is a transfer of lines just
// written: the other rank's copy of a block this rank has written last reads
// it out of this core's cache, at about half the speed of reading lines
// nobody has written since (the send buffer of a loop of Allreduce calls),
// docs/performance.md.
func allreduceRingAlg[T any](x coll, send, buf []T, op Op[T]) error {
	p, me := x.size(), x.rank()
	n := len(buf)
	left, right := (me-1+p)%p, (me+1)%p
	var tmp []T
	if send == nil {
		_, maxHi := sched.BlockSpan(n, p, 0)
		var h *[]byte
		tmp, h = tempBuf[T](x, maxHi)
		defer x.putTemp(h)
	}
	for i := 0; i < p-1; i++ {
		sl, sh := sched.BlockSpan(n, p, (me-i+p)%p)
		rl, rh := sched.BlockSpan(n, p, (me-i-1+p)%p)
		out, own := buf[sl:sh], buf[rl:rh] // out: the block reduced in the step before
		in := own
		if send == nil {
			in = tmp[:rh-rl]
		} else if i == 0 {
			out = send[sl:sh]
		}
		if err := x.sendrecv(raw(out), right, raw(in), left, 1); err != nil {
			return err
		}
		// Commutative only: order does not matter.
		if send == nil {
			op.Fn(in, own)
		} else {
			op.Fn(send[rl:rh], own)
		}
	}
	for i := 0; i < p-1; i++ {
		sl, sh := sched.BlockSpan(n, p, (me+1-i+p)%p)
		rl, rh := sched.BlockSpan(n, p, (me-i+p)%p)
		if err := x.sendrecv(raw(buf[sl:sh]), right, raw(buf[rl:rh]), left, 2); err != nil {
			return err
		}
	}
	return nil
}

// Gather collects every rank's send (len(send) elements each) into root's
// recv, in rank order (MPI_Gather): linear, root receives from every rank;
// cost (p-1)·(α + nβ) at root. A nil send at root means in place (root's
// block is already in recv).
func Gather[T any](c *Comm, send, recv []T, root int) error {
	if err := plain[T](); err != nil {
		return err
	}
	if err := agreeType[T](c, CallGather, rootBlock(c, root, len(send), len(recv))); err != nil {
		return err
	}
	return c.runColl(CallGather, root, len(raw(send)), func(x coll) error {
		if err := checkRoot(c, root); err != nil {
			return err
		}
		p := c.size
		l := x.nodeLevels()
		if c.rank != root {
			if l != nil {
				sb := raw(send)
				return x.gatherNodes(sb, nil, len(sb), root, l)
			}
			return x.send(raw(send), root, 0)
		}
		if len(recv)%p != 0 {
			return fmt.Errorf("%w: Gather receive buffer of %d elements for %d ranks", ErrCount, len(recv), p)
		}
		k := len(recv) / p
		if send != nil {
			if len(send) != k {
				return fmt.Errorf("%w: Gather of %d elements per rank into blocks of %d", ErrCount, len(send), k)
			}
			copyT(recv[root*k:], send)
		}
		if l != nil {
			rb := raw(recv)
			kb := len(rb) / p
			return x.gatherNodes(rb[root*kb:(root+1)*kb], rb, kb, root, l)
		}
		counts, displs := make([]int, p), make([]int, p)
		for i := range counts {
			counts[i], displs[i] = k, i*k
		}
		return gathervRoot(x, recv, counts, displs)
	})
}

func gathervRoot[T any](x coll, recv []T, counts, displs []int) error {
	reqs := make([]Request, 0, x.size())
	for i := 0; i < x.size(); i++ {
		if i == x.rank() {
			continue
		}
		r, err := x.cc.irecv(raw(recv[displs[i]:displs[i]+counts[i]]), x.peer(i), x.tag)
		if err != nil {
			return err
		}
		reqs = append(reqs, r)
	}
	return waitall(reqs, nil)
}

func checkV(p, n int, counts, displs []int, what string) error {
	if len(counts) != p || len(displs) != p {
		return fmt.Errorf("%w: %s needs %d counts and displacements, got %d and %d", ErrCount, what, p, len(counts), len(displs))
	}
	for i := range counts {
		if counts[i] < 0 || displs[i] < 0 || displs[i]+counts[i] > n {
			return fmt.Errorf("%w: %s block %d [%d,+%d) outside a buffer of %d", ErrCount, what, i, displs[i], counts[i], n)
		}
	}
	return nil
}

// Gatherv is Gather with a count and displacement (in elements) per rank at
// root (MPI_Gatherv). A nil send at root means in place.
func Gatherv[T any](c *Comm, send, recv []T, counts, displs []int, root int) error {
	if err := plain[T](); err != nil {
		return err
	}
	return c.runColl(CallGatherv, root, len(raw(send)), func(x coll) error {
		if err := checkRoot(c, root); err != nil {
			return err
		}
		if c.rank != root {
			return x.send(raw(send), root, 0)
		}
		if err := checkV(c.size, len(recv), counts, displs, "Gatherv"); err != nil {
			return err
		}
		if send != nil {
			copyT(recv[displs[root]:displs[root]+counts[root]], send)
		}
		return gathervRoot(x, recv, counts, displs)
	})
}

// Scatter sends block i of root's send (len(recv) elements each) to rank i's
// recv (MPI_Scatter): linear from root; cost (p-1)·(α + nβ) at root. A nil
// recv at root means in place (root keeps its block in send).
func Scatter[T any](c *Comm, send, recv []T, root int) error {
	if err := plain[T](); err != nil {
		return err
	}
	if err := agreeType[T](c, CallScatter, rootBlock(c, root, len(recv), len(send))); err != nil {
		return err
	}
	return c.runColl(CallScatter, root, len(raw(recv)), func(x coll) error {
		if err := checkRoot(c, root); err != nil {
			return err
		}
		p := c.size
		if c.rank != root {
			return x.recv(raw(recv), root, 0)
		}
		if len(send)%p != 0 {
			return fmt.Errorf("%w: Scatter send buffer of %d elements for %d ranks", ErrCount, len(send), p)
		}
		k := len(send) / p
		counts, displs := make([]int, p), make([]int, p)
		for i := range counts {
			counts[i], displs[i] = k, i*k
		}
		if recv != nil {
			copyT(recv, send[root*k:(root+1)*k])
		}
		return scattervRoot(x, send, counts, displs)
	})
}

func scattervRoot[T any](x coll, send []T, counts, displs []int) error {
	reqs := make([]Request, 0, x.size())
	for i := 0; i < x.size(); i++ {
		if i == x.rank() {
			continue
		}
		r, err := x.cc.isend(raw(send[displs[i]:displs[i]+counts[i]]), x.peer(i), x.tag, Standard)
		if err != nil {
			return err
		}
		reqs = append(reqs, r)
	}
	return waitall(reqs, nil)
}

// Scatterv is Scatter with a count and displacement (in elements) per rank at
// root (MPI_Scatterv). A nil recv at root means in place.
func Scatterv[T any](c *Comm, send []T, counts, displs []int, recv []T, root int) error {
	if err := plain[T](); err != nil {
		return err
	}
	return c.runColl(CallScatterv, root, len(raw(recv)), func(x coll) error {
		if err := checkRoot(c, root); err != nil {
			return err
		}
		if c.rank != root {
			return x.recv(raw(recv), root, 0)
		}
		if err := checkV(c.size, len(send), counts, displs, "Scatterv"); err != nil {
			return err
		}
		if recv != nil {
			copyT(recv, send[displs[root]:displs[root]+counts[root]])
		}
		return scattervRoot(x, send, counts, displs)
	})
}

// Allgather collects every rank's send into every rank's recv, in rank order
// (MPI_Allgather): recursive doubling for power-of-two sizes up to
// AMGO_ALLGATHER_RD bytes in total (log2(p)·α + (p-1)/p·nβ), the ring
// otherwise ((p-1)·α + (p-1)/p·nβ). A nil send means in place (the rank's block
// is already in recv).
func Allgather[T any](c *Comm, send, recv []T) error {
	if err := plain[T](); err != nil {
		return err
	}
	if err := agreeType[T](c, CallAllgather, perRank(c, len(recv))); err != nil {
		return err
	}
	return c.runColl(CallAllgather, AnySource, len(raw(send)), func(x coll) error {
		return allgather(x, send, recv)
	})
}

func allgather[T any](x coll, send, recv []T) error {
	c := x.c
	p := c.size
	if len(recv)%p != 0 {
		return fmt.Errorf("%w: Allgather receive buffer of %d elements for %d ranks", ErrCount, len(recv), p)
	}
	k := len(recv) / p
	if send != nil {
		if len(send) != k {
			return fmt.Errorf("%w: Allgather of %d elements per rank into blocks of %d", ErrCount, len(send), k)
		}
		copyT(recv[c.rank*k:], send)
	}
	if l := x.nodeLevels(); l != nil && k > 0 {
		return x.allgatherNodes(raw(recv), len(raw(recv))/p, l)
	}
	if p&(p-1) == 0 && len(raw(recv)) <= allgatherRD {
		return allgatherRecursiveDoubling(x, recv, k)
	}
	counts, displs := make([]int, p), make([]int, p)
	for i := range counts {
		counts[i], displs[i] = k, i*k
	}
	return allgatherRing(x, recv, counts, displs)
}

func allgatherRecursiveDoubling[T any](x coll, recv []T, k int) error {
	p, me := x.size(), x.rank()
	for mask := 1; mask < p; mask <<= 1 {
		partner := me ^ mask
		myLo := (me &^ (mask - 1)) * k
		pLo := (partner &^ (mask - 1)) * k
		if err := x.sendrecv(raw(recv[myLo:myLo+mask*k]), partner, raw(recv[pLo:pLo+mask*k]), partner, 1); err != nil {
			return err
		}
	}
	return nil
}

func allgatherRing[T any](x coll, recv []T, counts, displs []int) error {
	p, me := x.size(), x.rank()
	left, right := (me-1+p)%p, (me+1)%p
	for i := 0; i < p-1; i++ {
		sb := (me - i + p) % p
		rb := (me - i - 1 + p) % p
		if err := x.sendrecv(raw(recv[displs[sb]:displs[sb]+counts[sb]]), right,
			raw(recv[displs[rb]:displs[rb]+counts[rb]]), left, 2); err != nil {
			return err
		}
	}
	return nil
}

// Allgatherv is Allgather with a count and displacement (in elements) per
// rank (MPI_Allgatherv): the ring. A nil send means in place.
func Allgatherv[T any](c *Comm, send, recv []T, counts, displs []int) error {
	if err := plain[T](); err != nil {
		return err
	}
	return c.runColl(CallAllgatherv, AnySource, len(raw(send)), func(x coll) error {
		if err := checkV(c.size, len(recv), counts, displs, "Allgatherv"); err != nil {
			return err
		}
		if send != nil {
			if len(send) != counts[c.rank] {
				return fmt.Errorf("%w: Allgatherv of %d elements where counts[%d] is %d", ErrCount, len(send), c.rank, counts[c.rank])
			}
			copyT(recv[displs[c.rank]:], send)
		}
		return allgatherRing(x, recv, counts, displs)
	})
}

// Alltoall sends block j of every rank's send to rank j, which stores it as
// block i of its recv (MPI_Alltoall): through the communicator's shared area
// when its ranks share a node and recv is at most 4 KiB (coll_shm.go); else
// Bruck's algorithm up to AMGO_ALLTOALL_BRUCK bytes per block (log2(p)·α +
// (p/2)·log2(p)·nβ), pairwise exchange above ((p-1)·(α + nβ)). A nil send
// means in place.
func Alltoall[T any](c *Comm, send, recv []T) error {
	if err := plain[T](); err != nil {
		return err
	}
	if a := c.readyArea(); a != nil && len(recv) > 0 && len(recv)%c.size == 0 && (send == nil || len(send) == len(recv)) && smallColl(c, raw(recv)) {
		// As Bcast's: a small Alltoall straight to the shared area.
		id := c.p.collBeginBlocking(CallAlltoall, c, AnySource, len(raw(recv)))
		err := shmAlltoall(a, c.areaColl(), send, recv)
		c.p.collEnd(id)
		return err
	}
	if err := agreeType[T](c, CallAlltoall, perRank(c, len(recv))); err != nil {
		return err
	}
	return c.runColl(CallAlltoall, AnySource, len(raw(send)), func(x coll) error {
		return alltoall(x, send, recv)
	})
}

func alltoall[T any](x coll, send, recv []T) error {
	p := x.size()
	if send == nil && len(recv)%p != 0 {
		return fmt.Errorf("%w: in-place Alltoall of %d elements for %d ranks", ErrCount, len(recv), p)
	}
	if send != nil && (len(send) != len(recv) || len(recv)%p != 0) {
		return fmt.Errorf("%w: Alltoall of %d elements into %d for %d ranks", ErrCount, len(send), len(recv), p)
	}
	if x.v == nil && p > 1 && len(recv) > 0 && len(raw(recv)) <= shmCollSlot {
		if a := x.c.shmArea(); a != nil {
			return shmAlltoall(a, x, send, recv)
		}
	}
	if send == nil {
		send = append([]T(nil), recv...)
	}
	k := len(recv) / p
	if k > 0 && len(raw(recv[:k])) <= alltoallBruck && p > 2 {
		return alltoallBruckAlg(x, send, recv, k)
	}
	counts, displs := make([]int, p), make([]int, p)
	for i := range counts {
		counts[i], displs[i] = k, i*k
	}
	return alltoallPairwise(x, send, counts, displs, recv, counts, displs)
}

func alltoallPairwise[T any](x coll, send []T, scounts, sdispls []int, recv []T, rcounts, rdispls []int) error {
	p, me := x.size(), x.rank()
	x.blocks = true
	copyT(recv[rdispls[me]:rdispls[me]+rcounts[me]], send[sdispls[me]:sdispls[me]+scounts[me]])
	for i := 1; i < p; i++ {
		dst, src := (me+i)%p, (me-i+p)%p
		if err := x.sendrecv(raw(send[sdispls[dst]:sdispls[dst]+scounts[dst]]), dst,
			raw(recv[rdispls[src]:rdispls[src]+rcounts[src]]), src, 1); err != nil {
			return err
		}
	}
	return nil
}

// alltoallBruckAlg (Bruck et al. 1997): rotate the blocks, then in phase k send
// every block whose index has bit k set to rank+2^k, then rotate back.
func alltoallBruckAlg[T any](x coll, send, recv []T, k int) error {
	p, me := x.size(), x.rank()
	tmp := make([]T, p*k)
	for i := 0; i < p; i++ { // tmp block i = send block (me+i) mod p
		copyT(tmp[i*k:(i+1)*k], send[((me+i)%p)*k:])
	}
	pack := make([]T, 0, (p/2+1)*k)
	unpack := make([]T, (p/2+1)*k)
	for pof2 := 1; pof2 < p; pof2 <<= 1 {
		pack = pack[:0]
		nblk := 0
		for i := 0; i < p; i++ {
			if i&pof2 != 0 {
				pack = append(pack, tmp[i*k:(i+1)*k]...)
				nblk++
			}
		}
		dst, src := (me+pof2)%p, (me-pof2+p)%p
		u := unpack[:nblk*k]
		if err := x.sendrecv(raw(pack), dst, raw(u), src, 1); err != nil {
			return err
		}
		j := 0
		for i := 0; i < p; i++ {
			if i&pof2 != 0 {
				copyT(tmp[i*k:(i+1)*k], u[j*k:(j+1)*k])
				j++
			}
		}
	}
	for i := 0; i < p; i++ { // recv block (me-i) mod p = tmp block i
		copyT(recv[((me-i+p)%p)*k:], tmp[i*k:(i+1)*k])
	}
	return nil
}

// Alltoallv is Alltoall with counts and displacements (in elements) per rank
// on both sides (MPI_Alltoallv): pairwise exchange.
func Alltoallv[T any](c *Comm, send []T, scounts, sdispls []int, recv []T, rcounts, rdispls []int) error {
	if err := plain[T](); err != nil {
		return err
	}
	return c.runColl(CallAlltoallv, AnySource, len(raw(send)), func(x coll) error {
		if err := checkV(c.size, len(send), scounts, sdispls, "Alltoallv send"); err != nil {
			return err
		}
		if err := checkV(c.size, len(recv), rcounts, rdispls, "Alltoallv receive"); err != nil {
			return err
		}
		return alltoallPairwise(x, send, scounts, sdispls, recv, rcounts, rdispls)
	})
}

// ReduceScatterBlock combines every rank's send (p blocks of len(recv)
// elements) with op and leaves block i of the result in rank i's recv
// (MPI_Reduce_scatter_block): the ring reduce-scatter for commutative
// operations ((p-1)·(α + nβ/p + nγ/p)); Reduce to rank 0 and Scatter
// otherwise. A nil send means in place: recv then holds all p blocks on entry
// and block rank's result in its first len(recv)/p elements on return.
func ReduceScatterBlock[T any](c *Comm, send, recv []T, op Op[T]) error {
	if err := plain[T](); err != nil {
		return err
	}
	if err := agreeType[T](c, CallReduceScatterBlock, len(recv)/max(1, c.sizeIf(send == nil))); err != nil {
		return err
	}
	return c.runColl(CallReduceScatterBlock, AnySource, len(raw(send)), func(x coll) error {
		p := c.size
		k := len(recv)
		if send == nil {
			if k%p != 0 {
				return fmt.Errorf("%w: in-place ReduceScatterBlock of %d elements for %d ranks", ErrCount, k, p)
			}
			send, k = append([]T(nil), recv...), k/p
		}
		if len(send) != k*p {
			return fmt.Errorf("%w: ReduceScatterBlock of %d elements into blocks of %d for %d ranks", ErrCount, len(send), k, p)
		}
		if !op.Commutative {
			var all []T
			if c.rank == 0 {
				all = make([]T, len(send))
			}
			if err := reduceBinomial(x, send, all, op, 0, 0); err != nil {
				return err
			}
			if c.rank != 0 {
				return x.recv(raw(recv[:k]), 0, 2)
			}
			copyT(recv[:k], all[:k])
			for i := 1; i < p; i++ {
				if err := x.send(raw(all[i*k:(i+1)*k]), i, 2); err != nil {
					return err
				}
			}
			return nil
		}
		buf := append([]T(nil), send...)
		me := c.rank
		left, right := (me-1+p)%p, (me+1)%p
		tmp := make([]T, k)
		for i := 0; i < p-1; i++ {
			sb := (me - i - 1 + p) % p
			rb := (me - i - 2 + p) % p
			if err := x.sendrecv(raw(buf[sb*k:(sb+1)*k]), right, raw(tmp), left, 1); err != nil {
				return err
			}
			op.Fn(tmp, buf[rb*k:(rb+1)*k])
		}
		copyT(recv[:k], buf[me*k:(me+1)*k])
		return nil
	})
}

// Scan computes the inclusive prefix reduction: rank i's recv gets
// send_0 ∘ ... ∘ send_i (MPI_Scan): recursive doubling, log2(p)·(α + nβ + nγ),
// in rank order. A nil send means in place.
func Scan[T any](c *Comm, send, recv []T, op Op[T]) error {
	return scan(c, send, recv, op, false)
}

// Exscan computes the exclusive prefix reduction: rank i's recv gets
// send_0 ∘ ... ∘ send_(i-1); rank 0's recv is left untouched (MPI_Exscan). A
// nil send means in place.
func Exscan[T any](c *Comm, send, recv []T, op Op[T]) error {
	return scan(c, send, recv, op, true)
}

func scan[T any](c *Comm, send, recv []T, op Op[T], exclusive bool) error {
	if err := plain[T](); err != nil {
		return err
	}
	call := CallScan
	if exclusive {
		call = CallExscan
	}
	if err := agreeType[T](c, call, len(recv)); err != nil {
		return err
	}
	return c.runColl(call, AnySource, len(raw(send)), func(x coll) error {
		if send == nil {
			send = append([]T(nil), recv...)
		}
		if len(send) != len(recv) {
			return fmt.Errorf("%w: scan of %d elements into a buffer of %d", ErrCount, len(send), len(recv))
		}
		p, me := c.size, c.rank
		n := len(send)
		partial := append([]T(nil), send...) // reduction of the ranks this one has heard from, including itself
		have := !exclusive                   // whether recv holds a value yet
		if !exclusive {
			copyT(recv, send)
		}
		tmp := make([]T, n)
		for mask := 1; mask < p; mask <<= 1 {
			partner := me ^ mask
			if partner >= p {
				continue
			}
			if err := x.sendrecv(raw(partial), partner, raw(tmp), partner, 1); err != nil {
				return err
			}
			if partner < me {
				// tmp covers lower ranks: it goes in front.
				op.Fn(tmp, partial)
				if have {
					op.Fn(tmp, recv)
				} else {
					copyT(recv, tmp)
					have = true
				}
			} else {
				// tmp covers higher ranks: it goes behind.
				op.Fn(partial, tmp)
				copyT(partial, tmp)
			}
		}
		return nil
	})
}
