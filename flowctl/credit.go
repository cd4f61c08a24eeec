package flowctl

import (
	"fmt"

	"github.com/amgo-hpc/amgo/internal/cacheline"
)

// The credit engine: the sender's side (Sender, one per peer) and the
// receiver's side (Ledger, one per rank), as state machines. Their inputs
// are the events of the buffered protocol: a request to reserve room for,
// a request the network refused, a request that arrived, a request answered
// with a reply or consumed without one, credit that came back, an idle
// receiver. Their outputs are what to put in the packet (a reservation, a
// range it carries back) and what to send or queue (acks). They do no I/O,
// start no goroutine and take no lock; the caller (package am) encodes and
// sends what they decide.

// Range is a span [Off, Off+Len) of one peer's receive buffer, in bytes.
// Len 0 is no range.
type Range struct {
	Off, Len uint32
}

// End is the offset just past r.
func (r Range) End() uint32 { return r.Off + r.Len }

// Params are the sizes of the packets the engine reserves room for, in
// bytes. Every rank of a job uses the same, except that BufferBytes may
// differ between pairs of ranks (a pair over another network): the two ends
// of a pair use the same (Ledger.SetBuffer on the receiving side).
type Params struct {
	// BufferBytes is the per-peer receive buffer (DefaultBufferBytes).
	BufferBytes int
	// ReplyReserve is the room every request reserves for its reply.
	ReplyReserve int
	// ExtLen is the length of the header extension that carries a range
	// back on a request: every request reserves it, so that the decision
	// to carry comes after the reservation.
	ExtLen int
	// MinReply is the smallest room a reply needs (a reply header): a
	// request whose reservation leaves less is malformed.
	MinReply int
}

// Check reports an ErrBadSize for parameters no buffer can serve: a buffer
// that is not a positive multiple of Granule up to 1 GiB, or a reply
// reserve below MinReply or above half the buffer.
func (p Params) Check() error {
	if p.BufferBytes <= 0 || p.BufferBytes%Granule != 0 || p.BufferBytes > 1<<30 {
		return fmt.Errorf("%w: buffer of %d bytes (want a positive multiple of %d up to 1 GiB)", ErrBadSize, p.BufferBytes, Granule)
	}
	if p.ReplyReserve < p.MinReply || p.ReplyReserve > p.BufferBytes/2 || p.ExtLen < 0 || p.MinReply < 0 {
		return fmt.Errorf("%w: reply reserve %d (from %d to half the buffer), extension %d", ErrBadSize, p.ReplyReserve, p.MinReply, p.ExtLen)
	}
	return nil
}

// Reservation is the room, in bytes, that a request whose header encodes to
// hdrLen bytes (without the extension) reserves for a payload of payload
// bytes: the packet, the extension and the reply's room, in whole granules.
func (p Params) Reservation(hdrLen, payload int) int {
	return RoundUp(hdrLen + p.ExtLen + payload + p.ReplyReserve)
}

// Grant is one request's share of the credit: Space, the room reserved for
// it in the peer's buffer (the packet's Off and Reserve), and Carry, the
// credit this rank owed the peer that the request takes back (its free
// extension; Len 0: none).
type Grant struct {
	Space Range
	Carry Range
}

// Sender is the credit of one rank toward one peer: its Window in the
// peer's buffer, and the Owed range it carries back on requests. It is not
// safe for concurrent use (package am guards it with the peer's lock); its
// Owed is, and the Ledger that owns it adds to it concurrently.
type Sender struct {
	p    Params
	win  *Window
	owed *Owed
}

// NewSender returns the sender's side toward one peer, which carries back
// owed (from Ledger.Owed for that peer). Errors: ErrBadSize for p.
func NewSender(p Params, owed *Owed) (*Sender, error) {
	if err := p.Check(); err != nil {
		return nil, err
	}
	w, err := NewWindow(p.BufferBytes)
	if err != nil {
		return nil, err
	}
	s := cacheline.New[Sender]()
	*s = Sender{p: p, win: w, owed: owed}
	return s, nil
}

