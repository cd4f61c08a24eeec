package mpiam

import (
	"fmt"
	"sync"
	"time"

	"github.com/amgo-hpc/amgo/handlers"
	"github.com/amgo-hpc/amgo/internal/shmem"
	"github.com/amgo-hpc/amgo/mpiam/internal/proto"
)

// Typed data that is not contiguous (a derived datatype) moves through the
// same protocols as a byte slice, packed on the way (docs/mpi.md
// "Datatypes"):
//
//   - eager: the sender packs into scratch space that the medium request
//     copies; the receiver unpacks from the payload;
//   - rendezvous, non-contiguous sender: up to typedChunk bytes to a peer
//     that reads with one copy and is not on this node with shared stages,
//     it packs the data into a staging buffer at once and offers that
//     buffer, which the receiver reads as it reads a contiguous sender's;
//     otherwise it offers no address, so the receiver asks for stores, and
//     the sender packs each piece asked for and stores it (the last store
//     of a piece with the piece or data notice);
//   - rendezvous, non-contiguous receiver: it reads an offered buffer a
//     chunk at a time into a staging buffer and unpacks it (pull), or,
//     without a single-copy read or from a sender of this node with shared
//     stages (stage.go), asks the sender for pieces into the two halves of
//     its staging buffer, up to one per half at a time (into a shared
//     stage, up to stageSlots in turn), and unpacks each as it lands while
//     the sender packs the next.
//
// No message is ever staged whole: at most typedChunk bytes per transfer.

// typedChunk is the largest piece, in bytes, that a rendezvous of
// non-contiguous data packs or stages at a time.
const typedChunk = 256 << 10

// scratch is a reusable byte buffer.
type scratch struct{ b []byte }

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// getScratch returns a buffer of n bytes; putScratch gives it back.
func getScratch(n int) *scratch {
	s := scratchPool.Get().(*scratch)
	if cap(s.b) < n {
		s.b = make([]byte, n, (n+4095)&^4095)
	}
	s.b = s.b[:n]
	return s
}

func putScratch(s *scratch) { scratchPool.Put(s) }

var chunkPool = sync.Pool{New: func() any { b := make([]byte, typedChunk); return &b }}

// getChunk returns a staging buffer of typedChunk bytes; putChunk gives it
// back.
func getChunk() []byte { return *chunkPool.Get().(*[]byte) }

func putChunk(b []byte) {
	b = b[:cap(b)]
	chunkPool.Put(&b)
}

// planTypedLocked plans the rendezvous of n > 0 packed bytes of m into
// receive r, whose data is not contiguous: a chunked pull when the sender
// offered a buffer this rank can read, else chunked stores into a staging
// buffer; from a sender of this node with shared stages, always the
// latter, into a shared stage (the sender copies a piece while this rank
// unpacks the last, where a pull would do both here). p.mu is held.
func (p *proc) planTypedLocked(r *reqState, m *inMsg, n int) rndvPlan {
	var plan rndvPlan
	plan.args.SendID = m.sendID
	r.useCold()
	r.parts, r.xferErr, r.xferPB, r.xferHasPB = 1, nil, 0, false
	if m.addr != 0 && p.ep.CanGet(m.src, n) && !p.stagesTo(m.src) {
		plan.pull = true
		plan.job = pullJob{addr: m.addr, off: 0, n: n, sendID: m.sendID}
		return plan
	}
	plan.cts = true
	if err := p.typedStoreLocked(r, m.src, 0, n, &plan.args); err != nil {
		// Ask for nothing, so that the sender completes, and fail the receive.
		r.status.Err, r.status.Bytes = err, 0
		plan.args = ctsArgs{SendID: m.sendID, RecvID: plan.args.RecvID}
	}
	return plan
}

// typedStoreLocked sets receive r up to take packed bytes [from, n) from
// world rank src by stores into its staging buffer (a shared stage when src
// can map one, stage.go), a piece per clear-to-send, and fills args
// (SendID set) with the first; sending it asks for the second
// (askAfterCTS). p.mu is held.
func (p *proc) typedStoreLocked(r *reqState, src, from, n int, args *ctsArgs) error {
	if r.id == 0 || p.reqs[r.id] != r {
		p.nextID++
		r.id = p.nextID
		p.fileReqLocked(r)
	}
	args.RecvID = r.id
	if r.bounce == nil {
		if st := p.stageForLocked(src); st != nil {
			r.bounce, r.seg, r.stage = st.mem, st.seg, st
		} else {
			r.bounce = getChunk()
		}
	}
	if r.seg.Len == 0 {
		seg, err := p.ep.RegisterSegment(r.bounce)
		if err != nil {
			return fmt.Errorf("%w: staging buffer: %v", ErrBuffer, err)
		}
		r.seg = seg
	}
	// A persistent receive starts here again: nothing of its last round's
	// pieces carries over.
	r.at, r.end, r.peerSendID = from, n, args.SendID
	r.hstate = [stageSlots]uint8{}
	p.askPieceLocked(r, args)
	return nil
}

