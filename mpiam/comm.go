package mpiam

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"

	"github.com/amgo-hpc/amgo/internal/cacheline"
)

// Comm is a communicator (MPI_Comm): a group of ranks and a context that
// separates its messages from every other communicator's. Point-to-point
// traffic uses the context id, collective traffic the next one (context+1), so
// that a collective never matches a user's message (MPI-4.1 §6.1.2).
type Comm struct {
	p     *proc
	ctx   uint32 // even; ctx+1 carries this communicator's collective traffic
	rank  int
	size  int
	ranks []int // communicator rank -> world rank; nil means identity (world)
	freed atomic.Bool
	noted bool // recorded in p.fail.comms (p.mu): a receive has been posted on c

	// sendSeq numbers the messages to each rank of c (MPI-4.1 §3.5
	// non-overtaking). A goroutine takes its number and sends without a lock:
	// one goroutine's sends leave in number order; two goroutines that race
	// may reach the network out of order, and the receiver holds the early
	// one until the gap fills (MPI orders only one thread's sends). Taken
	// with an atomic add, or a plain increment at a single-threaded
	// level (nextSeq).
	sendSeq []uint32

	collSeq atomic.Uint32 // collective calls started on c: tags of their messages
	coll    *Comm         // c's collective context (ctx+1), nil for that one itself

	barriers atomic.Uint64                 // Barrier and Ibarrier calls started on c (coll_am.go)
	bar      atomic.Pointer[barrierCounts] // this rank's arrival counts of c's barrier messages, once looked up
	ar       atomic.Pointer[arState]       // this rank's small-allreduce slots on c, once looked up (coll_amreduce.go)
	arCalls  atomic.Uint64                 // small allreduces over active messages started on c
	lv       atomic.Pointer[levels]        // how c's ranks sit on nodes, once computed (coll_node.go)
	shmState atomic.Int32                  // whether c's collectives go through a shared area (coll_shm.go)
	shmc     *shmColl                      // that area, set before shmState becomes shmReady

	// nbcq is c's nonblocking and persistent collectives under way, in
	// the order they started, from nbcHead on (proc.nbc.mu): each is
	// reported complete only after those before it (coll_sched.go).
	nbcq    []*nbc
	nbcHead int
	// schedCache keeps finished one-shot operations for calls with the
	// same arguments (proc.nbc.mu; coll_sched.go), replaced in turn from
	// schedNext.
	schedCache [schedCacheSize]*nbc
	schedNext  int

	name atomic.Pointer[string] // SetName's (info.go); nil: the default

	cart   *cartTopo     // the Cartesian topology CartCreate or CartSub attached; nil: none (topo.go)
	graph  *graphTopo    // the distributed graph DistGraphCreate(Adjacent) attached; nil: none (neighbor.go)
	ggraph *generalGraph // the graph GraphCreate attached; nil: none (graph.go)
}

// Rank is the calling process's rank in c (MPI_Comm_rank), or Undefined for
// the nil communicator (MPI_COMM_NULL, what Split with color Undefined returns).
func (c *Comm) Rank() int {
	if c == nil {
		return Undefined
	}
	return c.rank
}

// Size is the number of ranks in c (MPI_Comm_size), 0 for the nil communicator.
func (c *Comm) Size() int {
	if c == nil {
		return 0
	}
	return c.size
}

// Network names the network that carries this rank's messages to rank r
// of c: "shm", "tcp", "udp", "xdp", "loop" or "sim" (docs/transports.md),
// the same for every message to r; "" for the nil communicator or a rank
// out of range. An amgo extension for diagnostics (MPI has no such call;
// SplitType with CommTypeShared tells which ranks share this node).
func (c *Comm) Network(r int) string {
	if c == nil || c.p == nil || uint(r) >= uint(c.size) {
		return ""
	}
	return c.p.ep.Network(c.world(r))
}

// Context is c's context id, for tools and diagnostics; 0 for the nil
// communicator.
func (c *Comm) Context() uint32 {
	if c == nil {
		return 0
	}
	return c.ctx
}

func (c *Comm) world(r int) int {
	if c.ranks == nil {
		return r
	}
	return c.ranks[r]
}

