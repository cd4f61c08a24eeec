package match

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

// Tests named after the MPI-4.1 rule or the ob1 behaviour they prove. R and M
// are strings so that failures read well.

type eng = Engine[string, string]
type matches = []Match[string, string]

func env(ctx uint32, src, tag int32, seq uint32) Envelope {
	return Envelope{Context: ctx, Source: src, Tag: tag, Seq: seq}
}

func spec(ctx uint32, src, tag int32) Spec { return Spec{Context: ctx, Source: src, Tag: tag} }

func arrive(t *testing.T, e *eng, en Envelope, m string) matches {
	t.Helper()
	out, err := e.Arrive(en, m, nil)
	require.NoError(t, err)
	return out
}

func postQueued(t *testing.T, e *eng, s Spec, r string) PostedHandle {
	t.Helper()
	_, _, h, ok := e.Post(s, r)
	require.False(t, ok, "receive %q should have been queued", r)
	require.True(t, h.Valid())
	return h
}

func postMatched(t *testing.T, e *eng, s Spec, r string) (string, Envelope) {
	t.Helper()
	m, en, h, ok := e.Post(s, r)
	require.True(t, ok, "receive %q should have matched", r)
	require.False(t, h.Valid())
	return m, en
}

func recvs(ms matches) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.Recv+"<-"+m.Msg)
	}
	return out
}

// MPI-4.1 §3.5 Order: "If a sender sends two messages in succession to the
// same destination, and both match the same receive, then this operation
// cannot receive the second message if the first one is still pending."
func TestNonOvertaking_MPI41_3_5(t *testing.T) {
	e := New[string, string]()
	require.Empty(t, arrive(t, e, env(0, 3, 7, 0), "first"))
	require.Empty(t, arrive(t, e, env(0, 3, 7, 1), "second"))
	for _, s := range []Spec{spec(0, 3, 7), spec(0, AnySource, 7), spec(0, 3, AnyTag), spec(0, AnySource, AnyTag)} {
		e := New[string, string]()
		arrive(t, e, env(0, 3, 7, 0), "first")
		arrive(t, e, env(0, 3, 7, 1), "second")
		m, en := postMatched(t, e, s, "r1")
		require.Equal(t, "first", m, "spec %+v", s)
		require.Equal(t, uint32(0), en.Seq)
		m, _ = postMatched(t, e, s, "r2")
		require.Equal(t, "second", m, "spec %+v", s)
	}
	// The same with the receives posted first.
	m, _ := postMatched(t, e, spec(0, AnySource, AnyTag), "r1")
	require.Equal(t, "first", m)
}

// MPI-4.1 §3.5 Order: "If a receiver posts two receives in succession, and
// both match the same message, the second receive operation cannot be
// satisfied by this message, if the first one is still pending."
func TestReceivesMatchInPostingOrder_MPI41_3_5(t *testing.T) {
	e := New[string, string]()
	postQueued(t, e, spec(0, 1, 5), "r1")
	postQueued(t, e, spec(0, 1, 5), "r2")
	require.Equal(t, []string{"r1<-a"}, recvs(arrive(t, e, env(0, 1, 5, 0), "a")))
	require.Equal(t, []string{"r2<-b"}, recvs(arrive(t, e, env(0, 1, 5, 1), "b")))
	require.Zero(t, e.Stats().Posted)
}

// A message takes the earliest-posted matching receive whatever its kind:
// ob1 compares req_sequence across wild_receives and specific_receives.
func TestWildcardKeepsPostingOrder(t *testing.T) {
	kinds := []Spec{spec(0, 2, 9), spec(0, AnySource, 9), spec(0, 2, AnyTag), spec(0, AnySource, AnyTag)}
	names := []string{"exact", "anysrc", "anytag", "anyany"}
	// Every rotation of the four kinds: each arrival must take them in
	// posting order.
	for rot := range kinds {
		e := New[string, string]()
		var want []string
		for i := range kinds {
			k := (rot + i) % len(kinds)
			postQueued(t, e, kinds[k], names[k])
			want = append(want, names[k]+"<-m")
		}
		// A receive for another tag and one for another source, posted
		// last, must not be disturbed.
		postQueued(t, e, spec(0, 2, 10), "othertag")
		postQueued(t, e, spec(0, 3, 9), "othersrc")
		var got []string
		for i := range kinds {
			got = append(got, recvs(arrive(t, e, env(0, 2, 9, uint32(i)), "m"))...)
		}
		require.Equal(t, want, got, "rotation %d", rot)
		require.Equal(t, 2, e.Stats().Posted)
	}
}

