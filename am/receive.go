package am

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/amgo-hpc/amgo/flowctl"
	"github.com/amgo-hpc/amgo/handlers"
	"github.com/amgo-hpc/amgo/internal/wire"
)

// Receiving: polling the network, decoding and dispatching each packet to its
// handler, replies and retained payloads, drops and counters.

// Poll is am_poll: it drains arrived packets and runs their handlers on the
// calling goroutine, and returns how many packets it handled. It never blocks;
// if another goroutine is polling it returns 0 at once. Errors come from the
// network (a dead peer, a closed transport); dropped packets are counted in
// Stats, not returned.
func (ep *Endpoint) Poll() (int, error) {
	if !ep.pollMu.TryLock() {
		return 0, nil
	}
	defer ep.pollMu.Unlock()
	return ep.pollLocked()
}

const pollBatch = 64

func (ep *Endpoint) pollLocked() (int, error) {
	if ep.seq.Collided() {
		return 0, ErrSeq
	}
	ep.started()
	if ep.backlogged.Load() > 0 {
		for i := range ep.peers {
			p := &ep.peers[i]
			p.mu.Lock()
			if len(p.backlog) > 0 {
				ep.flushBacklogLocked(i, p)
			}
			p.mu.Unlock()
		}
	}
	if ep.rx.credit.Urgent() {
		ep.sendUrgentFrees()
	}
	n, err := ep.tr.Poll((*receiver)(ep), pollBatch)
	if err != nil {
		err = ep.pollFailure(err)
	}
	// Credit returns for requests answered without a reply wait, coalesced,
	// for a reply to carry them, until they reach a quarter of the buffer, or
	// until the endpoint has found nothing to do for idleFlushPolls polls in a
	// row: an ack per message would put a second packet on every one-way
	// message's path (SP AM likewise acks "when one-quarter of the window
	// remains unacknowledged").
	if n > 0 {
		// A poll that delivers shows it finishes polls every 16 (an atomic
		// add per poll would sit on every message's path).
		ep.rx.idle = 0
		if ep.rx.busy++; ep.rx.busy%16 == 0 {
			ep.polls.Add(1)
		}
	} else if ep.rx.idle++; ep.rx.idle >= idleFlushPolls && ep.rx.credit.Pending() {
		ep.flushFrees()
	} else if ep.rx.idle%64 == 0 {
		ep.polls.Add(1) // an idle poller shows it finishes polls, now and then
	}
	return n, err
}

// idleFlushPolls is the number of empty polls in a row after which pending
// credit returns are sent (about a microsecond of idling).
const idleFlushPolls = 32

// receiver adapts the endpoint to transport.Receiver without exporting Deliver.
type receiver Endpoint

// Deliver runs an immediate request (the common packet of a stream of
// small messages over shared memory) from here: decoded in place, its
// handler looked up and run on the token kept for immediate requests, all
// in this one frame. Everything else, and an immediate request that fails
// a check (which deliverImmediate then reports), goes to deliver.
func (r *receiver) Deliver(src int, pkt []byte) {
	ep := (*Endpoint)(r)
	rx := &ep.rx
	if h, args, payload, ok := wire.DecodeImmediateInPlace(pkt); ok && !rx.credit.Urgent() &&
		uint(src) < uint(len(ep.nets)) && ep.nets[src].immediate {
		if fn := ep.table.Runnable(handlers.Index(h), len(args)); fn != nil {
			rx.c.immediate++ // Stats counts them among the requests too
			rx.c.bytes += uint64(len(payload))
			// rx.kind is left as it is: only Retain reads it, which an
			// immediate request's token refuses before.
			rx.immTok.RunFrom(src, fn, args, payload)
			return
		}
	}
	ep.deliver(src, pkt)
}

