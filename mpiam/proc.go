package mpiam

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/amgo-hpc/amgo/am"
	"github.com/amgo-hpc/amgo/handlers"
	"github.com/amgo-hpc/amgo/internal/cacheline"
	"github.com/amgo-hpc/amgo/internal/locks"
	"github.com/amgo-hpc/amgo/internal/memcopy"
	"github.com/amgo-hpc/amgo/mpiam/internal/match"
	"github.com/amgo-hpc/amgo/mpiam/internal/proto"
)

// EnvEagerLimit overrides the eager limit in bytes: standard and ready sends of
// at most this many bytes use the eager protocol, larger ones the rendezvous
// protocol, on every network (capped at am.Endpoint.MaxMedium). Without it the
// limit depends on the peer: DefaultGetEagerLimit where the receiver can read
// the send buffer with a single copy (am.Endpoint.CanGet), MaxMedium (the
// largest medium payload that fits the per-peer buffer with its envelope)
// elsewhere.
const EnvEagerLimit = "AMGO_EAGER_LIMIT"

// DefaultStreamLimit is the largest message, in bytes, that goes eager to a
// peer with a single-copy read whatever else is in flight to it; larger
// ones, up to the eager limit, go eager only when nothing is (a
// ping-pong), and by rendezvous within a window (a stream) or a
// collective's exchange, where eager copies in and out of the ring would
// keep both cores busy twice over.
const DefaultStreamLimit = 32 << 10

// DefaultBlockLimit is the largest block, in bytes, that an all-to-all's
// exchange step (Alltoall, Alltoallv, their nonblocking and persistent
// forms) sends eagerly to a peer with a single-copy read; larger ones go by
// rendezvous. It is below DefaultStreamLimit: an all-to-all's blocks are
// exchanged back to back with nothing computed between, and at 32 KiB the
// receiver's single copy was faster than two eager copies on each core in
// every phase measured (docs/performance.md), where the exchanges of a
// reduction, which alternate with its arithmetic, still gain from eager
// copies there.
const DefaultBlockLimit = 16 << 10

// DefaultGetEagerLimit is the most the default eager limit, in bytes,
// towards a peer whose memory this rank can read with a single copy (shared
// memory's Cross Memory Attach, in-process ranks) can be; it is a quarter of
// the smallest per-peer buffer of the job (the ring's size over shm and
// loop: 16 KiB with 64 KiB rings, 64 KiB with shm's 256 KiB rings on a node
// of up to 8 ranks) when that is less (getEagerLimit). Up to it the eager
// protocol's two copies (into the ring and out of it) beat the rendezvous
// protocol's one (the receiver's get) and its request-to-send, system call
// and notice; a quarter of the buffer leaves room for four such messages in
// flight (docs/mpi.md has the measurements).
const DefaultGetEagerLimit = 64 << 10

// getEagerLimit is the default eager limit towards peers with a single-copy
// get on ep's job (DefaultGetEagerLimit).
func getEagerLimit(ep *am.Endpoint) int {
	buf := ep.BufferBytes()
	for r := range ep.Size() {
		if b := ep.BufferBytesTo(r); b > 0 {
			buf = min(buf, b)
		}
	}
	return min(DefaultGetEagerLimit, ep.MaxMedium(), buf/4)
}

// DefaultEagerLimit is the default eager limit, in bytes, towards a peer
// whose memory this rank cannot read with a single copy (another node's,
// over tcp or udp), unless its network's largest medium request is smaller
// (am.Endpoint.MaxMediumTo; 16 KiB less headers with a 16 KiB buffer). There
// a rendezvous costs a round trip more than eager's two copies, up to the
// size at which four messages fill the 256 KiB buffer of those networks; Open
// MPI's TCP eager limit is the same 64 KiB (docs/mpi.md has the
// measurements).
const DefaultEagerLimit = 64 << 10

// EnvUnexpectedLimit sets how many bytes of unexpected messages from one
// source, payload and records, a rank holds before it tells that source to
// send it every message by rendezvous (default 1 MiB); below half of it, the
// source may send eagerly again. See unexpected.go and docs/mpi.md.
const EnvUnexpectedLimit = "AMGO_UNEXPECTED_LIMIT"

