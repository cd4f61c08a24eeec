package match

import (
	"errors"
	"fmt"

	"github.com/amgo-hpc/amgo/internal/cacheline"
)

// AnySource in Spec.Source matches a message from any source (MPI_ANY_SOURCE).
const AnySource int32 = -1

// AnyTag in Spec.Tag matches a message with any tag that is zero or more
// (MPI_ANY_TAG). Negative tags are reserved for amgo's own traffic and are
// matched only by a receive that names them, as in Open MPI ob1.
const AnyTag int32 = -1

// Errors returned by Arrive, usable with errors.Is. The returned errors wrap
// them and name the context, source, tag and sequence number involved.
var (
	// ErrInvalidEnvelope: the source is negative, or the tag is AnyTag, which
	// no receive could ever match.
	ErrInvalidEnvelope = errors.New("match: invalid envelope")
	// ErrDuplicateSequence: the sequence number was already delivered or is
	// already held. The transport delivered a message twice.
	ErrDuplicateSequence = errors.New("match: duplicate sequence number")
	// ErrSourceDropped: DropSource was called for this (context, source).
	ErrSourceDropped = errors.New("match: source dropped")
)

// Envelope is what a message carries for matching (MPI-4.1 §3.2.3).
type Envelope struct {
	// Context is the communicator's context id; point-to-point and collective
	// traffic on one communicator use different contexts.
	Context uint32
	// Source is the sender's rank in the communicator, zero or more.
	Source int32
	// Tag is zero or more for user messages; below AnyTag (-2 and less) for
	// internal ones. AnyTag itself is invalid in an envelope.
	Tag int32
	// Seq is the sender's sequence number for (Context, destination), taken in
	// send-initiation order (one counter per communicator and destination at
	// the sender); it wraps.
	Seq uint32
}

// Validate reports whether Arrive would accept e's source and tag.
func (e Envelope) Validate() error {
	if e.Source < 0 || e.Tag == AnyTag {
		return fmt.Errorf("%w: context %d source %d tag %d seq %d",
			ErrInvalidEnvelope, e.Context, e.Source, e.Tag, e.Seq)
	}
	return nil
}

// Spec is what a receive, probe or matched probe asks for.
type Spec struct {
	Context uint32
	// Source is a rank, zero or more, or AnySource.
	Source int32
	// Tag is a tag, or AnyTag. A negative tag other than AnyTag names an
	// internal tag exactly.
	Tag int32
}

// Validate reports whether s names a source the engine can ever match: a rank
// of zero or more, or AnySource. Post queues a receive with another source, but
// no message ever matches it; checking the rank against the communicator's size
// (MPI_ERR_RANK) is the caller's job in any case.
func (s Spec) Validate() error {
	if s.Source < AnySource {
		return fmt.Errorf("match: invalid receive source %d (context %d tag %d)", s.Source, s.Context, s.Tag)
	}
	return nil
}

// matches is the MPI matching rule with ob1's treatment of negative tags:
// req_tag == tag || (req_tag == ANY_TAG && tag >= 0).
func (s Spec) matches(e Envelope) bool {
	return s.Context == e.Context &&
		(s.Source == AnySource || s.Source == e.Source) &&
		(s.Tag == e.Tag || (s.Tag == AnyTag && e.Tag >= 0))
}

// Match is a receive paired with the message it received.
type Match[R, M any] struct {
	Recv R
	Msg  M
	Env  Envelope
}

// Message is a queued message returned by DropContext and DropSource, for the
// caller to release its buffer.
type Message[M any] struct {
	Msg M
	Env Envelope
}

// PostedHandle names a queued receive for Cancel. The zero value names none.
type PostedHandle struct {
	slot uint32
	gen  uint64
}

// Valid reports whether h came from a Post that queued a receive. It may since
// have been matched or cancelled.
func (h PostedHandle) Valid() bool { return h.gen != 0 }

// Stats are the engine's counters.
type Stats struct {
	Posted     int // receives queued, waiting for a message
	Unexpected int // matchable messages queued, waiting for a receive
	Held       int // arrivals ahead of their sequence, waiting for the gap to fill
	// MatchAttempts counts searches for a partner: one per Post and one per
	// message that became matchable. Each search looks at four list heads at most.
	MatchAttempts uint64
	Matches       uint64 // receive/message pairs made (Take not included)
}