func (ep *Endpoint) deliver(src int, pkt []byte) {
	rx := &ep.rx
	if rx.credit.Urgent() {
		ep.sendUrgentFrees()
	}
	if wire.IsImmediate(pkt) {
		ep.deliverImmediate(src, pkt)
		return
	}
	h := &rx.hdr
	payload, err := wire.Decode(pkt, h, &rx.args)
	if err != nil {
		ep.drop(fmt.Errorf("am: packet from rank %d: %w", src, err))
		return
	}
	if int(h.Src) != src || src < 0 || src >= ep.size {
		ep.drop(fmt.Errorf("am: packet from rank %d claims source %d", src, h.Src))
		return
	}
	args := rx.args[:h.NArgs]
	if h.Flags&wire.FlagFree != 0 {
		off, n := h.Off, h.Reserve // a reply's or an ack's
		if h.Kind.IsRequest() {
			off, n = h.FreeOff, h.FreeLen // a request's own reservation is in Off, Reserve
		}
		p := &ep.peers[src]
		p.mu.Lock()
		err := p.cr.Free(flowctl.Range{Off: off, Len: n})
		p.mu.Unlock()
		if err != nil {
			ep.drop(fmt.Errorf("am: %s from rank %d: %w", h.Kind, src, err))
			return
		}
	}
	switch h.Kind {
	case wire.KindAck:
		rx.c.acks++
	case wire.KindReplyShort, wire.KindReplyMedium:
		rx.c.replies++
		rx.c.bytes += uint64(len(payload))
		rx.tok.Begin((*replier)(ep), src, false)
		if h.Flags&wire.FlagPiggyback != 0 {
			rx.tok.SetPiggyback(h.Piggyback)
		}
		ep.dispatch(h.Handler, args, payload)
	case wire.KindRequestShort, wire.KindRequestMedium, wire.KindRequestStore, wire.KindStoreDone:
		// Room for the reply, the same whether the request carried credit or
		// not (flowctl.Ledger.Arrival).
		room, err := rx.credit.Arrival(src, flowctl.Range{Off: h.Off, Len: h.Reserve}, len(pkt), h.Flags&wire.FlagFree != 0)
		if err != nil {
			ep.drop(fmt.Errorf("am: %s from rank %d: %w", h.Kind, src, err))
			return
		}
		if h.Kind == wire.KindRequestStore || h.Kind == wire.KindStoreDone {
			region, err := ep.storeRegion(h, payload)
			if err != nil {
				ep.drop(fmt.Errorf("am: %s from rank %d: %w", h.Kind, src, err))
				ep.addFree(src, h.Off, h.Reserve)
				return
			}
			if h.Kind == wire.KindRequestStore && h.Flags&wire.FlagLast == 0 {
				ep.addFree(src, h.Off, h.Reserve)
				return
			}
			payload = region
		}
		rx.c.requests++
		rx.c.bytes += uint64(len(payload))
		tok := &rx.tok
		tok.Begin((*replier)(ep), src, true)
		if h.Flags&wire.FlagPiggyback != 0 {
			tok.SetPiggyback(h.Piggyback)
		}
		tok.ReqOff, tok.ReqLen = h.Off, h.Reserve
		tok.MaxReply = room
		rx.payload = payload
		rx.kind = h.Kind
		ep.dispatch(h.Handler, args, payload)
		rx.payload = nil
		if !tok.Replied() && !tok.IsRetained() {
			ep.addFree(src, h.Off, h.Reserve)
		}
	}
}

// deliverImmediate runs the handler of an immediate request from src: no
// reservation to check, no credit to return, a token that cannot reply
// or retain.
func (ep *Endpoint) deliverImmediate(src int, pkt []byte) {
	rx := &ep.rx
	h, args, payload, ok := wire.DecodeImmediateInPlace(pkt)
	if !ok {
		var err error
		if h, args, payload, err = wire.DecodeImmediate(pkt, &rx.args); err != nil {
			ep.drop(fmt.Errorf("am: packet from rank %d: %w", src, err))
			return
		}
	}
	if uint(src) >= uint(ep.size) || !ep.nets[src].immediate {
		ep.drop(fmt.Errorf("am: immediate request from rank %d, whose network does not carry them", src))
		return
	}
	rx.c.immediate++ // Stats counts them among the requests too
	rx.c.bytes += uint64(len(payload))
	rx.tok.BeginImmediate((*replier)(ep), src)
	rx.kind = wire.KindRequestImmediate
	// Dispatch, inlined: the handler runs from here, one call fewer per
	// message; dispatch refuses and reports what it cannot run.
	if fn := ep.table.Runnable(handlers.Index(h), len(args)); fn != nil {
		rx.tok.Run(fn, args, payload)
		return
	}
	ep.dispatch(h, args, payload)
}

func (ep *Endpoint) dispatch(idx uint8, args []uint64, payload []byte) {
	if err := ep.table.Dispatch(&ep.rx.tok, handlers.Index(idx), args, payload); err != nil {
		ep.drop(err)
	}
}

// replier is the endpoint as its handlers' tokens see it (handlers.Replier):
// a handler replies and retains through its token, never through the
// endpoint's exported methods.
type replier Endpoint

// Reply implements handlers.Replier: it sends tok's reply, which returns the
// request's credit (and any owed credit adjacent to it) to the requester.
func (r *replier) Reply(tok *handlers.Token, h handlers.Index, payload []byte, medium bool) error {
	ep := (*Endpoint)(r)
	args := tok.ReplyArgs()
	if err := ep.table.CheckSend(h, len(args)); err != nil {
		return err
	}
	src := tok.Source()
	hdr := wire.Header{Kind: wire.KindReplyShort, Handler: uint8(h), NArgs: uint8(len(args)), Src: uint32(ep.rank),
		Flags: wire.FlagFree, Off: tok.ReqOff, Reserve: tok.ReqLen}
	if pb, ok := tok.ReplyPiggyback(); ok {
		hdr.Flags |= wire.FlagPiggyback
		hdr.Piggyback = pb
	}
	if size := hdr.EncodedLen() + len(payload); size > tok.MaxReply {
		return fmt.Errorf("%w: reply of %d bytes with %d arguments to rank %d (room for %d)",
			ErrTooLarge, len(payload), len(args), tok.Source(), tok.MaxReply)
	}
	if medium {
		hdr.Kind = wire.KindReplyMedium
		hdr.Len = uint32(len(payload))
	} else {
		payload = nil
	}
	// With the credit owed to src for earlier requests too when it is
	// adjacent (and no request took it meanwhile).
	back := ep.rx.credit.Reply(src, flowctl.Range{Off: tok.ReqOff, Len: tok.ReqLen})
	hdr.Off, hdr.Reserve = back.Off, back.Len
	return ep.sendResponse(src, &hdr, args, payload)
}