// Handler indices mpiam registers on its endpoint.
const (
	hEager       handlers.Index = 200 + iota // medium request: envelope + data (eager protocol)
	hRTS                                     // short request: envelope + size (rendezvous request-to-send)
	hCTS                                     // short reply or request: receive buffer address (clear-to-send)
	hData                                    // store handler: rendezvous data has landed
	hFin                                     // short request: rendezvous with nothing to store is done
	hPulled                                  // short request: the receiver has read its part of the send buffer
	hBarrier                                 // short request: a dissemination barrier's message (coll_am.go)
	hThrottle                                // short reply or request: stop or resume eager sends to the sender (unexpected.go)
	hStorePart                               // store handler: a chunk of packed rendezvous data has landed, more follow (rndv_typed.go)
	hEagerSig                                // hEager with the type signature hash after the envelope (typecheck.go)
	hRTSSig                                  // hRTS with the type signature hash after its arguments (typecheck.go)
	hAllreduce                               // medium request: a small allreduce's partial result (coll_amreduce.go)
	hRMAPut                                  // store handler: a Put's data has landed in the window (rma.go)
	hRMAAck                                  // short reply: a one-sided operation is done at the target, or failed
	hRMAAcc                                  // medium request: an Accumulate's operands
	hRMAGet                                  // short request: read a range of the window for the origin
	hRMAGetDone                              // store handler: a Get's data has landed at the origin
	hRMALock                                 // short request: lock the window at the target
	hRMAGrant                                // short reply or request: the lock is granted
	hRMAUnlock                               // short request: release the lock
	hRMAFetch                                // medium request: FetchAndOp or CompareAndSwap; the old value comes back in a medium reply
	hRMAFetched                              // medium reply: the old value of a FetchAndOp or CompareAndSwap
	hRMAGetAcc                               // medium request: a GetAccumulate's operands; the old values come back as a store
	hRMAPost                                 // short request: the target opened an exposure epoch to this origin (Post)
	hRMAComplete                             // short request: the origin closed its access epoch to this target (Complete)
	hRMAPutMed                               // medium request: a Put's piece into a dynamic window, checked and copied by the target
	hRMAPutV                                 // medium request: runs of a PutTyped (offsets, lengths, bytes), scattered by the target
	hRMAAccV                                 // medium request: runs of an AccumulateTyped, applied by the target
	hRMAGetV                                 // medium request: runs of a GetTyped, gathered by the target and stored back
	hRMAGetAccV                              // medium request: runs of a GetAccumulateTyped and their operands, applied by the target and the old values stored back
	hCollWake                                // short request: a rank published in a collectives' shared area; wakes a rank that may sleep (coll_shm.go)
	hDataPiece                               // store handler, or short request: a piece a staged strided receive asked for has landed (rndv_typed.go)
)

// Message flags, in bits 30-31 of the envelope's first argument (proto.FlagSync, FlagReady).
const (
	flagSync  = proto.FlagSync  // synchronous send: the sender waits for the match
	flagReady = proto.FlagReady // ready send: the receive must already be posted
)

// inMsg is an arrived message waiting in the unexpected list, or just matched.
type inMsg struct {
	rndv     bool
	flags    uint64
	src      int     // world rank of the sender
	size     int     // message bytes
	sendID   uint64  // rendezvous: the sender's request id
	addr     uint64  // rendezvous: the send buffer's address, offered for a pull (0: none)
	payload  []byte  // eager: data (valid during the handler; a copy in heap once queued)
	heap     *[]byte // the pooled copy payload lives in, if any
	notReady bool    // a ready send that found no posted receive
	// kept: the payload stays in the sender's space of the per-peer buffer
	// (retained) until a receive takes it: back-pressure, only past the hard
	// limit (unexpected.go).
	kept     bool
	retained handlers.Retained
	pb       uint64 // tool value piggybacked by the sender (hasPB)
	hasPB    bool
	sig      uint64 // type signature hash (hasSig: the sender checks types, typecheck.go)
	hasSig   bool
	cost     int64 // charged to unexpBytes[src] while unexpected (unexpected.go)
	// inl: payload is a copy in inline (counted in unexpBytes like a heap
	// copy); an unexpected message of up to inlinePayload bytes needs no
	// pooled buffer.
	inl    bool
	inline [inlinePayload]byte
}

// inlinePayload is the largest unexpected eager payload copied into its
// message record itself rather than into a pooled buffer, in bytes: small
// messages that run ahead of their receives (a Bcast root's, a flood of
// short sends) then cost no buffer pool round trip.
const inlinePayload = 128

// maxFreeMsgs bounds proc.freeMsgs.
const maxFreeMsgs = 256

// deferred is work that handlers must not do themselves (AM handlers may not
// move data or wait: the clear-to-send handler only puts the store on a
// list); any polling MPI call runs it (runDeferred, rndv.go).
type deferred struct {
	kind  workKind
	pb    uint64 // store: the receiver's piggybacked value from the clear-to-send
	hasPB bool
	req   *reqState // the receive (cts, pull) or the send (store)
	dst   int       // world rank of the peer
	cts   ctsArgs   // cts: what to send; store: what the receiver asked for
	pull  pullJob   // pull: what to read

	throttleOn bool   // throttle: stop (true) or resume eager sends
	epoch      uint64 // throttle: the episode (unexpected.go)

	fn func() // workFunc: the work
}

