package mpiam

import (
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/amgo-hpc/amgo/am"
	"github.com/amgo-hpc/amgo/internal/release"
	"github.com/amgo-hpc/amgo/mpiam/internal/match"
)

type reqKind uint8

const (
	kindSend reqKind = iota + 1
	kindRecv
	kindColl // a nonblocking collective
	kindRMA  // a one-sided operation's request (Rput, Rget, ...: rma.go)
)

// Mode is a send mode (MPI-4.1 §3.4).
type Mode uint8

// The four send modes.
const (
	// Standard: eager (buffered at the receiver) up to the eager limit,
	// rendezvous above it.
	Standard Mode = iota
	// Buffered (Bsend): copied into the buffer attached with BufferAttach;
	// completes locally.
	Buffered
	// Synchronous (Ssend): completes only once the matching receive has started;
	// always a rendezvous handshake, at every size.
	Synchronous
	// Ready (Rsend): the matching receive must already be posted.
	Ready
)

var modeNames = [...]string{"standard", "buffered", "synchronous", "ready"}

// String names the mode.
func (m Mode) String() string {
	if int(m) < len(modeNames) {
		return modeNames[m]
	}
	return fmt.Sprintf("mode(%d)", m)
}

// Request is the handle of a nonblocking operation (MPI_Request), a value
// of 16 bytes that is copied freely. Its zero value is MPI_REQUEST_NULL: Wait
// and Test on it return at once with an empty status, and IsNull reports it.
// Wait, Test and the slice forms (Waitall, Testall, ...) set the handle they
// report a completed non-persistent request through to the zero value, as
// MPI_Wait sets its argument to MPI_REQUEST_NULL. Persistent requests
// (SendInit, RecvInit, the persistent collectives) become inactive on
// completion instead and can be started again.
//
// The operation's state lives apart and, once its completion is reported
// (and no tool is attached, see Info), is recycled for a later operation, so
// that a stream of Isend/Irecv/Waitall allocates nothing; the handle carries
// the generation of the state it was made for, and every recycle moves the
// state's generation on, so any other copy of a reported handle acts as a
// null one from then on, whatever operation the state serves next. A handle
// kept in the caller's slice is reused with it: a window of requests writes
// the same cache lines every round (docs/performance.md, "Handles as
// values"). An eager send that completes in its call (Isend up to the eager
// limit with no tool attached) takes a state that is complete from the
// start, as a request object of an MPI library in C is.
type Request struct {
	s   *reqState // nil: null
	gen uint64    // s's generation when the handle was made (reqState.gen)
}

// handleOf returns a new handle for the operation state s.
func handleOf(s *reqState) Request { return Request{s: s, gen: s.gen} }

// IsNull reports whether r is MPI_REQUEST_NULL: the zero Request, a handle
// Wait or Test has reported through, a freed one, or a copy of any of those
// taken before. An inactive persistent request is not null (MPI-4.1 §3.7.3).
func (r *Request) IsNull() bool {
	s := r.state()
	return s == nil || s.reported
}

// state returns the operation behind r; nil for a null handle or a stale
// copy of a reported one.
func (r *Request) state() *reqState {
	if r == nil || r.s == nil || r.s.gen != r.gen {
		return nil
	}
	return r.s
}

// null reports whether r acts as MPI_REQUEST_NULL or an inactive persistent request.
func (r *Request) null() bool { return r.state().null() }

// detach sets r, a reported non-persistent request, to the null Request and
// returns its state for the cache (nil: keep it): nothing inside mpiam
// references an operation once its completion is published (complete is every
// protocol path's last touch), and handles are the only way users reach it.
// Tools may ask a copy of a reported request for its Info, so states are
// kept while any tool is attached (the copies see them reported: null).
func (r *Request) detach() *reqState {
	s := r.state()
	if s == nil || !s.reported || s.persistent {
		return nil
	}
	*r = Request{}
	if s.p.tools != nil {
		return nil
	}
	return s
}

// recycle returns a reported operation's state to the cache (see detach).
func (r *Request) recycle() {
	if s := r.detach(); s != nil {
		s.p.states.putAll([]*reqState{s})
	}
}

