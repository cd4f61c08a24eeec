package am

import (
	"errors"
	"fmt"
	"sync"

	"github.com/amgo-hpc/amgo/am/transport"
	"github.com/amgo-hpc/amgo/flowctl"
	"github.com/amgo-hpc/amgo/handlers"
	"github.com/amgo-hpc/amgo/internal/wire"
)

// Sending: requests (short, medium, store), gets, and the responses
// (replies and acks) that need no credit; the per-peer backlog of responses
// the network refused.

func (ep *Endpoint) checkDst(dst int) error {
	if dst < 0 || dst >= ep.size {
		return fmt.Errorf("%w: %d (job has %d ranks)", ErrRank, dst, ep.size)
	}
	if ep.closed.Load() {
		return ErrClosed
	}
	if pe := ep.dead[dst].Load(); pe != nil {
		return pe
	}
	if ep.seq.Collided() {
		return ErrSeq
	}
	return nil
}

// RequestShort sends a short request: handler h runs at rank dst with args (at
// most 16). It returns once the request is handed to the network; it polls while
// dst's buffer has no room (back-pressure). Errors: ErrRank, ErrClosed,
// handlers.ErrUnknownHandler, handlers.ErrArgCount, ErrInHandler, transport errors.
func (ep *Endpoint) RequestShort(dst int, h handlers.Index, args ...uint64) error {
	if h > handlers.MaxClientIndex {
		return fmt.Errorf("%w: %d", handlers.ErrIndexReserved, h)
	}
	return ep.requestShort(dst, h, args)
}

// RequestShortWith is RequestShort with a tool value piggybacked in the
// packet's header when pb is set (one value per message, in the same packet,
// never an extra message: the header-extension scheme of TAU's overhead
// compensation); the handler reads it with Token.Piggyback. With the zero
// Piggyback it is RequestShort: a layer that may piggyback calls it always.
func (ep *Endpoint) RequestShortWith(dst int, h handlers.Index, pb handlers.Piggyback, args ...uint64) error {
	if h > handlers.MaxClientIndex {
		return fmt.Errorf("%w: %d", handlers.ErrIndexReserved, h)
	}
	if !pb.Set {
		return ep.requestShort(dst, h, args)
	}
	if err := ep.checkDst(dst); err != nil {
		return err
	}
	if err := ep.table.CheckSend(h, len(args)); err != nil {
		return err
	}
	hdr := wire.Header{Kind: wire.KindRequestShort, Handler: uint8(h), NArgs: uint8(len(args)), Src: uint32(ep.rank),
		Flags: wire.FlagPiggyback, Piggyback: pb.Value}
	return ep.sendRequest(dst, &hdr, args, nil, nil)
}

// RequestMediumWith is RequestMedium with a tool value piggybacked in the
// packet's header when pb is set, read by the handler with Token.Piggyback;
// with the zero Piggyback it is RequestMedium.
func (ep *Endpoint) RequestMediumWith(dst int, h handlers.Index, payload []byte, pb handlers.Piggyback, args ...uint64) error {
	var flags uint16
	if pb.Set {
		flags = wire.FlagPiggyback
	}
	return ep.requestMedium(dst, h, payload, flags, pb.Value, args)
}

// requestShort is RequestShort without the client index check (am's own handlers).
func (ep *Endpoint) requestShort(dst int, h handlers.Index, args []uint64) error {
	if err := ep.checkDst(dst); err != nil {
		return err
	}
	if h == barrierHandler && ep.deaths.Load() > 0 {
		// A barrier is over every rank: with one dead it can never complete.
		return ep.firstDead()
	}
	if err := ep.table.CheckSend(h, len(args)); err != nil {
		return err
	}
	hdr := wire.Header{Kind: wire.KindRequestShort, Handler: uint8(h), NArgs: uint8(len(args)), Src: uint32(ep.rank)}
	return ep.sendRequest(dst, &hdr, args, nil, nil)
}

// RequestMedium sends a medium request: payload (at most MaxMedium bytes) lands
// in the space this rank allocated in its receive buffer at dst, and handler h
// runs there with args and the payload, which stays valid until the handler
// returns (or until released, if the handler retains it). payload may be reused
// when RequestMedium returns. Errors as RequestShort, plus ErrTooLarge.
func (ep *Endpoint) RequestMedium(dst int, h handlers.Index, payload []byte, args ...uint64) error {
	return ep.requestMedium(dst, h, payload, 0, 0, args)
}