// proc is one rank's MPI state: its endpoint, the matching engine, the request
// tables, and the deferred protocol work.
type proc struct {
	ep         *am.Endpoint
	eagerLimit int // eager up to this many bytes to every peer
	eagerNoGet int // and up to this many (and the peer's am.MaxMediumTo) to a peer that cannot be read with one copy
	// streamLimit: above it (and up to eagerLimit), a send to a peer with
	// a single-copy read goes eager only while nothing else is in flight
	// to it (eagerLarge); eagerLimit when AMGO_EAGER_LIMIT sets the limit.
	streamLimit int
	blockLimit  int // an all-to-all's exchanges: DefaultBlockLimit, within streamLimit
	world       *Comm

	nbc nbcEngine // nonblocking and persistent collectives under way (coll_sched.go)

	checkTypes bool // AMGO_CHECK_TYPES: messages carry type signatures (typecheck.go)

	mu       locks.Mutex // guards eng, reqs, nextID, work, nextCtx; a plain flag at a single-threaded level (thread.go)
	eng      *match.Engine[*reqState, *inMsg]
	matchBuf []match.Match[*reqState, *inMsg]
	reqs     map[uint64]*reqState // rendezvous requests waiting for a peer, by id (fileReqLocked)
	// sendsTo[w] counts the rendezvous sends to world rank w filed in reqs:
	// a rendezvous from w that arrives while this rank sends one to w is
	// an exchange, which the receiver does not split (planRndvLocked).
	sendsTo  []int32
	nextID   uint64
	work     []deferred // queued from workHead on; the array is reused once drained
	workHead int
	hasWork  atomic.Bool
	// pendingRelease: queued eager messages consumed by matches made in a
	// handler for another message, recycled once p.mu is dropped.
	pendingRelease []*inMsg
	nextCtx        uint32
	wins           map[uint32]*Win           // one-sided windows by id (rma.go), under mu
	barrierCounts  map[uint32]*barrierCounts // by communicator context (coll_am.go)
	arStates       map[uint32]*arState       // small allreduces' slots by communicator context (coll_amreduce.go; p.mu)
	rndvSplit      int                       // EnvRndvSplit: smallest rendezvous split between store and get (0: never)
	stages         stages                    // shared stages of strided receives (stage.go)
	packMu         locks.Mutex               // guards packBuf and packFill (a flag at single-threaded levels)
	packBuf        []byte                    // packBufBytes for packing eager messages (sendPacked), made on first use
	packFill       packFiller                // what sendPacked packs in place, under packMu

	msgPool sync.Pool
	// freeMsgs holds recycled message records for the next eager arrivals
	// (at most maxFreeMsgs), guarded by mu: a message matched in its own
	// handler, or by a receive that found it queued with its payload inline,
	// goes back here under the lock that the arrival takes anyway, skipping
	// the pool.
	freeMsgs []*inMsg
	payloads payloadPool

	unexpLimit   int            // unexpected cost per source before it is throttled (EnvUnexpectedLimit; unexpected.go)
	unexpBytes   []atomic.Int64 // by world rank: cost of its unexpected messages held here
	recvThrottle []recvThrottle // by world rank: what this rank told that source
	sendThrottle []sendThrottle // by world rank: that destination's word on eager sends
	throttleOff  atomic.Bool    // some recvThrottle has an "off" to send
	states       reqCache       // idle operation states and request handles (reqcache.go)
	recvStates   recvStack      // states and handles of nonblocking receives, under mu (reqcache.go)

	bsend bsendBuffer

	finalized atomic.Bool

	thread ThreadLevel // declared level of thread support (thread.go)
	seq    *locks.Seq  // a single-threaded level in force: p.mu and the request stack are plain flags
	mainG  uint64      // id of the goroutine that called Init or runs the rank's function

	tools       []Tool        // interposition hooks (tool.go); nil: none, one branch per call
	toolsClosed atomic.Bool   // closeTools has run (Finalize, Abort or a fatal signal)
	pbTool      Piggybacker   // the tool whose value rides on every outgoing message, if any
	drops       atomic.Uint64 // protocol messages ignored (misbehaving peer)

	fail failures // failed ranks and what to fail with them (failure.go)

	diagMu  sync.Mutex   // guards colls and collSeq
	colls   []activeColl // collective calls under way, for writePending (signals.go)
	collSeq uint64
	// blocking records the blocking collective under way at a
	// single-threaded level without diagMu (collBeginBlocking).
	blocking collSlot
	// direct records the nonblocking collective started directly through
	// a shared area last (startAreaNB), and directN how many such are
	// under way; written under the schedule engine's lock, read by
	// writePending.
	direct  collSlot
	directN uint64
}

