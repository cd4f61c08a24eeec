package mpiam

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"
	"unsafe"

	"github.com/amgo-hpc/amgo/am/transport"
	"github.com/amgo-hpc/amgo/handlers"
	"github.com/amgo-hpc/amgo/internal/memcopy"
	"github.com/amgo-hpc/amgo/mpiam/internal/match"
	"github.com/amgo-hpc/amgo/mpiam/internal/proto"
)

// The rendezvous protocol (docs/mpi.md "Rendezvous"). The sender announces a
// message with a request-to-send (RTS) naming its size and, on networks with
// a single-copy read (am.Endpoint.CanGet), its buffer's address. The receiver,
// once the message matches a receive, moves the data one of three ways:
//
//   - store (MPI over SP AM's protocol; networks without Get, small messages): a
//     clear-to-send (CTS) names the receive buffer, the sender Stores the data
//     there, the store's handler completes the receive;
//   - pull: the receiver reads the whole message with am Get and tells the
//     sender with a pulled notice; no CTS, one one-way trip before the copy;
//   - split (messages of at least the split size): the CTS asks the sender to
//     store the first part while the receiver pulls the rest, so that both
//     processes copy at once.
//
// A rendezvous request counts the parts still to finish (Request.parts, under
// proc.mu) and completes when the last one does. The sender's parts are one
// for the receiver's final word (a pulled notice, or a CTS without ctsMore)
// plus one per store a CTS asks for.

// EnvRndvSplit sets the smallest rendezvous message, in bytes, that is moved
// half by the sender's store and half by the receiver's get, both processes
// copying at once; "off" or 0 turns splitting off. Default
// DefaultRndvSplitBytes. Only on networks with a single-copy get.
const EnvRndvSplit = "AMGO_RNDV_SPLIT"

// DefaultRndvSplitBytes is the default of EnvRndvSplit, in bytes.
const DefaultRndvSplitBytes = 128 << 10

// ctsMore, a clear-to-send flag: another message (a pulled notice or a
// further CTS) follows for this send; keep it waiting.
const ctsMore = proto.CTSMore

type workKind uint8

const (
	workCTS      workKind = iota + 1 // send a clear-to-send request for a receive
	workStore                        // store a send's data where the receiver asked
	workPull                         // receive: optionally a CTS, then get, then the pulled notice
	workThrottle                     // tell a source to stop or resume eager sends (unexpected.go)
	workFunc                         // run fn: one-sided communication's target work (rma.go)
)

// ctsArgs are a clear-to-send's arguments: which send, where and which part of
// it to store, which receive to run the store's handler for (proto.CTS).
type ctsArgs = proto.CTS

// pullJob is the receiver's get: bytes [off, n) of the receive buffer from the
// sender's buffer at addr (already offset), then the pulled notice for sendID.
type pullJob struct {
	addr   uint64
	off, n int
	sendID uint64
}

// rndvPlan is how a matched rendezvous moves its data.
type rndvPlan struct {
	cts  bool // send args as a clear-to-send
	args ctsArgs
	pull bool // run job
	job  pullJob
}

// fileReqLocked files rendezvous request r under its id in p.reqs, and
// counts a send toward its peer (sendsTo). p.mu is held.
func (p *proc) fileReqLocked(r *reqState) {
	p.reqs[r.id] = r
	if r.kind == kindSend {
		p.sendsTo[r.comm.world(r.peer)]++
	}
}

// unfileReqLocked removes the request filed under id, if any, uncounting a
// send. p.mu is held.
func (p *proc) unfileReqLocked(id uint64) {
	r, ok := p.reqs[id]
	if !ok {
		return
	}
	delete(p.reqs, id)
	if r.kind == kindSend {
		p.sendsTo[r.comm.world(r.peer)]--
	}
}

func rndvSplitFromEnv() (int, error) {
	v := os.Getenv(EnvRndvSplit)
	switch v {
	case "":
		return DefaultRndvSplitBytes, nil
	case "off", "0":
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%w: %s=%q is not a byte count (or off)", ErrArg, EnvRndvSplit, v)
	}
	return n, nil
}

// offerAddr is the address a rendezvous send offers for a pull, or 0 when the
// receiver could not read it with a single copy. The buffer is on the Go heap
// (the request holds it), which does not move, and stays alive and unchanged
// until the receiver's final word.
func (p *proc) offerAddr(world int, buf []byte) uint64 {
	if !p.ep.CanGet(world, len(buf)) {
		return 0
	}
	return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(buf))))
}