func (ep *Endpoint) requestMedium(dst int, h handlers.Index, payload []byte, flags uint16, pb uint64, args []uint64) error {
	if err := ep.checkMedium(dst, h, len(payload), len(args)); err != nil {
		return err
	}
	hdr := wire.Header{Kind: wire.KindRequestMedium, Handler: uint8(h), NArgs: uint8(len(args)),
		Src: uint32(ep.rank), Len: uint32(len(payload)), Flags: flags, Piggyback: pb}
	return ep.sendRequest(dst, &hdr, args, payload, nil)
}

// RequestMediumFill is RequestMediumWith for a payload of n bytes (at most
// MaxMediumTo(dst)) that f writes: GASNet-EX's negotiated-payload medium
// request (gex_AM_PrepareRequestMedium and gex_AM_CommitRequestMedium) in
// one call. Over a network that takes a payload in place (PeerFills: shm,
// loop) f.Fill writes it straight into the request's room in the network's
// buffer, so a payload that must be built (non-contiguous data packed) is
// copied once instead of twice; over the others it is built in a scratch
// buffer and sent as RequestMediumWith would. f.Fill is called at most
// once, before the request leaves (in place: once the room is reserved,
// after any wait for credit, polling meanwhile); an error found before
// (an argument, a dead peer) leaves it uncalled. It gets all n bytes to
// write, must not keep them, and must not call the endpoint.
// Errors as RequestMedium's, plus ErrArg (f nil, n negative).
func (ep *Endpoint) RequestMediumFill(dst int, h handlers.Index, n int, f transport.Filler, pb handlers.Piggyback, args ...uint64) error {
	if f == nil || n < 0 {
		return fmt.Errorf("%w: RequestMediumFill of %d bytes with filler %v", ErrArg, n, f)
	}
	if err := ep.checkMedium(dst, h, n, len(args)); err != nil {
		return err
	}
	hdr := wire.Header{Kind: wire.KindRequestMedium, Handler: uint8(h), NArgs: uint8(len(args)),
		Src: uint32(ep.rank), Len: uint32(n)}
	if pb.Set {
		hdr.Flags, hdr.Piggyback = wire.FlagPiggyback, pb.Value
	}
	if ep.nets[dst].fill {
		return ep.sendRequest(dst, &hdr, args, nil, f)
	}
	b := fillScratch.Get().(*[]byte)
	if cap(*b) < n {
		*b = make([]byte, n)
	}
	f.Fill((*b)[:n])
	err := ep.sendRequest(dst, &hdr, args, (*b)[:n], nil)
	fillScratch.Put(b)
	return err
}

// fillScratch holds the buffers RequestMediumFill builds payloads in for
// networks that cannot take them in place.
var fillScratch = sync.Pool{New: func() any { return new([]byte) }}

// PeerFills reports whether RequestMediumFill to rank dst writes the
// payload in place in the network's buffer (transport.FillSender), rather
// than building it first.
func (ep *Endpoint) PeerFills(dst int) bool {
	return uint(dst) < uint(ep.size) && ep.nets[dst].fill
}

// checkMedium checks a client's medium request of n bytes with nargs
// arguments to dst with handler h.
func (ep *Endpoint) checkMedium(dst int, h handlers.Index, n, nargs int) error {
	if err := ep.checkDst(dst); err != nil {
		return err
	}
	if mm := ep.nets[dst].maxMedium; n > mm {
		return fmt.Errorf("%w: medium of %d bytes to rank %d (MaxMediumTo %d)", ErrTooLarge, n, dst, mm)
	}
	if h > handlers.MaxClientIndex {
		return fmt.Errorf("%w: %d", handlers.ErrIndexReserved, h)
	}
	return ep.table.CheckSend(h, nargs)
}

// MaxImmediate is the largest payload of an immediate request, in bytes.
const MaxImmediate = 1024

// immediatePollEvery is how many immediate requests in a row to one peer
// RequestImmediate sends before it polls once (see there).
const immediatePollEvery = 64