func newProc(ep *am.Endpoint) (*proc, error) {
	if ep.Size() > proto.MaxSource+1 {
		// An envelope carries the source rank in 30 bits (docs/mpi.md).
		return nil, fmt.Errorf("%w: a job of %d ranks; MPI over this library holds at most %d", ErrArg, ep.Size(), proto.MaxSource+1)
	}
	p := cacheline.New[proc]() // see internal/cacheline: goroutine ranks share one heap
	*p = proc{
		ep:      ep,
		eng:     match.New[*reqState, *inMsg](),
		reqs:    map[uint64]*reqState{},
		sendsTo: make([]int32, ep.Size()),
		nextID:  1,
		nextCtx: 2,
	}
	p.matchBuf = cacheline.Slice[match.Match[*reqState, *inMsg]](16)[:0]
	p.msgPool.New = func() any { return cacheline.New[inMsg]() }
	p.unexpLimit = 1 << 20
	if v := os.Getenv(EnvUnexpectedLimit); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("%w: %s=%q is not a byte count", ErrArg, EnvUnexpectedLimit, v)
		}
		p.unexpLimit = n
	}
	p.unexpBytes = make([]atomic.Int64, ep.Size())
	p.recvThrottle = make([]recvThrottle, ep.Size())
	p.sendThrottle = make([]sendThrottle, ep.Size())
	split, err := rndvSplitFromEnv()
	if err != nil {
		return nil, err
	}
	p.rndvSplit = split
	switch v := os.Getenv(EnvTypedStage); v {
	case "", "1":
	case "0":
		p.stages.off = true
	default:
		return nil, fmt.Errorf("%w: %s=%q (want 0 or 1)", ErrArg, EnvTypedStage, v)
	}
	// Towards a peer without a single-copy read, eager up to
	// DefaultEagerLimit or its network's largest medium, whichever is less
	// (eager checks MaxMediumTo per peer).
	p.eagerLimit, p.eagerNoGet = getEagerLimit(ep), 0
	p.streamLimit = min(p.eagerLimit, DefaultStreamLimit)
	p.blockLimit = min(p.streamLimit, DefaultBlockLimit)
	for r := range ep.Size() {
		p.eagerNoGet = max(p.eagerNoGet, min(DefaultEagerLimit, ep.MaxMediumTo(r)))
	}
	if v := os.Getenv(EnvEagerLimit); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("%w: %s=%q is not a byte count", ErrArg, EnvEagerLimit, v)
		}
		p.eagerLimit = min(n, ep.MaxMedium())
		p.eagerNoGet = p.eagerLimit
		p.streamLimit = p.eagerLimit
		p.blockLimit = p.eagerLimit
	}
	entries := []handlers.Entry{
		{Index: hEager, Name: "mpi.eager", NArgs: proto.EnvelopeArgs, Fn: p.onEagerFn()},
		{Index: hRTS, Name: "mpi.rts", NArgs: proto.RTSArgs, Fn: p.onRTS},
		{Index: hCTS, Name: "mpi.cts", NArgs: 6, Fn: p.onCTS},
		{Index: hData, Name: "mpi.data", NArgs: 1, Fn: p.onData},
		{Index: hFin, Name: "mpi.fin", NArgs: 1, Fn: p.onData},
		{Index: hPulled, Name: "mpi.pulled", NArgs: 1, Fn: p.onPulled},
		{Index: hBarrier, Name: "mpi.barrier", NArgs: 2, Fn: p.onBarrier},
		{Index: hCollWake, Name: "mpi.coll.wake", NArgs: 0, Fn: p.onCollWake},
		{Index: hThrottle, Name: "mpi.throttle", NArgs: 2, Fn: p.onThrottle},
		{Index: hStorePart, Name: "mpi.data.part", NArgs: 0, Fn: p.onStorePart},
		{Index: hDataPiece, Name: "mpi.data.piece", NArgs: proto.PieceArgs, Fn: p.onDataPiece},
		{Index: hEagerSig, Name: "mpi.eager.sig", NArgs: proto.EnvelopeArgs + 1, Fn: p.onEagerSig},
		{Index: hRTSSig, Name: "mpi.rts.sig", NArgs: proto.RTSArgs + 1, Fn: p.onRTSSig},
		{Index: hAllreduce, Name: "mpi.allreduce", NArgs: proto.AllreduceAMArgs, Fn: p.onAllreduceAM},
	}
	entries = append(entries, p.rmaHandlers()...)
	p.checkTypes = checkTypesFromEnv()
	for _, e := range entries {
		if _, err := ep.Register(e); err != nil {
			return nil, err
		}
	}
	p.world = p.newComm(0, ep.Rank(), ep.Size(), nil)
	// With a progress goroutine (AMGO_PROGRESS), deferred protocol work
	// (rendezvous stores, clear-to-sends) also runs while the program computes.
	ep.OnProgress(p.runDeferred)
	return p, nil
}