// Reserve reserves room for a request (Params.Reservation of hdrLen and
// payload bytes) and decides whether it carries the owed range back
// (CarryOnRequest). ok is false when the window is full now: the caller
// polls, so that replies free space, and tries again. Errors: ErrBadSize for
// a request that can never fit the buffer.
func (s *Sender) Reserve(hdrLen, payload int) (g Grant, ok bool, err error) {
	n := s.p.Reservation(hdrLen, payload)
	off, ok, err := s.win.Alloc(n)
	if err != nil || !ok {
		return Grant{}, false, err
	}
	g.Space = Range{off, uint32(n)}
	if CarryOnRequest(s.owed.Len(), payload, s.p.BufferBytes) {
		if off, n, ok := s.owed.Take(); ok {
			g.Carry = Range{off, n}
		}
	}
	return g, true, nil
}

// OwesCarry reports whether the credit owed to the peer is CarryAny bytes or
// more, which every request to it carries back: an immediate request, which
// has no room for it, goes as a medium request instead.
func (s *Sender) OwesCarry() bool { return s.owed.Len() >= CarryAny }

// ReserveBare reserves room for a request that carries no payload and no
// credit back (a store-done sent with a single-copy put's data, whose
// header is written before the put). ok and errors as Reserve.
func (s *Sender) ReserveBare(hdrLen int) (Range, bool, error) {
	n := s.p.Reservation(hdrLen, 0)
	off, ok, err := s.win.Alloc(n)
	return Range{off, uint32(n)}, ok, err
}

// Refused undoes g after the network refused its request: the room is free
// again, and the credit it carried must still go back. The result is that
// range (Len 0: none): the caller queues it as an ack behind what the
// network refused, or drops it if the peer is dead.
func (s *Sender) Refused(g Grant) (ack Range) {
	_ = s.win.Free(g.Space.Off, g.Space.Len) // handed out by Reserve: cannot fail
	return g.Carry
}

// Free returns r to the window: credit the peer sent back on a reply, an ack
// or a request. Errors: ErrNotAllocated for a range not handed out or
// returned twice (a malformed or duplicated packet; nothing changes).
func (s *Sender) Free(r Range) error { return s.win.Free(r.Off, r.Len) }

// InUse is the number of bytes of the peer's buffer this rank holds (see
// Window.InUse): 0 once every request is answered.
func (s *Sender) InUse() int { return s.win.InUse() }

// Outstanding is the number of requests whose room is not yet returned.
func (s *Sender) Outstanding() int { return s.win.Outstanding() }

// Ack is a range of Peer's buffer space that goes back to Peer alone, in an
// ack packet.
type Ack struct {
	Peer int
	Range
}

// owedSlot keeps each peer's Owed on its own cache line: the poller adds to
// one while a sender takes another's.
type owedSlot struct {
	Owed
	_ [cacheline.Size - 8]byte
}

// Ledger is the receiver's side of the credit of one rank: what it owes
// each sender, and when that goes back. Arrival, Consumed, Reply, Urgent,
// TakeUrgent and TakeAll are called by the one goroutine that delivers
// packets (package am's poller); the Owed of each peer is taken concurrently
// by that peer's Sender.
type Ledger struct {
	p       Params
	bufs    []int // by peer: its buffer's size (p.BufferBytes unless SetBuffer)
	owed    []owedSlot
	dirty   []int  // peers owed credit (possibly taken since)
	isDirty []bool // by peer: in dirty
	urgent  bool   // a range reached Urgent: it goes before the next delivery
}

// NewLedger returns the receiver's side for a job of peers ranks. Errors:
// ErrBadSize for p.
func NewLedger(p Params, peers int) (*Ledger, error) {
	if err := p.Check(); err != nil {
		return nil, err
	}
	l := cacheline.New[Ledger]()
	*l = Ledger{p: p, owed: cacheline.Slice[owedSlot](peers), dirty: cacheline.Slice[int](peers)[:0],
		isDirty: cacheline.Slice[bool](peers), bufs: make([]int, peers)}
	for i := range l.bufs {
		l.bufs[i] = p.BufferBytes
	}
	return l, nil
}

// SetBuffer sets the size of peer's buffer, in bytes, when it differs from
// the Params' (a peer over another network): the peer's Sender must use the
// same size. Call it before the first packet from peer. Errors: ErrBadSize
// for a size the Params would refuse, or a peer out of range.
func (l *Ledger) SetBuffer(peer, bytes int) error {
	q := l.p
	q.BufferBytes = bytes
	if err := q.Check(); err != nil {
		return err
	}
	if peer < 0 || peer >= len(l.bufs) {
		return fmt.Errorf("%w: peer %d of %d", ErrBadSize, peer, len(l.bufs))
	}
	l.bufs[peer] = bytes
	return nil
}