// A posted receive takes the earliest matchable message: across sources, the
// one that became matchable first.
func TestPostTakesEarliestAcrossSources(t *testing.T) {
	e := New[string, string]()
	arrive(t, e, env(0, 1, 4, 0), "s1t4")
	arrive(t, e, env(0, 0, 5, 0), "s0t5")
	arrive(t, e, env(0, 0, 4, 1), "s0t4")
	arrive(t, e, env(0, 1, 5, 1), "s1t5")

	m, _ := postMatched(t, e, spec(0, AnySource, 5), "r")
	require.Equal(t, "s0t5", m)
	m, _ = postMatched(t, e, spec(0, 0, AnyTag), "r")
	require.Equal(t, "s0t4", m)
	m, _ = postMatched(t, e, spec(0, AnySource, AnyTag), "r")
	require.Equal(t, "s1t4", m)
	m, _ = postMatched(t, e, spec(0, 1, 5), "r")
	require.Equal(t, "s1t5", m)
	require.Zero(t, e.Stats().Unexpected)
}

// Contexts separate communicators (and collective from point-to-point traffic
// on one communicator): nothing matches across them.
func TestContextsDoNotMatchEachOther(t *testing.T) {
	e := New[string, string]()
	postQueued(t, e, spec(1, AnySource, AnyTag), "c1")
	require.Empty(t, arrive(t, e, env(2, 0, 0, 0), "m"))
	_, _, ok := e.Probe(spec(1, AnySource, AnyTag))
	require.False(t, ok)
	require.Equal(t, []string{"c1<-n"}, recvs(arrive(t, e, env(1, 0, 0, 0), "n")))
}

// ob1: req_tag == tag || (req_tag == ANY_TAG && tag >= 0). Negative tags are
// internal and no AnyTag receive or probe may see them.
func TestAnyTagIgnoresNegativeTags(t *testing.T) {
	e := New[string, string]()
	postQueued(t, e, spec(0, 1, AnyTag), "anytag")
	postQueued(t, e, spec(0, AnySource, AnyTag), "anyany")
	require.Empty(t, arrive(t, e, env(0, 1, -5, 0), "internal"))
	for _, s := range []Spec{spec(0, 1, AnyTag), spec(0, AnySource, AnyTag)} {
		_, _, ok := e.Probe(s)
		require.False(t, ok, "%+v", s)
	}
	// Named exactly, with or without AnySource, the internal tag matches.
	m, en, ok := e.Probe(spec(0, AnySource, -5))
	require.True(t, ok)
	require.Equal(t, "internal", m)
	require.Equal(t, int32(-5), en.Tag)
	m, _ = postMatched(t, e, spec(0, 1, -5), "collective")
	require.Equal(t, "internal", m)
	// A posted internal receive is not taken by a user message either.
	postQueued(t, e, spec(0, 1, -5), "collective2")
	require.Equal(t, []string{"anytag<-user"}, recvs(arrive(t, e, env(0, 1, 0, 1), "user")))
	require.Equal(t, []string{"collective2<-internal2"}, recvs(arrive(t, e, env(0, 1, -5, 2), "internal2")))
}

// ob1 frags_cant_match: an arrival ahead of the expected sequence number waits
// for the gap; then the held ones match in sequence order.
func TestOutOfSequenceArrivalIsHeld(t *testing.T) {
	e := New[string, string]()
	postQueued(t, e, spec(0, 0, AnyTag), "r0")
	postQueued(t, e, spec(0, 0, AnyTag), "r1")
	require.Empty(t, arrive(t, e, env(0, 0, 1, 3), "m3"))
	require.Empty(t, arrive(t, e, env(0, 0, 1, 1), "m1"))
	require.Empty(t, arrive(t, e, env(0, 0, 1, 2), "m2"))
	st := e.Stats()
	require.Equal(t, 3, st.Held)
	require.Equal(t, 2, st.Posted)
	_, _, ok := e.Probe(spec(0, AnySource, AnyTag))
	require.False(t, ok, "held messages are not matchable")

	// Another source is not held up.
	postQueued(t, e, spec(0, 1, 1), "other")
	require.Equal(t, []string{"other<-o0"}, recvs(arrive(t, e, env(0, 1, 1, 0), "o0")))

	out := arrive(t, e, env(0, 0, 1, 0), "m0")
	require.Equal(t, []string{"r0<-m0", "r1<-m1"}, recvs(out))
	require.Equal(t, []uint32{0, 1}, []uint32{out[0].Env.Seq, out[1].Env.Seq})
	st = e.Stats()
	require.Equal(t, 0, st.Held)
	require.Equal(t, 2, st.Unexpected)
	m, _ := postMatched(t, e, spec(0, AnySource, 1), "r2")
	require.Equal(t, "m2", m)
	m, _ = postMatched(t, e, spec(0, AnySource, 1), "r3")
	require.Equal(t, "m3", m)
}