// tagKey is a tag bucket's key within its context: source (AnySource for the
// (AnySource, tag) bucket) and tag packed in one word, so that the map takes
// its fast path for 64-bit keys.
func tagKey(src, tag int32) uint64 { return uint64(uint32(src))<<32 | uint64(uint32(tag)) }

// tagBucket holds the exact receives and matchable messages of one (context,
// source, tag), or with source AnySource, the (AnySource, tag) receives and all
// matchable messages with that tag. An empty bucket stays in its map, on the
// engine's idle list, until maxIdleBuckets newer ones have emptied: tags in
// steady use then cost no map insertion and deletion per message, while tags
// used once (say, an iteration number) do not pile up.
type tagBucket[R, M any] struct {
	ctx   *context[R, M] // nil when in the free pool
	key   uint64         // tagKey(src, tag)
	recvs recvList[R, M]
	msgs  msgList[R, M]
	// idlePrev and idleNext link the bucket on the engine's idle list while
	// it is empty; idleNext also links the free pool.
	idlePrev, idleNext *tagBucket[R, M]
	idle               bool
}

// maxIdleBuckets is how many empty tag buckets the engine keeps in their maps.
const maxIdleBuckets = 256

// peer is the receiving side's state for one (context, source).
type peer[R, M any] struct {
	ctx      *context[R, M]
	recvs    recvList[R, M] // (source, AnyTag) receives
	msgs     msgList[R, M]  // matchable messages with tag >= 0
	internal msgList[R, M]  // matchable messages with tag < 0
	held     msgList[R, M]  // arrivals ahead of expect, ascending Seq (ob1 frags_cant_match)
	expect   uint32         // next sequence number to match (ob1 expected_sequence)
	dropped  bool
}

// context is the state of one context id. Peers and tag buckets are looked up
// per context, so that dropping a context visits only its own.
type context[R, M any] struct {
	peers map[int32]*peer[R, M]
	// byRank holds the peers of sources below maxByRank too, for the
	// per-message lookup without hashing.
	byRank []*peer[R, M]
	tags   map[uint64]*tagBucket[R, M]
	// lastK and lastB cache the last key looked up or made and its bucket
	// (nil: the key has none) while lastOK: a program that receives on one
	// tag from one source again and again (a ping-pong, a halo exchange)
	// skips the map's hashing, and so does a message with a new tag (a
	// collective call's) between the lookup that finds no receive, the
	// bucket made for it, and the receive that takes it.
	lastK  uint64
	lastB  *tagBucket[R, M]
	lastOK bool
	// anySrcIndexed: the context keeps (AnySource, tag) buckets for its
	// unexpected messages. It turns on at the first (AnySource, tag) receive
	// or probe, which indexes the messages queued until then (one pass over
	// them); until then an arrival with a new tag makes one bucket, not two
	// (collective contexts, and programs that never receive from AnySource
	// by tag, stay so).
	anySrcIndexed bool
	// anySrcTag counts the receives queued in (AnySource, tag) buckets: while
	// none is, an arrival that finds its exact receive needs no second bucket
	// lookup.
	anySrcTag int
	recvs     recvList[R, M] // (AnySource, AnyTag) receives
	msgs      msgList[R, M]  // matchable messages with tag >= 0, in matchable order
	internal  msgList[R, M]  // matchable messages with tag < 0
}

// Engine is the matching engine of one MPI process: posted receives,
// unexpected messages and held out-of-sequence arrivals, for all contexts. It
// is a pure state machine: it starts no goroutine, takes no lock, reads no
// clock and does no I/O. The caller serializes all calls.
//
// R is the caller's receive request type and M its message type (typically a
// pointer to a buffer descriptor); the engine only stores and returns them.
type Engine[R, M any] struct {
	ctxs map[uint32]*context[R, M]
	// last is the context looked up last (nil: none), lastID its id: traffic
	// mostly stays on one communicator.
	last   *context[R, M]
	lastID uint32

	slots       []*recvNode[R, M] // every receive node ever made, by slot
	freeRecvs   []*recvNode[R, M]
	recvSlab    []recvNode[R, M] // the current slab's unused nodes
	freeMsgs    *msgNode[R, M]   // linked through next[0]
	freeBuckets *tagBucket[R, M]
	idleHead    *tagBucket[R, M] // empty buckets still in their maps, oldest first
	idleTail    *tagBucket[R, M]
	pendIdle    *tagBucket[R, M] // the bucket that emptied last, idle but not yet listed (releaseIfEmpty)
	nIdle       int
	maxIdle     int               // maxIdleBuckets; tests lower it
	scratch     []*recvNode[R, M] // reused by the Drop functions

	pseq                     uint64
	nPosted, nUnexp, nHeld   int
	attempts, matchesCounted uint64
}

