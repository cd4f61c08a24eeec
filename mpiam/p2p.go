package mpiam

import (
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/amgo-hpc/amgo/am/transport"
	"github.com/amgo-hpc/amgo/handlers"
	"github.com/amgo-hpc/amgo/mpiam/internal/match"
)

// argsOK is the common case of checkSend and checkRecv, inlined into the
// point-to-point calls (the checks themselves do not inline): c usable, the
// peer a rank of c (no wildcard, no ProcNull), the tag 0..TagUB.
func (c *Comm) argsOK(peer, tag int) bool {
	return c.usable() && uint(peer) < uint(c.size) && uint(tag) <= TagUB
}

// checkSend validates a send's destination and tag (MPI-4.1 §3.2.3).
func (c *Comm) checkSend(dest, tag int) error {
	if c.argsOK(dest, tag) {
		return nil // the common case, one call
	}
	return c.checkSendSlow(dest, tag)
}

// checkSendSlow is checkSend past its common case.
func (c *Comm) checkSendSlow(dest, tag int) error {
	if err := c.valid(); err != nil {
		return err
	}
	if dest != ProcNull && (dest < 0 || dest >= c.size) {
		return fmt.Errorf("%w: destination %d (communicator %d has %d ranks)", ErrRank, dest, c.ctx, c.size)
	}
	if tag < 0 || tag > TagUB {
		return fmt.Errorf("%w: %d (0..%d for sends)", ErrTag, tag, TagUB)
	}
	return nil
}

// checkRecv validates a receive's source and tag (wildcards allowed).
func (c *Comm) checkRecv(src, tag int) error {
	if c.argsOK(src, tag) {
		return nil // the common case, one call
	}
	return c.checkRecvSlow(src, tag)
}

// checkRecvSlow is checkRecv past its common case.
func (c *Comm) checkRecvSlow(src, tag int) error {
	if err := c.valid(); err != nil {
		return err
	}
	if src != ProcNull && src != AnySource && (src < 0 || src >= c.size) {
		return fmt.Errorf("%w: source %d (communicator %d has %d ranks)", ErrRank, src, c.ctx, c.size)
	}
	if tag != AnyTag && (tag < 0 || tag > TagUB) {
		return fmt.Errorf("%w: %d (0..%d or AnyTag)", ErrTag, tag, TagUB)
	}
	return nil
}

// startSend starts r (kind send, fields set) on its communicator.
func (p *proc) startSend(r *reqState) error {
	c := r.comm
	if r.peer == ProcNull {
		r.complete(Status{Source: ProcNull, Tag: r.tag})
		return nil
	}
	if r.mode == Buffered {
		// Copy into the attached buffer and send the copy; the user's request
		// completes at once (a local operation, MPI-4.1 §3.4).
		ir, err := p.bsend.take(r)
		if errors.Is(err, errBsendFull) {
			// Pending buffered sends may finish (or have finished without
			// this rank having polled their completion): poll for a while
			// before failing, as MPICH's buffered send does.
			for start := time.Now(); errors.Is(err, errBsendFull) && time.Since(start) < bsendWait; {
				p.progress()
				runtime.Gosched()
				ir, err = p.bsend.take(r)
			}
		}
		if err != nil {
			r.complete(Status{Err: err})
			return err
		}
		if err := p.startSend(ir); err != nil {
			r.complete(Status{Err: err})
			return err
		}
		r.complete(Status{})
		return nil
	}
	world := c.world(r.peer)
	var rndv bool
	if r.lay != nil {
		rndv = r.mode == Synchronous || !p.eagerPacked(world, r.size())
	} else {
		rndv = r.mode == Synchronous || r.rndv || !p.eager(world, r.size())
	}
	var flags uint64
	switch r.mode {
	case Synchronous:
		flags = flagSync
	case Ready:
		flags = flagReady
	}
	var addr uint64
	if rndv {
		r.useCold()
		if r.lay == nil {
			addr = p.offerAddr(world, r.buf)
		} else if n := r.size(); n <= typedChunk && p.ep.CanGet(world, n) && !p.stagesTo(world) {
			// Non-contiguous data of one chunk to a peer that reads with
			// one copy: packed now into a staging buffer, which is offered
			// as a contiguous sender's buffer is (rndv_typed.go). A peer
			// on this node with shared stages is offered nothing instead:
			// a strided receiver has this rank pack into its stage, piece
			// by piece, while it unpacks (stage.go).
			r.bounce = getChunk()
			r.lay.pack(r.bounce[:n], r.buf, 0)
			addr = p.offerAddr(world, r.bounce[:n])
		}
		p.mu.Lock()
		p.nextID++
		r.id = p.nextID
		r.parts, r.xferErr, r.xferPB, r.xferHasPB = 1, nil, 0, false // the receiver's final word
		p.fileReqLocked(r)
		p.mu.Unlock()
	}
	seq := c.nextSeq(r.peer)
	a0, a1 := envelope(c.ctx, c.rank, r.tag, seq, flags)
	var err error
	pb, hasPB := r.pbOut, r.hasPBOut
	if !hasPB {
		pb, hasPB = p.outgoingPB()
	}
	piggyback := handlers.Piggyback{Value: pb, Set: hasPB}
	if r.hasSig {
		err = p.sendWithSig(r, world, rndv, piggyback, addr, a0, a1)
	} else if rndv {
		err = p.ep.RequestShortWith(world, hRTS, piggyback, a0, a1, uint64(r.size()), r.id, addr) // proto.RTS
	} else if r.lay != nil {
		// Non-contiguous data up to the eager limit: packed into scratch
		// space, which the medium request copies.
		s := getScratch(r.lay.n)
		r.lay.pack(s.b, r.buf, 0)
		err = p.sendEagerData(world, s.b, piggyback, a0, a1)
		putScratch(s)
	} else {
		err = p.sendEagerData(world, r.buf, piggyback, a0, a1)
	}
	if err != nil {
		if rndv {
			p.mu.Lock()
			p.unfileReqLocked(r.id)
			bounce := r.bounce
			r.bounce = nil
			p.mu.Unlock()
			if bounce != nil {
				putChunk(bounce)
			}
		}
		err = p.netErr(c, world, fmt.Sprintf("send to rank %d, tag %d", r.peer, r.tag), err)
		r.complete(Status{Err: err})
		return err
	}
	if !rndv {
		r.complete(Status{})
	}
	return nil
}