// wait is Wait without tool hooks.
func (r *Request) wait() (Status, error) {
	var st Status
	err := r.waitInto(&st)
	return st, err
}

// waitInto is wait with the status written to *st (see copyStatus).
func (r *Request) waitInto(st *Status) error {
	err := r.waitKeepInto(st)
	r.recycle()
	return err
}

// doneFlag is a request's completion flag: set by the goroutine that
// completes the operation (often a handler inside another goroutine's poll),
// loaded by waiters. Setting it is a release store (internal/release): the
// status written before it is visible to a waiter that sees it set, and no
// completer loads anything after it that a waiter writes, so the full barrier
// of an atomic store (an XCHG, ~10 ns behind the stores it drains) buys
// nothing. osu_bw completes two requests per message.
type doneFlag struct{ v uint32 }

// Load reports whether the flag is set.
func (d *doneFlag) Load() bool { return atomic.LoadUint32(&d.v) != 0 }

// Store sets (true) or clears the flag.
func (d *doneFlag) Store(done bool) {
	var v uint32
	if done {
		v = 1
	}
	release.Store32(&d.v, v)
}

// waitKeepInto is wait with the status written to *st (see copyStatus),
// leaving the state with its handle for the caller to detach.
func (r *Request) waitKeepInto(st *Status) error {
	return r.state().waitInto(st)
}

// test is Test without tool hooks.
func (r *Request) test() (bool, Status, error) {
	var st Status
	done, err := r.testInto(&st)
	return done, st, err
}

// testInto is test with the status written to *st once the request has
// completed (see copyStatus); *st is left as it is when it has not.
func (r *Request) testInto(st *Status) (bool, error) {
	s := r.state()
	if s.null() {
		copyStatus(st, &emptyStatus)
		return true, nil
	}
	done, err := s.testInto(st)
	if done {
		r.recycle()
	}
	return done, err
}

// cancel is Cancel without tool hooks.
func (r *Request) cancel() error { return r.state().cancel() }

// start is Start without tool hooks.
func (r *Request) start() error { return r.state().start() }

// reqState is a nonblocking operation's state behind its Request handle; the
// blocking calls use one from the pool directly.
//
// The fields an eager message's send or receive touches (reqHot) come first,
// on the state's first three cache lines; the rendezvous, buffered-send,
// tool and typed-data fields (reqCold) follow, and a state is recycled
// (reset) without touching them unless its operation wrote them (useCold).
// A window of 64 receives in flight touches 64 states: states whose every
// line was written, twice, overflowed the first-level cache.
type reqState struct {
	reqHot
	reqCold
	// gen counts the state's recycles (reset): a Request made for it
	// carries the count of its time, so stale copies see it move on.
	gen uint64
}

// reqHot is the part of a reqState that every operation uses.
type reqHot struct {
	p          *proc
	kind       reqKind
	mode       Mode
	reported   bool // completion reported by Wait/Test: now null
	persistent bool
	active     bool // persistent: started and not yet completed
	hasSig     bool
	// coldUsed: a reqCold field may have been written (useCold), so reset
	// zeroes that part too.
	coldUsed bool
	done     doneFlag
	comm     *Comm
	peer     int // destination or source as given (comm rank, AnySource, ProcNull)
	tag      int
	buf      []byte

	handle match.PostedHandle // a posted receive not matched yet
	onDone func(*reqState)
	coll   *nbc // a nonblocking or persistent collective's operation (kind coll)
	// Typed buffers (datatype.go): lay is the layout of non-contiguous
	// data within buf (nil: buf is the data).
	lay *layout
	// Type checking (typecheck.go, AMGO_CHECK_TYPES): a send's signature
	// hash, or the hash the matched message carried (hasSig).
	sig uint64

	status Status
}

