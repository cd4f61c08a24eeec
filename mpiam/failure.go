package mpiam

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/amgo-hpc/amgo/am"
	"github.com/amgo-hpc/amgo/mpiam/internal/match"
)

// Process failures (in the manner of ULFM, the MPI Forum's fault-tolerance
// proposal, without its recovery calls).
//
// When the endpoint records a rank dead (am.PeerError: its process died, its
// connection broke), every operation that involves the rank completes with
// ErrProcFailed naming it, at once, and the calls blocked on them return:
//   - sends to it, receives from it by name, rendezvous transfers under way
//     with it (either side), and new operations to or from it;
//   - receives from AnySource on a communicator that contains it (ULFM
//     MPI_ERR_PROC_FAILED; there is no MPI_Comm_failure_ack to re-enable
//     them, so they keep failing on that communicator);
//   - collectives on a communicator that contains it: every receive pending
//     on the communicator's collective context fails and later ones fail at
//     once, so no rank waits for ever on a peer that is itself failing.
//
// What the dead rank left in the matching engine is released with
// match.DropSource (DropContext for collective contexts). Operations that do
// not involve the dead rank go on.

// ProcFailedError reports an operation that involved a failed process. It
// matches ErrProcFailed (class MPI_ERR_PROC_FAILED) and wraps the network's
// report (an *am.PeerError).
type ProcFailedError struct {
	Rank      int    // the failed process's rank in the operation's communicator (-1 if not a member)
	WorldRank int    // its world rank
	Op        string // what failed ("receive from rank 2, tag 7", ...)
	Err       error  // the network's report
}

func (e *ProcFailedError) Error() string {
	return fmt.Sprintf("mpiam: process failed: %s: rank %d (world rank %d): %v", e.Op, e.Rank, e.WorldRank, e.Err)
}

// Unwrap gives ErrProcFailed (for errors.Is and ErrorClass) and the network's report.
func (e *ProcFailedError) Unwrap() []error { return []error{ErrProcFailed, e.Err} }

// failures is a process's record of failed ranks and of what it must fail
// when one is found. Fields other than seen and any are guarded by proc.mu.
type failures struct {
	syncMu sync.Mutex   // one syncDeaths at a time
	seen   atomic.Int64 // endpoint deaths acted on
	any    atomic.Bool  // some rank has failed
	dead   []bool       // by world rank
	cause  []error      // by world rank: the endpoint's *am.PeerError
	comms  map[uint32]*Comm
	anyRcv map[*reqState]struct{} // AnySource receives posted and not matched
}

// procFailed builds the error of an operation on c involving world rank w.
func (p *proc) procFailed(c *Comm, w int, op string) error {
	cause := p.ep.PeerFailure(w)
	if p.fail.cause != nil && w < len(p.fail.cause) && p.fail.cause[w] != nil {
		cause = p.fail.cause[w]
	}
	r := w
	if c != nil {
		r = commRankOf(c, w)
	}
	return &ProcFailedError{Rank: r, WorldRank: w, Op: op, Err: cause}
}

// netErr maps a network error of an operation with world rank w to what the
// caller reports: ErrProcFailed when the endpoint found w dead, else ErrOther.
func (p *proc) netErr(c *Comm, w int, op string, err error) error {
	if err == nil {
		return nil
	}
	var pe *am.PeerError
	if errors.As(err, &pe) {
		return &ProcFailedError{Rank: commRankOfOr(c, pe.Rank), WorldRank: pe.Rank, Op: op, Err: pe}
	}
	if errors.Is(err, am.ErrSeq) {
		return fmt.Errorf("%w: %s", p.threadErr(), op)
	}
	return fmt.Errorf("%w: %s: %w", ErrOther, op, err)
}

func commRankOfOr(c *Comm, w int) int {
	if c == nil {
		return w
	}
	return commRankOf(c, w)
}

// commRankOf returns world rank w's rank in c, or -1.
func commRankOf(c *Comm, w int) int {
	if c.ranks == nil {
		if w < c.size {
			return w
		}
		return -1
	}
	for i, x := range c.ranks {
		if x == w {
			return i
		}
	}
	return -1
}