// sendEager sends an eager message (standard or ready mode) and returns when it
// is on its way: the blocking Send's fast path.
func (p *proc) sendEager(c *Comm, buf []byte, dest, tag int, mode Mode, pb uint64, hasPB bool) error {
	world := c.world(dest)
	var flags uint64
	if mode == Ready {
		flags = flagReady
	}
	seq := c.nextSeq(dest)
	a0, a1 := envelope(c.ctx, c.rank, tag, seq, flags)
	err := p.sendEagerData(world, buf, handlers.Piggyback{Value: pb, Set: hasPB}, a0, a1)
	if err != nil {
		return p.netErr(c, world, fmt.Sprintf("send to rank %d, tag %d", dest, tag), err)
	}
	return nil
}

// sendEagerStd is sendEager for a standard-mode send without a tool value
// to world rank world (dest in c), in fewer steps: the envelope, then an
// immediate request, or a medium one when the immediate cannot go.
func (p *proc) sendEagerStd(c *Comm, buf []byte, world, dest, tag int) error {
	a0, a1 := envelope(c.ctx, c.rank, tag, c.nextSeq(dest), 0)
	ok, err := p.ep.RequestImmediate(world, hEager, buf, a0, a1)
	if !ok && err == nil {
		err = p.ep.RequestMediumWith(world, hEager, buf, handlers.Piggyback{}, a0, a1)
	}
	if err != nil {
		return p.netErr(c, world, fmt.Sprintf("send to rank %d, tag %d", dest, tag), err)
	}
	return nil
}

// sendEagerFill is sendEager for n bytes of data that f writes in place in
// a medium request's payload (am.Endpoint.RequestMediumFill).
func (p *proc) sendEagerFill(c *Comm, f transport.Filler, n, dest, tag int, mode Mode, pb uint64, hasPB bool) error {
	world := c.world(dest)
	var flags uint64
	if mode == Ready {
		flags = flagReady
	}
	a0, a1 := envelope(c.ctx, c.rank, tag, c.nextSeq(dest), flags)
	if err := p.ep.RequestMediumFill(world, hEager, n, f, handlers.Piggyback{Value: pb, Set: hasPB}, a0, a1); err != nil {
		return p.netErr(c, world, fmt.Sprintf("send to rank %d, tag %d", dest, tag), err)
	}
	return nil
}

// sendEagerData sends an eager message's data with its envelope (a0, a1)
// to world rank world: as an immediate request when it can go at once
// without a tool value (no reservation in the receiver's buffer, no credit
// back: am.Endpoint.RequestImmediate), else as a medium request.
func (p *proc) sendEagerData(world int, buf []byte, pb handlers.Piggyback, a0, a1 uint64) error {
	if !pb.Set {
		if ok, err := p.ep.RequestImmediate(world, hEager, buf, a0, a1); ok || err != nil {
			return err
		}
	}
	return p.ep.RequestMediumWith(world, hEager, buf, pb, a0, a1)
}

// startRecv posts r (kind recv, fields set).
func (p *proc) startRecv(r *reqState) error { return p.postRecv(r, false) }

// postRecv posts r (kind recv, fields set); locked: p.mu is held and deaths
// synced (r.peer is not ProcNull then). It unlocks p.mu. One function, so
// that a receive's path is one call deep.
func (p *proc) postRecv(r *reqState, locked bool) error {
	if !locked {
		if r.peer == ProcNull {
			r.complete(Status{Source: ProcNull, Tag: AnyTag})
			return nil
		}
		p.syncDeaths()
		p.mu.Lock()
	}
	c := r.comm
	spec := match.Spec{Context: c.ctx, Source: int32(r.peer), Tag: int32(r.tag)}
	if err := p.refuseRecvLocked(c, r.peer, r.tag); err != nil {
		p.mu.Unlock()
		r.complete(Status{Source: r.peer, Tag: r.tag, Err: err})
		return err
	}
	m, env, h, ok := p.eng.Post(spec, r)
	if !ok {
		r.handle = h
		p.notePostedLocked(r)
		p.mu.Unlock()
		return nil
	}
	return p.completePostedLocked(r, m, env)
}

