package trace

import (
	"errors"
	"fmt"
)

// SentMessage is a message sent by the rank whose records were given to
// Messages.
type SentMessage struct {
	// Time is the time stamp (ns) of the Send or Isend record: the earliest
	// moment the message could leave.
	Time uint64
	// Receiver is the destination's rank in Comm.
	Receiver uint32
	// Comm is the communicator id; Tag the message tag.
	Comm, Tag uint32
	// Length is the size in bytes.
	Length uint64
	// Index is the position of the Send or Isend record in the input.
	Index int
}

// ReceivedMessage is a message received by the rank whose records were given
// to Messages.
type ReceivedMessage struct {
	// Time is the time stamp (ns) of the Recv or Irecv record: the latest
	// moment the message could arrive.
	Time uint64
	// Sender is the source's rank in Comm.
	Sender uint32
	// Comm is the communicator id; Tag the message tag (the actual ones of
	// the received message, never wildcards).
	Comm, Tag uint32
	// Length is the size in bytes of the received message.
	Length uint64
	// Index is the position of the Recv or Irecv record in the input.
	Index int
}

// The problems Messages reports, wrapped in a *RecordError.
var (
	// ErrUnknownRequest: an IsendComplete or an Irecv names a request id
	// that is not pending. The IsendComplete is ignored; the Irecv's message
	// is recorded like a blocking Recv.
	ErrUnknownRequest = errors.New("trace: completion of a request id that is not pending")
	// ErrDuplicateRequest: an Isend or IrecvRequest uses a request id that is
	// already pending. Both are kept; completions take the oldest first.
	ErrDuplicateRequest = errors.New("trace: request id already pending")
	// ErrAmbiguousRequest: a RequestCancelled names an id that is both a
	// pending Isend and a pending IrecvRequest; both are cancelled.
	ErrAmbiguousRequest = errors.New("trace: cancelled request id is both a pending Isend and a pending IrecvRequest")
	// ErrPendingRequest: an Isend or IrecvRequest is neither completed nor
	// cancelled at the end of the records. It produces no message; the
	// messages queued behind it are recorded at the end.
	ErrPendingRequest = errors.New("trace: request neither completed nor cancelled at the end of the records")
)

// RecordError is a problem with one record found by Messages.
type RecordError struct {
	Index  int    // position of the record in the input
	Record Record // the record
	Err    error  // one of the Err...Request sentinels
}

// Error implements error.
func (e *RecordError) Error() string {
	return fmt.Sprintf("record %d %v: %v", e.Index, e.Record, e.Err)
}

// Unwrap returns e.Err.
func (e *RecordError) Unwrap() error { return e.Err }

// pending is a started nonblocking request with the messages queued behind
// it, in a doubly linked list in start order.
type pending[M any] struct {
	req        uint64
	index      int
	msg        M // the Isend's message (unused for receives)
	blocked    []M
	prev, next *pending[M]
}

// pendingList is the queue of started, not yet completed requests of one
// kind, with a map from request id to the entries with that id (oldest first).
type pendingList[M any] struct {
	head, tail *pending[M]
	byID       map[uint64][]*pending[M]
}

func (l *pendingList[M]) empty() bool { return l.head == nil }

func (l *pendingList[M]) push(p *pending[M]) {
	if l.byID == nil {
		l.byID = map[uint64][]*pending[M]{}
	}
	p.prev = l.tail
	if l.tail != nil {
		l.tail.next = p
	} else {
		l.head = p
	}
	l.tail = p
	l.byID[p.req] = append(l.byID[p.req], p)
}

func (l *pendingList[M]) find(req uint64) *pending[M] {
	if ps := l.byID[req]; len(ps) > 0 {
		return ps[0]
	}
	return nil
}

// complete implements the completion rule for p. If p is the earliest
// pending request, its message (if record) and everything queued behind it are
// emitted in order; otherwise they are appended to the previous request's
// queue. p leaves the list.
func (l *pendingList[M]) complete(p *pending[M], msg M, record bool, emit func(M)) {
	if p.prev == nil {
		if record {
			emit(msg)
		}
		for _, m := range p.blocked {
			emit(m)
		}
	} else {
		if record {
			p.prev.blocked = append(p.prev.blocked, msg)
		}
		p.prev.blocked = append(p.prev.blocked, p.blocked...)
	}
	// unlink
	if p.prev != nil {
		p.prev.next = p.next
	} else {
		l.head = p.next
	}
	if p.next != nil {
		p.next.prev = p.prev
	} else {
		l.tail = p.prev
	}
	ps := l.byID[p.req]
	if len(ps) == 1 {
		delete(l.byID, p.req)
	} else {
		l.byID[p.req] = ps[1:]
	}
	p.prev, p.next, p.blocked = nil, nil, nil
}

