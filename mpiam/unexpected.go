package mpiam

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"github.com/amgo-hpc/amgo/handlers"
	"github.com/amgo-hpc/amgo/mpiam/internal/proto"
)

// Unexpected messages, and how memory for them stays bounded.
//
// An eager message that finds no posted receive is copied out of the sender's
// space in the per-peer buffer, so that the space returns at once: the sender
// allocates that space in ring order, and a message kept there would hold up
// every later message from the same sender, a barrier's or another
// communicator's included, behind a receive that may come only after them.
//
// What the copies cost is counted per source (proc.unexpBytes): the payload
// plus unexpRecordBytes for the message's record, so a flood of empty
// messages counts too; a request-to-send waiting for its receive costs its
// record. Past AMGO_UNEXPECTED_LIMIT (unexpLimit) from one source, the
// receiver tells that source to stop sending eagerly (a throttle message,
// hThrottle): the sender then sends every message to this rank as a
// rendezvous, whose request-to-send leaves the data at the sender until the
// receive pulls it, and whose send request completes only then (MPI lets a
// standard-mode send wait for its receive, MPI-4.1 §3.4). Once the source's
// unexpected cost falls below half the limit, the receiver lifts the
// throttle. Between the limit and the throttle's arrival, the sender can have
// at most its credit's worth of eager messages on the way (a per-peer buffer),
// which are copied out too: the cost from one source stays below
// unexpHardLimit. Only past that, which a sender that obeys the throttle never
// reaches, does a message keep its space in the buffer (back-pressure).
//
// A throttle message carries an epoch, so that an "on" overtaken by the "off"
// that follows it (they travel as a reply and a request) does not leave the
// sender throttled: the sender applies "on" for a newer epoch than it has
// seen, "off" for the newest or a newer one.

// unexpRecordBytes is what one unexpected message's record costs against the
// unexpected limit, in bytes.
const unexpRecordBytes = int64(unsafe.Sizeof(inMsg{}))

// sendThrottle is a destination's word on whether to send it eagerly.
type sendThrottle struct {
	on    atomic.Bool
	epoch uint64 // newest epoch applied; p.mu
	_     [48]byte
}

// recvThrottle is what this rank told a source.
type recvThrottle struct {
	on         atomic.Bool   // the source was told to stop sending eagerly
	epoch      atomic.Uint64 // of the latest "on"
	offPending atomic.Bool   // an "off" is to be sent (runDeferred)
	_          [40]byte
}

// unexpHardLimit is the most unexpected cost one source may have before its
// messages keep their buffer space: the limit plus what a sender can have on
// the way when the throttle reaches it: four buffers' worth of the smallest
// messages, records included, for slack, and a network queue's worth
// (queueBytes: am.Endpoint.ImmediateQueueBytes) of the smallest immediate
// requests, which have no buffer space to keep and are always copied.
func unexpHardLimit(limit, bufferBytes, queueBytes int) int64 {
	b, q := int64(bufferBytes), int64(queueBytes)
	return int64(limit) + 4*b + 4*b/64*unexpRecordBytes + q + q/64*unexpRecordBytes
}

// unexpHardFrom is unexpHardLimit for source src (a world rank), with the
// buffer of src's network (1 MiB over tcp, a ring's size over shm) and a
// network queue only if src sends immediate requests: in a job over several
// networks a source is allowed the slack of its own network, not the
// largest. Computed at each check, on the unexpected path only.
func (p *proc) unexpHardFrom(src int) int64 {
	q := 0
	if p.ep.PeerCarriesImmediate(src) {
		q = p.ep.ImmediateQueueBytes()
	}
	return unexpHardLimit(p.unexpLimit, p.ep.BufferBytesTo(src), q)
}

// chargeUnexpected records that m, unexpected from m.src, costs cost bytes,
// and says whether the source is now past the limit.
func (p *proc) chargeUnexpected(m *inMsg, cost int64) (over bool) {
	m.cost = cost
	return p.unexpBytes[m.src].Add(cost) > int64(p.unexpLimit)
}

// recycleRTS recycles the record of a request-to-send that a receive has
// taken, giving back what it cost while it waited.
func (p *proc) recycleRTS(m *inMsg) {
	p.unchargeUnexpected(m)
	p.msgPool.Put(m)
}

// unchargeUnexpected gives back what m cost; when its source has fallen below
// half the limit and was throttled, the throttle is lifted at the next
// polling call.
func (p *proc) unchargeUnexpected(m *inMsg) {
	if m.cost == 0 {
		return
	}
	left := p.unexpBytes[m.src].Add(-m.cost)
	m.cost = 0
	rt := &p.recvThrottle[m.src]
	if left < int64(p.unexpLimit)/2 && rt.on.Load() && rt.on.CompareAndSwap(true, false) {
		rt.offPending.Store(true)
		p.throttleOff.Store(true)
		p.hasWork.Store(true)
	}
}

// throttleSource tells src to stop sending eagerly, once per episode: by a
// reply to tok, the request being handled, when it has none yet, else by a
// request from the next polling call.
func (p *proc) throttleSource(tok *handlers.Token, src int) {
	rt := &p.recvThrottle[src]
	if !rt.on.CompareAndSwap(false, true) {
		return
	}
	rt.offPending.Store(false)
	e := rt.epoch.Add(1)
	var buf [proto.ThrottleArgs]uint64
	msg := proto.Throttle{On: true, Epoch: e}
	if tok != nil && !tok.Replied() && !tok.IsRetained() && tok.ReplyShort(hThrottle, msg.Append(buf[:0])...) == nil {
		return
	}
	p.mu.Lock()
	p.queueLocked(deferred{kind: workThrottle, dst: src, throttleOn: true, epoch: e})
	p.mu.Unlock()
}

// sendThrottleOffs sends the "off" messages unchargeUnexpected asked for.
func (p *proc) sendThrottleOffs() {
	for src := range p.recvThrottle {
		rt := &p.recvThrottle[src]
		if rt.offPending.Swap(false) && !rt.on.Load() {
			p.sendThrottleMsg(src, false, rt.epoch.Load())
		}
	}
}

// sendThrottleMsg sends a throttle message to dst as a request.
func (p *proc) sendThrottleMsg(dst int, on bool, epoch uint64) {
	var buf [proto.ThrottleArgs]uint64
	msg := proto.Throttle{On: on, Epoch: epoch}
	if err := p.ep.RequestShort(dst, hThrottle, msg.Append(buf[:0])...); err != nil {
		p.dropped(err) // a dead peer: nothing to throttle
	}
}

// onThrottle applies a destination's throttle message (args: on, epoch).
func (p *proc) onThrottle(tok *handlers.Token, a []uint64, _ []byte) {
	m, err := proto.ParseThrottle(a)
	if err != nil {
		p.dropped(fmt.Errorf("from rank %d: %w", tok.Source(), err))
		return
	}
	st := &p.sendThrottle[tok.Source()]
	p.mu.Lock()
	switch {
	case m.On && m.Epoch > st.epoch:
		st.epoch = m.Epoch
		st.on.Store(true)
	case !m.On && m.Epoch >= st.epoch:
		st.epoch = m.Epoch
		st.on.Store(false)
	}
	p.mu.Unlock()
}