// completePostedLocked completes receive r with message m, which it matched
// when posted (or through Mrecv). It unlocks p.mu.
func (p *proc) completePostedLocked(r *reqState, m *inMsg, env match.Envelope) error {
	if !m.rndv {
		p.finishEagerLocked(r, m, env)
		released := p.releaseMsgLocked(m)
		p.mu.Unlock()
		if !released {
			p.releaseMsg(m)
		}
		return nil
	}
	plan := p.planRndvLocked(r, m, env)
	p.mu.Unlock()
	dst := m.src
	p.recycleRTS(m)
	p.runRndv(r, dst, plan)
	return nil
}

// newSend takes an operation state from the cache, with a handle for it when
// handle is set (blocking calls put theirs back once wait returns; handles
// recycle theirs, see Request.recycle).
func (c *Comm) newSend(buf []byte, dest, tag int, mode Mode, handle bool) (*reqState, Request) {
	r, h := c.p.states.get(handle)
	c.setSend(r, buf, dest, tag, mode)
	return r, h
}

// setSend fills state r for a send of buf to dest with tag on c in mode.
func (c *Comm) setSend(r *reqState, buf []byte, dest, tag int, mode Mode) {
	r.p, r.kind, r.mode, r.comm, r.peer, r.tag, r.buf = c.p, kindSend, mode, c, dest, tag, buf
}

// newRecv is newSend for a receive.
func (c *Comm) newRecv(buf []byte, src, tag int, handle bool) (*reqState, Request) {
	r, h := c.p.states.get(handle)
	c.setRecv(r, buf, src, tag)
	return r, h
}

// setRecv fills state r for a receive of buf from src with tag on c.
func (c *Comm) setRecv(r *reqState, buf []byte, src, tag int) {
	r.p, r.kind, r.comm, r.peer, r.tag, r.buf = c.p, kindRecv, c, src, tag, buf
}

// sendsEager reports whether a send of n contiguous bytes to dest in mode
// goes eagerly, and so completes in its call (sendEager).
func (c *Comm) sendsEager(dest, n int, mode Mode) bool {
	return (mode == Standard || mode == Ready) && dest != ProcNull && c.p.eager(c.world(dest), n)
}

// isend starts a nonblocking send and returns its handle.
func (c *Comm) isend(buf []byte, dest, tag int, mode Mode) (Request, error) {
	if !c.argsOK(dest, tag) {
		if err := c.checkSendSlow(dest, tag); err != nil {
			return Request{}, err
		}
	}
	p := c.p
	if p.tools == nil && p.pbTool == nil && mode == Standard && dest != ProcNull {
		// The common eager send, in this frame: sendsEager's and
		// sendEager's steps without their calls; the handle as below.
		world := c.world(dest)
		// p.eager(world, n), written out (it does not inline).
		if n := len(buf); n <= p.streamLimit && !p.sendThrottle[world].on.Load() || n > p.streamLimit && p.eagerLarge(world, n) {
			// sendEagerStd, written out: its call costs an eager Isend
			// about 30 instructions (SelfWindow).
			a0, a1 := envelope(c.ctx, c.rank, tag, c.nextSeq(dest), 0)
			ok, err := p.ep.RequestImmediate(world, hEager, buf, a0, a1)
			if !ok && err == nil {
				err = p.ep.RequestMediumWith(world, hEager, buf, handlers.Piggyback{}, a0, a1)
			}
			if err != nil {
				return Request{}, p.netErr(c, world, fmt.Sprintf("send to rank %d, tag %d", dest, tag), err)
			}
			return c.sentRequest(buf, nil, dest, tag, Standard), nil
		}
	}
	if p.tools == nil && c.sendsEager(dest, len(buf), mode) {
		// Eager: the send completes in this call (as Send's does), so its
		// state is complete from the start.
		pb, hasPB := p.outgoingPB()
		if err := p.sendEager(c, buf, dest, tag, mode, pb, hasPB); err != nil {
			return Request{}, err
		}
		return c.sentRequest(buf, nil, dest, tag, mode), nil
	}
	r, h := c.newSend(buf, dest, tag, mode, true)
	if err := c.p.startSend(r); err != nil {
		return Request{}, err
	}
	return h, nil
}

// sentRequest returns the handle of a nonblocking send in mode of buf (laid
// out by lay, nil for contiguous bytes) to dest with tag on c that completed
// in its call (eager): its state comes from the cache and is completed at
// once, with the status reqState.complete gives a send, so every call that
// reports requests treats it as any other, and its state is recycled warm.
func (c *Comm) sentRequest(buf []byte, lay *layout, dest, tag int, mode Mode) Request {
	st := &c.p.states
	var r *reqState
	var h Request
	if st.mu.Sequential() {
		// reqCache.get's steps without its call or its lock (see irecv).
		if r = st.free.pop(); r == nil {
			r = st.newState()
		}
		h = handleOf(r)
	} else {
		r, h = st.get(true)
	}
	c.setSend(r, buf, dest, tag, mode)
	r.lay = lay
	// reqState.complete's steps for a send with no completion callback,
	// written out: its call does not inline, and this is every eager Isend.
	r.status = Status{Source: dest, Tag: tag, Bytes: r.size()}
	r.done.Store(true)
	return h
}