// onRTS handles a rendezvous request-to-send: envelope, size, the sender's
// request id and the address offered for a pull.
func (p *proc) onRTS(tok *handlers.Token, a []uint64, _ []byte) {
	p.rtsArrived(tok, a, 0, false)
}

// onRTSSig is onRTS for a message with a type signature hash.
func (p *proc) onRTSSig(tok *handlers.Token, a []uint64, _ []byte) {
	p.rtsArrived(tok, a[:proto.RTSArgs], a[proto.RTSArgs], true)
}

// rtsArrived handles a request-to-send (with the type signature hash sig
// when hasSig).
func (p *proc) rtsArrived(tok *handlers.Token, a []uint64, sig uint64, hasSig bool) {
	rts, err := proto.ParseRTS(a)
	if err != nil {
		p.dropped(fmt.Errorf("from rank %d: %w", tok.Source(), err))
		return
	}
	env := rts.Env.Envelope
	m := p.newMsg()
	m.rndv = true
	m.flags = rts.Env.Flags
	m.size = int(rts.Size)
	m.sendID = rts.SendID
	m.addr = rts.Addr
	m.src = tok.Source()
	m.pb, m.hasPB = tok.Piggyback()
	m.sig, m.hasSig = sig, hasSig
	p.mu.Lock()
	out, mine, _, ok := p.arriveLocked(env, m, "request-to-send")
	if !ok {
		return
	}
	over := false
	src := m.src
	if !mine {
		// A request-to-send waiting for its receive costs its record
		// (unexpected.go).
		over = p.chargeUnexpected(m, unexpRecordBytes)
		if m.flags&flagReady != 0 {
			m.notReady = true
		}
	}
	p.finishArrivalLocked(out, tok, m)
	if over {
		p.throttleSource(tok, src)
	}
}

// planRndvLocked decides how matched rendezvous m reaches receive r, sets r's
// status (truncation, ready-mode errors) and part count, registers the
// receive buffer when the sender will store into it, and returns what to send
// and read. p.mu is held.
func (p *proc) planRndvLocked(r *reqState, m *inMsg, env match.Envelope) rndvPlan {
	n := min(m.size, r.size())
	r.status = Status{Source: int(env.Source), Tag: int(env.Tag), Bytes: n, Piggyback: m.pb, HasPiggyback: m.hasPB}
	if m.size > r.size() {
		r.status.Err = fmt.Errorf("%w: message of %d bytes from rank %d, tag %d, into a buffer of %d", ErrTruncate, m.size, env.Source, env.Tag, r.size())
	} else if m.notReady {
		r.status.Err = fmt.Errorf("%w (from rank %d, tag %d)", ErrReadyNotPosted, env.Source, env.Tag)
	} else if m.hasSig {
		// Checked at the match: the data still moves (the sender's
		// transfer completes), and the receive reports the mismatch.
		r.status.Err = p.sigErr(r, n, m.sig, m.hasSig, envelopeInfo{int(env.Source), int(env.Tag)})
	}
	if r.lay != nil && n > 0 {
		return p.planTypedLocked(r, m, n)
	}
	split := p.rndvSplit
	if p.sendsTo[m.src] > 0 {
		// An exchange: this rank is sending the source a rendezvous too
		// (Sendrecv, a collective's pairwise step), so both cores are
		// busy copying already; a split would only add its clear-to-send
		// and store (osu alltoall of 128 KiB on 2 ranks: 16 -> 13 µs).
		split = 0
	}
	t := planTransfer(n, m.addr != 0, m.addr != 0 && p.ep.CanGet(m.src, n), split)
	r.useCold()
	r.parts, r.xferErr, r.xferPB, r.xferHasPB = t.recvParts, nil, 0, false
	var plan rndvPlan
	plan.args.SendID = m.sendID
	plan.pull, plan.cts = t.pull, t.cts
	push := t.push // bytes the sender stores
	if t.pull {
		plan.job = pullJob{addr: m.addr + uint64(push), off: push, n: n, sendID: m.sendID}
	}
	if !t.cts {
		return plan // the pulled notice is the receiver's only word
	}
	if t.more {
		plan.args.Flags = ctsMore
	}
	if push > 0 {
		seg, err := p.ep.RegisterSegment(r.buf[:n])
		if err != nil {
			// The buffer cannot be a store destination (it overlaps another
			// receive's: an erroneous program). Ask for nothing, so that the
			// sender still completes, and fail the receive.
			r.status.Err = fmt.Errorf("%w: receive buffer for rank %d, tag %d: %v", ErrBuffer, env.Source, env.Tag, err)
			r.status.Bytes = 0
			plan.pull = false
			plan.args.Flags = 0
			r.parts = 1
			push = 0
		} else {
			r.seg = seg
			plan.args.Addr = seg.Addr
			// The data will land within about push / (4 GB/s) plus a round
			// trip: keep polling rather than sleep through it.
			p.ep.Expect(time.Duration(push/4)*time.Nanosecond + 50*time.Microsecond)
		}
	}
	plan.args.N = uint64(push)
	p.nextID++
	r.id = p.nextID
	p.fileReqLocked(r)
	plan.args.RecvID = r.id
	return plan
}