// Sequence numbers are uint32 and wrap: order must survive the wrap, in
// arrival and in holding.
func TestSequenceWrap(t *testing.T) {
	var ss sendSeq
	ss.next = map[uint64]uint32{4: math.MaxUint32 - 2} // context 0, destination 4
	var seqs []uint32
	for range 6 {
		seqs = append(seqs, ss.Next(0, 4))
	}
	require.Equal(t, []uint32{math.MaxUint32 - 2, math.MaxUint32 - 1, math.MaxUint32, 0, 1, 2}, seqs)

	e := New[string, string]()
	e.contextFor(0).peerFor(4).expect = math.MaxUint32 - 2
	names := []string{"a", "b", "c", "d", "e", "f"}
	// Arrive in the order 3 (=0), 5, 1, 4, 0, 2.
	for _, i := range []int{3, 5, 1, 4} {
		require.Empty(t, arrive(t, e, env(0, 4, 0, seqs[i]), names[i]))
	}
	require.Equal(t, 4, e.Stats().Held)
	require.Empty(t, arrive(t, e, env(0, 4, 0, seqs[0]), names[0]))
	require.Equal(t, 2, e.Stats().Unexpected, "seqs[0] drains seqs[1]")
	require.Equal(t, 3, e.Stats().Held)
	arrive(t, e, env(0, 4, 0, seqs[2]), names[2])
	require.Equal(t, 6, e.Stats().Unexpected)
	for i := range names {
		m, en := postMatched(t, e, spec(0, 4, AnyTag), "r")
		require.Equal(t, names[i], m)
		require.Equal(t, seqs[i], en.Seq)
	}
	// A number just behind the expected one, across the wrap, is a duplicate.
	_, err := e.Arrive(env(0, 4, 0, math.MaxUint32), "old", nil)
	require.ErrorIs(t, err, ErrDuplicateSequence)
}

func TestDuplicateSequenceIsRefused(t *testing.T) {
	e := New[string, string]()
	arrive(t, e, env(0, 0, 0, 0), "m0")
	arrive(t, e, env(0, 0, 0, 2), "m2")
	var out matches
	out, err := e.Arrive(env(0, 0, 0, 0), "again0", out)
	require.ErrorIs(t, err, ErrDuplicateSequence)
	require.ErrorContains(t, err, "source 0")
	require.Empty(t, out)
	_, err = e.Arrive(env(0, 0, 0, 2), "again2", nil)
	require.ErrorIs(t, err, ErrDuplicateSequence)
	st := e.Stats()
	require.Equal(t, 1, st.Unexpected)
	require.Equal(t, 1, st.Held)
}

func TestInvalidEnvelopeIsRefused(t *testing.T) {
	e := New[string, string]()
	for _, en := range []Envelope{env(0, -1, 0, 0), env(0, -9, 0, 0), env(0, 0, AnyTag, 0)} {
		out, err := e.Arrive(en, "bad", nil)
		require.ErrorIs(t, err, ErrInvalidEnvelope, "%+v", en)
		require.Empty(t, out)
		require.ErrorIs(t, en.Validate(), ErrInvalidEnvelope)
	}
	require.Equal(t, Stats{}, e.Stats())
	require.NoError(t, env(0, 0, -2, 0).Validate())
}