func (c *Comm) send(buf []byte, dest, tag int, mode Mode) error {
	if !c.argsOK(dest, tag) {
		if err := c.checkSendSlow(dest, tag); err != nil {
			return err
		}
	}
	p := c.p
	if p.pbTool == nil && mode == Standard && dest != ProcNull {
		// The common eager send, as isend's (p.eager written out).
		world := c.world(dest)
		if n := len(buf); n <= p.streamLimit && !p.sendThrottle[world].on.Load() || n > p.streamLimit && p.eagerLarge(world, n) {
			return p.sendEagerStd(c, buf, world, dest, tag)
		}
	}
	if c.sendsEager(dest, len(buf), mode) {
		// Eager: complete once the data is on its way, so no request is needed.
		pb, hasPB := p.outgoingPB()
		return p.sendEager(c, buf, dest, tag, mode, pb, hasPB)
	}
	r, _ := c.newSend(buf, dest, tag, mode, false)
	err := c.p.startSend(r)
	if err == nil {
		_, err = r.wait()
	}
	c.p.states.put(r)
	return err
}

// irecv posts a nonblocking receive and returns its handle.
func (c *Comm) irecv(buf []byte, src, tag int) (Request, error) {
	if !c.argsOK(src, tag) {
		if err := c.checkRecvSlow(src, tag); err != nil {
			return Request{}, err
		}
	}
	p := c.p
	if src == ProcNull {
		r, h := c.newRecv(buf, src, tag, true)
		if err := p.startRecv(r); err != nil {
			return Request{}, err
		}
		return h, nil
	}
	var r *reqState
	var h Request
	if p.mu.Sequential() {
		// One goroutine in the library: the state straight off the
		// cache's stack, taken once p.mu's flag is, so that a second
		// goroutine (a misuse of the thread level) is caught before it
		// can take the same state (as postBlocking). Through newRecv and
		// reqCache.get, neither of which inlines, this costs about 50
		// instructions more per message (SelfWindow).
		p.syncDeaths()
		p.mu.Lock()
		st := &p.states
		if r = st.free.pop(); r == nil {
			r = st.newState()
		}
		h = handleOf(r)
		c.setRecv(r, buf, src, tag)
	} else {
		// With locks: the state is taken under the matching lock that
		// posting takes anyway (recvStack).
		p.syncDeaths()
		p.mu.Lock()
		r = p.recvStates.getLocked(&p.states)
		h = handleOf(r)
		c.setRecv(r, buf, src, tag)
	}
	if p.fail.any.Load() {
		if err := p.postRecv(r, true); err != nil {
			return Request{}, err
		}
		return h, nil
	}
	// postRecv's common case (no failed rank to refuse for, no message
	// waiting), in this frame.
	m, env, ph, ok := p.eng.Post(match.Spec{Context: c.ctx, Source: int32(src), Tag: int32(tag)}, r)
	if !ok {
		r.handle = ph
		p.notePostedLocked(r)
		p.mu.Unlock()
		return h, nil
	}
	if err := p.completePostedLocked(r, m, env); err != nil {
		return Request{}, err
	}
	return h, nil
}

func (c *Comm) recv(buf []byte, src, tag int) (Status, error) {
	var st Status
	err := c.recvInto(buf, src, tag, &st)
	return st, err
}

// recvInto is recv with the status written to *st (see copyStatus).
func (c *Comm) recvInto(buf []byte, src, tag int, st *Status) error {
	if !c.argsOK(src, tag) {
		if err := c.checkRecvSlow(src, tag); err != nil {
			*st = Status{}
			return err
		}
	}
	r, err := c.postBlocking(buf, src, tag)
	if err != nil {
		*st = Status{}
		return err
	}
	err = r.waitInto(st)
	c.p.states.put(r)
	return err
}

// postBlocking posts a receive of buf from src with tag (checked) for a
// blocking call, which waits for the state it returns and puts it back in
// the cache (no handle).
func (c *Comm) postBlocking(buf []byte, src, tag int) (*reqState, error) {
	p := c.p
	var r *reqState
	if p.mu.Sequential() && src != ProcNull {
		// As irecv's: the state straight off the cache's stack, taken once
		// p.mu's flag is, so that a second goroutine (a misuse of the
		// thread level) is caught before it can take the same state.
		p.syncDeaths()
		p.mu.Lock()
		cache := &p.states
		if r = cache.free.pop(); r == nil {
			r = cache.newState()
		}
		c.setRecv(r, buf, src, tag)
		if err := p.postRecv(r, true); err != nil {
			return nil, err
		}
		return r, nil
	}
	r, _ = c.newRecv(buf, src, tag, false)
	if err := p.startRecv(r); err != nil {
		return nil, err
	}
	return r, nil
}