// RequestImmediate sends a medium request (handler h at rank dst with args
// and payload, which may be reused when it returns) that reserves nothing
// in dst's per-peer buffer, if it can go at once: true when the network took
// it. It answers false, having sent nothing and without waiting, when the
// request cannot go that way now: the payload is over MaxImmediate, the
// network that reaches dst does not carry immediate requests (only an
// ordered, reliable network that states a bounded queue of opaque packets,
// transport.Caps.QueueBytes, does: PeerCarriesImmediate), the network's
// queue to dst is full, replies to dst are queued ahead of it, another
// goroutine is sending to dst, or this rank owes dst credit that every
// request carries back (flowctl.CarryAny), for which an immediate request
// has no room. The caller then sends it as a medium request
// (RequestMedium), which waits as needed; order between the two is kept.
//
// This is Open MPI's send-immediate and GASNet-EX's GEX_FLAG_IMMEDIATE:
// a small message leaves without a reservation or a descriptor, or not at
// all. What it saves is the credit: no space is reserved at dst for the
// payload or a reply, so none comes back; the network's own bounded queue
// (a shared-memory ring) bounds what is in flight.
// The price is on the handler: its token cannot reply or retain
// (handlers.ErrImmediate); it must consume the payload before it returns.
// A sender that only sends never waits for credit, and so never polls on
// its own: RequestImmediate polls once every 64 immediate requests to a
// peer (not inside a handler, where a poll does nothing), so that what
// receivers send back, a layer's "stop sending" included, reaches it.
//
// Errors as RequestMedium (ErrRank, ErrClosed, a dead peer, handler
// errors, transport errors other than a full queue); false with them.
func (ep *Endpoint) RequestImmediate(dst int, h handlers.Index, payload []byte, args ...uint64) (bool, error) {
	if uint(dst) >= uint(ep.size) || ep.closed.Load() || ep.dead[dst].Load() != nil || ep.seq.Collided() {
		return false, ep.checkDst(dst) // checkDst's checks, inline on the common path
	}
	if !ep.nets[dst].immediate || len(payload) > MaxImmediate || ep.peers[dst].cr.OwesCarry() {
		// Too long, or credit to carry back that an immediate request has
		// no room for (flowctl.CarryAny): a medium request takes it.
		return false, nil
	}
	if h > handlers.MaxClientIndex {
		return false, fmt.Errorf("%w: %d", handlers.ErrIndexReserved, h)
	}
	if err := ep.table.CheckSend(h, len(args)); err != nil {
		return false, err
	}
	ep.started()
	p := &ep.peers[dst]
	if !p.mu.TryLock() {
		return false, nil // another goroutine sends to dst: the medium request waits its turn
	}
	if len(p.backlog) > 0 {
		p.mu.Unlock()
		return false, nil
	}
	n := wire.EncodeImmediate(p.scratch[:], uint8(h), args)
	err := ep.tr.Send(dst, p.scratch[:n], payload)
	poll := false
	if err == nil {
		p.c.immediate++ // Stats counts them among the requests too
		p.c.bytes += uint64(len(payload))
		if p.immRun++; p.immRun == immediatePollEvery {
			p.immRun, poll = 0, true
		}
	}
	p.mu.Unlock()
	switch {
	case err == nil:
		if poll {
			// A stream of immediate requests polls now and then, as a
			// stream of medium requests does whenever its window fills:
			// what the receiver answers (an upper layer's "stop sending",
			// credit for other traffic) reaches this rank even when it
			// only sends. A failure it finds is the next call's to report.
			_, _ = ep.Poll()
		}
		return true, nil
	case errors.Is(err, transport.ErrWouldBlock):
		return false, nil
	}
	if pe := ep.peerFailed(dst, err); pe != nil {
		return false, pe
	}
	return false, fmt.Errorf("am: immediate request to rank %d: %w", dst, err)
}

// PeerCarriesImmediate reports whether immediate requests to rank dst can
// go (RequestImmediate): the network that reaches it is ordered and
// reliable and states a bounded queue (transport.Caps.QueueBytes), and
// Config.NoImmediate is not set.
func (ep *Endpoint) PeerCarriesImmediate(dst int) bool {
	return uint(dst) < uint(ep.size) && ep.nets[dst].immediate
}