// recvSlab is how many receive nodes are allocated at once: a window of
// receives in flight then sits in a few contiguous lines rather than in
// single allocations scattered over the heap. The engine serves one rank, so
// its nodes need no padding against another's.
const recvSlab = 32

// New returns an empty engine.
func New[R, M any]() *Engine[R, M] {
	e := cacheline.New[Engine[R, M]]()
	*e = Engine[R, M]{ctxs: make(map[uint32]*context[R, M]), maxIdle: maxIdleBuckets,
		freeRecvs: cacheline.Slice[*recvNode[R, M]](64)[:0], slots: cacheline.Slice[*recvNode[R, M]](64)[:0]}
	return e
}

// Post posts a receive for s (MPI_Irecv once the caller has a request r).
//
// If a matchable unexpected message matches s, Post removes the earliest one
// and returns it with ok true: for one source the earliest is the lowest
// sequence number, across sources the one that became matchable first.
// Otherwise it queues r behind every receive posted before it and returns a
// handle for Cancel.
//
// s should pass s.Validate; see there for what happens otherwise.
func (e *Engine[R, M]) Post(s Spec, r R) (m M, env Envelope, h PostedHandle, ok bool) {
	e.attempts++
	if c := e.last; c != nil && e.lastID == s.Context && s.Source != AnySource && s.Tag != AnyTag {
		if b := c.bucket(tagKey(s.Source, s.Tag)); b != nil && b.msgs.head == nil {
			// The common case of an exact receive on the context looked up
			// last (a window's, a ping-pong's) whose bucket exists and
			// holds no message: the receive queues in it, without the
			// general path's context lookup and switch.
			if b.idle {
				e.wake(b)
			}
			// queueRecv, written out: the common post makes no call.
			var x *recvNode[R, M]
			if n := len(e.freeRecvs); n > 0 {
				x = e.freeRecvs[n-1]
				e.freeRecvs = e.freeRecvs[:n-1]
			} else {
				x = e.newRecv()
			}
			x.r, x.spec, x.pseq = r, s, e.pseq
			e.pseq++
			b.recvs.pushBack(x)
			e.nPosted++
			return m, env, PostedHandle{slot: x.slot, gen: x.gen}, false
		}
	}
	c := e.contextFor(s.Context)
	var l *recvList[R, M]
	var x *msgNode[R, M]
	switch {
	case s.Source == AnySource && s.Tag == AnyTag:
		x, l = c.msgs.head, &c.recvs
	case s.Tag == AnyTag:
		p := c.peerFor(s.Source)
		x, l = p.msgs.head, &p.recvs
	default: // exact, or (AnySource, tag): the bucket key holds AnySource
		if s.Source == AnySource {
			e.indexAnySource(c)
		}
		k := tagKey(s.Source, s.Tag)
		b := c.bucket(k)
		if b != nil {
			x = b.msgs.head
		}
		if x == nil {
			if b == nil {
				b = e.newBucket(c, k)
			} else {
				e.wake(b)
			}
			l = &b.recvs
			if s.Source == AnySource {
				c.anySrcTag++
			}
		}
	}
	if x != nil {
		m, env = x.msg, x.env
		e.removeMsg(x)
		e.matchesCounted++
		return m, env, PostedHandle{}, true
	}
	return e.queueRecv(l, s, r)
}

// queueRecv queues r for s at the tail of l and returns its handle.
func (e *Engine[R, M]) queueRecv(l *recvList[R, M], s Spec, r R) (m M, env Envelope, h PostedHandle, ok bool) {
	x := e.newRecv()
	x.r, x.spec, x.pseq = r, s, e.pseq
	e.pseq++
	l.pushBack(x)
	e.nPosted++
	return m, env, PostedHandle{slot: x.slot, gen: x.gen}, false
}