// sendrecvLayInto is a send and a receive at once, each of memory laid out
// by its layout (nil: contiguous) and typed for the checks by its msgType,
// with the receive's status written to *st (see copyStatus). Both calls'
// arguments are checked before anything starts. The receive is posted
// first, then the send runs as a blocking send: eager, it completes at
// once; by rendezvous, its wait progresses the posted receive too, so two
// ranks that exchange large messages this way both finish. That is MPI's
// definition (an Irecv, an Isend and a Waitall, MPI-4.1 §3.10) without the
// two requests' handles. A send that fails cancels the receive if it has
// not matched yet, and its error is returned with an empty status.
func (c *Comm) sendrecvLayInto(smem []byte, slay *layout, smt msgType, dest, sendtag int,
	rmem []byte, rlay *layout, rmt msgType, src, recvtag int, st *Status) error {
	if !c.argsOK(src, recvtag) || !c.argsOK(dest, sendtag) {
		err := c.checkRecvSlow(src, recvtag)
		if err == nil {
			err = c.checkSendSlow(dest, sendtag)
		}
		if err != nil {
			*st = Status{}
			return err
		}
	}
	var r *reqState
	var err error
	if rlay == nil && !c.checking() {
		r, err = c.postBlocking(rmem, src, recvtag)
	} else {
		r, _, err = c.postLay(rmem, rlay, rmt, src, recvtag, false)
	}
	if err != nil {
		*st = Status{}
		return err
	}
	if slay == nil && !c.checking() {
		err = c.send(smem, dest, sendtag, Standard)
	} else {
		err = c.sendLay(smem, slay, smt, dest, sendtag, Standard)
	}
	if err != nil {
		_ = r.cancel()
		_ = r.waitInto(st)
		c.p.states.put(r)
		*st = Status{}
		return err
	}
	err = r.waitInto(st)
	c.p.states.put(r)
	return err
}

// sendCall is a blocking send in mode, under the tools' hooks when any.
func (c *Comm) sendCall(call Call, b []byte, dest, tag int, mode Mode) error {
	if c.hooked() {
		return c.p.hookErr(&Event{Call: call, Comm: c, Peer: dest, Tag: tag, Bytes: len(b), Mode: mode},
			func() error { return c.send(b, dest, tag, mode) })
	}
	return c.send(b, dest, tag, mode)
}

// isendCall starts a send in mode, under the tools' hooks when any.
func (c *Comm) isendCall(call Call, b []byte, dest, tag int, mode Mode) (Request, error) {
	if c.hooked() {
		return c.p.hookReq(&Event{Call: call, Comm: c, Peer: dest, Tag: tag, Bytes: len(b), Mode: mode},
			func() (Request, error) { return c.isend(b, dest, tag, mode) })
	}
	return c.isend(b, dest, tag, mode)
}

// Send is a standard-mode blocking send (MPI_Send, MPI-4.1 §3.2.1) of buf to rank
// dest of c with tag (0..TagUB). Up to the eager limit it returns once the data
// is on its way (buffered at the receiver); above it, once the data has been
// stored into the matching receive buffer (rendezvous). Errors: ErrComm,
// ErrRank, ErrTag, ErrOther (network).
func Send[T Elem](c *Comm, buf []T, dest, tag int) error {
	if c.checking() {
		return c.sendLayCall(CallSend, bytesOf(buf), nil, sliceType[T](len(buf)), dest, tag, Standard)
	}
	if !c.hooked() {
		return c.send(bytesOf(buf), dest, tag, Standard) // sendCall's common case, without its call
	}
	return c.sendCall(CallSend, bytesOf(buf), dest, tag, Standard)
}

// Bsend is a buffered-mode send (MPI_Bsend, MPI-4.1 §3.4): the message is copied
// into the buffer attached with BufferAttach and Bsend returns; ErrBuffer when the
// attached buffer lacks len(buf)*size + BsendOverhead bytes (after polling
// for up to 100 ms while earlier buffered sends are pending).
func Bsend[T Elem](c *Comm, buf []T, dest, tag int) error {
	if c.checking() {
		return c.sendLayCall(CallBsend, bytesOf(buf), nil, sliceType[T](len(buf)), dest, tag, Buffered)
	}
	return c.sendCall(CallBsend, bytesOf(buf), dest, tag, Buffered)
}

// Ssend is a synchronous-mode send (MPI_Ssend, MPI-4.1 §3.4): it returns only
// once the matching receive has started (a rendezvous handshake at every size).
func Ssend[T Elem](c *Comm, buf []T, dest, tag int) error {
	if c.checking() {
		return c.sendLayCall(CallSsend, bytesOf(buf), nil, sliceType[T](len(buf)), dest, tag, Synchronous)
	}
	return c.sendCall(CallSsend, bytesOf(buf), dest, tag, Synchronous)
}

// Rsend is a ready-mode send (MPI_Rsend, MPI-4.1 §3.4): the matching receive must
// already be posted. amgo sends it as a standard send would; if it arrives before
// its receive is posted, the receive that matches it completes with
// ErrReadyNotPosted (data intact) so that the erroneous program is reported.
func Rsend[T Elem](c *Comm, buf []T, dest, tag int) error {
	if c.checking() {
		return c.sendLayCall(CallRsend, bytesOf(buf), nil, sliceType[T](len(buf)), dest, tag, Ready)
	}
	return c.sendCall(CallRsend, bytesOf(buf), dest, tag, Ready)
}