// reqCold is the part of a reqState that only rendezvous transfers, buffered
// sends, tools' values and type checking use. Code that writes a field of it
// calls useCold first; race builds check that at every reset.
type reqCold struct {
	rtype msgType    // type checking: a receive's type
	seg   am.Segment // rendezvous receive: the registered buffer
	id    uint64     // rendezvous: id in proc.reqs

	// Rendezvous transfer (rndv.go), under proc.mu: parts still to finish,
	// the first failure, the peer's piggybacked value.
	parts   int
	xferErr error
	xferPB  uint64
	bblock  bsendBlock // buffered send: space in the attached buffer

	pbOut uint64 // value to piggyback instead of the tool's current one (hasPBOut)

	// A rendezvous receive of non-contiguous data stages it in bounce
	// (rndv_typed.go): it asks the sender for the packed bytes up to end,
	// at being those asked for so far, a piece at a time, at most two at a
	// time (slots 0 and 1; through a shared stage stageSlots); slot i holds
	// the piece from packed byte pfrom[i] (of pieceAt(pfrom[i]) bytes) at
	// poff[i] units of proto.StageUnit bytes into bounce (a half of a
	// private buffer; the next part of a shared stage in turn) and is free,
	// asked for (the clear-to-send queued), sent (the clear-to-send gone)
	// or full (landed, being unpacked) by hstate[i]; unpackers counts the
	// pieces being unpacked outside p.mu, while which partDone leaves
	// bounce to them.
	bounce     []byte
	stage      *stageIn // bounce is this shared stage (stage.go)
	at         int
	pfrom      [stageSlots]int
	poff       [stageSlots]uint16
	hstate     [stageSlots]uint8
	unpackers  int8
	xferHasPB  bool
	hasPBOut   bool
	rndv       bool   // a send that goes by rendezvous whatever its size (a collective's exchange step: eagerStep)
	end        int    // the packed bytes the receive takes
	peerSendID uint64 // the sender's request id, for further clear-to-sends
}

// useCold marks that r's operation writes reqCold fields, which reset must
// then zero. Call it before the first such write.
func (r *reqState) useCold() { r.coldUsed = true }

// reset zeroes r for reuse, dropping what it references (the reqCold part
// only when useCold was called), and moves its generation on, so that every
// handle made for its last operation becomes null. Race builds check that
// useCold was called whenever a reqCold field is set.
func (r *reqState) reset() {
	if r.coldUsed {
		r.reqCold = reqCold{}
	} else if checkCold {
		checkColdZero(r)
	}
	r.reqHot = reqHot{}
	r.gen++
}

// size is the request's data in bytes (packed bytes for a typed layout).
func (r *reqState) size() int {
	if r.lay != nil {
		return r.lay.n
	}
	return len(r.buf)
}

// complete records the final status and publishes completion.
func (r *reqState) complete(st Status) {
	if r.kind == kindSend && st.Source == 0 && st.Tag == 0 {
		st.Source, st.Tag = r.peer, r.tag
	}
	if r.kind == kindSend {
		st.Bytes = r.size()
	}
	r.status = st
	r.completed()
}

// completed publishes the completion of r, whose status is written: it runs
// the completion callback, then sets the done flag.
func (r *reqState) completed() {
	if r.onDone != nil {
		r.onDone(r)
	}
	r.done.Store(true)
}

// null reports whether r acts as MPI_REQUEST_NULL or an inactive persistent request.
func (r *reqState) null() bool {
	return r == nil || r.reported || (r.persistent && !r.active)
}

// report turns a completed request into a reported one (null), or a
// persistent one into an inactive one.
func (r *reqState) report() {
	if r.persistent {
		r.active = false
	} else {
		r.reported = true
	}
}

// wait is Wait without tool hooks.
func (r *reqState) wait() (Status, error) {
	var st Status
	err := r.waitInto(&st)
	return st, err
}

// waitInto is wait with the status written to *st, for the blocking calls
// that return one (Recv, Wait): see copyStatus.
func (r *reqState) waitInto(st *Status) error {
	if r.null() {
		copyStatus(st, &emptyStatus)
		return nil
	}
	if err := r.p.waitDone(&r.done); err != nil {
		*st = Status{Err: err}
		return err
	}
	r.report()
	copyStatus(st, &r.status)
	return st.Err
}