// ImmediateQueueBytes is the most bytes of immediate requests that one
// peer can send this rank between two of its polls, so the most that can
// follow a message this rank sends it: the largest network queue toward a
// peer that carries them, plus the 64 requests of at most MaxImmediate
// bytes RequestImmediate sends between its polls; 0 when no peer carries
// them. A layer that bounds its memory per sender adds it to the slack it
// allows for messages already sent when it asks a sender to stop.
func (ep *Endpoint) ImmediateQueueBytes() int {
	if ep.immQueue == 0 {
		return 0
	}
	return ep.immQueue + immediatePollEvery*MaxImmediate
}

// Store is SP AM's am_store (GASNet-EX RequestLong): it
// writes data into rank dst's memory at addr, an address inside a segment that
// dst registered (Segment.Addr plus an offset) and passed to this rank, and then
// runs handler h at dst with args and the stored region as payload. Where the
// network offers a single-copy put (shared memory: Cross Memory Attach), the
// data moves once, straight from data into the destination; otherwise it travels
// in fragments of at most MaxMedium bytes through the per-peer buffer. Store
// returns when data may be reused. Errors as RequestShort, plus ErrTooLarge and
// transport errors of the put.
//
// As with GASNet's dest_addr and with RDMA, addr must come from dst: on
// networks with a single-copy put the data is written before dst can check
// the address (dst then drops the store's handler and counts it); on the
// others dst checks every fragment against its segments and drops what falls
// outside. A store into a segment dst has unregistered is undefined on the
// single-copy path.
func (ep *Endpoint) Store(dst int, h handlers.Index, addr uint64, data []byte, args ...uint64) error {
	if err := ep.checkDst(dst); err != nil {
		return err
	}
	if uint64(len(data)) > MaxStore {
		return fmt.Errorf("%w: store of %d bytes (max %d)", ErrTooLarge, len(data), uint64(MaxStore))
	}
	if h > handlers.MaxClientIndex {
		return fmt.Errorf("%w: %d", handlers.ErrIndexReserved, h)
	}
	if err := ep.table.CheckSend(h, len(args)); err != nil {
		return err
	}
	total := uint32(len(data))
	p := &ep.peers[dst]
	if nt := &ep.nets[dst]; nt.put && len(data) > 0 && len(data) >= nt.putMin {
		p.mu.Lock()
		noPut := p.noPut
		p.mu.Unlock()
		if !noPut {
			hdr := wire.Header{Kind: wire.KindStoreDone, Handler: uint8(h), NArgs: uint8(len(args)),
				Src: uint32(ep.rank), Addr: addr, Total: total}
			sent, err := ep.putSend(dst, p, &hdr, args, addr, data)
			if !sent && err == nil {
				err = ep.putter.Put(dst, uintptr(addr), data)
			}
			switch {
			case sent:
				return nil
			case err == nil:
				p.mu.Lock()
				p.c.storesPut++
				p.mu.Unlock()
				return ep.sendRequest(dst, &hdr, args, nil, nil)
			case errors.Is(err, transport.ErrPutUnsupported):
				p.mu.Lock()
				p.noPut = true
				p.mu.Unlock()
			default:
				if pe := ep.peerFailed(dst, err); pe != nil {
					return pe
				}
				return fmt.Errorf("am: store of %d bytes to rank %d at %#x: %w", len(data), dst, addr, err)
			}
		}
	}
	p.mu.Lock()
	p.c.storesPacketed++
	p.mu.Unlock()
	if ep.batcher != nil && len(data) > ep.nets[dst].maxMedium {
		// The fragments go as one run: a network that is a Batcher hands
		// several to the wire per system call.
		ep.batcher.Hold()
		defer ep.batcher.Flush()
	}
	chunk := ep.nets[dst].maxMedium
	for frag := 0; ; frag += chunk {
		n := min(chunk, len(data)-frag)
		last := frag+n == len(data)
		hdr := wire.Header{Kind: wire.KindRequestStore, Handler: uint8(h), Src: uint32(ep.rank),
			Len: uint32(n), Addr: addr, Frag: uint32(frag), Total: total}
		var a []uint64
		if last {
			hdr.Flags = wire.FlagLast
			hdr.NArgs = uint8(len(args))
			a = args
		}
		if err := ep.sendRequest(dst, &hdr, a, data[frag:frag+n], nil); err != nil {
			return err
		}
		if last {
			return nil
		}
	}
}