// Arrive offers an arrived message, appends to out the matches that became
// possible, in the order they were made, and returns out.
//
// A message whose Seq is the next one expected from (Context, Source) becomes
// matchable: it matches the earliest-posted receive that matches it, exact or
// wildcard, or is queued as unexpected. Then the held messages that follow it
// in sequence become matchable in turn. A message ahead of the next expected
// Seq is held, and Arrive returns out unchanged (MPI-4.1 §3.5 non-overtaking,
// ob1 frags_cant_match).
//
// On error the message is not kept and out is returned unchanged; the caller
// releases the message.
func (e *Engine[R, M]) Arrive(env Envelope, m M, out []Match[R, M]) ([]Match[R, M], error) {
	if err := env.Validate(); err != nil {
		return out, err
	}
	p := e.contextFor(env.Context).peerFor(env.Source)
	if p.dropped {
		return out, fmt.Errorf("%w: context %d source %d tag %d seq %d",
			ErrSourceDropped, env.Context, env.Source, env.Tag, env.Seq)
	}
	if d := int32(env.Seq - p.expect); d != 0 {
		if d < 0 {
			return out, e.duplicate(env, p)
		}
		return out, e.hold(p, env, m)
	}
	out = e.deliver(p, env, m, out)
	p.expect++
	for x := p.held.head; x != nil && x.env.Seq == p.expect; x = p.held.head {
		p.held.remove(byTag, x)
		e.nHeld--
		henv, hm := x.env, x.msg
		e.freeMsg(x)
		out = e.deliver(p, henv, hm, out)
		p.expect++
	}
	return out, nil
}

func (e *Engine[R, M]) duplicate(env Envelope, p *peer[R, M]) error {
	return fmt.Errorf("%w: context %d source %d tag %d seq %d (expecting %d)",
		ErrDuplicateSequence, env.Context, env.Source, env.Tag, env.Seq, p.expect)
}

// hold inserts an out-of-sequence arrival into its peer's held list, kept in
// ascending sequence order. Arrivals are mostly close to in order, so the
// search starts from the tail.
func (e *Engine[R, M]) hold(p *peer[R, M], env Envelope, m M) error {
	at := p.held.tail
	for at != nil {
		d := int32(at.env.Seq - env.Seq)
		if d == 0 {
			return e.duplicate(env, p)
		}
		if d < 0 {
			break
		}
		at = at.prev[byTag]
	}
	x := e.newMsg()
	x.env, x.msg = env, m
	p.held.insertAfter(byTag, x, at)
	e.nHeld++
	return nil
}

// deliver matches a message that has just become matchable against the
// posted receives, or queues it as unexpected. The receives that can match it
// sit at the heads of at most four lists; the earliest posted wins (ob1
// match_incomming, UCX's expected-queue sn).
func (e *Engine[R, M]) deliver(p *peer[R, M], env Envelope, m M, out []Match[R, M]) []Match[R, M] {
	e.attempts++
	c := p.ctx
	best, exact, anySrc := bestRecv(p, env)
	if best != nil {
		out = append(out, Match[R, M]{Recv: best.r, Msg: m, Env: env})
		e.removeRecv(best)
		e.matchesCounted++
		return out
	}
	x := e.newMsg()
	x.env, x.msg = env, m
	if exact == nil {
		exact = e.newBucket(c, tagKey(env.Source, env.Tag))
	} else {
		e.wake(exact)
	}
	if anySrc == nil && c.anySrcIndexed {
		anySrc = c.bucket(tagKey(AnySource, env.Tag)) // not looked up above when it holds no receive
		if anySrc == nil {
			anySrc = e.newBucket(c, tagKey(AnySource, env.Tag))
		}
	}
	exact.msgs.pushBack(byTag, x)
	if anySrc != nil {
		e.wake(anySrc)
		anySrc.msgs.pushBack(byAnySourceTag, x)
	}
	if env.Tag >= 0 {
		p.msgs.pushBack(bySource, x)
		c.msgs.pushBack(byContext, x)
	} else {
		p.internal.pushBack(bySource, x)
		c.internal.pushBack(byContext, x)
	}
	e.nUnexp++
	return out
}

// bestRecv returns the earliest-posted receive that matches env from p, if
// any, and the exact and (AnySource, tag) buckets it looked up (nil when absent;
// anySrc also nil when the context has no such receive).
func bestRecv[R, M any](p *peer[R, M], env Envelope) (best *recvNode[R, M], exact, anySrc *tagBucket[R, M]) {
	c := p.ctx
	exact = c.bucket(tagKey(env.Source, env.Tag))
	if c.anySrcTag > 0 {
		anySrc = c.bucket(tagKey(AnySource, env.Tag))
	}
	if exact != nil {
		best = exact.recvs.head
	}
	if anySrc != nil {
		best = earlier(best, anySrc.recvs.head)
	}
	if env.Tag >= 0 {
		best = earlier(best, p.recvs.head)
		best = earlier(best, c.recvs.head)
	}
	return best, exact, anySrc
}