// Buffer is the size of peer's buffer in bytes.
func (l *Ledger) Buffer(peer int) int { return l.bufs[peer] }

// Owed is what this rank owes peer, for that peer's Sender to carry back.
func (l *Ledger) Owed(peer int) *Owed { return &l.owed[peer].Owed }

// Arrival checks the reservation space of a request from peer src, whose
// packet is pktLen bytes and carries a range back or not, and returns the
// room left for its reply (bytes, at least MinReply): the reservation less
// the packet, and less the extension's room when the packet does not use it,
// so that the room does not depend on whether the request carried credit.
// Errors: ErrNotAllocated for a reservation outside the buffer, not in whole
// granules, or without room for a reply (a malformed request: the caller
// drops it; its space cannot be trusted, so it is not owed).
func (l *Ledger) Arrival(src int, space Range, pktLen int, carries bool) (replyRoom int, err error) {
	replyRoom = int(space.Len) - pktLen
	if !carries {
		replyRoom -= l.p.ExtLen
	}
	if uint64(space.Off)+uint64(space.Len) > uint64(l.bufs[src]) || space.Off%Granule != 0 ||
		space.Len%Granule != 0 || replyRoom < l.p.MinReply {
		return 0, fmt.Errorf("%w: reservation [%d,+%d) for a packet of %d bytes", ErrNotAllocated, space.Off, space.Len, pktLen)
	}
	return replyRoom, nil
}

// Consumed records that the request from src that had space is done with
// it and was not answered by a reply: the space is owed to src. Adjacent
// consumptions coalesce; one that is not adjacent displaces the older range,
// which is returned (Len > 0) for the caller to send in an ack at once. A
// range that reaches Urgent goes at the next TakeUrgent.
func (l *Ledger) Consumed(src int, space Range) (now Range) {
	prevOff, prevLen, total := l.owed[src].Add(space.Off, space.Len)
	if !l.isDirty[src] {
		l.isDirty[src] = true
		l.dirty = append(l.dirty, src)
	}
	if Urgent(total, l.bufs[src]) {
		l.urgent = true
	}
	return Range{prevOff, prevLen}
}

// Reply returns the range a reply to src's request with space gives back:
// the space, and the range owed to src when it ends where the space starts
// (and no request to src took it meanwhile).
func (l *Ledger) Reply(src int, space Range) Range {
	if off, n, ok := l.owed[src].TakeBefore(space.Off); ok {
		return Range{off, n + space.Len}
	}
	return space
}

// Urgent reports whether a range owed reached Urgent: TakeUrgent before
// delivering the next packet.
func (l *Ledger) Urgent() bool { return l.urgent }

// Pending reports whether any peer may be owed credit: TakeAll when the
// receiver idles.
func (l *Ledger) Pending() bool { return len(l.dirty) > 0 }

// TakeUrgent appends to acks the ranges owed that are Urgent, taking them,
// and returns the result.
func (l *Ledger) TakeUrgent(acks []Ack) []Ack {
	l.urgent = false
	dirty := l.dirty[:0]
	for _, src := range l.dirty {
		o := &l.owed[src].Owed
		if Urgent(o.Len(), l.bufs[src]) {
			if off, n, ok := o.Take(); ok {
				acks = append(acks, Ack{src, Range{off, n}})
			}
		}
		if o.Len() != 0 {
			dirty = append(dirty, src)
		} else {
			l.isDirty[src] = false
		}
	}
	l.dirty = dirty
	return acks
}

// TakeAll appends to acks every range owed, taking them, and returns the
// result: what an idle receiver, or one that closes, sends back.
func (l *Ledger) TakeAll(acks []Ack) []Ack {
	for _, src := range l.dirty {
		if off, n, ok := l.owed[src].Take(); ok {
			acks = append(acks, Ack{src, Range{off, n}})
		}
		l.isDirty[src] = false
	}
	l.dirty = l.dirty[:0]
	l.urgent = false
	return acks
}