// Isend starts a standard-mode send (MPI_Isend) and returns its request. buf
// must not be modified until the request completes.
func Isend[T Elem](c *Comm, buf []T, dest, tag int) (Request, error) {
	if c.checking() {
		return c.isendLayCall(CallIsend, bytesOf(buf), nil, sliceType[T](len(buf)), dest, tag, Standard)
	}
	if !c.hooked() {
		return c.isend(bytesOf(buf), dest, tag, Standard) // isendCall's common case, without its call
	}
	return c.isendCall(CallIsend, bytesOf(buf), dest, tag, Standard)
}

// Ibsend starts a buffered-mode send (MPI_Ibsend); see Bsend.
func Ibsend[T Elem](c *Comm, buf []T, dest, tag int) (Request, error) {
	if c.checking() {
		return c.isendLayCall(CallIbsend, bytesOf(buf), nil, sliceType[T](len(buf)), dest, tag, Buffered)
	}
	return c.isendCall(CallIbsend, bytesOf(buf), dest, tag, Buffered)
}

// Issend starts a synchronous-mode send (MPI_Issend); it completes once the
// matching receive has started.
func Issend[T Elem](c *Comm, buf []T, dest, tag int) (Request, error) {
	if c.checking() {
		return c.isendLayCall(CallIssend, bytesOf(buf), nil, sliceType[T](len(buf)), dest, tag, Synchronous)
	}
	return c.isendCall(CallIssend, bytesOf(buf), dest, tag, Synchronous)
}

// Irsend starts a ready-mode send (MPI_Irsend); see Rsend.
func Irsend[T Elem](c *Comm, buf []T, dest, tag int) (Request, error) {
	if c.checking() {
		return c.isendLayCall(CallIrsend, bytesOf(buf), nil, sliceType[T](len(buf)), dest, tag, Ready)
	}
	return c.isendCall(CallIrsend, bytesOf(buf), dest, tag, Ready)
}

// Recv receives into buf from rank src (or AnySource, ProcNull) with tag (or
// AnyTag) on c (MPI_Recv, MPI-4.1 §3.2.4). A message longer than buf fills buf
// and reports ErrTruncate; nothing is written past buf. Errors: ErrComm,
// ErrRank, ErrTag, ErrTruncate, ErrReadyNotPosted, ErrOther.
func Recv[T Elem](c *Comm, buf []T, src, tag int) (Status, error) {
	if c.checking() {
		b, mt := bytesOf(buf), sliceType[T](len(buf))
		f := func() (Status, error) { return c.recvLay(b, nil, mt, src, tag) }
		if c.hooked() {
			return c.p.hookStatus(&Event{Call: CallRecv, Comm: c, Peer: src, Tag: tag, Bytes: len(b)}, f)
		}
		return f()
	}
	if c.hooked() {
		b := bytesOf(buf)
		return c.p.hookStatus(&Event{Call: CallRecv, Comm: c, Peer: src, Tag: tag, Bytes: len(b)},
			func() (Status, error) { return c.recv(b, src, tag) })
	}
	// The status a field at a time: see copyStatus.
	var st Status
	err := c.recvInto(bytesOf(buf), src, tag, &st)
	return Status{Source: st.Source, Tag: st.Tag, Err: st.Err, Bytes: st.Bytes,
		Cancelled: st.Cancelled, Piggyback: st.Piggyback, HasPiggyback: st.HasPiggyback}, err
}

// Irecv posts a receive (MPI_Irecv) and returns its request; buf must not be
// read or modified until it completes.
func Irecv[T Elem](c *Comm, buf []T, src, tag int) (Request, error) {
	if c.checking() {
		b, mt := bytesOf(buf), sliceType[T](len(buf))
		f := func() (Request, error) { return c.irecvLay(b, nil, mt, src, tag) }
		if c.hooked() {
			return c.p.hookReq(&Event{Call: CallIrecv, Comm: c, Peer: src, Tag: tag, Bytes: len(b)}, f)
		}
		return f()
	}
	if c.hooked() {
		b := bytesOf(buf)
		return c.p.hookReq(&Event{Call: CallIrecv, Comm: c, Peer: src, Tag: tag, Bytes: len(b)},
			func() (Request, error) { return c.irecv(b, src, tag) })
	}
	return c.irecv(bytesOf(buf), src, tag)
}

// sendrecv is Sendrecv without tool hooks.
func sendrecv[S, R Elem](c *Comm, sendbuf []S, dest, sendtag int, recvbuf []R, src, recvtag int, st *Status) error {
	var smt, rmt msgType
	if c.checking() {
		smt, rmt = sliceType[S](len(sendbuf)), sliceType[R](len(recvbuf))
	}
	return c.sendrecvLayInto(bytesOf(sendbuf), nil, smt, dest, sendtag, bytesOf(recvbuf), nil, rmt, src, recvtag, st)
}

// sendrecvReplace is SendrecvReplace without tool hooks.
func sendrecvReplace[T Elem](c *Comm, buf []T, dest, sendtag, src, recvtag int, st *Status) error {
	// The outgoing data from pooled scratch, which the blocking send is
	// done with when sendrecvLayInto returns.
	out := getScratch(len(bytesOf(buf)))
	copy(out.b, bytesOf(buf))
	var mt msgType
	if c.checking() {
		mt = sliceType[T](len(buf))
	}
	err := c.sendrecvLayInto(out.b, nil, mt, dest, sendtag, bytesOf(buf), nil, mt, src, recvtag, st)
	putScratch(out)
	return err
}