// envelope packs (context, source, tag, sequence, flags) into a message's
// two envelope arguments (proto.Envelope).
func envelope(ctx uint32, src int, tag int, seq uint32, flags uint64) (a0, a1 uint64) {
	return proto.Envelope{Envelope: match.Envelope{Context: ctx, Source: int32(src), Tag: int32(tag), Seq: seq}, Flags: flags}.Args()
}

func (p *proc) newMsg() *inMsg {
	m := p.msgPool.Get().(*inMsg)
	*m = inMsg{}
	return m
}

// onEagerSig is the handler of eager messages with a type signature hash
// (hEagerSig).
func (p *proc) onEagerSig(tok *handlers.Token, a []uint64, payload []byte) {
	p.eagerArrived(tok, a[:proto.EnvelopeArgs], payload, a[proto.EnvelopeArgs], true)
}

// eagerArrived handles an eager message (with the type signature hash sig
// when hasSig).
func (p *proc) eagerArrived(tok *handlers.Token, a []uint64, payload []byte, sig uint64, hasSig bool) {
	pe, ok := proto.EnvelopeOf(a)
	if !ok {
		_, err := proto.ParseEnvelope(a)
		p.dropped(fmt.Errorf("eager message from rank %d: %w", tok.Source(), err))
		return
	}
	p.mu.Lock()
	r, posted := p.eng.ArrivePosted(pe.Envelope)
	p.eagerLocked(tok, pe, payload, r, posted, sig, hasSig)
}

// onEagerFn returns the handler of eager messages without a signature
// (hEager): if the receive is posted, the handler copies the message into
// it and the space goes back to the sender; if not, the message goes on
// the unexpected list (unexpected.go). It is eagerArrived with its common
// case, a contiguous receive posted for the message, completed in the
// handler's own frame, and a closure rather than a method value, whose
// wrapper would be one more call on every message. (Not inlined into its
// caller: a closure made in an inlined body has its own calls left
// uninlined.)
//
//go:noinline
func (p *proc) onEagerFn() handlers.Func {
	return func(tok *handlers.Token, a []uint64, payload []byte) {
		pe, ok := proto.EnvelopeOf(a)
		if !ok {
			p.eagerArrived(tok, a, payload, 0, false) // reports it
			return
		}
		p.mu.Lock()
		r, posted := p.eng.ArrivePosted(pe.Envelope)
		if !posted || r.lay != nil || len(payload) > len(r.buf) {
			p.eagerLocked(tok, pe, payload, r, posted, 0, false)
			return
		}
		r.handle = match.PostedHandle{}
		p.matchedLocked(r)
		pb, hasPB := tok.Piggyback()
		// completeEagerLocked's common case (contiguous, fits, no
		// signature to check), without its call.
		n := copy(r.buf, payload)
		st := &r.status
		st.Source, st.Tag, st.Err, st.Bytes = int(pe.Source), int(pe.Tag), nil, n
		st.Cancelled, st.Piggyback, st.HasPiggyback = false, pb, hasPB
		if r.onDone == nil {
			r.done.Store(true) // completed, without its call
		} else {
			r.completed()
		}
		p.mu.Unlock()
	}
}