// copyStatus sets *dst to *src a field at a time. A Status is too large to
// live in registers, so Go copies one (an assignment, or a Status result
// passed on through a call that does not inline) as 16-byte moves through
// stack temporaries that were just stored a word at a time. An x86 core
// cannot forward one load from two stores, so each such load waits until the
// stores reach the cache: some tens of cycles at each layer of a blocking
// receive's return (removing them made an 8-byte ping-pong 13 % faster on an
// AMD EPYC guest). Word loads of word stores forward, so the blocking calls
// pass the status down as a pointer, set it with copyStatus and return it as
// a composite literal of its fields (a helper that returned the literal would
// add a copy when inlined): the status's way from the completed request to
// Recv's caller costs no stall.
func copyStatus(dst, src *Status) {
	dst.Source = src.Source
	dst.Tag = src.Tag
	dst.Err = src.Err
	dst.Bytes = src.Bytes
	dst.Cancelled = src.Cancelled
	dst.Piggyback = src.Piggyback
	dst.HasPiggyback = src.HasPiggyback
}

// testInto polls once unless r has completed, and reports whether it has;
// if so it reports it (as Test does) and writes its status to *st. r is
// not null (Request.testInto answers for a null request).
func (r *reqState) testInto(st *Status) (bool, error) {
	if !r.done.Load() {
		r.p.progress()
		if !r.done.Load() {
			return false, nil
		}
	}
	r.report()
	copyStatus(st, &r.status)
	return true, r.status.Err
}

// cancel is Cancel without tool hooks.
func (r *reqState) cancel() error {
	if r.null() {
		return nil
	}
	if r.kind == kindSend {
		return ErrCancelSend
	}
	p := r.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if r.done.Load() || !r.handle.Valid() {
		return nil
	}
	if _, ok := p.eng.Cancel(r.handle); ok {
		r.handle = match.PostedHandle{}
		p.matchedLocked(r)
		r.complete(Status{Source: r.peer, Tag: r.tag, Cancelled: true})
	}
	return nil
}

// Free releases a request (MPI_Request_free): the handle becomes null. An
// active operation still completes (a buffered or standard send is still
// delivered); its outcome can no longer be observed.
func (r *Request) Free() error {
	s := r.state()
	if s == nil {
		return nil
	}
	// A point-to-point operation that has completed (an eager Isend, freed
	// rather than waited, completes in its call) goes back to the cache as
	// a reported one would; anything else is left to the collector, since
	// its operation may still touch it.
	recycle := !s.persistent && (s.kind == kindSend || s.kind == kindRecv) && s.done.Load()
	s.reported = true
	s.persistent = false
	if recycle {
		r.recycle()
	}
	*r = Request{}
	return nil
}

// persistent reports whether r is a persistent request (its handle stays
// as it is in the slice forms).
func (r *Request) persistent() bool {
	s := r.state()
	return s != nil && s.persistent
}

// completed reports whether r's operation has completed; r must not be null.
func (r *Request) completed() bool { return r.s.done.Load() }

// waitall is Waitall without tool hooks.
func waitall(reqs []Request, statuses []Status) error {
	if statuses != nil && len(statuses) != len(reqs) {
		return fmt.Errorf("%w: %d statuses for %d requests", ErrArg, len(statuses), len(reqs))
	}
	var failed int
	var firstErr error
	var spent stateBatch
	var scratch Status
	for i := range reqs {
		r := &reqs[i]
		s := r.state()
		if s != nil && !s.persistent && !s.reported && s.p.tools == nil && s.done.Load() {
			// Complete already (a window of eager sends): report and recycle
			// without the wait's status copies; the same steps as below.
			s.reported = true
			if err := s.status.Err; err != nil {
				failed++
				if firstErr == nil {
					firstErr = err
				}
			}
			if statuses != nil {
				copyStatus(&statuses[i], &s.status)
			}
			if c := &s.p.states; c.mu.Sequential() && len(c.free) < reqCacheMax {
				s.reset() // reqCache.put's common case, without its call
				c.free = append(c.free, s)
			} else {
				spent.add(s)
			}
			*r = Request{}
			continue
		}
		// The status straight into its place (see copyStatus).
		st := &scratch
		if statuses != nil {
			st = &statuses[i]
		}
		err := r.waitKeepInto(st)
		if s := r.detach(); s != nil {
			spent.add(s)
		}
		if err != nil {
			failed++
			if firstErr == nil {
				firstErr = err
			}
		}
		if !r.persistent() {
			*r = Request{}
		}
	}
	spent.flush()
	if failed > 0 {
		return fmt.Errorf("%w: %d of %d requests failed, first: %v", ErrInStatus, failed, len(reqs), firstErr)
	}
	return nil
}