// putSend puts data at addr in dst and sends the store-done h with it in one
// call of the network (transport.PutSender), when the network can and the
// store-done's credit is free now. sent false and err nil: it did nothing
// (no PutSender, no credit now, queued responses to dst first, or dst
// dead); the caller puts and then sends the store-done as a request, which
// waits for credit. Errors are the put's; the reservation is undone.
func (ep *Endpoint) putSend(dst int, p *peer, h *wire.Header, args []uint64, addr uint64, data []byte) (sent bool, err error) {
	if !ep.nets[dst].putSend || ep.dead[dst].Load() != nil {
		return false, nil
	}
	ep.started()
	// The header goes in p.putHdr under p.putMu (a local array would escape
	// through the interface call: an allocation per store); the transport
	// serializes puts to one peer anyway.
	p.putMu.Lock()
	defer p.putMu.Unlock()
	buf := &p.putHdr
	p.mu.Lock()
	if len(p.backlog) > 0 {
		p.mu.Unlock()
		return false, nil
	}
	space, ok, err := p.cr.ReserveBare(h.EncodedLen())
	if err != nil || !ok {
		p.mu.Unlock()
		return false, nil
	}
	h.Off, h.Reserve = space.Off, space.Len
	n := wire.Encode(buf[:], h, args)
	// Counted before it leaves: dst may run the handler before PutSend returns.
	p.c.requests++
	p.c.storesPut++
	p.mu.Unlock()
	// Outside p.mu: the put may wait for the socket to drain.
	if err := ep.putSender.PutSend(dst, uintptr(addr), data, buf[:n], nil); err != nil {
		p.mu.Lock()
		_ = p.cr.Free(space) // reserved above: cannot fail
		p.c.requests--
		p.c.storesPut--
		p.mu.Unlock()
		return false, err
	}
	return true, nil
}

// InFlight reports how many bytes of rank dst's receive buffer this rank's
// requests hold (sent and not yet freed by dst's answer or credit): zero
// when nothing this rank sent to dst is outstanding, as between the turns
// of a ping-pong. 0 for an invalid rank.
func (ep *Endpoint) InFlight(dst int) int {
	if uint(dst) >= uint(ep.size) {
		return 0
	}
	p := &ep.peers[dst]
	p.mu.Lock()
	n := p.cr.InUse()
	p.mu.Unlock()
	return n
}

// CanGet reports whether Get from rank src can move n bytes with the network's
// single copy: the network offers it (Caps.Get), n is at least Caps.PutMin
// (below it a system call costs more than copying packets), and src has not
// refused it (EPERM from Cross Memory Attach) or failed.
func (ep *Endpoint) CanGet(src, n int) bool {
	return uint(src) < uint(ep.size) && ep.nets[src].get && n > 0 && n >= ep.nets[src].putMin &&
		!ep.noGet[src].Load() && ep.dead[src].Load() == nil && !ep.closed.Load()
}

// Get is a blocking single-copy read (GASNet-EX gex_RMA_GetBlocking; SP AM's
// am_get without its completion handler): it
// copies len(buf) bytes at addr in rank src's memory into buf and returns
// when they are there. It runs no handler at either end and sends no packet:
// the owner learns that the read is done only from a request the caller sends
// afterwards (the rendezvous protocol's fin). addr must name memory that src
// gave to this rank and keeps alive and unchanged until then; like a Store's
// destination on single-copy networks it cannot be checked by src.
//
// Only networks with a single-copy read have Get (shared memory: Cross Memory
// Attach; in-process: a copy); elsewhere ask src to Store the data instead.
// Errors: ErrRank, ErrClosed, a *PeerError for a failed src, and an error
// wrapping transport.ErrGetUnsupported when the network or this peer has no
// single-copy read (see CanGet; a refusal is remembered), or the network's
// error for an unmapped range.
func (ep *Endpoint) Get(src int, addr uint64, buf []byte) error {
	if err := ep.checkDst(src); err != nil {
		return err
	}
	if !ep.nets[src].get {
		return fmt.Errorf("am: get from rank %d over %s: %w", src, ep.nets[src].name, transport.ErrGetUnsupported)
	}
	if len(buf) == 0 {
		return nil
	}
	if ep.noGet[src].Load() {
		return fmt.Errorf("am: get from rank %d: refused earlier: %w", src, transport.ErrGetUnsupported)
	}
	err := ep.getter.Get(src, uintptr(addr), buf)
	switch {
	case err == nil:
		ep.gets.Add(1)
		return nil
	case errors.Is(err, transport.ErrGetUnsupported):
		ep.noGet[src].Store(true)
		return fmt.Errorf("am: get of %d bytes from rank %d: %w", len(buf), src, err)
	default:
		if pe := ep.peerFailed(src, err); pe != nil {
			return pe
		}
		return fmt.Errorf("am: get of %d bytes from rank %d at %#x: %w", len(buf), src, addr, err)
	}
}

