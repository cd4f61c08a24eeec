package am

import (
	"github.com/amgo-hpc/amgo/internal/wire"
)

// Credit coming back: the space of requests answered without a reply is
// owed to their senders and returned on a later request, a reply or an ack.

// packOwed and unpackOwed convert a free range to and from peer.owed's word.
func packOwed(off, n uint32) uint64 { return uint64(off)<<32 | uint64(n) }

func unpackOwed(w uint64) (off, n uint32) { return uint32(w >> 32), uint32(w) }

// piggybackFreeMin is the smallest payload, in bytes, of a request that
// carries the credit owed to its destination however little it is: below it
// a request carries a free only once the owed range reaches a quarter of the
// buffer, when an ack would go anyway. The free extension's 8 bytes would
// make an 8-byte MPI message two cache lines in a ring instead of one.
const piggybackFreeMin = 256

// addFree records that space [off,+n) of src's buffer here is consumed and
// owed back to src (peer.owed); adjacent frees coalesce into one range. The
// range goes back with the next request to src that carries it (sendLocked),
// the next reply to src when adjacent (Reply), or as an ack: once it reaches a
// quarter of the buffer, before the next packet is delivered or at the start
// of the next poll, whichever comes first (sendUrgentFrees); otherwise when
// the endpoint idles (flushFrees). Not from the delivery that filled the
// quarter: when that packet is the last that arrived (a ping-pong), its
// handler's work is what the caller waits for, the caller's answer usually
// carries the range, and on a network where a send is a system call an ack
// sat in front of the answer; while packets stream in, the next delivery
// sends it.
func (ep *Endpoint) addFree(src int, off, n uint32) {
	w := &ep.peers[src].owed
	total := n
	for {
		old := w.Load()
		if o, l := unpackOwed(old); l != 0 && o+l == off {
			if w.CompareAndSwap(old, packOwed(o, l+n)) {
				total = l + n
				break
			}
			continue // a request took the range meanwhile
		}
		if prev := w.Swap(packOwed(off, n)); prev != 0 {
			ep.sendAck(src, prev) // not adjacent: the older range goes alone
		}
		break
	}
	if !ep.rx.isDirty[src] {
		ep.rx.isDirty[src] = true
		ep.rx.dirty = append(ep.rx.dirty, src)
	}
	if int(total) >= ep.cfg.BufferBytes/4 {
		ep.rx.urgent = true
	}
}

// sendUrgentFrees returns the owed ranges that reached a quarter of the
// buffer as acks (see addFree) and drops the sources owed nothing from the
// dirty list.
func (ep *Endpoint) sendUrgentFrees() {
	ep.rx.urgent = false
	dirty := ep.rx.dirty[:0]
	for _, src := range ep.rx.dirty {
		w := &ep.peers[src].owed
		if _, n := unpackOwed(w.Load()); int(n) >= ep.cfg.BufferBytes/4 {
			if v := w.Swap(0); v != 0 {
				ep.sendAck(src, v)
			}
		}
		if w.Load() != 0 {
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
		if v := ep.peers[src].owed.Swap(0); v != 0 {
			ep.sendAck(src, v)
		}
		ep.rx.isDirty[src] = false
	}
	ep.rx.dirty = ep.rx.dirty[:0]
}

// sendAck returns the owed range w (packOwed) to dst in an ack.
func (ep *Endpoint) sendAck(dst int, w uint64) {
	if ep.dead[dst].Load() != nil {
		return // credit for a dead rank: nobody to return it to
	}
	off, n := unpackOwed(w)
	h := wire.Header{Kind: wire.KindAck, Src: uint32(ep.rank), Flags: wire.FlagFree, Off: off, Reserve: n}
	if err := ep.sendResponse(dst, &h, nil, nil); err != nil {
		ep.drop(err)
	}
}