// queueRndvLocked queues the deferred part of plan for receive r of a message
// from world rank src: a clear-to-send still to send, and the pull after it
// (in one item, so that the sender sees them in that order). p.mu is held.
func (p *proc) queueRndvLocked(r *reqState, src int, plan rndvPlan) {
	switch {
	case plan.pull:
		d := deferred{kind: workPull, req: r, dst: src, pull: plan.job}
		if plan.cts {
			d.cts = plan.args
		}
		p.queueLocked(d)
	case plan.cts:
		p.queueLocked(deferred{kind: workCTS, req: r, dst: src, cts: plan.args})
	}
}

// runRndv does plan's work for receive r of a message from world rank src on
// the calling goroutine (not a handler): the clear-to-send, then the pull.
func (p *proc) runRndv(r *reqState, src int, plan rndvPlan) {
	d := deferred{req: r, dst: src, pull: plan.job}
	if plan.cts {
		d.cts = plan.args
	}
	if plan.pull {
		d.kind = workPull
	} else if plan.cts {
		d.kind = workCTS
	} else {
		return
	}
	p.runWork(d)
}

// sendCTS sends a clear-to-send request for receive r.
func (p *proc) sendCTS(d *deferred) error {
	var buf [proto.CTSArgs]uint64
	return p.ep.RequestShortWith(d.dst, hCTS, p.piggyback(), d.cts.Append(buf[:0])...)
}