// SendInit creates an inactive persistent send request (MPI_Send_init and the
// mode variants, MPI-4.1 §3.9); Start begins each send.
func SendInit[T Elem](c *Comm, buf []T, dest, tag int, mode Mode) (Request, error) {
	if err := c.checkSend(dest, tag); err != nil {
		return Request{}, err
	}
	if mode > Ready {
		return Request{}, fmt.Errorf("%w: send mode %d", ErrArg, mode)
	}
	r, _ := c.newSend(bytesOf(buf), dest, tag, mode, false)
	r.setType(sliceType[T](len(buf)))
	r.persistent = true
	return handleOf(r), nil
}

// RecvInit creates an inactive persistent receive request (MPI_Recv_init).
func RecvInit[T Elem](c *Comm, buf []T, src, tag int) (Request, error) {
	if err := c.checkRecv(src, tag); err != nil {
		return Request{}, err
	}
	r, _ := c.newRecv(bytesOf(buf), src, tag, false)
	r.setType(sliceType[T](len(buf)))
	r.persistent = true
	return handleOf(r), nil
}

// start is Start without tool hooks.
func (r *reqState) start() error {
	if r == nil || !r.persistent {
		return fmt.Errorf("%w: Start needs a persistent request", ErrRequest)
	}
	if r.active {
		return fmt.Errorf("%w: persistent request is still active", ErrRequest)
	}
	r.active = true
	r.done.Store(false)
	r.status = Status{}
	r.handle = match.PostedHandle{}
	switch r.kind {
	case kindColl:
		return r.coll.startPersistent()
	case kindSend:
		return r.p.startSend(r)
	}
	return r.p.startRecv(r)
}

// startall is Startall without tool hooks.
func startall(reqs []Request) error {
	for i, r := range reqs {
		if err := r.start(); err != nil {
			return fmt.Errorf("request %d: %w", i, err)
		}
	}
	return nil
}

// iprobe is Iprobe without tool hooks.
func (c *Comm) iprobe(src, tag int) (bool, Status, error) {
	if err := c.checkRecv(src, tag); err != nil {
		return false, Status{}, err
	}
	if src == ProcNull {
		return true, Status{Source: ProcNull, Tag: AnyTag}, nil
	}
	c.p.progress()
	return c.probe(src, tag)
}

func (c *Comm) probe(src, tag int) (bool, Status, error) {
	spec := match.Spec{Context: c.ctx, Source: int32(src), Tag: int32(tag)}
	p := c.p
	p.mu.Lock()
	defer p.mu.Unlock()
	m, env, ok := p.eng.Probe(spec)
	if !ok {
		return false, Status{}, nil
	}
	return true, Status{Source: int(env.Source), Tag: int(env.Tag), Bytes: m.size}, nil
}

// probeWait is Probe without tool hooks.
func (c *Comm) probeWait(src, tag int) (Status, error) {
	var st Status
	var perr error
	found := false
	if err := c.checkRecv(src, tag); err != nil {
		return Status{}, err
	}
	if src == ProcNull {
		return Status{Source: ProcNull, Tag: AnyTag}, nil
	}
	err := c.p.waitFor(func() bool {
		found, st, perr = c.probe(src, tag)
		if !found && perr == nil {
			perr = c.p.sourceFailed(c, src, tag)
		}
		return found || perr != nil
	})
	if err == nil {
		err = perr
	}
	return st, err
}

// Message is a message removed from matching by Mprobe or Improbe
// (MPI_Message, MPI-4.1 §3.8.2); only Mrecv or Imrecv can receive it.
type Message struct {
	comm *Comm
	msg  *inMsg
	env  match.Envelope
	null bool // MPI_MESSAGE_NO_PROC
}

// improbeAPI is Improbe without tool hooks.
func (c *Comm) improbeAPI(src, tag int) (bool, *Message, Status, error) {
	if err := c.checkRecv(src, tag); err != nil {
		return false, nil, Status{}, err
	}
	if src == ProcNull {
		return true, &Message{comm: c, null: true}, Status{Source: ProcNull, Tag: AnyTag}, nil
	}
	c.p.progress()
	return c.improbe(src, tag)
}

func (c *Comm) improbe(src, tag int) (bool, *Message, Status, error) {
	spec := match.Spec{Context: c.ctx, Source: int32(src), Tag: int32(tag)}
	p := c.p
	p.mu.Lock()
	m, env, ok := p.eng.Take(spec)
	p.mu.Unlock()
	if !ok {
		return false, nil, Status{}, nil
	}
	return true, &Message{comm: c, msg: m, env: env}, Status{Source: int(env.Source), Tag: int(env.Tag), Bytes: m.size}, nil
}

