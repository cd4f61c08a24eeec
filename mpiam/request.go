package mpiam

import (
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/amgo-hpc/amgo/am"
	"github.com/amgo-hpc/amgo/mpiam/internal/match"
)

type reqKind uint8

const (
	kindSend reqKind = iota + 1
	kindRecv
	kindColl // a nonblocking collective
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

// Request is a nonblocking operation (MPI_Request). A nil *Request is
// MPI_REQUEST_NULL: Wait and Test on it return at once with an empty status.
// A completed non-persistent request that Wait or Test has reported behaves as
// a null request from then on (in C the call sets the handle to
// MPI_REQUEST_NULL; the slice forms Waitall/Testall/... set the element to nil).
// Persistent requests (SendInit, RecvInit) become inactive on completion and
// can be started again.
type Request struct {
	p    *proc
	kind reqKind
	mode Mode
	comm *Comm
	peer int // destination or source as given (comm rank, AnySource, ProcNull)
	tag  int
	buf  []byte

	done   atomic.Bool
	status Status
	handle match.PostedHandle // a posted receive not matched yet
	seg    am.Segment         // rendezvous receive: the registered buffer
	id     uint64             // rendezvous: id in proc.reqs

	// Rendezvous transfer (rndv.go), under proc.mu: parts still to finish,
	// the first failure, the peer's piggybacked value.
	parts     int
	xferErr   error
	xferPB    uint64
	xferHasPB bool
	bblock    bsendBlock // buffered send: space in the attached buffer
	pooled    bool       // internal request of a blocking call
	reported  bool       // completion reported by Wait/Test: now null

	pbOut    uint64 // value to piggyback instead of the tool's current one (hasPBOut)
	hasPBOut bool

	persistent bool
	active     bool // persistent: started and not yet completed
	onDone     func(*Request)
}

// complete records the final status and publishes completion.
func (r *Request) complete(st Status) {
	if r.kind == kindSend && st.Source == 0 && st.Tag == 0 {
		st.Source, st.Tag = r.peer, r.tag
	}
	if r.kind == kindSend {
		st.Bytes = len(r.buf)
	}
	r.status = st
	if r.onDone != nil {
		r.onDone(r)
	}
	r.done.Store(true)
}

// null reports whether r acts as MPI_REQUEST_NULL or an inactive persistent request.
func (r *Request) null() bool {
	return r == nil || r.reported || (r.persistent && !r.active)
}

// finish turns a completed request into a reported one and returns its status.
func (r *Request) finish() Status {
	st := r.status
	if r.persistent {
		r.active = false
	} else {
		r.reported = true
	}
	return st
}

// wait is Wait without tool hooks.
func (r *Request) wait() (Status, error) {
	if r.null() {
		return emptyStatus, nil
	}
	if err := r.p.waitFor(r.done.Load); err != nil {
		return Status{Err: err}, err
	}
	st := r.finish()
	return st, st.Err
}

// test is Test without tool hooks.
func (r *Request) test() (bool, Status, error) {
	if r.null() {
		return true, emptyStatus, nil
	}
	if !r.done.Load() {
		r.p.progress()
		if !r.done.Load() {
			return false, Status{}, nil
		}
	}
	st := r.finish()
	return true, st, st.Err
}

// cancel is Cancel without tool hooks.
func (r *Request) cancel() error {
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

// Free releases a request (MPI_Request_free). An active operation still
// completes (a buffered or standard send is still delivered); its outcome can no
// longer be observed.
func (r *Request) Free() error {
	if r == nil {
		return nil
	}
	r.reported = true
	r.persistent = false
	return nil
}

// waitall is Waitall without tool hooks.
func waitall(reqs []*Request, statuses []Status) error {
	if statuses != nil && len(statuses) != len(reqs) {
		return fmt.Errorf("%w: %d statuses for %d requests", ErrArg, len(statuses), len(reqs))
	}
	var failed int
	var firstErr error
	for i, r := range reqs {
		st, err := r.wait()
		if statuses != nil {
			statuses[i] = st
		}
		if err != nil {
			failed++
			if firstErr == nil {
				firstErr = err
			}
		}
		if r != nil && !r.persistent {
			reqs[i] = nil
		}
	}
	if failed > 0 {
		return fmt.Errorf("%w: %d of %d requests failed, first: %v", ErrInStatus, failed, len(reqs), firstErr)
	}
	return nil
}

// testall is Testall without tool hooks.
func testall(reqs []*Request, statuses []Status) (bool, error) {
	if statuses != nil && len(statuses) != len(reqs) {
		return false, fmt.Errorf("%w: %d statuses for %d requests", ErrArg, len(statuses), len(reqs))
	}
	var p *proc
	for _, r := range reqs {
		if !r.null() {
			p = r.p
			break
		}
	}
	if p != nil {
		p.progress()
	}
	for _, r := range reqs {
		if !r.null() && !r.done.Load() {
			return false, nil
		}
	}
	return true, waitall(reqs, statuses)
}

// waitany is Waitany without tool hooks.
func waitany(reqs []*Request) (int, Status, error) {
	p := activeProc(reqs)
	if p == nil {
		return Undefined, emptyStatus, nil
	}
	idx := -1
	err := p.waitFor(func() bool {
		for i, r := range reqs {
			if !r.null() && r.done.Load() {
				idx = i
				return true
			}
		}
		return false
	})
	if err != nil {
		return Undefined, Status{Err: err}, err
	}
	st, err := reqs[idx].wait()
	if !reqs[idx].persistent {
		reqs[idx] = nil
	}
	return idx, st, err
}

// testany is Testany without tool hooks.
func testany(reqs []*Request) (int, bool, Status, error) {
	p := activeProc(reqs)
	if p == nil {
		return Undefined, true, emptyStatus, nil
	}
	p.progress()
	for i, r := range reqs {
		if !r.null() && r.done.Load() {
			st, err := r.wait()
			if !r.persistent {
				reqs[i] = nil
			}
			return i, true, st, err
		}
	}
	return Undefined, false, Status{}, nil
}

// waitsome is Waitsome without tool hooks.
func waitsome(reqs []*Request) (indices []int, statuses []Status, err error) {
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
func testsome(reqs []*Request) (indices []int, statuses []Status, err error) {
	p := activeProc(reqs)
	if p == nil {
		return nil, nil, nil
	}
	p.progress()
	return collectDone(reqs)
}

func activeProc(reqs []*Request) *proc {
	for _, r := range reqs {
		if !r.null() {
			return r.p
		}
	}
	return nil
}

func anyDone(reqs []*Request) bool {
	for _, r := range reqs {
		if !r.null() && r.done.Load() {
			return true
		}
	}
	return false
}

func collectDone(reqs []*Request) (indices []int, statuses []Status, err error) {
	indices, statuses = []int{}, []Status{} // active requests: not nil even if none completed
	failed := 0
	for i, r := range reqs {
		if r.null() || !r.done.Load() {
			continue
		}
		st, e := r.wait()
		if e != nil {
			failed++
		}
		indices = append(indices, i)
		statuses = append(statuses, st)
		if !r.persistent {
			reqs[i] = nil
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