// testall is Testall without tool hooks.
func testall(reqs []Request, statuses []Status) (bool, error) {
	if statuses != nil && len(statuses) != len(reqs) {
		return false, fmt.Errorf("%w: %d statuses for %d requests", ErrArg, len(statuses), len(reqs))
	}
	var p *proc
	for _, r := range reqs {
		if !r.null() {
			p = r.s.p
			break
		}
	}
	if p != nil {
		p.progress()
	}
	for _, r := range reqs {
		if !r.null() && !r.completed() {
			return false, nil
		}
	}
	return true, waitall(reqs, statuses)
}

// waitany is Waitany without tool hooks, the status written to *st (see
// copyStatus).
func waitany(reqs []Request, st *Status) (int, error) {
	p := activeProc(reqs)
	if p == nil {
		copyStatus(st, &emptyStatus)
		return Undefined, nil
	}
	idx := -1
	err := p.waitFor(func() bool {
		for i, r := range reqs {
			if !r.null() && r.completed() {
				idx = i
				return true
			}
		}
		return false
	})
	if err != nil {
		*st = Status{Err: err}
		return Undefined, err
	}
	err = reqs[idx].waitInto(st)
	if !reqs[idx].persistent() {
		reqs[idx] = Request{}
	}
	return idx, err
}

// testany is Testany without tool hooks, the status written to *st (see
// copyStatus) when it reports a request or none active, left as it is
// otherwise.
func testany(reqs []Request, st *Status) (int, bool, error) {
	p := activeProc(reqs)
	if p == nil {
		copyStatus(st, &emptyStatus)
		return Undefined, true, nil
	}
	p.progress()
	for i, r := range reqs {
		if !r.null() && r.completed() {
			err := r.waitInto(st)
			if !r.persistent() {
				reqs[i] = Request{}
			}
			return i, true, err
		}
	}
	return Undefined, false, nil
}

// waitsome is Waitsome without tool hooks.
func waitsome(reqs []Request) (indices []int, statuses []Status, err error) {
	p := activeProc(reqs)
	if p == nil {
		return nil, nil, nil
	}
	if werr := p.waitFor(func() bool { return anyDone(reqs) }); werr != nil {
		return nil, nil, werr
	}
	return collectDone(reqs)
}

// testsome is Testsome without tool hooks.
func testsome(reqs []Request) (indices []int, statuses []Status, err error) {
	p := activeProc(reqs)
	if p == nil {
		return nil, nil, nil
	}
	p.progress()
	return collectDone(reqs)
}

func activeProc(reqs []Request) *proc {
	for _, r := range reqs {
		if !r.null() {
			return r.s.p
		}
	}
	return nil
}

func anyDone(reqs []Request) bool {
	for _, r := range reqs {
		if !r.null() && r.completed() {
			return true
		}
	}
	return false
}

func collectDone(reqs []Request) (indices []int, statuses []Status, err error) {
	indices, statuses = []int{}, []Status{} // active requests: not nil even if none completed
	failed := 0
	for i, r := range reqs {
		if r.null() || !r.completed() {
			continue
		}
		st, e := r.wait()
		if e != nil {
			failed++
		}
		indices = append(indices, i)
		statuses = append(statuses, st)
		if !r.persistent() {
			reqs[i] = Request{}
		}
	}
	if failed > 0 {
		err = fmt.Errorf("%w: %d of %d completed requests failed", ErrInStatus, failed, len(indices))
	}
	return indices, statuses, err
}

var (
	dropLogMu   sync.Mutex
	dropLogLast time.Time
)

// logDrop reports a protocol message that had to be ignored (a peer that
// misbehaves); at most one log line per second.
func logDrop(rank int, err error) {
	dropLogMu.Lock()
	ok := time.Since(dropLogLast) >= time.Second
	if ok {
		dropLogLast = time.Now()
	}
	dropLogMu.Unlock()
	if ok {
		slog.Warn("amgo mpiam: dropped protocol message", "rank", rank, "err", err)
	}
}
