package match

// Link slots of a queued message: a matchable unexpected message sits on four
// FIFO lists at once, one per way a receive can name it, so that every kind of
// receive finds its earliest candidate at a list head and a match unlinks the
// message from all four in O(1).
const (
	// byTag links the message into the (context, source, tag) bucket, the list
	// an exact receive reads. A held (out-of-sequence) message uses this slot
	// for its peer's held list instead, since it is on no other list.
	byTag = iota
	// bySource links it into its peer's (context, source) list, the list a
	// (source, AnyTag) receive reads; messages with a negative tag go on the
	// peer's internal list instead, which AnyTag never reads.
	bySource
	// byAnySourceTag links it into the (context, AnySource, tag) bucket, the
	// list an (AnySource, tag) receive reads.
	byAnySourceTag
	// byContext links it into the context's list, the list an (AnySource,
	// AnyTag) receive reads; negative tags go on the context's internal list.
	byContext
	nLinks
)

// msgNode is one message the engine keeps: a matchable unexpected message or a
// held out-of-sequence arrival. Nodes are recycled through Engine.freeMsgs.
type msgNode[R, M any] struct {
	env        Envelope
	msg        M
	next, prev [nLinks]*msgNode[R, M]
	in         [nLinks]*msgList[R, M] // nil where not linked
}

// msgList is an intrusive FIFO of messages threaded through one link slot.
type msgList[R, M any] struct {
	head, tail *msgNode[R, M]
	n          int
	// bucket is the tag bucket that owns this list, nil for peer and context
	// lists; a bucket whose lists are both empty is returned to the pool.
	bucket *tagBucket[R, M]
}

func (l *msgList[R, M]) pushBack(k int, x *msgNode[R, M]) {
	x.in[k] = l
	x.next[k] = nil
	x.prev[k] = l.tail
	if l.tail != nil {
		l.tail.next[k] = x
	} else {
		l.head = x
	}
	l.tail = x
	l.n++
}

// insertAfter links x after at, or at the head when at is nil.
func (l *msgList[R, M]) insertAfter(k int, x, at *msgNode[R, M]) {
	if at == nil {
		x.prev[k] = nil
		x.next[k] = l.head
		if l.head != nil {
			l.head.prev[k] = x
		} else {
			l.tail = x
		}
		l.head = x
	} else {
		x.prev[k] = at
		x.next[k] = at.next[k]
		if at.next[k] != nil {
			at.next[k].prev[k] = x
		} else {
			l.tail = x
		}
		at.next[k] = x
	}
	x.in[k] = l
	l.n++
}

func (l *msgList[R, M]) remove(k int, x *msgNode[R, M]) {
	if x.prev[k] != nil {
		x.prev[k].next[k] = x.next[k]
	} else {
		l.head = x.next[k]
	}
	if x.next[k] != nil {
		x.next[k].prev[k] = x.prev[k]
	} else {
		l.tail = x.prev[k]
	}
	x.next[k], x.prev[k], x.in[k] = nil, nil, nil
	l.n--
}

// recvNode is one posted receive. Its slot in Engine.slots is permanent; gen
// changes every time the node is freed, which makes old PostedHandles stale.
type recvNode[R, M any] struct {
	r          R
	spec       Spec
	pseq       uint64 // posting order across all four posted lists
	next, prev *recvNode[R, M]
	in         *recvList[R, M] // nil when free
	slot       uint32
	gen        uint64
}

// recvList is an intrusive FIFO of posted receives in posting order.
type recvList[R, M any] struct {
	head, tail *recvNode[R, M]
	n          int
	bucket     *tagBucket[R, M] // as in msgList
}

func (l *recvList[R, M]) pushBack(x *recvNode[R, M]) {
	x.in = l
	x.next = nil
	x.prev = l.tail
	if l.tail != nil {
		l.tail.next = x
	} else {
		l.head = x
	}
	l.tail = x
	l.n++
}

func (l *recvList[R, M]) remove(x *recvNode[R, M]) {
	if x.prev != nil {
		x.prev.next = x.next
	} else {
		l.head = x.next
	}
	if x.next != nil {
		x.next.prev = x.prev
	} else {
		l.tail = x.prev
	}
	x.next, x.prev, x.in = nil, nil, nil
	l.n--
}

// earlier returns whichever of a and b was posted first; either may be nil.
func earlier[R, M any](a, b *recvNode[R, M]) *recvNode[R, M] {
	if a == nil || (b != nil && b.pseq < a.pseq) {
		return b
	}
	return a
}