// deadWorld reports whether world rank w has failed (p.mu held or racy-ok read
// after fail.any).
func (p *proc) deadWorldLocked(w int) bool {
	return p.fail.dead != nil && p.fail.dead[w]
}

// commDeadLocked returns a failed member of c (world rank), or -1. p.mu held.
func (p *proc) commDeadLocked(c *Comm) int {
	if p.fail.dead == nil {
		return -1
	}
	if c.ranks == nil {
		for w := 0; w < c.size; w++ {
			if p.fail.dead[w] {
				return w
			}
		}
		return -1
	}
	for _, w := range c.ranks {
		if p.fail.dead[w] {
			return w
		}
	}
	return -1
}

// refuseRecvLocked returns the error a receive posted on c from src (a rank
// of c or AnySource) must fail with at once, or nil. p.mu held.
func (p *proc) refuseRecvLocked(c *Comm, src, tag int) error {
	if !p.fail.any.Load() {
		return nil // inlined: no rank has failed
	}
	return p.refuseRecvAfterFailure(c, src, tag)
}

// refuseRecvAfterFailure is refuseRecvLocked once some rank has failed.
func (p *proc) refuseRecvAfterFailure(c *Comm, src, tag int) error {
	if src != AnySource {
		if w := c.world(src); p.deadWorldLocked(w) {
			return p.procFailed(c, w, fmt.Sprintf("receive from rank %d, tag %d", src, tag))
		}
		if c.ctx&1 == 0 {
			return nil
		}
	}
	if w := p.commDeadLocked(c); w >= 0 {
		what := "receive from AnySource"
		if c.ctx&1 == 1 {
			what = "collective"
		}
		return p.procFailed(c, w, fmt.Sprintf("%s on communicator %d", what, c.ctx&^1))
	}
	return nil
}

// notePostedLocked records a receive left posted on c, so that a failure can
// find its communicator and, for AnySource, the receive. p.mu held.
func (p *proc) notePostedLocked(r *reqState) {
	if !r.comm.noted || r.peer == AnySource {
		p.noteNewPostedLocked(r) // inlined: nothing to note
	}
}

// noteNewPostedLocked is notePostedLocked for a receive from AnySource or
// on a communicator not noted yet.
func (p *proc) noteNewPostedLocked(r *reqState) {
	c := r.comm
	if !c.noted {
		p.noteCommLocked(c)
	}
	if r.peer == AnySource {
		p.fail.anyRcv[r] = struct{}{}
	}
}

// noteCommLocked records c in p.fail.comms on its first posted receive. p.mu held.
func (p *proc) noteCommLocked(c *Comm) {
	c.noted = true
	if p.fail.comms == nil {
		p.fail.comms = map[uint32]*Comm{}
		p.fail.anyRcv = map[*reqState]struct{}{}
	}
	if _, ok := p.fail.comms[c.ctx]; ok {
		return
	}
	p.fail.comms[c.ctx] = c
	if p.fail.any.Load() {
		// The first receive on c since a failure: release what the dead
		// members left on it.
		for w, d := range p.fail.dead {
			if d {
				for _, f := range p.dropSourceLocked(c, w) {
					f()
				}
			}
		}
	}
}

// matchedLocked forgets a posted receive that left the matching engine. p.mu held.
func (p *proc) matchedLocked(r *reqState) {
	if r.peer == AnySource && p.fail.anyRcv != nil {
		delete(p.fail.anyRcv, r)
	}
}

// syncDeaths acts on the ranks the endpoint has recorded dead since the last
// call: two atomic loads, inlined, when there are none.
func (p *proc) syncDeaths() {
	if p.fail.seen.Load() != int64(p.ep.Deaths()) {
		p.syncNewDeaths()
	}
}