// started seals the handler table and starts the progress goroutine (if
// configured) at the first request or poll: communication has started.
func (ep *Endpoint) started() {
	if !ep.table.Sealed() {
		ep.start()
	}
}

// start is started's first time, out of line so that started inlines.
func (ep *Endpoint) start() {
	ep.table.Seal()
	ep.startProgress()
}

// sendRequest takes credit at dst and sends one request, polling while there is
// no room.
func (ep *Endpoint) sendRequest(dst int, h *wire.Header, args []uint64, payload []byte, f transport.Filler) error {
	ep.started()
	p := &ep.peers[dst]
	if ep.dead[dst].Load() == nil && p.mu.TryLock() {
		// The common case, without the wait's pacing: the peer's lock is
		// free, nothing is backlogged and the window has room.
		if len(p.backlog) == 0 {
			if credit, err := ep.sendLocked(dst, p, h, args, payload, f); credit && err == nil {
				p.mu.Unlock()
				return nil
			} // else the loop below waits, retries or reports
		}
		p.mu.Unlock()
	}
	return ep.sendRequestWait(dst, p, h, args, payload, f)
}

// sendLocked takes credit toward dst (flowctl.Sender.Reserve: the room,
// and the owed range the request carries back) and sends the request; p.mu
// is held. With f, the payload is h.Len bytes that f writes in place
// (RequestMediumFill) rather than payload. credit false: the window is full
// now. err: the reservation can never fit (from flowctl), or the network
// refused the packet (credit true; the reservation is undone).
func (ep *Endpoint) sendLocked(dst int, p *peer, h *wire.Header, args []uint64, payload []byte, f transport.Filler) (credit bool, err error) {
	h.Flags &^= wire.FlagFree // the reservation leaves room for it anyway
	plen := len(payload)
	if f != nil {
		plen = int(h.Len)
	}
	g, ok, err := p.cr.Reserve(h.EncodedLen(), plen)
	if err != nil || !ok {
		return false, err
	}
	h.Off, h.Reserve = g.Space.Off, g.Space.Len
	if g.Carry.Len != 0 {
		h.Flags |= wire.FlagFree
		h.FreeOff, h.FreeLen = g.Carry.Off, g.Carry.Len
	}
	n := wire.Encode(p.scratch[:], h, args)
	if f != nil {
		err = ep.filler.SendFill(dst, p.scratch[:n], plen, f)
	} else {
		err = ep.tr.Send(dst, p.scratch[:n], payload)
	}
	if err != nil {
		if ack := p.cr.Refused(g); ack.Len != 0 {
			// The credit must still go back: as an ack, queued behind
			// whatever the network refused (dropped if dst is dead).
			ep.backlogAckLocked(dst, p, ack)
		}
		return true, err
	}
	p.c.requests++
	p.c.bytes += uint64(plen)
	return true, nil
}