// valid reports whether c can be used: ErrComm for a nil or freed
// communicator, ErrFinalized after Finalize, ErrThread for calls that
// collided under a single-threaded level. The common case inlines.
func (c *Comm) valid() error {
	if c.usable() {
		return nil
	}
	return c.invalid()
}

// usable is valid's common case, inlined into the argument checks of every
// call: c is not nil, not freed, its rank neither finalized nor found
// called by two goroutines at once under a single-threaded level.
func (c *Comm) usable() bool {
	if c == nil {
		return false
	}
	p := c.p
	return p != nil && !p.seq.Collided() && !c.freed.Load() && !p.finalized.Load()
}

// invalid is valid's error path.
func (c *Comm) invalid() error {
	if c == nil || c.p == nil {
		return fmt.Errorf("%w: nil communicator", ErrComm)
	}
	if c.p.seq.Collided() {
		return c.p.threadErr()
	}
	if c.freed.Load() {
		return fmt.Errorf("%w: communicator %d was freed", ErrComm, c.ctx)
	}
	if c.p.finalized.Load() {
		return ErrFinalized
	}
	return nil
}

// nextSeq takes the sequence number of c's next message to rank dest.
func (c *Comm) nextSeq(dest int) uint32 {
	s := &c.sendSeq[dest]
	if c.p.seq != nil { // one goroutine at a time: a plain increment
		v := *s
		*s = v + 1
		return v
	}
	return atomic.AddUint32(s, 1) - 1
}

// collective returns the hidden communicator of c's collective traffic.
func (c *Comm) collective() *Comm {
	if c.coll != nil {
		return c.coll
	}
	return c // c carries collective traffic itself
}

// newComm makes a communicator over the given world ranks (nil: identity) with
// context ctx, and its collective context.
func (p *proc) newComm(ctx uint32, rank, size int, ranks []int) *Comm {
	// Off other objects' cache lines: goroutine ranks share one heap
	// (internal/cacheline).
	c := cacheline.New[Comm]()
	*c = Comm{p: p, ctx: ctx, rank: rank, size: size, ranks: ranks, sendSeq: cacheline.Slice[uint32](size)}
	c.coll = cacheline.New[Comm]()
	*c.coll = Comm{p: p, ctx: ctx + 1, rank: rank, size: size, ranks: ranks, sendSeq: cacheline.Slice[uint32](size)}
	return c
}

// collTag returns the tag base of the next nonblocking collective call on c
// (or of an internal agreement such as Dup's): every rank calls collectives on
// c in the same order (MPI-4.1 §6.12), so the k-th such call has the same base
// everywhere, and calls in flight at once never match each other's messages.
// The low 8 bits number the steps of one call. Bases run from 1<<8 and wrap
// after 2^21-1 calls; base 0 is blockingCollTag's.
func (c *Comm) collTag() int {
	k := c.collSeq.Add(1)
	return int((k-1)%(1<<21-1)+1) << 8
}

// blockingCollTag is the tag base of every blocking collective call, as MPICH
// has one tag per collective: a rank is in one blocking collective on c at a
// time (MPI-4.1 §6.12 makes concurrent calls on one communicator erroneous),
// the algorithms receive by source, never from AnySource, and they send and
// receive the same messages between each pair of ranks in the same order
// given the same arguments, so the non-overtaking rule (§3.5) pairs the k-th
// call's messages with the k-th call's receives even when a rank runs calls
// ahead (a Bcast root). Reusing one tag keeps the matching engine's bucket for
// (source, tag) in use instead of making and dropping one per call
// (osu bcast 1 B over shm: see docs/performance.md).
const blockingCollTag = 0

// Steps of collective calls, added to collTag's base.
const (
	tagDupPropose = 1
	tagDupAgree   = 2
)

// Dup returns a new communicator with the same ranks and a new context
// (MPI_Comm_dup, MPI-4.1 §7.4.2). Collective over c: every rank must call it.
// The context id is agreed without a central server: every rank proposes the
// next id it has free and all take the largest.
func (c *Comm) Dup() (*Comm, error) {
	if c.hooked() {
		var d *Comm
		err := c.p.hookErr(&Event{Call: CallCommDup, Comm: c}, func() (err error) { d, err = c.dup(); return err })
		return d, err
	}
	return c.dup()
}

