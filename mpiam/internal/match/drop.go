package match

import (
	"cmp"
	"slices"
)

// DropContext removes every receive and message of context ctx, for when its
// communicator is freed. It appends the queued unexpected and held messages to
// msgs, for the caller to release their buffers, and the queued receives to
// recvs in posting order, for the caller to complete with an error. Handles of
// the dropped receives become stale. A later Post or Arrive on ctx starts
// afresh, expecting sequence number 0 from every source.
//
// It costs O(items removed + sources and tags of ctx); it is meant for
// communicator destruction, not hot paths.
func (e *Engine[R, M]) DropContext(ctx uint32, msgs []Message[M], recvs []R) ([]Message[M], []R) {
	c := e.ctxs[ctx]
	if c == nil {
		return msgs, recvs
	}
	// Every matchable message of ctx is on one of the two context lists.
	msgs = e.dropMsgs(&c.msgs, msgs)
	msgs = e.dropMsgs(&c.internal, msgs)
	e.scratch = appendRecvs(e.scratch[:0], &c.recvs)
	for _, p := range c.peers {
		msgs = e.dropHeld(p, msgs)
		e.scratch = appendRecvs(e.scratch, &p.recvs)
	}
	for _, b := range c.tags {
		e.scratch = appendRecvs(e.scratch, &b.recvs)
	}
	recvs = e.dropRecvs(recvs)
	for _, b := range c.tags { // all empty now
		e.freeBucket(b)
	}
	delete(e.ctxs, ctx)
	if e.last == c {
		e.last = nil
	}
	return msgs, recvs
}

// DropSource removes what source src left in context ctx, for when that
// process has failed. It appends to msgs its matchable unexpected messages (in
// sequence order; negative tags after the others) and its held ones, for the
// caller to release their buffers, and appends to recvs, in posting order, the
// receives posted for src by name (exact or with AnyTag), for the caller to
// complete with an error (as ULFM's MPI_ERR_PROC_FAILED). AnySource receives
// stay posted. From then on Arrive refuses messages from (ctx, src) with
// ErrSourceDropped, until DropContext(ctx); a receive posted for src later is
// queued as usual, so the caller should refuse it first.
//
// It costs O(items removed + tags in use in ctx).
func (e *Engine[R, M]) DropSource(ctx uint32, src int32, msgs []Message[M], recvs []R) ([]Message[M], []R) {
	c := e.contextFor(ctx)
	p := c.peerFor(src)
	msgs = e.dropMsgs(&p.msgs, msgs)
	msgs = e.dropMsgs(&p.internal, msgs)
	msgs = e.dropHeld(p, msgs)
	e.scratch = appendRecvs(e.scratch[:0], &p.recvs)
	for k, b := range c.tags {
		if int32(k>>32) == src {
			e.scratch = appendRecvs(e.scratch, &b.recvs)
		}
	}
	recvs = e.dropRecvs(recvs)
	p.dropped = true
	return msgs, recvs
}

// dropMsgs removes every matchable message on l, appending it to msgs.
func (e *Engine[R, M]) dropMsgs(l *msgList[R, M], msgs []Message[M]) []Message[M] {
	for x := l.head; x != nil; x = l.head {
		msgs = append(msgs, Message[M]{Msg: x.msg, Env: x.env})
		e.removeMsg(x)
	}
	return msgs
}

// dropHeld removes every held message of p, appending it to msgs.
func (e *Engine[R, M]) dropHeld(p *peer[R, M], msgs []Message[M]) []Message[M] {
	for x := p.held.head; x != nil; x = p.held.head {
		msgs = append(msgs, Message[M]{Msg: x.msg, Env: x.env})
		p.held.remove(byTag, x)
		e.nHeld--
		e.freeMsg(x)
	}
	return msgs
}

func appendRecvs[R, M any](dst []*recvNode[R, M], l *recvList[R, M]) []*recvNode[R, M] {
	for x := l.head; x != nil; x = x.next {
		dst = append(dst, x)
	}
	return dst
}

// dropRecvs removes the receives gathered in e.scratch, appending them to
// recvs in posting order.
func (e *Engine[R, M]) dropRecvs(recvs []R) []R {
	slices.SortFunc(e.scratch, func(a, b *recvNode[R, M]) int { return cmp.Compare(a.pseq, b.pseq) })
	for i, x := range e.scratch {
		recvs = append(recvs, x.r)
		e.removeRecv(x)
		e.scratch[i] = nil
	}
	e.scratch = e.scratch[:0]
	return recvs
}

// Posted calls yield for every queued receive, in posting order, until yield
// returns false: for diagnostics (what a hung rank waits for). It costs
// O(receives ever allocated); it is not for hot paths.
func (e *Engine[R, M]) Posted(yield func(s Spec, r R) bool) {
	nodes := make([]*recvNode[R, M], 0, e.nPosted)
	for _, x := range e.slots {
		if x.in != nil {
			nodes = append(nodes, x)
		}
	}
	slices.SortFunc(nodes, func(a, b *recvNode[R, M]) int { return cmp.Compare(a.pseq, b.pseq) })
	for _, x := range nodes {
		if !yield(x.spec, x.r) {
			return
		}
	}
}
