package match

import (
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var modelSeed = flag.Uint64("match.seed", 0, "seed for TestEngineAgainstReferenceModel (0: fixed seeds plus one from the clock)")

// refMatcher is the obvious matcher, written from MPI-4.1 §3.5 with linear
// scans and nothing clever: the engine must make exactly its choices.
type refMatcher struct {
	posted  []refRecv // in posting order
	unexp   []refMsg  // in the order messages became matchable
	held    map[peerKey]map[uint32]refMsg
	expect  map[peerKey]uint32
	dropped map[peerKey]bool
}

type refRecv struct {
	s  Spec
	id int
}

type peerKey struct {
	ctx uint32
	src int32
}

type refMsg struct {
	env Envelope
	id  int
}

type refMatch struct{ recv, msg int }

func newRef() *refMatcher {
	return &refMatcher{
		held:    map[peerKey]map[uint32]refMsg{},
		expect:  map[peerKey]uint32{},
		dropped: map[peerKey]bool{},
	}
}

func (r *refMatcher) nHeld() int {
	n := 0
	for _, h := range r.held {
		n += len(h)
	}
	return n
}

func (r *refMatcher) firstMsg(s Spec) int {
	return slices.IndexFunc(r.unexp, func(m refMsg) bool { return s.matches(m.env) })
}

func (r *refMatcher) post(s Spec, id int) (refMsg, bool) {
	if i := r.firstMsg(s); i >= 0 {
		m := r.unexp[i]
		r.unexp = slices.Delete(r.unexp, i, i+1)
		return m, true
	}
	r.posted = append(r.posted, refRecv{s, id})
	return refMsg{}, false
}

// arrive returns the matches made, or a non-nil error kind.
func (r *refMatcher) arrive(env Envelope, id int) ([]refMatch, error) {
	if env.Source < 0 || env.Tag == AnyTag {
		return nil, ErrInvalidEnvelope
	}
	k := peerKey{env.Context, env.Source}
	if r.dropped[k] {
		return nil, ErrSourceDropped
	}
	exp := r.expect[k]
	d := int32(env.Seq - exp)
	if d < 0 {
		return nil, ErrDuplicateSequence
	}
	if d > 0 {
		if _, dup := r.held[k][env.Seq]; dup {
			return nil, ErrDuplicateSequence
		}
		if r.held[k] == nil {
			r.held[k] = map[uint32]refMsg{}
		}
		r.held[k][env.Seq] = refMsg{env, id}
		return nil, nil
	}
	var out []refMatch
	m := refMsg{env, id}
	for {
		out = r.deliver(m, out)
		exp++
		next, ok := r.held[k][exp]
		if !ok {
			break
		}
		delete(r.held[k], exp)
		m = next
	}
	r.expect[k] = exp
	return out, nil
}

func (r *refMatcher) deliver(m refMsg, out []refMatch) []refMatch {
	i := slices.IndexFunc(r.posted, func(p refRecv) bool { return p.s.matches(m.env) })
	if i < 0 {
		r.unexp = append(r.unexp, m)
		return out
	}
	out = append(out, refMatch{r.posted[i].id, m.id})
	r.posted = slices.Delete(r.posted, i, i+1)
	return out
}

func (r *refMatcher) cancel(id int) bool {
	i := slices.IndexFunc(r.posted, func(p refRecv) bool { return p.id == id })
	if i < 0 {
		return false
	}
	r.posted = slices.Delete(r.posted, i, i+1)
	return true
}

func (r *refMatcher) probe(s Spec, take bool) (refMsg, bool) {
	i := r.firstMsg(s)
	if i < 0 {
		return refMsg{}, false
	}
	m := r.unexp[i]
	if take {
		r.unexp = slices.Delete(r.unexp, i, i+1)
	}
	return m, true
}

// drop removes everything the predicates select; it returns the message ids
// (sorted: their order is not specified) and the receive ids in posting order.
func (r *refMatcher) drop(msg func(Envelope) bool, recv func(Spec) bool, peer func(peerKey) bool) (msgs, recvs []int) {
	r.unexp = slices.DeleteFunc(r.unexp, func(m refMsg) bool {
		if msg(m.env) {
			msgs = append(msgs, m.id)
			return true
		}
		return false
	})
	for k, h := range r.held {
		if peer(k) {
			for _, m := range h {
				msgs = append(msgs, m.id)
			}
			delete(r.held, k)
		}
	}
	r.posted = slices.DeleteFunc(r.posted, func(p refRecv) bool {
		if recv(p.s) {
			recvs = append(recvs, p.id)
			return true
		}
		return false
	})
	slices.Sort(msgs)
	return msgs, recvs
}

// TestEngineAgainstReferenceModel drives the engine and refMatcher with the
// same 10^5 random operations per seed (posts with random wildcards, arrivals
// reordered within a bounded window, duplicates, cancels of live and stale
// handles, probes, matched probes, dropped sources and contexts) and requires
// identical results after every one. Sequence numbers start near 2^32 so that
// they wrap during the run. Reproduce a failure with -match.seed=N.
func TestEngineAgainstReferenceModel(t *testing.T) {
	seeds := []uint64{1, 2, uint64(time.Now().UnixNano())}
	if raceEnabled {
		seeds = seeds[:1] // still 10^5 operations
	}
	if *modelSeed != 0 {
		seeds = []uint64{*modelSeed}
	}
	ops := 100_000
	if testing.Short() {
		ops = 20_000
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			runModel(t, seed, ops)
		})
	}
}