// The states of a slot of a staged receive: a piece in flight, into a half
// of its private staging buffer or the next part of its shared stage.
const (
	slotFree  = iota
	slotAsked // its piece is asked for (the clear-to-send is queued)
	slotSent  // its piece's clear-to-send has gone to the sender
	slotFull  // its piece has landed and is being unpacked
)

// askPieceLocked asks for receive r's next piece into a free slot (a half of
// its private staging buffer; the next part of its shared stage, clear of
// the pieces in flight), filling args with the clear-to-send, and reports
// whether it did: packed bytes remain to ask for, a slot is free and, for
// the last piece, every other piece's clear-to-send has gone (the last one,
// without the more flag, ends the sender's bookkeeping, so it must reach
// the sender after the others; two goroutines may send queued ones in
// either order, but one queued after another has gone follows it on the
// peer's ordered stream). The last piece is thus asked for while the one
// before it is packed, not after it has landed. p.mu is held.
func (p *proc) askPieceLocked(r *reqState, args *ctsArgs) bool {
	if r.at >= r.end {
		return false
	}
	free, queued := -1, false
	for i, st := range r.hstate[:r.slots()] {
		switch {
		case st == slotFree && free < 0:
			free = i
		case st == slotAsked:
			queued = true
		}
	}
	k := r.pieceAt(r.at)
	last := r.at+k >= r.end
	if free < 0 || last && queued {
		return false
	}
	off := free * typedChunk / 2
	if st := r.stage; st != nil {
		// In turn through the shared stage, but never over a piece still
		// in flight: one piece may lag (its sender's goroutine slow, its
		// unpacking not done) while the other slots' pieces go round the
		// stage. It is asked for once that piece has been unpacked.
		off = st.place(k)
		for i, hs := range r.hstate {
			if at := r.pieceOff(i); hs != slotFree && i != free && off < at+r.pieceAt(r.pfrom[i]) && at < off+k {
				return false
			}
		}
		st.take(off, k)
	}
	*args = ctsArgs{SendID: r.peerSendID, Addr: r.seg.Addr + uint64(off), Off: uint64(r.at), N: uint64(k),
		RecvID: r.id, Flags: proto.CTSPiece}
	if !last {
		args.Flags |= ctsMore
	}
	if r.stage != nil {
		args.Flags |= r.stage.ctsFlags(off)
	}
	r.pfrom[free], r.poff[free], r.hstate[free] = r.at, uint16(off/proto.StageUnit), slotAsked
	r.at += k
	p.ep.Expect(time.Duration(k/4)*time.Nanosecond + 50*time.Microsecond)
	return true
}

// queueAsksLocked queues the clear-to-sends to world rank src of the pieces
// receive r can ask for now (askPieceLocked). p.mu is held.
func (p *proc) queueAsksLocked(r *reqState, src int) {
	for {
		d := deferred{kind: workCTS, req: r, dst: src}
		if !p.askPieceLocked(r, &d.cts) {
			return
		}
		p.queueLocked(d)
	}
}

// askAfterCTS runs once clear-to-send a of receive r went to world rank src:
// when it asked for a piece, that piece's slot is marked sent and the
// receive may ask for more at once (its first clear-to-send asks for one
// piece; the other slots' follow it, the last piece's included), so that
// the sender packs the next pieces while this rank unpacks.
func (p *proc) askAfterCTS(r *reqState, src int, a *ctsArgs) {
	if !morePieces(a) {
		return
	}
	p.mu.Lock()
	p.ctsSentLocked(r, src, a)
	p.mu.Unlock()
}

// morePieces reports whether clear-to-send a asked for a piece of a staged
// receive that asks for more.
func morePieces(a *ctsArgs) bool { return a.Flags&proto.CTSPiece != 0 && a.Flags&ctsMore != 0 }

