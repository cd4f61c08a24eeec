package am

import (
	"github.com/amgo-hpc/amgo/flowctl"
	"github.com/amgo-hpc/amgo/internal/wire"
)

// Credit coming back: the space of requests answered without a reply is
// owed to their senders and returned on a later request, a reply or an ack.
// The decisions are flowctl's (the Ledger, rx.credit); this file sends the
// acks it asks for.
//
// A range goes back with the next request to src that carries it
// (flowctl.Sender.Reserve, by flowctl.CarryOnRequest), the next reply to src
// when adjacent (Reply), or as an ack: at once when a range that is not
// adjacent displaces it; once it is flowctl.Urgent (a quarter of the
// buffer), before the next packet is delivered or at the start of the next
// poll, whichever comes first (sendUrgentFrees); otherwise when the endpoint
// idles (flushFrees). Not from the delivery that filled the quarter: when
// that packet is the last that arrived (a ping-pong), its handler's work is
// what the caller waits for, the caller's answer usually carries the range,
// and on a network where a send is a system call an ack sat in front of the
// answer; while packets stream in, the next delivery sends it.

// addFree records that space [off,+n) of src's buffer here is consumed and
// owed back to src.
func (ep *Endpoint) addFree(src int, off, n uint32) {
	if now := ep.rx.credit.Consumed(src, flowctl.Range{Off: off, Len: n}); now.Len != 0 {
		ep.sendAck(src, now) // not adjacent: the older range goes alone
	}
}

// sendUrgentFrees returns the owed ranges that are flowctl.Urgent as acks.
func (ep *Endpoint) sendUrgentFrees() {
	ep.rx.acks = ep.rx.credit.TakeUrgent(ep.rx.acks[:0])
	ep.sendAcks()
}

// flushFrees returns every owed range as an ack.
func (ep *Endpoint) flushFrees() {
	ep.rx.acks = ep.rx.credit.TakeAll(ep.rx.acks[:0])
	ep.sendAcks()
}

// sendAcks sends the acks the ledger decided (rx.acks).
func (ep *Endpoint) sendAcks() {
	for _, a := range ep.rx.acks {
		ep.sendAck(a.Peer, a.Range)
	}
}

// sendAck returns the owed range r to dst in an ack.
func (ep *Endpoint) sendAck(dst int, r flowctl.Range) {
	if ep.dead[dst].Load() != nil {
		return // credit for a dead rank: nobody to return it to
	}
	h := wire.Header{Kind: wire.KindAck, Src: uint32(ep.rank), Flags: wire.FlagFree, Off: r.Off, Reserve: r.Len}
	if err := ep.sendResponse(dst, &h, nil, nil); err != nil {
		ep.drop(err)
	}
}