// MPI-4.1 §3.8.4: a receive that has not matched can be cancelled; "either the
// cancellation succeeds, or the communication succeeds, but not both".
func TestCancelUnmatchedReceive(t *testing.T) {
	e := New[string, string]()
	h := postQueued(t, e, spec(0, 0, 1), "r")
	r, ok := e.Cancel(h)
	require.True(t, ok)
	require.Equal(t, "r", r)
	_, ok = e.Cancel(h)
	require.False(t, ok, "cancelled twice")
	require.Empty(t, arrive(t, e, env(0, 0, 1, 0), "m"), "a cancelled receive does not match")
	require.Equal(t, 1, e.Stats().Unexpected)

	h2 := postQueued(t, e, spec(0, AnySource, 2), "r2")
	require.Len(t, arrive(t, e, env(0, 0, 2, 1), "m2"), 1)
	_, ok = e.Cancel(h2)
	require.False(t, ok, "a matched receive cannot be cancelled")

	// The slot of h2 is reused by the next post: h2 must stay stale.
	h3 := postQueued(t, e, spec(0, AnySource, 3), "r3")
	_, ok = e.Cancel(h2)
	require.False(t, ok)
	require.Equal(t, 1, e.Stats().Posted)
	r, ok = e.Cancel(h3)
	require.True(t, ok)
	require.Equal(t, "r3", r)

	_, ok = e.Cancel(PostedHandle{})
	require.False(t, ok)
	_, ok = e.Cancel(PostedHandle{slot: 1 << 30, gen: 1})
	require.False(t, ok)
	require.Zero(t, e.Stats().Posted)
}

// Cancelling one of several receives leaves the others in posting order.
func TestCancelKeepsOtherReceivesInOrder(t *testing.T) {
	e := New[string, string]()
	postQueued(t, e, spec(0, AnySource, AnyTag), "a")
	h := postQueued(t, e, spec(0, 0, 0), "b")
	postQueued(t, e, spec(0, 0, AnyTag), "c")
	_, ok := e.Cancel(h)
	require.True(t, ok)
	out, err := e.Arrive(env(0, 0, 0, 0), "m0", nil)
	require.NoError(t, err)
	out, err = e.Arrive(env(0, 0, 0, 1), "m1", out)
	require.NoError(t, err)
	require.Equal(t, []string{"a<-m0", "c<-m1"}, recvs(out))
}

// MPI-4.1 §3.8.1: MPI_Iprobe returns the message a receive would get without
// receiving it.
func TestProbeDoesNotRemove(t *testing.T) {
	e := New[string, string]()
	_, _, ok := e.Probe(spec(0, AnySource, AnyTag))
	require.False(t, ok)
	arrive(t, e, env(0, 2, 8, 0), "m0")
	arrive(t, e, env(0, 2, 8, 1), "m1")
	for range 3 {
		m, en, ok := e.Probe(spec(0, AnySource, AnyTag))
		require.True(t, ok)
		require.Equal(t, "m0", m)
		require.Equal(t, env(0, 2, 8, 0), en)
	}
	require.Equal(t, 2, e.Stats().Unexpected)
	m, _ := postMatched(t, e, spec(0, 2, 8), "r")
	require.Equal(t, "m0", m, "the receive gets the probed message")
}

// MPI-4.1 §3.8.2: MPI_Improbe removes the message from matching; no later
// receive or probe sees it.
func TestMprobeTakes(t *testing.T) {
	e := New[string, string]()
	arrive(t, e, env(0, 1, 3, 0), "m0")
	arrive(t, e, env(0, 1, 3, 1), "m1")
	m, en, ok := e.Take(spec(0, 1, AnyTag))
	require.True(t, ok)
	require.Equal(t, "m0", m)
	require.Equal(t, uint32(0), en.Seq)
	m, _, _ = e.Probe(spec(0, AnySource, 3))
	require.Equal(t, "m1", m)
	m, _ = postMatched(t, e, spec(0, 1, 3), "r")
	require.Equal(t, "m1", m)
	_, _, ok = e.Take(spec(0, 1, 3))
	require.False(t, ok)
	require.Equal(t, Stats{MatchAttempts: 3, Matches: 1}, e.Stats())
}