// eagerLocked is eagerArrived once ArrivePosted has looked for a posted
// receive (r, when posted); p.mu is held, and released on return.
func (p *proc) eagerLocked(tok *handlers.Token, pe proto.Envelope, payload []byte, r *reqState, posted bool, sig uint64, hasSig bool) {
	env := pe.Envelope
	if posted {
		// A receive waits for this message: no message record, no match
		// list.
		r.handle = match.PostedHandle{}
		p.matchedLocked(r)
		pb, hasPB := tok.Piggyback()
		prefetchForUnpack(r, payload)
		p.completeEagerLocked(r, payload, env, pb, hasPB, false, sig, hasSig)
		p.mu.Unlock()
		return
	}
	var m *inMsg
	if n := len(p.freeMsgs); n > 0 {
		m = p.freeMsgs[n-1]
		p.freeMsgs = p.freeMsgs[:n-1]
		*m = inMsg{}
	} else {
		m = p.newMsg()
	}
	m.flags = pe.Flags
	m.src = tok.Source()
	m.size = len(payload)
	m.payload = payload
	m.pb, m.hasPB = tok.Piggyback()
	m.sig, m.hasSig = sig, hasSig
	out, mine, held, ok := p.arriveLocked(env, m, "eager message")
	if !ok {
		return
	}
	over := false
	src := m.src
	if !mine {
		// Unexpected (or held for order): copied out of the per-peer buffer,
		// so that the sender's space returns at once, and charged to the
		// source; past the limit the source is throttled (unexpected.go).
		// Past the hard limit, which a sender that obeys reaches only by
		// ignoring the throttle, the message keeps its space. A message held
		// for order is always copied: the message before it, from another
		// goroutine of the sender, may be waiting for space in the buffer.
		cost := unexpRecordBytes + int64(len(payload))
		if !held && p.unexpBytes[src].Load()+cost > p.unexpHardFrom(src) {
			if buf, r, err := tok.Retain(); err == nil {
				m.payload, m.retained, m.kept = buf, r, true
				cost = unexpRecordBytes
			}
		}
		if !m.kept {
			if len(payload) <= len(m.inline) {
				m.payload, m.inl = m.inline[:len(payload)], true
			} else {
				m.heap = p.payloads.get(len(payload))
				m.payload = (*m.heap)[:len(payload)]
			}
			copy(m.payload, payload)
		}
		over = p.chargeUnexpected(m, cost)
		if m.flags&flagReady != 0 {
			m.notReady = true
		}
	}
	p.finishArrivalLocked(out, tok, m)
	if over {
		p.throttleSource(tok, src)
	}
}

// finishArrivalLocked completes the matches an arrival made in its handler
// (cur is the arrived message), releases p.mu, and recycles the queued
// messages those matches consumed.
func (p *proc) finishArrivalLocked(out []match.Match[*reqState, *inMsg], tok *handlers.Token, cur *inMsg) {
	p.matchBuf = out
	pull, ok := p.completeMatchesLocked(out, tok, cur)
	rel := p.pendingRelease
	p.pendingRelease = nil
	p.mu.Unlock()
	for _, x := range rel {
		p.releaseMsg(x)
	}
	if ok {
		p.pullInHandler(tok, pull)
	}
}

// arriveLocked offers m to the matching engine; p.mu is held. It returns the
// matches made, whether m itself was matched and whether it was held for
// sequence order; ok false (p.mu released, m recycled, the drop logged) when
// the engine refused it.
func (p *proc) arriveLocked(env match.Envelope, m *inMsg, what string) (out []match.Match[*reqState, *inMsg], mine, held, ok bool) {
	before := p.eng.Held()
	out, err := p.eng.Arrive(env, m, p.matchBuf[:0])
	if err != nil {
		p.mu.Unlock()
		src := m.src
		p.msgPool.Put(m)
		p.dropped(fmt.Errorf("%s from rank %d: %w", what, src, err))
		return nil, false, false, false
	}
	for _, x := range out {
		if x.Msg == m {
			mine = true
		}
	}
	return out, mine, p.eng.Held() > before, true
}

// completeMatchesLocked acts on matches made by an arrival in a handler: eager
// data is copied into the receive buffer; a request-to-send is answered with
// the receive buffer's address, by reply when it is the message being handled,
// else by a deferred request. A request-to-send being handled whose data the
// receiver reads whole, at most inlinePullMax bytes, is returned as pull (ok
// true) for the handler to read once p.mu is released (pullInHandler). p.mu is
// held.
func (p *proc) completeMatchesLocked(out []match.Match[*reqState, *inMsg], tok *handlers.Token, cur *inMsg) (pull deferred, ok bool) {
	for i := range out {
		x := &out[i]
		r, m := x.Recv, x.Msg
		r.handle = match.PostedHandle{}
		p.matchedLocked(r)
		if !m.rndv {
			if m == cur && !m.inl && m.heap == nil {
				prefetchForUnpack(r, m.payload)
			}
			p.finishEagerLocked(r, m, x.Env)
			switch {
			case m == cur:
				p.putMsgLocked(m)
			case !p.releaseMsgLocked(m):
				p.pendingRelease = append(p.pendingRelease, m)
			}
			continue
		}
		plan := p.planRndvLocked(r, m, x.Env)
		if m == cur && plan.pull && !plan.cts && plan.job.n-plan.job.off <= inlinePullMax {
			pull, ok = deferred{kind: workPull, req: r, dst: m.src, pull: plan.job}, true
			p.recycleRTS(m)
			continue
		}
		if plan.cts && m == cur {
			// Answer the message being handled with a reply: no credit needed.
			var buf [proto.CTSArgs]uint64
			rerr := tok.ReplyShortWith(hCTS, p.piggyback(), plan.args.Append(buf[:0])...)
			plan.cts = rerr != nil // queue it as a request if the reply failed
			if rerr == nil {
				// Gone: if it asked for a staged receive's first piece,
				// the next is asked for at once (ctsSentLocked checks).
				p.ctsSentLocked(r, m.src, &plan.args)
			}
		}
		p.queueRndvLocked(r, m.src, plan)
		p.recycleRTS(m)
	}
	return pull, ok
}