// ArrivePosted is Arrive's fast path for the common case of a message that
// finds its receive posted. When env is valid, is the next sequence number
// expected from its source, no held message waits behind it, and a posted
// receive matches it, ArrivePosted removes that receive, counts the match and
// returns the receive: exactly what Arrive would have done with a one-match
// output. Otherwise it changes nothing and returns false, and the caller
// calls Arrive (which also reports the errors).
func (e *Engine[R, M]) ArrivePosted(env Envelope) (r R, ok bool) {
	if env.Source < 0 || env.Tag == AnyTag { // invalid: Arrive reports it
		return r, false
	}
	c := e.lookupContext(env.Context)
	if c == nil {
		return r, false
	}
	p := c.peer(env.Source)
	if p == nil || p.dropped || env.Seq != p.expect || p.held.head != nil {
		return r, false
	}
	var best *recvNode[R, M]
	if c.anySrcTag == 0 && c.recvs.head == nil && p.recvs.head == nil {
		// No wildcard receive could take it: the exact bucket's first
		// receive, if any (bestRecv's answer, without its other lookups).
		if b := c.bucket(tagKey(env.Source, env.Tag)); b != nil {
			best = b.recvs.head
		}
	} else {
		best, _, _ = bestRecv(p, env)
	}
	if best == nil {
		return r, false
	}
	// removeRecv for a list head (bestRecv looks only at heads), written
	// out in this frame: the common message's match makes no call.
	l := best.in
	next := best.next
	l.head = next
	if next != nil {
		next.prev = nil
	} else {
		l.tail = nil
	}
	l.n--
	if b := l.bucket; b != nil && (l.n == 0 || b.ctx.anySrcTag != 0) {
		e.bucketLost(b)
	}
	r = best.r
	var zero R
	best.r, best.next, best.in = zero, nil, nil
	best.gen++ // stale handles no longer name this node
	e.freeRecvs = append(e.freeRecvs, best)
	e.nPosted--
	e.attempts++
	e.matchesCounted++
	p.expect++
	return r, true
}

// Cancel removes a queued receive and returns it (MPI_Cancel of a receive). It
// returns false if h was already matched or cancelled, or names no receive.
func (e *Engine[R, M]) Cancel(h PostedHandle) (r R, ok bool) {
	if uint64(h.slot) >= uint64(len(e.slots)) {
		return r, false
	}
	x := e.slots[h.slot]
	if x.gen != h.gen || x.in == nil {
		return r, false
	}
	r = x.r
	e.removeRecv(x)
	return r, true
}

// Probe returns the earliest matchable unexpected message that matches s,
// without removing it (MPI_Iprobe). The same message is what Post(s) would take
// now.
func (e *Engine[R, M]) Probe(s Spec) (m M, env Envelope, ok bool) {
	if x := e.firstMsg(s); x != nil {
		return x.msg, x.env, true
	}
	return m, env, false
}

// Take is Probe that also removes the message (MPI_Improbe): it leaves
// matching, and the caller receives it later from its message handle
// (MPI_Mrecv) without going through the engine.
func (e *Engine[R, M]) Take(s Spec) (m M, env Envelope, ok bool) {
	if x := e.firstMsg(s); x != nil {
		m, env = x.msg, x.env
		e.removeMsg(x)
		return m, env, true
	}
	return m, env, false
}

// Held is the number of arrivals held for sequence order (Stats().Held).
func (e *Engine[R, M]) Held() int { return e.nHeld }

// Stats returns the engine's counters.
func (e *Engine[R, M]) Stats() Stats {
	return Stats{
		Posted:        e.nPosted,
		Unexpected:    e.nUnexp,
		Held:          e.nHeld,
		MatchAttempts: e.attempts,
		Matches:       e.matchesCounted,
	}
}

