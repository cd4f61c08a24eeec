// Package sched is amgo's collective schedule engine: a collective operation
// is built once into a Schedule, a list of rounds of sends, receives and local
// steps (reductions, copies), and a Run walks it as the messages complete.
// Nonblocking (MPI-4.1 §6.12) and persistent (§6.13) collectives run on it,
// progressed by whatever MPI call polls, with no goroutine per operation.
//
// The model is libNBC's (Hoefler, Lumsdaine and Rehm, "Implementation and
// Performance Analysis of Non-Blocking Collective Operations for MPI", SC
// 2007): the steps of a round start in order when the round starts (local
// steps run to completion then, messages are posted), and the next round
// starts once every message of this one has completed. A reduction that
// needs a received block therefore sits in the round after the receive,
// and a send of its result in the same round after it.
//
// Like the matching engine, the package is a pure state machine: it starts no
// goroutine, takes no lock and does no I/O. The caller posts messages and
// reports their completion through the Net interface, so the algorithms'
// schedules are tested here against an in-memory network (sched_test.go),
// and mpiam drives the same schedules over AM.
package sched

import (
	"errors"
	"fmt"

	"github.com/amgo-hpc/amgo/internal/memcopy"
)

// Kind is what a step of a schedule does.
type Kind uint8

const (
	// SendOp sends Buf to rank Peer with tag Tag.
	SendOp Kind = iota
	// RecvOp receives exactly len(Buf) bytes from rank Peer with tag Tag.
	RecvOp
	// ReduceOp combines Buf into Dst element-wise with Red: Dst = Buf ∘ Dst.
	ReduceOp
	// CopyOp copies Buf to Dst (the same length).
	CopyOp
	// CallOp runs Fn; an error ends the schedule.
	CallOp
	// UntilOp waits, like a message, until Cond holds (a condition set by
	// something other than a message of the schedule: barrier counters).
	UntilOp
	// EventOp is posted through Net like a message and completes when the
	// caller says so (Ext describes what it waits for): a wait on an event
	// that something else drives, without the schedule testing a condition
	// at every poll as for an UntilOp.
	EventOp
)