func (c *Comm) dup() (*Comm, error) {
	if err := c.valid(); err != nil {
		return nil, err
	}
	p := c.p
	p.mu.Lock()
	mine := p.nextCtx
	p.mu.Unlock()
	agreed, err := c.allreduceMaxU32(mine)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	if p.nextCtx <= agreed {
		p.nextCtx = agreed + 2
	}
	p.mu.Unlock()
	return p.newComm(agreed, c.rank, c.size, c.ranks), nil
}

// allreduceMaxU32 returns the largest v over c's ranks: a gather to rank 0
// and a broadcast back, on c's collective context.
func (c *Comm) allreduceMaxU32(v uint32) (uint32, error) {
	cc := c.collective()
	base := c.collTag()
	var b [4]byte
	if c.rank != 0 {
		binary.LittleEndian.PutUint32(b[:], v)
		if err := cc.send(b[:], 0, base+tagDupPropose, Standard); err != nil {
			return 0, err
		}
		if _, err := cc.recv(b[:], 0, base+tagDupAgree); err != nil {
			return 0, err
		}
		return binary.LittleEndian.Uint32(b[:]), nil
	}
	for i := 1; i < c.size; i++ {
		if _, err := cc.recv(b[:], AnySource, base+tagDupPropose); err != nil {
			return 0, err
		}
		v = max(v, binary.LittleEndian.Uint32(b[:]))
	}
	binary.LittleEndian.PutUint32(b[:], v)
	for i := 1; i < c.size; i++ {
		if err := cc.send(b[:], i, base+tagDupAgree, Standard); err != nil {
			return 0, err
		}
	}
	return v, nil
}

// Barrier blocks until every rank of c has called it (MPI_Barrier): a
// dissemination barrier, ceil(log2 n) rounds of one short active message to
// a neighbour, counted on arrival without matching (coll_am.go). Errors:
// ErrComm, ErrProcFailed (a rank of c failed), ErrOther (network).
func (c *Comm) Barrier() error {
	if a := c.readyArea(); a != nil && smallColl(c, nil) {
		// As Bcast's: straight to the shared area.
		id := c.p.collBeginBlocking(CallBarrier, c, AnySource, 0)
		err := a.barrier(c.areaColl())
		c.p.collEnd(id)
		return err
	}
	return c.runColl(CallBarrier, AnySource, 0, func(x coll) error { return x.barrier() })
}

// Free marks c for deallocation (MPI_Comm_free); later calls on it fail with
// ErrComm. The world communicator cannot be freed.
func (c *Comm) Free() error {
	if c.hooked() {
		return c.p.hookErr(&Event{Call: CallCommFree, Comm: c}, c.free)
	}
	return c.free()
}

func (c *Comm) free() error {
	if err := c.valid(); err != nil {
		return err
	}
	if c == c.p.world {
		return fmt.Errorf("%w: the world communicator cannot be freed", ErrComm)
	}
	c.freed.Store(true)
	if c.shmState.CompareAndSwap(shmReady, shmNone) {
		c.shmc.free(c.p)
	}
	return nil
}

// Abort ends every process of the job with exit code code (MPI_Abort). The
// calling rank's tools are closed first, so its trace and profile are whole.
// Under a launcher the launcher kills the job and Abort does not return; in an
// in-process job the other ranks' calls fail (their errors match am.ErrClosed)
// and Abort returns an *am.AbortError (matching am.ErrAborted) for the caller
// to return from its rank function: Run then exits the process with code, as
// a launched rank does.
func (c *Comm) Abort(code int) error {
	if c == nil || c.p == nil {
		return fmt.Errorf("%w: nil communicator", ErrComm)
	}
	_ = c.p.closeTools() // a failed job's trace and profile are wanted most
	return c.p.ep.Abort(code, fmt.Sprintf("MPI_Abort(code %d) on rank %d of communicator %d", code, c.rank, c.ctx))
}