// firstMsg returns the head of the one unexpected list that holds exactly the
// messages s matches, in matchable order, or nil.
func (e *Engine[R, M]) firstMsg(s Spec) *msgNode[R, M] {
	c := e.lookupContext(s.Context)
	if c == nil {
		return nil
	}
	switch {
	case s.Source == AnySource && s.Tag == AnyTag:
		return c.msgs.head
	case s.Tag == AnyTag:
		if p := c.peer(s.Source); p != nil {
			return p.msgs.head
		}
	default:
		if s.Source == AnySource {
			e.indexAnySource(c)
		}
		if b := c.bucket(tagKey(s.Source, s.Tag)); b != nil {
			return b.msgs.head
		}
	}
	return nil
}

// indexAnySource turns on c's (AnySource, tag) buckets: it links every
// matchable message of c, in matchable order, into the bucket of its tag.
// It costs one pass over c's unexpected messages, once per context.
func (e *Engine[R, M]) indexAnySource(c *context[R, M]) {
	if c.anySrcIndexed {
		return
	}
	c.anySrcIndexed = true
	for _, l := range [...]*msgList[R, M]{&c.msgs, &c.internal} {
		for x := l.head; x != nil; x = x.next[byContext] {
			k := tagKey(AnySource, x.env.Tag)
			b := c.bucket(k)
			if b == nil {
				b = e.newBucket(c, k)
			}
			b.msgs.pushBack(byAnySourceTag, x)
		}
	}
}

// lookupContext returns the context of id ctx, nil if it has none.
func (e *Engine[R, M]) lookupContext(ctx uint32) *context[R, M] {
	if c := e.last; c != nil && e.lastID == ctx {
		return c
	}
	c := e.ctxs[ctx]
	if c != nil {
		e.last, e.lastID = c, ctx
	}
	return c
}

func (e *Engine[R, M]) contextFor(ctx uint32) *context[R, M] {
	c := e.lookupContext(ctx)
	if c == nil {
		c = cacheline.New[context[R, M]]()
		*c = context[R, M]{
			peers: make(map[int32]*peer[R, M]),
			tags:  make(map[uint64]*tagBucket[R, M]),
		}
		e.ctxs[ctx] = c
		e.last, e.lastID = c, ctx
	}
	return c
}

// bucket returns the tag bucket of key k in c, nil if there is none.
func (c *context[R, M]) bucket(k uint64) *tagBucket[R, M] {
	if c.lastOK && c.lastK == k {
		return c.lastB
	}
	b := c.tags[k]
	c.lastK, c.lastB, c.lastOK = k, b, true
	return b
}

// maxByRank bounds context.byRank: sources from it on are found by hashing.
const maxByRank = 1 << 12

// peer returns the peer of src, nil if it has none.
func (c *context[R, M]) peer(src int32) *peer[R, M] {
	if uint32(src) < uint32(len(c.byRank)) {
		return c.byRank[src]
	}
	return c.peers[src]
}

func (c *context[R, M]) peerFor(src int32) *peer[R, M] {
	if uint32(src) < uint32(len(c.byRank)) {
		if p := c.byRank[src]; p != nil {
			return p
		}
	}
	p := c.peers[src]
	if p == nil {
		p = cacheline.New[peer[R, M]]()
		p.ctx = c
		c.peers[src] = p
	}
	if src >= 0 && src < maxByRank {
		if int(src) >= len(c.byRank) {
			grown := cacheline.Slice[*peer[R, M]](int(src) + 1)
			copy(grown, c.byRank)
			c.byRank = grown
		}
		c.byRank[src] = p
	}
	return p
}

// newBucket makes an empty bucket for k in c, where k must not be yet.
func (e *Engine[R, M]) newBucket(c *context[R, M], k uint64) *tagBucket[R, M] {
	b := e.freeBuckets
	if b != nil {
		e.freeBuckets = b.idleNext
		b.idleNext = nil
	} else {
		b = cacheline.New[tagBucket[R, M]]()
		b.recvs.bucket = b
		b.msgs.bucket = b
	}
	b.ctx, b.key = c, k
	c.tags[k] = b
	c.lastK, c.lastB, c.lastOK = k, b, true
	return b
}