// String names k.
func (k Kind) String() string {
	switch k {
	case SendOp:
		return "send"
	case RecvOp:
		return "recv"
	case ReduceOp:
		return "reduce"
	case CopyOp:
		return "copy"
	case CallOp:
		return "call"
	case UntilOp:
		return "until"
	case EventOp:
		return "event"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Reduction is a reduction operation on packed elements (an MPI_Op over one
// element type).
type Reduction struct {
	// Fn sets inout[i] = in[i] ∘ inout[i] for every element; in holds the
	// contribution of lower ranks. in and inout have the same length, a
	// multiple of Elem.
	Fn func(in, inout []byte)
	// Commutative operations may be applied in any order; the others are
	// applied in rank order.
	Commutative bool
	// Elem is the size of one element in bytes (at least 1): blocks that
	// algorithms split vectors into start at element boundaries.
	Elem int
}

// Op is one step of a schedule.
type Op struct {
	Kind Kind
	Peer int    // Send, Recv: the rank, in the communicator's numbering
	Tag  int    // Send, Recv: the step's tag, 0..255, added to the call's tag base
	Buf  []byte // Send, Recv: the data; Reduce, Copy: the source
	Dst  []byte // Reduce, Copy: the destination
	Red  *Reduction
	Fn   func() error // Call
	Cond func() bool  // Until
	// Ext is the caller's own description of a message's data (Send,
	// Recv), passed through to Net untouched: mpiam's datatype layouts, for
	// data that is not Buf's bytes in order.
	Ext any
	// Exchange marks a Send whose peer sends to this member in the same
	// round (SendExchange): the two copy at once, which may call for
	// another protocol than a one-way message of the same size.
	Exchange bool
	// Blocks marks an exchange of independent blocks (SendExchangeBlocks:
	// an all-to-all's), which may switch protocol at another size than an
	// exchange of data computed in the schedule.
	Blocks bool
}

// message reports whether the step waits for something outside the rank.
func (o *Op) message() bool {
	return o.Kind == SendOp || o.Kind == RecvOp || o.Kind == UntilOp || o.Kind == EventOp
}

// Schedule is a collective operation's steps in rounds. It is immutable once
// built and may be run any number of times (persistent collectives), one run
// at a time.
type Schedule struct {
	ops  []Op
	ends []int // ends[r] is the index after round r's last step
}

// Ops returns the schedule's steps (for tests and diagnostics).
func (s *Schedule) Ops() []Op { return s.ops }

// Rounds returns the number of rounds.
func (s *Schedule) Rounds() int { return len(s.ends) }

// Round returns the steps of round r.
func (s *Schedule) Round(r int) []Op {
	lo := 0
	if r > 0 {
		lo = s.ends[r-1]
	}
	return s.ops[lo:s.ends[r]]
}

// Messages returns how many of the schedule's steps are messages.
func (s *Schedule) Messages() int {
	n := 0
	for i := range s.ops {
		if k := s.ops[i].Kind; k == SendOp || k == RecvOp {
			n++
		}
	}
	return n
}

// Builder builds a Schedule round by round. The zero value is ready to use.
type Builder struct {
	s    Schedule
	open int // steps of the current round so far
}

func (b *Builder) add(o Op) {
	if b.s.ops == nil {
		b.s.ops = make([]Op, 0, 8) // most schedules of a few ranks fit
	}
	b.s.ops = append(b.s.ops, o)
	b.open++
}

// Send adds a send of buf to peer with tag to the current round.
func (b *Builder) Send(peer, tag int, buf []byte) {
	b.add(Op{Kind: SendOp, Peer: peer, Tag: tag, Buf: buf})
}

// SendExchange is Send to a peer that sends to this member in the same
// round (Op.Exchange).
func (b *Builder) SendExchange(peer, tag int, buf []byte) {
	b.add(Op{Kind: SendOp, Peer: peer, Tag: tag, Buf: buf, Exchange: true})
}

// SendExchangeBlocks is SendExchange of an all-to-all's block, which
// nothing in the schedule computes (Op.Blocks).
func (b *Builder) SendExchangeBlocks(peer, tag int, buf []byte) {
	b.add(Op{Kind: SendOp, Peer: peer, Tag: tag, Buf: buf, Exchange: true, Blocks: true})
}

// Recv adds a receive of len(buf) bytes from peer with tag to the current round.
func (b *Builder) Recv(peer, tag int, buf []byte) {
	b.add(Op{Kind: RecvOp, Peer: peer, Tag: tag, Buf: buf})
}

// SendExt and RecvExt are Send and Recv with the caller's description of
// the data (Op.Ext).
func (b *Builder) SendExt(peer, tag int, buf []byte, ext any) {
	b.add(Op{Kind: SendOp, Peer: peer, Tag: tag, Buf: buf, Ext: ext})
}

func (b *Builder) RecvExt(peer, tag int, buf []byte, ext any) {
	b.add(Op{Kind: RecvOp, Peer: peer, Tag: tag, Buf: buf, Ext: ext})
}

// Reduce adds dst = in ∘ dst with red to the current round.
func (b *Builder) Reduce(red *Reduction, in, dst []byte) {
	if len(dst) == 0 {
		return
	}
	b.add(Op{Kind: ReduceOp, Buf: in, Dst: dst, Red: red})
}

// Copy adds a copy of src to dst to the current round (nothing when they
// are the same bytes or empty).
func (b *Builder) Copy(dst, src []byte) {
	if len(src) == 0 || len(dst) == 0 || &dst[0] == &src[0] {
		return
	}
	b.add(Op{Kind: CopyOp, Buf: src, Dst: dst})
}

// Call adds fn to the current round.
func (b *Builder) Call(fn func() error) { b.add(Op{Kind: CallOp, Fn: fn}) }

// Event adds a wait for an event that ext describes to the current round:
// the run posts it through Net.Post and tests it with Net.Test.
func (b *Builder) Event(ext any) { b.add(Op{Kind: EventOp, Ext: ext}) }

// Until adds a wait for cond to the current round.
func (b *Builder) Until(cond func() bool) { b.add(Op{Kind: UntilOp, Cond: cond}) }

// Fence ends the current round: the steps added next start once its
// messages have completed. A fence after an empty round does nothing.
func (b *Builder) Fence() {
	if b.open == 0 {
		return
	}
	b.s.ends = append(b.s.ends, len(b.s.ops))
	b.open = 0
}

// Temp returns n bytes of scratch space for the schedule, aligned for any
// element type (8 bytes).
func (b *Builder) Temp(n int) []byte { return Alloc(n) }

// Alloc returns n zero bytes aligned for any element type (8 bytes); nil
// for n = 0.
func Alloc(n int) []byte {
	if n == 0 {
		return nil
	}
	return unsafeBytes(make([]uint64, (n+7)/8))[:n]
}

// Schedule ends the current round and returns the schedule; b is empty
// afterwards.
func (b *Builder) Schedule() *Schedule {
	b.Fence()
	s := b.s
	b.s = Schedule{}
	return &s
}

// Net posts a schedule's messages and reports their completion; i is the
// step's index in the schedule, so the caller can keep per-step state in a
// slice of the schedule's length.
type Net interface {
	// Post starts step i (a Send, Recv or Event).
	Post(i int, op *Op) error
	// Test reports whether step i (a send, receive or wait) has completed,
	// and its error. A receive of other than len(op.Buf) bytes is an error
	// the Net reports.
	Test(i int, op *Op) (done bool, err error)
	// Cancel abandons posted step i (a message or an event), which has not
	// completed, after a failure elsewhere in the schedule.
	Cancel(i int, op *Op)
}

// ErrUnfinished is the error of a Run abandoned before the end of its
// schedule (Abort).
var ErrUnfinished = errors.New("collective schedule abandoned")

// Run is one execution of a Schedule. The zero Run is finished; Reset
// starts one.
type Run struct {
	s       *Schedule
	round   int  // the current round
	started bool // the current round's steps have been started
	scan    int  // the current round's steps before scan have completed
	end     int  // index after the current round's last step
	err     error
}

// Reset prepares r to run s from its first round. Nothing starts until
// Progress.
func (r *Run) Reset(s *Schedule) {
	*r = Run{s: s}
	if len(s.ends) > 0 {
		r.end = s.ends[0]
	}
}

// Finished reports whether the run has ended, and its error.
func (r *Run) Finished() (bool, error) {
	return r.s == nil || r.round == len(r.s.ends), r.err
}

// Progress starts and completes as many rounds as it can without waiting:
// it tests the current round's messages in order, and once all have
// completed starts the next round. It returns whether the schedule has
// finished, and the first error, which ends the run (the round's other
// posted messages are cancelled).
func (r *Run) Progress(n Net) (finished bool, err error) {
	if done, err := r.Finished(); done {
		return true, err
	}
	ops := r.s.ops
	for {
		if !r.started {
			r.started = true
			lo := r.scan
			for i := lo; i < r.end; i++ {
				if err := r.start(n, i, &ops[i]); err != nil {
					r.fail(n, lo, i, err)
					return true, r.err
				}
			}
		}
		for ; r.scan < r.end; r.scan++ {
			op := &ops[r.scan]
			if !op.message() {
				continue
			}
			done, err := n.Test(r.scan, op)
			if err != nil {
				r.fail(n, r.scan+1, r.end, err)
				return true, r.err
			}
			if !done {
				return false, nil
			}
		}
		r.round++
		r.started = false
		if r.round == len(r.s.ends) {
			return true, nil
		}
		r.end = r.s.ends[r.round]
	}
}

// start starts step i of the current round.
func (r *Run) start(n Net, i int, op *Op) error {
	switch op.Kind {
	case SendOp, RecvOp, EventOp:
		return n.Post(i, op)
	case ReduceOp:
		op.Red.Fn(op.Buf, op.Dst)
	case CopyOp:
		memcopy.Copy(op.Dst, op.Buf)
	case CallOp:
		return op.Fn()
	}
	return nil
}

// fail ends the run with err, cancelling the posted messages among steps
// [lo, hi) of the current round that have not completed.
func (r *Run) fail(n Net, lo, hi int, err error) {
	ops := r.s.ops
	for i := lo; i < hi; i++ {
		op := &ops[i]
		if op.Kind != SendOp && op.Kind != RecvOp && op.Kind != EventOp {
			continue
		}
		if done, _ := n.Test(i, op); !done {
			n.Cancel(i, op)
		}
	}
	r.err = err
	r.round = len(r.s.ends)
}

// Abort ends an unfinished run with err (ErrUnfinished if nil), cancelling
// its posted messages that have not completed.
func (r *Run) Abort(n Net, err error) {
	if done, _ := r.Finished(); done {
		return
	}
	if err == nil {
		err = ErrUnfinished
	}
	hi := r.scan
	if r.started {
		hi = r.end
	}
	r.fail(n, r.scan, hi, err)
}