// syncNewDeaths is syncDeaths once the endpoint has recorded more deaths
// than seen so far.
func (p *proc) syncNewDeaths() {
	n := int64(p.ep.Deaths())
	p.fail.syncMu.Lock()
	defer p.fail.syncMu.Unlock()
	if p.fail.seen.Load() == n {
		return
	}
	dead := p.ep.DeadPeers()
	var done []func()
	p.mu.Lock()
	if p.fail.dead == nil {
		p.fail.dead = make([]bool, p.ep.Size())
		p.fail.cause = make([]error, p.ep.Size())
	}
	for _, w := range dead {
		if !p.fail.dead[w] {
			p.fail.dead[w] = true
			p.fail.cause[w] = p.ep.PeerFailure(w)
			p.fail.any.Store(true)
			done = p.failRankLocked(w, done)
		}
	}
	rel := p.pendingRelease
	p.pendingRelease = nil
	p.mu.Unlock()
	p.fail.seen.Store(int64(len(dead)))
	for _, f := range done {
		f()
	}
	for _, m := range rel {
		p.releaseMsg(m)
	}
}

// failRankLocked fails everything pending that involves world rank w and
// returns the completions to run once p.mu is released. p.mu held.
func (p *proc) failRankLocked(w int, done []func()) []func() {
	// Rendezvous transfers waiting for w: sends for its clear-to-send,
	// receives for its data.
	for id, r := range p.reqs {
		c := r.comm
		var peer int
		var op string
		if r.kind == kindSend {
			peer, op = c.world(r.peer), fmt.Sprintf("send to rank %d, tag %d", r.peer, r.tag)
		} else {
			peer, op = c.world(r.status.Source), fmt.Sprintf("receive from rank %d, tag %d", r.status.Source, r.tag)
		}
		if peer != w {
			continue
		}
		p.unfileReqLocked(id)
		r.parts = 0 // parts finishing later leave it alone
		failStageLocked(r)
		if r.seg.Len > 0 {
			_ = p.ep.UnregisterSegment(r.seg)
			r.seg = am.Segment{}
		}
		st := Status{Source: r.status.Source, Tag: r.status.Tag, Err: p.procFailed(c, w, op)}
		done = append(done, func() { r.complete(st) })
	}
	for _, c := range p.fail.comms {
		done = p.dropSourceLocked(c, w, done...)
	}
	// AnySource receives on communicators that contain w (ULFM).
	for r := range p.fail.anyRcv {
		c := r.comm
		if commRankOf(c, w) < 0 || !r.handle.Valid() {
			continue
		}
		if _, ok := p.eng.Cancel(r.handle); !ok {
			continue
		}
		r.handle = match.PostedHandle{}
		delete(p.fail.anyRcv, r)
		st := Status{Source: AnySource, Tag: r.tag, Err: p.procFailed(c, w, fmt.Sprintf("receive from AnySource, tag %d, on communicator %d", r.tag, c.ctx))}
		done = append(done, func() { r.complete(st) })
	}
	return done
}

// dropSourceLocked releases what world rank w left on c and fails the
// receives posted there for it; on a collective context with w as a member,
// every pending receive fails. It returns the completions to run. p.mu held.
func (p *proc) dropSourceLocked(c *Comm, w int, done ...func()) []func() {
	src := commRankOf(c, w)
	if src < 0 {
		return done
	}
	var msgs []match.Message[*inMsg]
	var recvs []*reqState
	collective := c.ctx&1 == 1
	if collective {
		msgs, recvs = p.eng.DropContext(c.ctx, msgs, recvs)
	} else {
		msgs, recvs = p.eng.DropSource(c.ctx, int32(src), msgs, recvs)
	}
	for _, m := range msgs {
		p.pendingRelease = append(p.pendingRelease, m.Msg)
	}
	for _, r := range recvs {
		r.handle = match.PostedHandle{}
		p.matchedLocked(r)
		op := fmt.Sprintf("receive from rank %d, tag %d", r.peer, r.tag)
		if collective {
			op = fmt.Sprintf("collective on communicator %d (waiting on rank %d, tag %d)", c.ctx&^1, r.peer, r.tag)
		}
		st := Status{Source: r.peer, Tag: r.tag, Err: p.procFailed(c, w, op)}
		done = append(done, func() { r.complete(st) })
	}
	return done
}

// sourceFailed returns the error of a probe on c for src when src (or, for
// AnySource, a member of c) has failed; nil otherwise.
func (p *proc) sourceFailed(c *Comm, src, tag int) error {
	if !p.fail.any.Load() {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.refuseRecvLocked(c, src, tag)
}