// onCTS runs at the sender when the receiver has named where to store (part
// of) the data. It only records the fact; the data moves in runDeferred, run
// by the blocked send or, for a nonblocking one, by any MPI call that polls.
func (p *proc) onCTS(tok *handlers.Token, a []uint64, _ []byte) {
	args, err := proto.ParseCTS(a)
	if err != nil {
		p.dropped(fmt.Errorf("from rank %d: %w", tok.Source(), err))
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	r, ok := p.reqs[args.SendID]
	if !ok || r.kind != kindSend || args.Off > uint64(r.size()) || args.N > uint64(r.size())-args.Off {
		p.dropped(fmt.Errorf("clear-to-send from rank %d for unknown send %d or outside it ([%d,+%d))",
			tok.Source(), args.SendID, args.Off, args.N))
		return
	}
	r.parts++ // the store
	if args.Flags&ctsMore == 0 {
		p.unfileReqLocked(args.SendID)
		r.parts-- // the receiver's final word
	}
	d := deferred{kind: workStore, req: r, dst: tok.Source(), cts: args}
	d.pb, d.hasPB = tok.Piggyback()
	p.queueLocked(d)
}

// onPulled runs at the sender when the receiver has read its part of the send
// buffer: the receiver's final word.
func (p *proc) onPulled(tok *handlers.Token, a []uint64, _ []byte) {
	id, err := proto.ParseID(a)
	if err != nil {
		p.dropped(fmt.Errorf("pulled notice from rank %d: %w", tok.Source(), err))
		return
	}
	p.mu.Lock()
	r, ok := p.reqs[id]
	if ok && r.kind == kindSend {
		p.unfileReqLocked(id)
	}
	p.mu.Unlock()
	if !ok || r.kind != kindSend {
		p.dropped(fmt.Errorf("pulled notice from rank %d for unknown send %d", tok.Source(), id))
		return
	}
	pb, hasPB := tok.Piggyback()
	p.partDone(r, nil, pb, hasPB)
}

// onData runs at the receiver once stored rendezvous data has landed (a
// store's handler) or when there was nothing to store (fin).
func (p *proc) onData(tok *handlers.Token, a []uint64, _ []byte) {
	id, err := proto.ParseID(a)
	if err != nil {
		p.dropped(fmt.Errorf("rendezvous data from rank %d: %w", tok.Source(), err))
		return
	}
	p.mu.Lock()
	r, ok := p.reqs[id]
	p.mu.Unlock()
	if !ok || r.kind != kindRecv {
		p.dropped(fmt.Errorf("rendezvous data from rank %d for unknown receive %d", tok.Source(), id))
		return
	}
	p.partDone(r, nil, 0, false)
}

// partDone records that one part of rendezvous request r is over (err: how it
// failed; pb: a piggybacked value that came with it) and completes r after
// the last part: a receive with the status planned at the match, a send with
// the receiver's piggybacked value. A request already failed (parts 0) is left
// alone.
func (p *proc) partDone(r *reqState, err error, pb uint64, hasPB bool) {
	p.mu.Lock()
	if r.parts <= 0 {
		p.mu.Unlock()
		return
	}
	if err != nil && r.xferErr == nil {
		r.xferErr = err
	}
	if hasPB && !r.xferHasPB {
		r.xferPB, r.xferHasPB = pb, true
	}
	r.parts--
	if r.parts > 0 {
		p.mu.Unlock()
		return
	}
	if r.id != 0 && p.reqs[r.id] == r {
		p.unfileReqLocked(r.id)
	}
	// An unpacker still running keeps the staging buffer: the last one gives
	// it back (unpackChunk).
	seg, bounce := p.unstageLocked(r, r.unpackers > 0)
	p.mu.Unlock()
	if seg.Len > 0 {
		_ = p.ep.UnregisterSegment(seg)
	}
	if bounce != nil {
		putChunk(bounce)
	}
	if r.kind == kindRecv {
		st := r.status
		if st.Err == nil && r.xferErr != nil {
			st.Err = r.xferErr
		}
		r.complete(st)
		return
	}
	r.complete(Status{Err: r.xferErr, Piggyback: r.xferPB, HasPiggyback: r.xferHasPB})
}

// inlinePullMax is the largest rendezvous message, in bytes, that the handler
// of its request-to-send reads itself when the receive was already posted (a
// few microseconds of copying inside a poll), answering with the pulled notice
// as the request's reply; larger ones are read by a waiting goroutine (the
// deferred work), outside the poll.
const inlinePullMax = 64 << 10

// pullInHandler reads the data of a request-to-send from inside its handler
// (tok) and replies with the pulled notice, which also returns the request's
// buffer space: compared with deferring the get to a waiting goroutine and
// telling the sender with a request of its own, it saves the queueing, a
// credit allocation and the credit return (osu latency 16 KiB over shm, the
// ping-pong's path). A peer that refuses the get has the work queued as
// before (the store that replaces it needs a request).
func (p *proc) pullInHandler(tok *handlers.Token, d deferred) {
	r, j := d.req, d.pull
	err := p.getInto(r, d.dst, j)
	if errors.Is(err, transport.ErrGetUnsupported) {
		p.mu.Lock()
		p.queueLocked(d)
		p.mu.Unlock()
		return
	}
	p.notifyPulled(tok, r, d.dst, j.sendID, err)
}

// runDeferred does the protocol work handlers queued: clear-to-send requests
// for rendezvous receives matched outside the message's own handler, the
// receivers' gets, and the stores of rendezvous data whose address has
// arrived. Any goroutine that waits in MPI runs it; each item runs once.
func (p *proc) runDeferred() {
	if p.hasWork.Load() || p.throttleOff.Load() { // the common case, nothing queued, without a call
		p.runWorkQueue()
	}
	if e := &p.nbc; e.pending.Load() || e.nUntil.Load() > 0 || e.nAreas.Load() > 0 {
		p.progressColls() // after the queue, whose work may complete their steps
	}
}

// runWorkQueue runs the deferred protocol work queued so far.
func (p *proc) runWorkQueue() {
	if p.throttleOff.Load() && p.throttleOff.Swap(false) {
		p.sendThrottleOffs()
	}
	for p.hasWork.Load() {
		p.mu.Lock()
		if p.workHead == len(p.work) {
			p.hasWork.Store(false)
			p.mu.Unlock()
			return
		}
		d := p.work[p.workHead]
		p.work[p.workHead] = deferred{}
		if p.workHead++; p.workHead == len(p.work) {
			// Drained: the next item reuses the array (no allocation per
			// rendezvous).
			p.work, p.workHead = p.work[:0], 0
			p.hasWork.Store(false)
		}
		p.mu.Unlock()
		p.runWork(d)
	}
}

// storeInstead turns the pull of d into a store: it registers the receive
// buffer if the plan had not, and sends a clear-to-send for the part that was
// to be read, as the sender's final word. The store's handler finishes the part.
func (p *proc) storeInstead(d *deferred) error {
	r, j := d.req, d.pull
	p.mu.Lock()
	if r.lay != nil {
		cts := deferred{dst: d.dst, cts: ctsArgs{SendID: j.sendID}}
		err := p.typedStoreLocked(r, d.dst, j.off, j.n, &cts.cts)
		p.mu.Unlock()
		if err != nil {
			return err
		}
		return p.sendCTS(&cts)
	}
	if r.seg.Len == 0 {
		seg, err := p.ep.RegisterSegment(r.buf[:j.n])
		if err != nil {
			p.mu.Unlock()
			return fmt.Errorf("%w: receive buffer: %v", ErrBuffer, err)
		}
		r.seg = seg
	}
	if r.id == 0 || p.reqs[r.id] != r {
		p.nextID++
		r.id = p.nextID
		p.fileReqLocked(r)
	}
	cts := deferred{dst: d.dst, cts: ctsArgs{SendID: j.sendID, Addr: r.seg.Addr + uint64(j.off), Off: uint64(j.off),
		N: uint64(j.n - j.off), RecvID: r.id}}
	p.mu.Unlock()
	p.ep.Expect(time.Duration((j.n-j.off)/4)*time.Nanosecond + 50*time.Microsecond)
	return p.sendCTS(&cts)
}

// runWork does one item of rendezvous work on the calling goroutine.
func (p *proc) runWork(d deferred) {
	r := d.req
	switch d.kind {
	case workThrottle:
		p.sendThrottleMsg(d.dst, d.throttleOn, d.epoch)
	case workFunc:
		d.fn()
	case workCTS:
		if err := p.sendCTS(&d); err != nil {
			p.partDone(r, p.wrapNet(err), 0, false)
			return
		}
		p.askAfterCTS(r, d.dst, &d.cts)
	case workStore:
		// Store the send's data straight into the receive buffer.
		var err error
		if d.cts.N > 0 && r.lay != nil {
			err = p.storeTyped(&d)
		} else if d.cts.N > 0 {
			src := r.buf[d.cts.Off : d.cts.Off+d.cts.N]
			if b, w := p.stageOutFor(d.dst, &d.cts); b != nil {
				// Into the receiver's shared stage (stage.go), with the
				// stores w chooses as storeTyped packs, then tell.
				w.write(b, func(part []byte, at int, nt bool) {
					if nt {
						memcopy.CopyNT(part, src[at:])
						memcopy.StoreFence()
					} else {
						copy(part, src[at:])
					}
				})
				p.stages.packed.Add(int64(len(b)))
				err = p.dataNotice(d.dst, &d.cts)
			} else {
				err = p.storeLast(d.dst, d.cts.Addr, src, &d.cts)
			}
		} else {
			err = p.ep.RequestShort(d.dst, hFin, d.cts.RecvID)
		}
		p.partDone(r, p.wrapNet(err), d.pb, d.hasPB)
	case workPull:
		if d.cts.RecvID != 0 {
			if err := p.sendCTS(&d); err != nil {
				// The store part will not come: fail it too.
				p.partDone(r, p.wrapNet(err), 0, false)
				p.partDone(r, p.wrapNet(err), 0, false)
				return
			}
		}
		j := d.pull
		err := p.getInto(r, d.dst, j)
		if errors.Is(err, transport.ErrGetUnsupported) {
			// The peer refuses single-copy reads (remembered: later
			// matches plan stores): ask it to store this part instead.
			if err = p.storeInstead(&d); err == nil {
				return
			}
		}
		p.notifyPulled(nil, r, d.dst, j.sendID, err)
	}
}

// notifyPulled sends world rank dst the pulled notice for its send sendID (by
// reply when tok, the request-to-send's token, is not nil; else by request)
// and finishes receive r's get with err, the get's outcome. The notice goes
// even when the get failed, so that the send completes; the receive reports
// the failure.
func (p *proc) notifyPulled(tok *handlers.Token, r *reqState, dst int, sendID uint64, err error) {
	var nerr error
	if tok != nil {
		nerr = tok.ReplyShortWith(hPulled, p.piggyback(), sendID)
	} else {
		nerr = p.ep.RequestShortWith(dst, hPulled, p.piggyback(), sendID)
	}
	if err == nil {
		err = nerr
	}
	p.partDone(r, p.wrapNet(err), 0, false)
}
