package match

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// checkInvariants walks every structure of e and returns the first
// inconsistency it finds.
func checkInvariants[R, M any](e *Engine[R, M]) error {
	nPosted, nUnexp, nHeld, nIdle := 0, 0, 0, 0
	checkRecvs := func(l *recvList[R, M], what string, ok func(Spec) bool) error {
		n := 0
		var last *recvNode[R, M]
		for x := l.head; x != nil; x = x.next {
			if x.in != l || x.prev != last || !ok(x.spec) {
				return fmt.Errorf("%s: receive %+v misplaced", what, x.spec)
			}
			if last != nil && last.pseq >= x.pseq {
				return fmt.Errorf("%s: receives out of posting order", what)
			}
			if e.slots[x.slot] != x {
				return fmt.Errorf("%s: slot %d does not name its node", what, x.slot)
			}
			last = x
			n++
		}
		if l.tail != last || l.n != n {
			return fmt.Errorf("%s: tail or count wrong (%d, counted %d)", what, l.n, n)
		}
		nPosted += n
		return nil
	}
	checkMsgs := func(l *msgList[R, M], k int, what string, ok func(Envelope) bool) error {
		n := 0
		var last *msgNode[R, M]
		for x := l.head; x != nil; x = x.next[k] {
			if x.in[k] != l || x.prev[k] != last || !ok(x.env) {
				return fmt.Errorf("%s: message %+v misplaced", what, x.env)
			}
			last = x
			n++
		}
		if l.tail != last || l.n != n {
			return fmt.Errorf("%s: tail or count wrong (%d, counted %d)", what, l.n, n)
		}
		return nil
	}
	for id, c := range e.ctxs {
		if err := checkRecvs(&c.recvs, "context recvs", func(s Spec) bool {
			return s.Context == id && s.Source == AnySource && s.Tag == AnyTag
		}); err != nil {
			return err
		}
		if err := checkMsgs(&c.msgs, byContext, "context msgs", func(en Envelope) bool { return en.Context == id && en.Tag >= 0 }); err != nil {
			return err
		}
		if err := checkMsgs(&c.internal, byContext, "context internal", func(en Envelope) bool { return en.Context == id && en.Tag < 0 }); err != nil {
			return err
		}
		nUnexp += c.msgs.n + c.internal.n
		for src, p := range c.peers {
			if p.ctx != c {
				return fmt.Errorf("peer %d of context %d points elsewhere", src, id)
			}
			if err := checkRecvs(&p.recvs, "peer recvs", func(s Spec) bool {
				return s.Context == id && s.Source == src && s.Tag == AnyTag
			}); err != nil {
				return err
			}
			if err := checkMsgs(&p.msgs, bySource, "peer msgs", func(en Envelope) bool { return en.Source == src && en.Tag >= 0 }); err != nil {
				return err
			}
			if err := checkMsgs(&p.internal, bySource, "peer internal", func(en Envelope) bool { return en.Source == src && en.Tag < 0 }); err != nil {
				return err
			}
			prev := p.expect
			if err := checkMsgs(&p.held, byTag, "held", func(en Envelope) bool {
				ok := en.Context == id && en.Source == src && int32(en.Seq-prev) > 0
				prev = en.Seq
				return ok
			}); err != nil {
				return err
			}
			nHeld += p.held.n
		}
		for src, p := range c.byRank {
			if p != nil && c.peers[int32(src)] != p {
				return fmt.Errorf("byRank[%d] of context %d is not its peer", src, id)
			}
		}
		if c.lastOK && c.tags[c.lastK] != c.lastB {
			return fmt.Errorf("context %d caches bucket %p for key %#x, its map has %p", id, c.lastB, c.lastK, c.tags[c.lastK])
		}
		if b := c.lastB; b != nil && (b.ctx != c || b.key != c.lastK) {
			return fmt.Errorf("context %d caches bucket %#x, which is not its", id, b.key)
		}
		anySrcTag, anySrcMsgs := 0, 0
		for k, b := range c.tags {
			src, tag := int32(k>>32), int32(k)
			if src == AnySource {
				anySrcTag += b.recvs.n
				anySrcMsgs += b.msgs.n
				if !c.anySrcIndexed {
					return fmt.Errorf("context %d has bucket (AnySource, %d) before its first (AnySource, tag) receive", id, tag)
				}
			}
			if b.ctx != c || b.key != k {
				return fmt.Errorf("bucket (%d,%d) of context %d mislabelled", src, tag, id)
			}
			if b.idle != (b.recvs.n == 0 && b.msgs.n == 0) {
				return fmt.Errorf("bucket (%d,%d): idle %v with %d recvs %d msgs", src, tag, b.idle, b.recvs.n, b.msgs.n)
			}
			if b.idle {
				nIdle++
			}
			if err := checkRecvs(&b.recvs, "bucket recvs", func(s Spec) bool {
				return s.Context == id && s.Source == src && s.Tag == tag
			}); err != nil {
				return err
			}
			slot := byTag
			if src == AnySource {
				slot = byAnySourceTag
			}
			if err := checkMsgs(&b.msgs, slot, "bucket msgs", func(en Envelope) bool {
				return (src == AnySource || en.Source == src) && en.Tag == tag
			}); err != nil {
				return err
			}
		}
		if c.anySrcIndexed && anySrcMsgs != c.msgs.n+c.internal.n {
			return fmt.Errorf("context %d: %d messages in (AnySource, tag) buckets, %d matchable", id, anySrcMsgs, c.msgs.n+c.internal.n)
		}
		if c.anySrcTag != anySrcTag {
			return fmt.Errorf("context %d counts %d (AnySource, tag) receives, holds %d", id, c.anySrcTag, anySrcTag)
		}
	}
	if e.last != nil && e.ctxs[e.lastID] != e.last {
		return fmt.Errorf("cached context %d is stale", e.lastID)
	}
	st := e.Stats()
	if st.Posted != nPosted || st.Unexpected != nUnexp || st.Held != nHeld || e.nIdle != nIdle {
		return fmt.Errorf("counters %+v idle %d, counted posted %d unexpected %d held %d idle %d",
			st, e.nIdle, nPosted, nUnexp, nHeld, nIdle)
	}
	if nIdle > e.maxIdle {
		return fmt.Errorf("%d idle buckets", nIdle)
	}
	return nil
}

// Tags used once, like iteration numbers, must not grow the bucket maps
// beyond the items queued plus maxIdleBuckets.
func TestTagsUsedOnceDoNotPileUp(t *testing.T) {
	e := New[int, int]()
	for i := range 10 * maxIdleBuckets {
		tag := int32(i)
		e.Post(Spec{Source: 0, Tag: tag}, i)
		_, err := e.Arrive(Envelope{Source: 0, Tag: tag, Seq: uint32(i)}, i, nil)
		require.NoError(t, err)
		_, err = e.Arrive(Envelope{Source: 1, Tag: tag, Seq: uint32(i)}, i, nil)
		require.NoError(t, err)
		e.Post(Spec{Source: AnySource, Tag: tag}, i)
		require.NoError(t, checkInvariants(e))
	}
	require.LessOrEqual(t, len(e.ctxs[0].tags), maxIdleBuckets)
	require.Equal(t, maxIdleBuckets, e.nIdle)
	e.DropContext(0, nil, nil)
	require.Zero(t, e.nIdle)
	require.Nil(t, e.idleHead)
}