func TestDropContext(t *testing.T) {
	e := New[string, string]()
	arrive(t, e, env(5, 0, -2, 0), "u0")
	arrive(t, e, env(5, 1, -3, 0), "u1")
	arrive(t, e, env(5, 2, 1, 4), "held")
	postQueued(t, e, spec(5, 3, 1), "r1")
	h := postQueued(t, e, spec(5, AnySource, AnyTag), "r2")
	postQueued(t, e, spec(5, 3, AnyTag), "r3")
	postQueued(t, e, spec(5, AnySource, 9), "r4")
	// Another context must survive.
	arrive(t, e, env(6, 0, 1, 0), "keep")
	postQueued(t, e, spec(6, 1, 1), "keepr")

	msgs, rs := e.DropContext(5, nil, nil)
	require.ElementsMatch(t, []string{"u0", "u1", "held"}, msgNames(msgs))
	require.Equal(t, []string{"r1", "r2", "r3", "r4"}, rs, "receives come back in posting order")
	_, ok := e.Cancel(h)
	require.False(t, ok)
	require.Equal(t, 1, e.Stats().Unexpected)
	require.Equal(t, 1, e.Stats().Posted)
	require.Zero(t, e.Stats().Held)

	// Context 5 starts afresh: sequence 0 is expected again.
	require.Empty(t, arrive(t, e, env(5, 0, 1, 0), "new"))
	m, _ := postMatched(t, e, spec(6, 0, 1), "r")
	require.Equal(t, "keep", m)

	msgs, rs = e.DropContext(99, msgs[:0], rs[:0])
	require.Empty(t, msgs)
	require.Empty(t, rs)
}

func TestDropSource(t *testing.T) {
	e := New[string, string]()
	arrive(t, e, env(0, 7, -6, 0), "dead0")
	arrive(t, e, env(0, 7, -4, 1), "dead1")
	arrive(t, e, env(0, 7, 1, 3), "deadheld")
	arrive(t, e, env(0, 8, 1, 0), "alive")
	postQueued(t, e, spec(0, 7, 2), "exact")
	postQueued(t, e, spec(0, AnySource, 2), "wild")
	postQueued(t, e, spec(0, 7, AnyTag), "anytag")
	postQueued(t, e, spec(1, 7, 2), "othercontext")

	msgs, rs := e.DropSource(0, 7, nil, nil)
	require.Equal(t, []string{"dead0", "dead1", "deadheld"}, msgNames(msgs))
	require.Equal(t, []string{"exact", "anytag"}, rs)
	st := e.Stats()
	require.Equal(t, 1, st.Unexpected)
	require.Equal(t, 2, st.Posted)
	require.Zero(t, st.Held)

	_, err := e.Arrive(env(0, 7, 2, 2), "late", nil)
	require.ErrorIs(t, err, ErrSourceDropped)
	m, _ := postMatched(t, e, spec(0, AnySource, AnyTag), "r")
	require.Equal(t, "alive", m)

	// Dropping a source never heard from refuses its later messages too.
	msgs, rs = e.DropSource(0, 9, nil, nil)
	require.Empty(t, msgs)
	require.Empty(t, rs)
	_, err = e.Arrive(env(0, 9, 2, 0), "late", nil)
	require.ErrorIs(t, err, ErrSourceDropped)
}

func msgNames(ms []Message[string]) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.Msg)
	}
	return out
}

// No input makes the engine panic; a spec that can never match is queued
// harmlessly and can be cancelled.
func TestInvalidSpecIsHarmless(t *testing.T) {
	e := New[string, string]()
	bad := spec(0, -7, AnyTag)
	require.Error(t, bad.Validate())
	require.NoError(t, spec(0, AnySource, -3).Validate())
	h := postQueued(t, e, bad, "never")
	h2 := postQueued(t, e, spec(0, -7, 3), "never2")
	_, _, ok := e.Probe(bad)
	require.False(t, ok)
	_, _, ok = e.Take(spec(0, -7, 3))
	require.False(t, ok)
	_, err := e.Arrive(env(0, -7, 3, 0), "m", nil)
	require.Error(t, err)
	_, ok = e.Cancel(h)
	require.True(t, ok)
	_, ok = e.Cancel(h2)
	require.True(t, ok)
	e.DropSource(0, -7, nil, nil)
	e.DropContext(0, nil, nil)
	require.Equal(t, 0, e.Stats().Posted)
}