// ctsSentLocked is askAfterCTS with p.mu held, for a clear-to-send sent as a
// request or as the reply to the request-to-send (completeMatchesLocked).
func (p *proc) ctsSentLocked(r *reqState, src int, a *ctsArgs) {
	if morePieces(a) && r.parts > 0 && r.id == a.RecvID && p.reqs[r.id] == r && r.lay != nil && r.bounce != nil {
		for i := range r.hstate {
			if r.hstate[i] == slotAsked && uint64(r.pfrom[i]) == a.Off {
				r.hstate[i] = slotSent
			}
		}
		p.queueAsksLocked(r, src)
	}
}

// typedPieceMin is the smallest piece a staged receive asks for, in bytes.
const typedPieceMin = 8 << 10

// stageSlots is how many pieces a receive through a shared stage has in
// flight at most; one through a private staging buffer has two, one per
// half. With two, a message of more pieces than that, packed and unpacked
// at about the same rate, alternates: the receiver asks for a piece only
// once it has unpacked the one two before it, and waits while the request
// crosses and the sender packs; with three the sender packs ahead. (Four
// measured 1 % faster at 128 KiB and would take reqState past six cache
// lines: docs/performance.md, "Strided pieces asked for ahead".)
const stageSlots = 3

// pieceOff is where in r's staging buffer slot i's piece is, in bytes: a
// multiple of proto.StageUnit (a half of a private buffer, or a place in a
// shared stage).
func (r *reqState) pieceOff(i int) int { return int(r.poff[i]) * proto.StageUnit }

// slots is how many pieces receive r has in flight at most.
func (r *reqState) slots() int {
	if r.stage != nil {
		return stageSlots
	}
	return 2
}

// typedPiece is the piece a staged receive of n packed bytes asks for at a
// time, into halves of h bytes: half the message (a multiple of 4 KiB, at
// least typedPieceMin), so that even a message of one half's size is
// packed and unpacked in two overlapping pieces, and at most a half.
func typedPiece(n, h int) int {
	return min(h, max(typedPieceMin, (n/2+4095)&^4095))
}

// pieceAt is the length of staged receive r's piece from packed byte from:
// typedPiece's (typedStagePiece's through a shared stage), or what remains.
func (r *reqState) pieceAt(from int) int {
	piece := typedPiece
	if r.stage != nil {
		piece = typedStagePiece
	}
	return min(piece(r.end, typedChunk/2), r.end-from)
}

// stageQuarterMax is the largest message, in packed bytes, that a receive
// through a shared stage asks for in quarters rather than halves: at 128
// KiB the receiver then starts unpacking after a quarter has been packed
// rather than a half (`osu latency -d vector`, fast phase: 0.91-0.95 of
// halves), while from 256 KiB quarters of 64 KiB and up measured 4-15 %
// slower than halves, and pieces of 32 KiB there slower still
// (docs/performance.md, "Strided pieces asked for ahead").
const stageQuarterMax = 128 << 10

// typedStagePiece is typedPiece for a receive through a shared stage: a
// quarter of a message of up to stageQuarterMax bytes (at least
// typedPieceMin), so that the pieces overlap; typedPiece's half above.
func typedStagePiece(n, h int) int {
	if n <= stageQuarterMax {
		return min(h, max(typedPieceMin, (n/4+4095)&^4095))
	}
	return typedPiece(n, h)
}

// onDataPiece runs at a staged receive when a piece it asked for has landed
// in its staging buffer (the piece notice: a store's handler, or a short
// request after the sender packed into a shared stage).
func (p *proc) onDataPiece(tok *handlers.Token, a []uint64, _ []byte) {
	m, err := proto.ParsePiece(a)
	if err != nil {
		p.dropped(fmt.Errorf("piece notice from rank %d: %w", tok.Source(), err))
		return
	}
	src := tok.Source()
	p.mu.Lock()
	r, ok := p.reqs[m.RecvID]
	if !ok || r.kind != kindRecv || r.lay == nil || r.bounce == nil {
		p.mu.Unlock()
		p.dropped(fmt.Errorf("piece notice from rank %d for unknown receive %d", src, m.RecvID))
		return
	}
	if r.parts <= 0 {
		p.mu.Unlock() // failed meanwhile
		return
	}
	slot := -1
	for i := range r.hstate {
		// Sent, or still marked asked: the piece may land before the
		// goroutine that sent its clear-to-send marks it (askAfterCTS).
		if (r.hstate[i] == slotAsked || r.hstate[i] == slotSent) && uint64(r.pfrom[i]) == m.Off {
			slot = i
		}
	}
	if slot < 0 {
		p.mu.Unlock()
		p.dropped(fmt.Errorf("piece notice from rank %d for receive %d at %d, which it did not ask for", src, m.RecvID, m.Off))
		return
	}
	unlink := landedLocked(r)
	r.hstate[slot] = slotFull
	from, b := r.pfrom[slot], r.bounce[r.pieceOff(slot):][:r.pieceAt(r.pfrom[slot])]
	id := r.id
	// The last piece waits until the others have landed: it may be asked
	// for now, before this one is unpacked, so that the sender packs it
	// meanwhile.
	p.queueAsksLocked(r, src)
	p.queueLocked(deferred{kind: workFunc, fn: func() { p.unpackChunk(r, id, src, slot, b, from) }})
	p.mu.Unlock()
	if unlink != "" {
		_ = shmem.Remove(unlink)
	}
}