// mprobe is Mprobe without tool hooks.
func (c *Comm) mprobe(src, tag int) (*Message, Status, error) {
	if err := c.checkRecv(src, tag); err != nil {
		return nil, Status{}, err
	}
	if src == ProcNull {
		return &Message{comm: c, null: true}, Status{Source: ProcNull, Tag: AnyTag}, nil
	}
	var msg *Message
	var st Status
	var ferr error
	err := c.p.waitFor(func() bool {
		var ok bool
		ok, msg, st, _ = c.improbe(src, tag)
		if !ok {
			ferr = c.p.sourceFailed(c, src, tag)
		}
		return ok || ferr != nil
	})
	if err == nil && ferr != nil {
		return nil, Status{}, ferr
	}
	return msg, st, err
}

// imrecv is Imrecv without tool hooks.
func imrecv[T Elem](m *Message, buf []T) (Request, error) {
	var mt msgType
	if m != nil && m.comm.checking() {
		mt = sliceType[T](len(buf))
	}
	return imrecvLay(m, bytesOf(buf), nil, mt)
}

// imrecvLay is imrecv of mem, laid out by lay (nil: contiguous).
func imrecvLay(m *Message, mem []byte, lay *layout, mt msgType) (Request, error) {
	if m == nil || (m.msg == nil && !m.null) {
		return Request{}, fmt.Errorf("%w: message already received or nil", ErrRequest)
	}
	c := m.comm
	r, h := c.newRecv(mem, int(m.env.Source), int(m.env.Tag), true)
	r.lay = lay
	r.setType(mt)
	if m.null {
		r.complete(Status{Source: ProcNull, Tag: AnyTag})
		return h, nil
	}
	msg := m.msg
	m.msg = nil
	c.p.mu.Lock()
	if err := c.p.completePostedLocked(r, msg, m.env); err != nil {
		return Request{}, err
	}
	return h, nil
}

// mrecv is Mrecv without tool hooks.
func mrecv[T Elem](m *Message, buf []T) (Status, error) {
	r, err := imrecv(m, buf)
	if err != nil {
		return Status{}, err
	}
	return r.wait()
}

// outgoingPB is the tool value to piggyback on a message leaving now, if a
// tool attaches one (Piggybacker).
func (p *proc) outgoingPB() (uint64, bool) {
	if p.pbTool == nil {
		return 0, false
	}
	return p.pbTool.PiggybackValue(), true
}

// piggyback is the value every message of this rank carries: the attached
// tool's current one, or none.
func (p *proc) piggyback() handlers.Piggyback {
	if p.pbTool == nil {
		return handlers.Piggyback{}
	}
	return handlers.Piggyback{Value: p.pbTool.PiggybackValue(), Set: true}
}

// exchangeRndv reports whether a collective's exchange step of n bytes to
// world rank world goes by rendezvous whatever else is in flight: over
// limit (exchangeLimit) to a peer that can read this rank's memory with a
// single copy. An exchange is a stream both ways at once: eagerly each core
// copies its own message into the ring and the peer's out of it, by
// rendezvous each reads the peer's message once (docs/collectives.md).
func (p *proc) exchangeRndv(world, n, limit int) bool {
	return n > limit && p.ep.CanGet(world, n)
}

// exchangeLimit is the size, in bytes, above which an exchange step goes by
// rendezvous to a peer with a single-copy read: the stream limit, or for an
// exchange of an all-to-all's blocks (blocks) the lower block limit.
func (p *proc) exchangeLimit(blocks bool) int {
	if blocks {
		return p.blockLimit
	}
	return p.streamLimit
}

// eagerStep reports whether a collective step of n bytes to world rank
// world goes eager: as a standard send would; for an exchange (exLimit,
// from exchangeLimit, not 0), up to exLimit to a peer with a single-copy
// read (exchangeRndv), and to one without it also up to the eager limit of
// such peers (eagerNoGet, within MaxMedium) whatever the limit for this one.
func (p *proc) eagerStep(world, n, exLimit int) bool {
	if exLimit == 0 {
		return p.eager(world, n)
	}
	if p.exchangeRndv(world, n, exLimit) {
		return false
	}
	return p.eager(world, n) || n <= p.eagerNoGet && n <= p.ep.MaxMediumTo(world) && !p.sendThrottle[world].on.Load()
}

// sendPB is a blocking standard send that carries pb (if hasPB) instead of the
// tool's current value: collectives forward the largest value they have seen.
// For an exchange (a collective's exchange step: the peer sends to this rank
// at once; exLimit from exchangeLimit, 0 otherwise) the message goes eager
// up to MaxMedium to a peer without a single-copy read, whatever the eager
// limit, and up to exLimit to one with it (eagerStep; docs/collectives.md).
// A peer that throttled this rank (unexpected.go) gets a rendezvous all the
// same.
func (c *Comm) sendPB(buf []byte, dest, tag int, pb uint64, hasPB bool, exLimit int) error {
	if err := c.checkSend(dest, tag); err != nil {
		return err
	}
	p := c.p
	if dest != ProcNull && p.eagerStep(c.world(dest), len(buf), exLimit) {
		return p.sendEager(c, buf, dest, tag, Standard, pb, hasPB)
	}
	r, _ := c.newSend(buf, dest, tag, Standard, false)
	r.useCold()
	r.pbOut, r.hasPBOut = pb, hasPB
	r.rndv = exLimit != 0
	err := p.startSend(r)
	if err == nil {
		_, err = r.wait()
	}
	p.states.put(r)
	return err
}