// Steady-state Post+Arrive must not allocate: nodes and buckets come from free
// lists, and the match slice is the caller's.
func TestSteadyStateAllocatesNothing(t *testing.T) {
	e := New[int, int]()
	out := make([]Match[int, int], 0, 4)
	var ss sendSeq
	// Queue some of everything so that lists are non-trivial.
	for i := range 64 {
		src := int32(i % 8)
		_, err := e.Arrive(Envelope{Source: src, Tag: int32(i), Seq: ss.Next(0, src)}, i, nil)
		require.NoError(t, err)
		e.Post(Spec{Source: int32(i % 8), Tag: int32(1000 + i)}, i)
	}
	var err error
	step := func() {
		// Exact receive posted first, then matched by an arrival.
		e.Post(Spec{Source: 3, Tag: 77}, 1)
		out, err = e.Arrive(Envelope{Source: 3, Tag: 77, Seq: ss.Next(0, 3)}, 2, out[:0])
		// Arrival first, out of sequence by one, then wildcard receives.
		s1, s2 := ss.Next(0, 5), ss.Next(0, 5)
		out, err = e.Arrive(Envelope{Source: 5, Tag: 78, Seq: s2}, 3, out[:0])
		out, err = e.Arrive(Envelope{Source: 5, Tag: 78, Seq: s1}, 4, out[:0])
		e.Post(Spec{Source: AnySource, Tag: 78}, 5)
		e.Post(Spec{Source: 5, Tag: 78}, 5)
		e.Post(Spec{Source: 5, Tag: AnyTag}, 6) // takes the head of source 5's old queue
		_, _, h, _ := e.Post(Spec{Source: AnySource, Tag: 79}, 7)
		e.Cancel(h)
		// Put back what the AnyTag receive took.
		e.Arrive(Envelope{Source: 5, Tag: 5, Seq: ss.Next(0, 5)}, 8, out[:0])
	}
	for range 100 {
		step()
	}
	require.NoError(t, err)
	allocs := testing.AllocsPerRun(1000, step)
	require.Zero(t, allocs)
}

// An (AnySource, tag) receive posted after messages with that tag queued from
// several sources, in a context that had no such receive before, takes them
// in the order they became matchable; Probe sees the same.
func TestAnySourceTagIndexedLate(t *testing.T) {
	e := New[int, int]()
	arrive := func(src int32, tag int32, seq uint32, m int) {
		out, err := e.Arrive(Envelope{Source: src, Tag: tag, Seq: seq}, m, nil)
		require.NoError(t, err)
		require.Empty(t, out)
	}
	arrive(2, 7, 0, 1)
	arrive(1, 5, 0, 2)
	arrive(1, 7, 1, 3)
	arrive(0, -3, 0, 4) // internal
	arrive(0, 7, 1, 5)
	require.False(t, e.ctxs[0].anySrcIndexed)
	require.Len(t, e.ctxs[0].tags, 5, "one bucket per (source, tag), none for AnySource yet")
	require.NoError(t, checkInvariants(e))

	m, env, ok := e.Probe(Spec{Source: AnySource, Tag: 7})
	require.True(t, ok)
	require.Equal(t, 1, m)
	require.Equal(t, int32(2), env.Source)
	require.True(t, e.ctxs[0].anySrcIndexed)
	require.NoError(t, checkInvariants(e))
	for _, want := range []int{1, 3, 5} {
		m, _, _, ok := e.Post(Spec{Source: AnySource, Tag: 7}, 0)
		require.True(t, ok)
		require.Equal(t, want, m)
		require.NoError(t, checkInvariants(e))
	}
	m, _, _, ok = e.Post(Spec{Source: AnySource, Tag: -3}, 0)
	require.True(t, ok)
	require.Equal(t, 4, m)
	// From now on arrivals are indexed as they come.
	arrive(1, 9, 2, 6)
	m, _, _, ok = e.Post(Spec{Source: AnySource, Tag: 9}, 0)
	require.True(t, ok)
	require.Equal(t, 6, m)
	require.NoError(t, checkInvariants(e))
	require.Equal(t, 1, e.Stats().Unexpected)
}

func TestPostedListsQueuedReceivesInPostingOrder(t *testing.T) {
	e := New[int, int]()
	specs := []Spec{{Context: 0, Source: 1, Tag: 5}, {Context: 0, Source: AnySource, Tag: 7},
		{Context: 2, Source: 3, Tag: AnyTag}, {Context: 0, Source: AnySource, Tag: AnyTag}, {Context: 0, Source: 1, Tag: 6}}
	var hs []PostedHandle
	for i, s := range specs {
		_, _, h, ok := e.Post(s, i)
		require.False(t, ok)
		hs = append(hs, h)
	}
	_, ok := e.Cancel(hs[1])
	require.True(t, ok)
	var got []int
	var gotSpecs []Spec
	e.Posted(func(s Spec, r int) bool { got = append(got, r); gotSpecs = append(gotSpecs, s); return true })
	require.Equal(t, []int{0, 2, 3, 4}, got)
	require.Equal(t, specs[2], gotSpecs[1])
	n := 0
	e.Posted(func(Spec, int) bool { n++; return false })
	require.Equal(t, 1, n, "stops when yield says so")
}