// unpackChunk unpacks piece b, packed bytes from on, of receive r (whose
// transfer id is id) from that slot of its staging buffer; it then asks world
// rank src for the next piece into that slot, and finishes r once every
// piece has landed and been unpacked (pieces may be unpacked by two
// goroutines at once). A receive that failed meanwhile, or whose state went
// on to another operation, is left alone.
func (p *proc) unpackChunk(r *reqState, id uint64, src, slot int, b []byte, from int) {
	p.mu.Lock()
	if r.parts <= 0 || r.id != id || p.reqs[id] != r {
		p.mu.Unlock()
		return
	}
	r.unpackers++
	p.mu.Unlock()
	r.lay.unpack(r.buf, b, from)
	p.mu.Lock()
	if r.id != id {
		// Failed and handed back meanwhile (failRankLocked completes
		// without waiting for an unpacker): the state is another
		// operation's now.
		p.mu.Unlock()
		return
	}
	r.unpackers--
	r.hstate[slot] = slotFree
	var bounce []byte
	done := false
	switch {
	case r.parts <= 0:
		if r.unpackers == 0 {
			_, bounce = p.unstageLocked(r, false) // partDone left it to the unpackers
		}
	case r.at >= r.end && r.hstate == [stageSlots]uint8{}:
		done = true
	default:
		p.queueAsksLocked(r, src)
	}
	p.mu.Unlock()
	if bounce != nil {
		putChunk(bounce)
	}
	if done {
		p.partDone(r, nil, 0, false)
	}
}

// getInto reads pull job j of receive r from world rank src: straight into
// the receive buffer, or, for non-contiguous data, a chunk at a time
// through a staging buffer.
func (p *proc) getInto(r *reqState, src int, j pullJob) error {
	if r.lay == nil {
		return p.ep.Get(src, j.addr, r.buf[j.off:j.n])
	}
	b := getChunk()
	defer putChunk(b)
	for off := j.off; off < j.n; {
		k := min(len(b), j.n-off)
		if err := p.ep.Get(src, j.addr+uint64(off-j.off), b[:k]); err != nil {
			return err
		}
		r.lay.unpack(r.buf, b[:k], off)
		off += k
	}
	return nil
}

// storeTyped stores the packed bytes a clear-to-send asks of send d.req,
// whose data is not contiguous, a packed chunk at a time; the last store
// runs the receiver's data handler.
func (p *proc) storeTyped(d *deferred) error {
	r, a := d.req, d.cts
	if b, w := p.stageOutFor(d.dst, &a); b != nil {
		// The receiver's shared stage: pack straight into it, with the
		// stores w chooses, then tell.
		w.write(b, func(part []byte, at int, nt bool) {
			if nt {
				r.lay.packNT(part, r.buf, int(a.Off)+at)
			} else {
				r.lay.pack(part, r.buf, int(a.Off)+at)
			}
		})
		p.stages.packed.Add(int64(len(b)))
		return p.dataNotice(d.dst, &a)
	}
	s := getScratch(int(min(a.N, typedChunk)))
	defer putScratch(s)
	for off := uint64(0); off < a.N; {
		k := min(uint64(len(s.b)), a.N-off)
		r.lay.pack(s.b[:k], r.buf, int(a.Off+off))
		var err error
		if off+k < a.N {
			err = p.ep.Store(d.dst, hStorePart, a.Addr+off, s.b[:k])
		} else {
			err = p.storeLast(d.dst, a.Addr+off, s.b[:k], &a)
		}
		if err != nil {
			return err
		}
		off += k
	}
	return nil
}

// onStorePart is the handler of a store that is not a transfer's last: the
// data is in place, and the last store's handler finishes the transfer.
func (p *proc) onStorePart(*handlers.Token, []uint64, []byte) {}