// releaseIfEmpty marks b idle once neither of its lists holds anything. The
// bucket that emptied last waits in pendIdle rather than on the idle list,
// and goes on the list only when another bucket empties: a bucket that
// empties and fills again in turn (a ping-pong's, one receive at a time)
// then costs no list operations. When there are too many idle buckets the
// oldest on the list returns to the pool.
func (e *Engine[R, M]) releaseIfEmpty(b *tagBucket[R, M]) {
	if b.recvs.n != 0 || b.msgs.n != 0 || b.idle {
		return
	}
	b.idle = true
	e.nIdle++
	if p := e.pendIdle; p != nil {
		e.linkIdle(p)
	}
	e.pendIdle = b
	if e.nIdle > e.maxIdle && e.idleHead != nil {
		e.freeBucket(e.idleHead)
	}
}

// linkIdle appends b, idle and counted, to the idle list.
func (e *Engine[R, M]) linkIdle(b *tagBucket[R, M]) {
	b.idleNext = nil
	b.idlePrev = e.idleTail
	if e.idleTail != nil {
		e.idleTail.idleNext = b
	} else {
		e.idleHead = b
	}
	e.idleTail = b
}

// wake makes b busy again: it is about to receive an item.
func (e *Engine[R, M]) wake(b *tagBucket[R, M]) {
	if !b.idle {
		return
	}
	b.idle = false
	e.nIdle--
	if e.pendIdle == b {
		e.pendIdle = nil
		return
	}
	if b.idlePrev != nil {
		b.idlePrev.idleNext = b.idleNext
	} else {
		e.idleHead = b.idleNext
	}
	if b.idleNext != nil {
		b.idleNext.idlePrev = b.idlePrev
	} else {
		e.idleTail = b.idlePrev
	}
	b.idlePrev, b.idleNext = nil, nil
}

// freeBucket removes an empty bucket from its map and returns it to the pool.
func (e *Engine[R, M]) freeBucket(b *tagBucket[R, M]) {
	e.wake(b)
	delete(b.ctx.tags, b.key)
	if b.ctx.lastB == b {
		b.ctx.lastB = nil // lastK stays: it now has no bucket
	}
	b.ctx = nil
	b.idleNext = e.freeBuckets
	e.freeBuckets = b
}

func (e *Engine[R, M]) newRecv() *recvNode[R, M] {
	if n := len(e.freeRecvs); n > 0 {
		x := e.freeRecvs[n-1]
		e.freeRecvs = e.freeRecvs[:n-1]
		return x
	}
	if len(e.recvSlab) == 0 {
		e.recvSlab = make([]recvNode[R, M], recvSlab)
	}
	x := &e.recvSlab[0]
	e.recvSlab = e.recvSlab[1:]
	x.slot, x.gen = uint32(len(e.slots)), 1
	e.slots = append(e.slots, x)
	return x
}

// removeRecv unlinks a queued receive and frees its node.
func (e *Engine[R, M]) removeRecv(x *recvNode[R, M]) {
	l := x.in
	l.remove(x) // clears x's links
	if b := l.bucket; b != nil {
		e.bucketLost(b)
	}
	e.nPosted--
	var zero R
	x.r = zero // let the garbage collector have the request
	x.gen++    // stale handles no longer name this node
	e.freeRecvs = append(e.freeRecvs, x)
}

// bucketLost updates b's context and the idle list after a receive left
// b's list (removeRecv's bucket steps).
func (e *Engine[R, M]) bucketLost(b *tagBucket[R, M]) {
	if int32(uint32(b.key>>32)) == AnySource {
		b.ctx.anySrcTag--
	}
	if b.recvs.n == 0 && b.msgs.n == 0 {
		e.releaseIfEmpty(b)
	}
}

func (e *Engine[R, M]) newMsg() *msgNode[R, M] {
	x := e.freeMsgs
	if x == nil {
		return cacheline.New[msgNode[R, M]]()
	}
	e.freeMsgs = x.next[0]
	x.next[0] = nil
	return x
}

func (e *Engine[R, M]) freeMsg(x *msgNode[R, M]) {
	*x = msgNode[R, M]{} // drops the message for the garbage collector
	x.next[0] = e.freeMsgs
	e.freeMsgs = x
}

// removeMsg unlinks a matchable unexpected message from its four lists and
// frees its node.
func (e *Engine[R, M]) removeMsg(x *msgNode[R, M]) {
	for k := range nLinks {
		l := x.in[k] // a matchable message is on all four, or three before indexAnySource
		if l == nil {
			continue
		}
		l.remove(k, x)
		if l.bucket != nil {
			e.releaseIfEmpty(l.bucket)
		}
	}
	e.nUnexp--
	e.freeMsg(x)
}