// finishEagerLocked copies an eager message into its receive and completes it.
func (p *proc) finishEagerLocked(r *reqState, m *inMsg, env match.Envelope) {
	p.completeEagerLocked(r, m.payload, env, m.pb, m.hasPB, m.notReady, m.sig, m.hasSig)
}

// completeEagerLocked copies an eager message's payload into receive r and
// completes it.
func (p *proc) completeEagerLocked(r *reqState, payload []byte, env match.Envelope, pb uint64, hasPB, notReady bool, sig uint64, hasSig bool) {
	var n int
	if r.lay != nil {
		n = r.lay.unpack(r.buf, payload[:min(len(payload), r.lay.n)], 0)
	} else {
		n = copy(r.buf, payload)
	}
	var err error
	if len(payload) > r.size() {
		err = fmt.Errorf("%w: message of %d bytes from rank %d, tag %d, into a buffer of %d", ErrTruncate, len(payload), env.Source, env.Tag, r.size())
	} else if notReady {
		err = fmt.Errorf("%w (from rank %d, tag %d)", ErrReadyNotPosted, env.Source, env.Tag)
	} else if hasSig {
		err = p.sigErr(r, n, sig, hasSig, envelopeInfo{int(env.Source), int(env.Tag)})
	}
	// The status written field by field, in place: a Status built in a
	// local and assigned whole is copied with 16-byte moves that wait for
	// the narrower stores that built it (a store-forwarding stall on the
	// receive path of every eager message).
	st := &r.status
	st.Source, st.Tag, st.Err, st.Bytes = int(env.Source), int(env.Tag), err, n
	st.Cancelled, st.Piggyback, st.HasPiggyback = false, pb, hasPB
	r.completed()
}

func (p *proc) queueLocked(d deferred) {
	p.work = append(p.work, d)
	p.hasWork.Store(true)
}

func (p *proc) releaseMsg(m *inMsg) {
	p.unchargeUnexpected(m)
	if m.heap != nil {
		p.payloads.put(m.heap)
		m.heap = nil
	}
	m.inl = false
	if m.kept {
		if err := p.ep.Release(m.retained); err != nil && !errors.Is(err, am.ErrPeerDead) {
			p.dropped(err)
		}
		m.kept = false
	}
	p.msgPool.Put(m)
}

// releaseMsgLocked is releaseMsg under p.mu: a message whose payload is
// inline (or was never copied) goes back to p.freeMsgs; others are released
// by releaseMsg, which may call into the endpoint, once p.mu is dropped
// (ok false).
func (p *proc) releaseMsgLocked(m *inMsg) (ok bool) {
	if m.heap != nil || m.kept {
		return false
	}
	p.unchargeUnexpected(m)
	m.inl = false
	p.putMsgLocked(m)
	return true
}

// putMsgLocked recycles a released message record. p.mu held.
func (p *proc) putMsgLocked(m *inMsg) {
	if len(p.freeMsgs) < maxFreeMsgs {
		p.freeMsgs = append(p.freeMsgs, m)
		return
	}
	p.msgPool.Put(m)
}

// payloadPool keeps the buffers of unexpected eager messages by size class
// (powers of two from 64 bytes), so that steady traffic allocates nothing.
type payloadPool [26]sync.Pool

func payloadClass(n int) int {
	c := 0
	for 64<<c < n {
		c++
	}
	return c
}

func (pp *payloadPool) get(n int) *[]byte {
	c := payloadClass(n)
	if b, ok := pp[c].Get().(*[]byte); ok {
		return b
	}
	b := make([]byte, 64<<c)
	return &b
}

func (pp *payloadPool) put(b *[]byte) {
	pp[payloadClass(cap(*b))].Put(b)
}

func (p *proc) wrapNet(err error) error {
	if err == nil {
		return nil
	}
	var pe *am.PeerError
	if errors.As(err, &pe) {
		return &ProcFailedError{Rank: pe.Rank, WorldRank: pe.Rank, Op: "rendezvous", Err: pe}
	}
	return fmt.Errorf("%w: %w", ErrOther, err)
}