func runModel(t *testing.T, seed uint64, ops int) {
	const (
		nCtx    = 2
		nSrc    = 4
		window  = 8 // arrivals are reordered within this many messages in flight
		seqBase = math.MaxUint32 - 3000
	)
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	e := New[int, int]()
	e.maxIdle = 8 // so that idle buckets are evicted often
	ref := newRef()
	sendSeq := map[peerKey]uint32{}
	startPeer := func(k peerKey) {
		sendSeq[k] = seqBase
		ref.expect[k] = seqBase
		e.contextFor(k.ctx).peerFor(k.src).expect = seqBase
	}
	for c := range uint32(nCtx) {
		for s := range int32(nSrc) {
			startPeer(peerKey{c, s})
		}
	}
	var inflight []Envelope
	var delivered []Envelope // recent, for duplicates
	var last Envelope        // the latest delivered
	handles := map[int]PostedHandle{}
	var handleIDs []int // every receive id posted, live or not, recent ones
	nextID := 1
	var out []Match[int, int]

	op := 0
	fail := func(format string, args ...any) string {
		return fmt.Sprintf("seed %d op %d: ", seed, op) + fmt.Sprintf(format, args...)
	}
	randTag := func(wild bool) int32 {
		switch x := rng.IntN(10); {
		case x == 0:
			return -3 // internal
		case x < 3 && wild:
			return AnyTag
		case x == 3 && rng.IntN(4) == 0:
			return int32(4 + rng.IntN(1000)) // rarely reused: buckets go idle and are evicted
		default:
			return int32(rng.IntN(4))
		}
	}
	randSpec := func() Spec {
		s := Spec{Context: uint32(rng.IntN(nCtx)), Source: int32(rng.IntN(nSrc)), Tag: randTag(true)}
		// Context 1 sees no (AnySource, tag) receive or probe in the first
		// half, so that its (AnySource, tag) buckets are built late, over a
		// queue of unexpected messages (indexAnySource).
		if rng.IntN(3) == 0 && (s.Context == 0 || s.Tag == AnyTag || op >= ops/2) {
			s.Source = AnySource
		}
		return s
	}
	check := func() {
		st := e.Stats()
		require.Equal(t, len(ref.posted), st.Posted, fail("posted count"))
		require.Equal(t, len(ref.unexp), st.Unexpected, fail("unexpected count"))
		require.Equal(t, ref.nHeld(), st.Held, fail("held count"))
	}

	for op = 0; op < ops; op++ {
		switch x := rng.IntN(1000); {
		case x < 300: // a send is initiated: it takes its sequence number now
			k := peerKey{uint32(rng.IntN(nCtx)), int32(rng.IntN(nSrc))}
			tag := randTag(false)
			inflight = append(inflight, Envelope{Context: k.ctx, Source: k.src, Tag: tag, Seq: sendSeq[k]})
			sendSeq[k]++
		case x < 600: // one of the first few messages in flight arrives
			if len(inflight) == 0 {
				continue
			}
			i := rng.IntN(min(window, len(inflight)))
			en := inflight[i]
			inflight = slices.Delete(inflight, i, i+1)
			id := nextID
			nextID++
			want, wantErr := ref.arrive(en, id)
			var err error
			if r, ok := e.ArrivePosted(en); ok {
				// The fast path took it: it must be what Arrive would do.
				out = append(out[:0], Match[int, int]{Recv: r, Msg: id, Env: en})
			} else {
				out, err = e.Arrive(en, id, out[:0])
			}
			require.ErrorIs(t, err, wantErr, fail("arrive %+v", en))
			if wantErr == nil {
				require.NoError(t, err, fail("arrive %+v", en))
			}
			got := []refMatch(nil)
			for _, m := range out {
				got = append(got, refMatch{m.Recv, m.Msg})
			}
			require.Equal(t, want, got, fail("matches of arrival %+v", en))
			if err == nil {
				last = en
				if len(delivered) < 32 {
					delivered = append(delivered, en)
				} else {
					delivered[rng.IntN(32)] = en
				}
			}
		case x < 610: // the transport delivers a message twice
			if len(delivered) == 0 {
				continue
			}
			en := delivered[rng.IntN(len(delivered))]
			if rng.IntN(2) == 0 {
				en = last // likely still held if it was held
			}
			_, wantErr := ref.arrive(en, -1)
			out, err := e.Arrive(en, -1, out[:0])
			require.Empty(t, out, fail("duplicate %+v", en))
			require.ErrorIs(t, err, wantErr, fail("duplicate %+v", en))
			if wantErr == nil {
				require.NoError(t, err, fail("duplicate %+v", en))
			}
		case x < 850: // a receive is posted
			s := randSpec()
			id := nextID
			nextID++
			wantMsg, wantOK := ref.post(s, id)
			m, en, h, ok := e.Post(s, id)
			require.Equal(t, wantOK, ok, fail("post %+v", s))
			if ok {
				require.Equal(t, wantMsg.id, m, fail("post %+v", s))
				require.Equal(t, wantMsg.env, en, fail("post %+v", s))
			} else {
				handles[id] = h
				handleIDs = append(handleIDs, id)
				if len(handleIDs) > 64 {
					delete(handles, handleIDs[0])
					handleIDs = handleIDs[1:]
				}
			}
		case x < 900: // a receive is cancelled, matched or not
			if len(handleIDs) == 0 {
				continue
			}
			id := handleIDs[rng.IntN(len(handleIDs))]
			wantOK := ref.cancel(id)
			r, ok := e.Cancel(handles[id])
			require.Equal(t, wantOK, ok, fail("cancel %d", id))
			if ok {
				require.Equal(t, id, r, fail("cancel %d", id))
			}
		case x < 990: // Iprobe or Improbe
			s := randSpec()
			take := rng.IntN(2) == 0
			want, wantOK := ref.probe(s, take)
			var m int
			var en Envelope
			var ok bool
			if take {
				m, en, ok = e.Take(s)
			} else {
				m, en, ok = e.Probe(s)
			}
			require.Equal(t, wantOK, ok, fail("probe %+v take %v", s, take))
			if ok {
				require.Equal(t, want.id, m, fail("probe %+v take %v", s, take))
				require.Equal(t, want.env, en, fail("probe %+v take %v", s, take))
			}
		case x < 996: // a source fails
			if rng.IntN(8) != 0 {
				continue
			}
			k := peerKey{uint32(rng.IntN(nCtx)), int32(rng.IntN(nSrc))}
			wantMsgs, wantRecvs := ref.drop(
				func(en Envelope) bool { return en.Context == k.ctx && en.Source == k.src },
				func(s Spec) bool { return s.Context == k.ctx && s.Source == k.src },
				func(p peerKey) bool { return p == k })
			ref.dropped[k] = true
			msgs, recvs := e.DropSource(k.ctx, k.src, nil, nil)
			requireDropped(t, wantMsgs, wantRecvs, msgs, recvs, fail("drop source %+v", k))
		default: // a communicator is freed and its context reused from scratch
			if rng.IntN(8) != 0 {
				continue // rarer than the rest: let queues and idle buckets build up
			}
			c := uint32(rng.IntN(nCtx))
			wantMsgs, wantRecvs := ref.drop(
				func(en Envelope) bool { return en.Context == c },
				func(s Spec) bool { return s.Context == c },
				func(p peerKey) bool { return p.ctx == c })
			msgs, recvs := e.DropContext(c, nil, nil)
			requireDropped(t, wantMsgs, wantRecvs, msgs, recvs, fail("drop context %d", c))
			inflight = slices.DeleteFunc(inflight, func(en Envelope) bool { return en.Context == c })
			delivered = slices.DeleteFunc(delivered, func(en Envelope) bool { return en.Context == c })
			if last.Context == c {
				delivered = delivered[:0] // last is gone too; wait for a new one
			}
			for s := range int32(nSrc) {
				k := peerKey{c, s}
				delete(ref.dropped, k)
				delete(ref.expect, k)
				startPeer(k)
			}
		}
		check()
		if op%97 == 0 {
			require.NoError(t, checkInvariants(e), fail("invariants"))
		}
	}
	require.NoError(t, checkInvariants(e), fail("invariants"))
	st := e.Stats()
	t.Logf("seed %d: %d ops, final posted %d unexpected %d held %d, %d match attempts, %d matches",
		seed, ops, st.Posted, st.Unexpected, st.Held, st.MatchAttempts, st.Matches)
}

func requireDropped(t *testing.T, wantMsgs, wantRecvs []int, msgs []Message[int], recvs []int, msg string) {
	t.Helper()
	var got []int
	for _, m := range msgs {
		got = append(got, m.Msg)
	}
	slices.Sort(got)
	require.Equal(t, wantMsgs, got, msg)
	require.Equal(t, wantRecvs, recvs, msg)
}
