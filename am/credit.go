package am

import (
	"github.com/amgo-hpc/amgo/flowctl"
	"github.com/amgo-hpc/amgo/internal/wire"
)

// Credit coming back: the space of requests answered without a reply is
// owed to their senders (flowctl.Owed, one per peer) and returned on a later
// request, a reply or an ack, by the rules of package flowctl.

// addFree records that space [off,+n) of src's buffer here is consumed and
// owed back to src (peer.owed); adjacent frees coalesce into one range. The
// range goes back with the next request to src that carries it (sendLocked,
// flowctl.CarryOnRequest), the next reply to src when adjacent (Reply), or
// as an ack: once it is flowctl.Urgent (a quarter of the buffer), before the
// next packet is delivered or at the start of the next poll, whichever comes
// first (sendUrgentFrees); otherwise when the endpoint idles (flushFrees).
// Not from the delivery that filled the quarter: when that packet is the last
// that arrived (a ping-pong), its handler's work is what the caller waits
// for, the caller's answer usually carries the range, and on a network where
// a send is a system call an ack sat in front of the answer; while packets
// stream in, the next delivery sends it.
func (ep *Endpoint) addFree(src int, off, n uint32) {
	prevOff, prevLen, total := ep.peers[src].owed.Add(off, n)
	if prevLen != 0 {
		ep.sendAck(src, prevOff, prevLen) // not adjacent: the older range goes alone
	}
	if !ep.rx.isDirty[src] {
		ep.rx.isDirty[src] = true
		ep.rx.dirty = append(ep.rx.dirty, src)
	}
	if flowctl.Urgent(total, ep.cfg.BufferBytes) {
		ep.rx.urgent = true
	}
}

// sendUrgentFrees returns the owed ranges that are flowctl.Urgent as acks
// (see addFree) and drops the sources owed nothing from the dirty list.
func (ep *Endpoint) sendUrgentFrees() {
	ep.rx.urgent = false
	dirty := ep.rx.dirty[:0]
	for _, src := range ep.rx.dirty {
		o := &ep.peers[src].owed
		if flowctl.Urgent(o.Len(), ep.cfg.BufferBytes) {
			if off, n, ok := o.Take(); ok {
				ep.sendAck(src, off, n)
			}
		}
		if o.Len() != 0 {
			dirty = append(dirty, src)
		} else {
			ep.rx.isDirty[src] = false
		}
	}
	ep.rx.dirty = dirty
}

// flushFrees returns every owed range as an ack.
func (ep *Endpoint) flushFrees() {
	for _, src := range ep.rx.dirty {
		if off, n, ok := ep.peers[src].owed.Take(); ok {
			ep.sendAck(src, off, n)
		}
		ep.rx.isDirty[src] = false
	}
	ep.rx.dirty = ep.rx.dirty[:0]
}

// sendAck returns the owed range [off,+n) to dst in an ack.
func (ep *Endpoint) sendAck(dst int, off, n uint32) {
	if ep.dead[dst].Load() != nil {
		return // credit for a dead rank: nobody to return it to
	}
	h := wire.Header{Kind: wire.KindAck, Src: uint32(ep.rank), Flags: wire.FlagFree, Off: off, Reserve: n}
	if err := ep.sendResponse(dst, &h, nil, nil); err != nil {
		ep.drop(err)
	}
}