// Retain implements handlers.Replier: it keeps a medium request's payload in
// the per-peer receive buffer, in the sender's own space, until
// Endpoint.Release.
func (r *replier) Retain(tok *handlers.Token) ([]byte, handlers.Retained, error) {
	ep := (*Endpoint)(r)
	if ep.rx.kind != wire.KindRequestMedium {
		return nil, handlers.Retained{}, fmt.Errorf("%w (this is a %s)", ErrNotMedium, ep.rx.kind)
	}
	src := tok.Source()
	if ep.rx.retain == nil {
		ep.rx.retain = make([][]byte, ep.size)
	}
	if ep.rx.retain[src] == nil {
		ep.rx.retain[src] = make([]byte, ep.nets[src].buffer)
	}
	buf := ep.rx.retain[src][int(tok.ReqOff) : int(tok.ReqOff)+len(ep.rx.payload)]
	copy(buf, ep.rx.payload)
	return buf, handlers.Retained{Src: src, Off: tok.ReqOff, Len: tok.ReqLen}, nil
}

// Release frees a payload that a handler retained: the space returns to its
// sender, which answers the request. Call it once per Retained, from any
// goroutine, inside a handler or outside. The retained bytes must not be used
// afterwards. Errors: ErrRank or ErrConfig for a handle Retain did not make,
// transport errors.
func (ep *Endpoint) Release(r handlers.Retained) error {
	if err := ep.checkDst(r.Src); err != nil {
		return err
	}
	if r.Len == 0 || r.Off%flowctl.Granule != 0 || r.Len%flowctl.Granule != 0 || uint64(r.Off)+uint64(r.Len) > uint64(ep.nets[r.Src].buffer) {
		return fmt.Errorf("%w: not a retained payload: [%d,+%d) from rank %d", ErrConfig, r.Off, r.Len, r.Src)
	}
	h := wire.Header{Kind: wire.KindAck, Src: uint32(ep.rank), Flags: wire.FlagFree, Off: r.Off, Reserve: r.Len}
	return ep.sendResponse(r.Src, &h, nil, nil)
}

var dropLogEvery = time.Second

func (ep *Endpoint) drop(err error) {
	ep.rx.c.drops++
	ep.dropMu.Lock()
	ep.lastDrop = err.Error()
	log := ep.cfg.OnDrop == nil && time.Since(ep.lastLog) >= dropLogEvery
	if log {
		ep.lastLog = time.Now()
	}
	ep.dropMu.Unlock()
	if ep.cfg.OnDrop != nil {
		ep.cfg.OnDrop(err)
	} else if log {
		slog.Warn("amgo: dropped packet", "rank", ep.rank, "err", err)
	}
}

// Stats returns the endpoint's counters. Receive-side counters are read under the
// poll lock, so Stats waits for a running poll to finish.
func (ep *Endpoint) Stats() Stats {
	var s Stats
	for i := range ep.peers {
		p := &ep.peers[i]
		p.mu.Lock()
		s.RequestsSent += p.c.requests + p.c.immediate
		s.RepliesSent += p.c.replies
		s.AcksSent += p.c.acks
		s.BytesSent += p.c.bytes
		s.CreditStalls += p.c.stalls
		s.Backlogged += p.c.backlogged
		s.StoresPut += p.c.storesPut
		s.StoresPacketed += p.c.storesPacketed
		s.ImmediateSent += p.c.immediate
		p.mu.Unlock()
	}
	ep.pollMu.Lock()
	s.RequestsRecv = ep.rx.c.requests + ep.rx.c.immediate
	s.ImmediateRecv = ep.rx.c.immediate
	s.RepliesRecv = ep.rx.c.replies
	s.AcksRecv = ep.rx.c.acks
	s.BytesRecv = ep.rx.c.bytes
	s.Drops = ep.rx.c.drops
	ep.pollMu.Unlock()
	s.Gets = ep.gets.Load()
	s.UnknownHandler = ep.table.Unknown()
	ep.dropMu.Lock()
	s.LastDrop = ep.lastDrop
	ep.dropMu.Unlock()
	return s
}