// sendRequestWait is sendRequest's loop for a request that must wait for the
// peer's lock, for credit or for the network, polling meanwhile.
func (ep *Endpoint) sendRequestWait(dst int, p *peer, h *wire.Header, args []uint64, payload []byte, f transport.Filler) error {
	var b backoff
	defer b.end()
	stalled := false // waited for credit (not for the network)
	for {
		if pe := ep.dead[dst].Load(); pe != nil {
			return pe
		}
		p.mu.Lock()
		if len(p.backlog) > 0 {
			ep.flushBacklogLocked(dst, p)
		}
		if len(p.backlog) == 0 {
			credit, err := ep.sendLocked(dst, p, h, args, payload, f)
			switch {
			case credit && err == nil:
				if stalled {
					p.c.stalls++
				}
				p.mu.Unlock()
				return nil
			case !credit && err != nil:
				p.mu.Unlock()
				return err
			case !credit:
				stalled = true
			case !errors.Is(err, transport.ErrWouldBlock):
				p.mu.Unlock()
				if pe := ep.peerFailed(dst, err); pe != nil {
					return pe
				}
				return fmt.Errorf("am: request to rank %d: %w", dst, err)
			}
		}
		p.mu.Unlock()
		if err := ep.progress(&b); err != nil && !errors.Is(err, ErrPeerDead) {
			return err // another rank's death does not stop a request to dst
		}
	}
}

// sendResponse sends a reply or ack to dst. It never waits: when the network
// cannot take the packet now it is queued (in order) and sent by a later poll.
func (ep *Endpoint) sendResponse(dst int, h *wire.Header, args []uint64, payload []byte) error {
	if pe := ep.dead[dst].Load(); pe != nil {
		return pe
	}
	p := &ep.peers[dst]
	p.mu.Lock()
	defer p.mu.Unlock()
	n := wire.Encode(p.scratch[:], h, args)
	if h.Kind == wire.KindAck {
		p.c.acks++
	} else {
		p.c.replies++
		p.c.bytes += uint64(len(payload))
	}
	if len(p.backlog) > 0 {
		ep.flushBacklogLocked(dst, p)
	}
	if len(p.backlog) == 0 {
		err := ep.tr.Send(dst, p.scratch[:n], payload)
		if err == nil {
			return nil
		}
		if !errors.Is(err, transport.ErrWouldBlock) {
			if pe := ep.peerFailed(dst, err); pe != nil {
				return pe
			}
			return fmt.Errorf("am: %s to rank %d: %w", h.Kind, dst, err)
		}
	}
	ep.enqueueLocked(p, p.scratch[:n], payload)
	return nil
}

// enqueueLocked appends a copy of the packet (hdr, payload) to p's backlog,
// which a later poll sends in order; p.mu is held.
func (ep *Endpoint) enqueueLocked(p *peer, hdr, payload []byte) {
	if len(p.backlog) == 0 {
		ep.backlogged.Add(1)
	}
	pkt := make([]byte, 0, len(hdr)+len(payload))
	pkt = append(append(pkt, hdr...), payload...)
	p.backlog = append(p.backlog, pkt)
	p.c.backlogged++
}

// backlogAckLocked queues an ack returning r to dst behind its
// backlog; p.mu is held. The next flush of the backlog sends it.
func (ep *Endpoint) backlogAckLocked(dst int, p *peer, r flowctl.Range) {
	if ep.dead[dst].Load() != nil {
		return
	}
	h := wire.Header{Kind: wire.KindAck, Src: uint32(ep.rank), Flags: wire.FlagFree, Off: r.Off, Reserve: r.Len}
	k := wire.Encode(p.scratch[:], &h, nil) // the refused request's header is no longer needed
	ep.enqueueLocked(p, p.scratch[:k], nil)
	p.c.acks++
}

// flushBacklogLocked sends queued responses to dst in order; p.mu is held.
func (ep *Endpoint) flushBacklogLocked(dst int, p *peer) {
	var h wire.Header
	var args [wire.MaxArgs]uint64
	for len(p.backlog) > 0 {
		pkt := p.backlog[0]
		payload, _ := wire.Decode(pkt, &h, &args) // encoded by us: cannot fail
		if err := ep.tr.Send(dst, pkt[:len(pkt)-len(payload)], payload); err != nil {
			if !errors.Is(err, transport.ErrWouldBlock) && ep.peerFailed(dst, err) != nil {
				// dst is gone: what it was owed can never be delivered.
				clear(p.backlog)
				p.backlog = nil
				ep.backlogged.Add(-1)
			}
			return
		}
		p.backlog[0] = nil
		p.backlog = p.backlog[1:]
		if len(p.backlog) == 0 {
			p.backlog = nil
			ep.backlogged.Add(-1)
		}
	}
}