func (p *proc) dropped(err error) {
	p.drops.Add(1)
	logDrop(p.ep.Rank(), err)
}

// waitFor polls (and runs deferred protocol work) until cond holds. When a
// rank fails meanwhile, it fails what involved the rank (which may satisfy
// cond with an error status) and, if cond still does not hold, waits again:
// the wait did not depend on that rank.
func (p *proc) waitFor(cond func() bool) error {
	p.syncDeaths()
	if cond() {
		return nil
	}
	for {
		err := p.ep.PollUntil(func() bool {
			p.runDeferred()
			return cond()
		})
		if err == nil {
			return nil
		}
		if over, err := p.waited(err, cond); over {
			return err
		}
	}
}

// waitDone is waitFor(d.Load), the wait of a request, with the flag read in
// place rather than through a method value's wrapper: a ping-pong's wait
// for the answer. (Not inlined into its callers: a closure made in an
// inlined body has its own calls left uninlined.)
//
//go:noinline
func (p *proc) waitDone(d *doneFlag) error {
	p.syncDeaths()
	if d.Load() {
		return nil
	}
	for {
		err := p.ep.PollUntil(func() bool {
			p.runDeferred()
			return d.Load()
		})
		if err == nil {
			return nil
		}
		if over, err := p.waited(err, d.Load); over {
			return err
		}
	}
}

// waited acts on an error PollUntil returned to a waiter for cond: whether
// the wait is over, with its error (nil: cond holds). A dead peer's error
// is taken in (syncDeaths) and the wait goes on unless cond holds now.
func (p *proc) waited(err error, cond func() bool) (bool, error) {
	switch {
	case errors.Is(err, am.ErrSeq):
		return true, p.threadErr()
	case !errors.Is(err, am.ErrPeerDead):
		return true, fmt.Errorf("%w: %w", ErrOther, err)
	}
	p.syncDeaths()
	return cond(), nil
}

// progress polls once and runs deferred work (Test, Iprobe).
func (p *proc) progress() {
	_, _ = p.ep.Poll()
	p.syncDeaths()
	p.runDeferred()
}

// eager reports whether a standard or ready send of n bytes to world rank
// world uses the eager protocol (see EnvEagerLimit).
func (p *proc) eager(world, n int) bool {
	if n > p.streamLimit {
		return p.eagerLarge(world, n)
	}
	return !p.sendThrottle[world].on.Load()
}

// eagerLarge is eager for n over streamLimit: up to the eager limit, eager
// unless the peer can read this rank's memory with a single copy and
// requests of this rank still hold space in its buffer (a window of
// messages under way, in which eager copies would keep both cores busy
// twice over: docs/mpi.md); above it, eagerAbove.
func (p *proc) eagerLarge(world, n int) bool {
	if n > p.eagerLimit {
		return p.eagerAbove(world, n)
	}
	return !p.sendThrottle[world].on.Load() && (!p.ep.CanGet(world, n) || p.ep.InFlight(world) == 0)
}

// eagerAbove is eager for n over the eager limit: eager to a peer without
// a single-copy read, up to what it takes in one medium request.
func (p *proc) eagerAbove(world, n int) bool {
	return n <= p.eagerNoGet && n <= p.ep.MaxMediumTo(world) && !p.ep.CanGet(world, n) && !p.sendThrottle[world].on.Load()
}

// eagerPacked is eager for non-contiguous data, which is packed whatever
// the protocol and cannot be read with a single copy: eager up to the limit
// of peers without a single-copy read.
func (p *proc) eagerPacked(world, n int) bool {
	return (n <= p.eagerLimit || (n <= p.eagerNoGet && n <= p.ep.MaxMediumTo(world))) && !p.sendThrottle[world].on.Load()
}

// prefetchUnpack is the smallest eager payload, in bytes, whose lines a
// receive of non-contiguous data asks for all at once before it unpacks
// (memcopy.Prefetch): the unpacking loop's small loads and stores keep only
// the few lines of the payload its instruction window reaches in flight,
// where they come from the sending core one after the other. A contiguous
// receive's copy has its wide loads under way already, and asking first
// made it slower (docs/performance.md, "Unpacking from lines asked for at
// once").
const prefetchUnpack = 512

// prefetchForUnpack asks for payload's lines when receive r unpacks it and it
// is at least prefetchUnpack bytes. It is called only where payload is still
// in the per-peer buffer the sender wrote (the message being handled): a
// payload copied out earlier as unexpected was written by this core, and its
// lines are near already.
func prefetchForUnpack(r *reqState, payload []byte) {
	if r.lay != nil && len(payload) >= prefetchUnpack {
		memcopy.Prefetch(payload)
	}
}