// Messages turns the records of one rank, in the order they were recorded,
// into the ordered lists of messages it sent and received (the algorithm by
// which OTF2 readers process nonblocking MPI records; docs/tools.md):
//
//   - Send: recorded at once if no Isend is pending, else queued behind the
//     latest pending Isend.
//   - Isend: appended to the pending Isends with an empty queue.
//   - IsendComplete: if its Isend is the earliest pending one, the Isend's
//     message (with the Isend's time) and then its queue are recorded;
//     otherwise the message and its queue are appended to the previous
//     pending Isend's queue. The Isend leaves the pending list.
//   - Recv, IrecvRequest, Irecv: the same for receives; the message takes the
//     time and envelope of the Recv or Irecv record.
//   - RequestCancelled of a pending Isend or IrecvRequest: like a completion
//     without recording the cancelled message; of an unknown id: ignored.
//
// Sent messages are in send order (the order of their Send/Isend records);
// received messages are in completion order, which is the order the
// receiver's matching used. Sends and receives are independent.
//
// Messages never fails: err, if not nil, joins a *RecordError for every
// anomaly (an unknown or duplicate request id, a request pending at the end,
// see the Err...Request variables), and sent and received are the best
// result despite them. At the end of the records, messages still queued
// behind a pending request are recorded in queue order (they were
// completed, so they are kept).
func Messages(records []Record) (sent []SentMessage, received []ReceivedMessage, err error) {
	var (
		isends   pendingList[SentMessage]
		irecvs   pendingList[ReceivedMessage]
		problems []error
	)
	report := func(i int, e error) {
		problems = append(problems, &RecordError{Index: i, Record: records[i], Err: e})
	}
	emitSent := func(m SentMessage) { sent = append(sent, m) }
	emitRecv := func(m ReceivedMessage) { received = append(received, m) }
	isPending := func(req uint64) bool { return isends.find(req) != nil || irecvs.find(req) != nil }

	for i, r := range records {
		switch r.Kind {
		case KindSend:
			m := SentMessage{Time: r.Time, Receiver: r.Peer, Comm: r.Comm, Tag: r.Tag, Length: r.Length, Index: i}
			if isends.empty() {
				emitSent(m)
			} else {
				isends.tail.blocked = append(isends.tail.blocked, m)
			}
		case KindIsend:
			if isPending(r.Request) {
				report(i, ErrDuplicateRequest)
			}
			isends.push(&pending[SentMessage]{req: r.Request, index: i,
				msg: SentMessage{Time: r.Time, Receiver: r.Peer, Comm: r.Comm, Tag: r.Tag, Length: r.Length, Index: i}})
		case KindIsendComplete:
			p := isends.find(r.Request)
			if p == nil {
				report(i, ErrUnknownRequest)
				continue
			}
			isends.complete(p, p.msg, true, emitSent)
		case KindRecv:
			m := ReceivedMessage{Time: r.Time, Sender: r.Peer, Comm: r.Comm, Tag: r.Tag, Length: r.Length, Index: i}
			if irecvs.empty() {
				emitRecv(m)
			} else {
				irecvs.tail.blocked = append(irecvs.tail.blocked, m)
			}
		case KindIrecvRequest:
			if isPending(r.Request) {
				report(i, ErrDuplicateRequest)
			}
			irecvs.push(&pending[ReceivedMessage]{req: r.Request, index: i})
		case KindIrecv:
			m := ReceivedMessage{Time: r.Time, Sender: r.Peer, Comm: r.Comm, Tag: r.Tag, Length: r.Length, Index: i}
			p := irecvs.find(r.Request)
			if p == nil {
				report(i, ErrUnknownRequest)
				// The message was received: keep it, as a blocking Recv.
				if irecvs.empty() {
					emitRecv(m)
				} else {
					irecvs.tail.blocked = append(irecvs.tail.blocked, m)
				}
				continue
			}
			irecvs.complete(p, m, true, emitRecv)
		case KindRequestCancelled:
			ps, pr := isends.find(r.Request), irecvs.find(r.Request)
			if ps != nil && pr != nil {
				report(i, ErrAmbiguousRequest)
			}
			if ps != nil {
				isends.complete(ps, ps.msg, false, emitSent)
			}
			if pr != nil {
				irecvs.complete(pr, ReceivedMessage{}, false, emitRecv)
			}
		}
	}
	// Requests never completed: report them and keep what was queued behind.
	for p := isends.head; p != nil; p = p.next {
		report(p.index, ErrPendingRequest)
		sent = append(sent, p.blocked...)
	}
	for p := irecvs.head; p != nil; p = p.next {
		report(p.index, ErrPendingRequest)
		received = append(received, p.blocked...)
	}
	return sent, received, joinCapped(problems)
}

// maxProblems caps the number of problems joined into one error.
const maxProblems = 100

// joinCapped joins at most maxProblems errors and says how many were left
// out.
func joinCapped(errs []error) error {
	if len(errs) > maxProblems {
		n := len(errs) - maxProblems
		errs = append(errs[:maxProblems:maxProblems], fmt.Errorf("trace: %d more problems not shown", n))
	}
	return errors.Join(errs...)
}
