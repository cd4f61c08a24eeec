package flowctl

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

var testParams = Params{BufferBytes: 4 << 10, ReplyReserve: 64, ExtLen: 8, MinReply: 40}

func TestParamsCheckAndReservation(t *testing.T) {
	require.NoError(t, testParams.Check())
	for _, p := range []Params{
		{BufferBytes: 1000, ReplyReserve: 64, MinReply: 40},
		{BufferBytes: 0, ReplyReserve: 64},
		{BufferBytes: 4096, ReplyReserve: 32, MinReply: 40},
		{BufferBytes: 4096, ReplyReserve: 4096, MinReply: 40},
	} {
		require.ErrorIs(t, p.Check(), ErrBadSize, "%+v", p)
		_, err := NewLedger(p, 2)
		require.ErrorIs(t, err, ErrBadSize)
		_, err = NewSender(p, new(Owed))
		require.ErrorIs(t, err, ErrBadSize)
	}
	// 24-byte header, extension, 100-byte payload, reply room: 196 -> 256.
	require.Equal(t, 256, testParams.Reservation(24, 100))
	require.Equal(t, 128, testParams.Reservation(24, 0))
}

func TestSenderCarriesAndRefusalGivesBack(t *testing.T) {
	l, err := NewLedger(testParams, 2)
	require.NoError(t, err)
	s, err := NewSender(testParams, l.Owed(1))
	require.NoError(t, err)

	// Nothing owed: nothing carried.
	g, ok, err := s.Reserve(24, 8)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, Range{0, 128}, g.Space)
	require.Zero(t, g.Carry.Len)
	require.NoError(t, s.Free(g.Space))

	// A small owed range rides only on a large request; an urgent one on any.
	require.Zero(t, l.Consumed(1, Range{0, 64}).Len)
	g, _, _ = s.Reserve(24, 8)
	require.Zero(t, g.Carry.Len, "small request, small range")
	require.NoError(t, s.Free(g.Space))
	g, _, _ = s.Reserve(24, CarryMin)
	require.Equal(t, Range{0, 64}, g.Carry, "a large request carries any range")
	require.Zero(t, l.Owed(1).Len())

	// Refused: the room is free again and the carried range must go back.
	ack := s.Refused(g)
	require.Equal(t, Range{0, 64}, ack)
	require.Zero(t, s.InUse())

	// A request that can never fit.
	_, _, err = s.Reserve(24, testParams.BufferBytes)
	require.ErrorIs(t, err, ErrBadSize)
	// A full window: not now.
	for {
		_, ok, err := s.Reserve(24, 900)
		require.NoError(t, err)
		if !ok {
			break
		}
	}
	require.ErrorIs(t, s.Free(Range{64, 64}), ErrNotAllocated)
}

func TestLedgerAcks(t *testing.T) {
	l, err := NewLedger(testParams, 3)
	require.NoError(t, err)
	q := uint32(testParams.BufferBytes / 4)

	// Adjacent consumptions coalesce; a displaced range goes at once.
	require.Zero(t, l.Consumed(1, Range{0, 64}).Len)
	require.Zero(t, l.Consumed(1, Range{64, 64}).Len)
	require.Equal(t, Range{0, 128}, l.Consumed(1, Range{1024, 64}))
	require.False(t, l.Urgent())

	// A reply takes the range that ends where its request starts.
	require.Equal(t, Range{1024, 128}, l.Reply(1, Range{1088, 64}))
	require.Equal(t, Range{2048, 64}, l.Reply(1, Range{2048, 64}), "nothing adjacent")

	// Urgent ranges go before the next delivery; the others wait.
	require.Zero(t, l.Consumed(2, Range{0, q}).Len)
	require.Zero(t, l.Consumed(1, Range{0, 64}).Len)
	require.True(t, l.Urgent())
	acks := l.TakeUrgent(nil)
	require.Equal(t, []Ack{{2, Range{0, q}}}, acks)
	require.False(t, l.Urgent())
	require.True(t, l.Pending())
	acks = l.TakeAll(acks[:0])
	require.Equal(t, []Ack{{1, Range{0, 64}}}, acks)
	require.False(t, l.Pending())
	require.Empty(t, l.TakeAll(nil))

	// A peer whose range a request took leaves the list at the next scan.
	require.Zero(t, l.Consumed(1, Range{64, 64}).Len)
	_, _, ok := l.Owed(1).Take()
	require.True(t, ok)
	require.Empty(t, l.TakeUrgent(nil))
	require.False(t, l.Pending())
}

func TestArrivalRoomDoesNotDependOnCarry(t *testing.T) {
	l, err := NewLedger(testParams, 2)
	require.NoError(t, err)
	const hdr, payload = 24, 100
	space := Range{0, uint32(testParams.Reservation(hdr, payload))}
	bare, err := l.Arrival(0, space, hdr+payload, false)
	require.NoError(t, err)
	carrying, err := l.Arrival(0, space, hdr+testParams.ExtLen+payload, true)
	require.NoError(t, err)
	require.Equal(t, bare, carrying)
	require.GreaterOrEqual(t, bare, testParams.ReplyReserve)
	for _, bad := range []Range{{4096 - 64, 128}, {32, 128}, {0, 100}, {0, 64}} {
		_, err := l.Arrival(0, bad, hdr+payload, false)
		require.ErrorIs(t, err, ErrNotAllocated, "%+v", bad)
	}
}

// A model test of the whole engine: two ranks, each with a Ledger and a
// Sender toward the other, over a network that refuses some packets (its
// backlog, as package am keeps it, sends them later in order). Requests are
// answered by a reply, consumed, or retained and released later, in any
// order; ranks idle now and then. Against a reference (the granules each
// rank holds in the other's buffer), every return is accepted (no range is
// returned twice or unallocated), every reservation leaves the reply its
// room, and at the end every window is empty.
func TestCreditEngineAgainstReferenceModel(t *testing.T) {
	type packet struct {
		request bool
		space   Range // a request's reservation
		free    Range // the credit the packet returns (a request's carried range, a reply's, an ack's)
		pktLen  int
	}
	type rank struct {
		l        *Ledger
		s        *Sender
		wire     []packet // sent to the other rank, in order
		backlog  []packet // refused responses and acks, sent before anything new
		retained []Range  // requests from the other rank held by their handlers
		held     map[uint32]int
	}
	const hdr = 24
	for seed := uint64(1); seed <= 30; seed++ {
		rng := rand.New(rand.NewPCG(seed, 7))
		var rk [2]*rank
		for i := range rk {
			l, err := NewLedger(testParams, 2)
			require.NoError(t, err)
			rk[i] = &rank{l: l, held: map[uint32]int{}}
		}
		for i := range rk {
			s, err := NewSender(testParams, rk[i].l.Owed(1-i))
			require.NoError(t, err)
			rk[i].s = s
		}
		refuse := func() bool { return rng.IntN(8) == 0 }
		// respond sends a reply or ack from i, behind its backlog.
		respond := func(i int, r Range) {
			pk := packet{free: r, pktLen: hdr}
			if len(rk[i].backlog) > 0 || refuse() {
				rk[i].backlog = append(rk[i].backlog, pk)
				return
			}
			rk[i].wire = append(rk[i].wire, pk)
		}
		flush := func(i int) {
			for len(rk[i].backlog) > 0 && !refuse() {
				rk[i].wire = append(rk[i].wire, rk[i].backlog[0])
				rk[i].backlog = rk[i].backlog[1:]
			}
		}
		sendAcks := func(i int, acks []Ack) {
			for _, a := range acks {
				require.Equal(t, 1-i, a.Peer)
				respond(i, a.Range)
			}
		}
		// returned: rank i's window got r back from the other rank.
		returned := func(i int, r Range) {
			require.NoError(t, rk[i].s.Free(r), "seed %d: rank %d given back [%d,+%d)", seed, i, r.Off, r.Len)
			for g := r.Off; g < r.End(); g += Granule {
				rk[i].held[g]--
				require.GreaterOrEqual(t, rk[i].held[g], 0, "seed %d: granule %d returned twice", seed, g)
			}
		}
		deliver := func(to int) {
			from := 1 - to
			pk := rk[from].wire[0]
			rk[from].wire = rk[from].wire[1:]
			if rk[to].l.Urgent() {
				sendAcks(to, rk[to].l.TakeUrgent(nil))
			}
			if pk.free.Len != 0 {
				returned(to, pk.free)
			}
			if !pk.request {
				return
			}
			room, err := rk[to].l.Arrival(from, pk.space, pk.pktLen, pk.free.Len != 0)
			require.NoError(t, err, "seed %d", seed)
			require.GreaterOrEqual(t, room, testParams.ReplyReserve)
			switch k := rng.IntN(10); {
			case k < 3:
				respond(to, rk[to].l.Reply(from, pk.space))
			case k < 4:
				rk[to].retained = append(rk[to].retained, pk.space)
			default:
				if now := rk[to].l.Consumed(from, pk.space); now.Len != 0 {
					respond(to, now)
				}
			}
		}
		for step := 0; step < 20000; step++ {
			i := rng.IntN(2)
			r := rk[i]
			switch k := rng.IntN(12); {
			case k < 5: // a request, behind the backlog
				flush(i)
				if len(r.backlog) > 0 {
					continue
				}
				payload := rng.IntN(testParams.BufferBytes / 3)
				if rng.IntN(2) == 0 {
					payload = rng.IntN(64)
				}
				g, ok, err := r.s.Reserve(hdr, payload)
				require.NoError(t, err)
				if !ok {
					continue // a real sender polls here
				}
				for gr := g.Space.Off; gr < g.Space.End(); gr += Granule {
					r.held[gr]++
				}
				if refuse() {
					if ack := r.s.Refused(g); ack.Len != 0 {
						r.backlog = append(r.backlog, packet{free: ack, pktLen: hdr})
					}
					for gr := g.Space.Off; gr < g.Space.End(); gr += Granule {
						r.held[gr]--
					}
					continue
				}
				pktLen := hdr + payload
				if g.Carry.Len != 0 {
					pktLen += testParams.ExtLen
				}
				r.wire = append(r.wire, packet{request: true, space: g.Space, free: g.Carry, pktLen: pktLen})
			case k < 9 && len(rk[1-i].wire) > 0: // i delivers what the other sent
				deliver(i)
			case k < 10 && len(r.retained) > 0: // a retained payload is released
				j := rng.IntN(len(r.retained))
				respond(i, r.retained[j])
				r.retained = append(r.retained[:j], r.retained[j+1:]...)
			case k < 11:
				flush(i)
			default: // i idles
				sendAcks(i, r.l.TakeAll(nil))
			}
		}
		// Quiesce: release, deliver and flush until nothing moves.
		for round := 0; round < 1000; round++ {
			moved := false
			for i, r := range rk {
				for _, sp := range r.retained {
					respond(i, sp)
				}
				r.retained = nil
				for len(r.backlog) > 0 {
					r.wire = append(r.wire, r.backlog[0])
					r.backlog = r.backlog[1:]
				}
				for len(rk[1-i].wire) > 0 {
					deliver(i)
					moved = true
				}
				if acks := r.l.TakeAll(nil); len(acks) > 0 {
					sendAcks(i, acks)
					moved = true
				}
			}
			if !moved && len(rk[0].backlog)+len(rk[1].backlog)+len(rk[0].wire)+len(rk[1].wire) == 0 {
				break
			}
		}
		for i, r := range rk {
			require.Zero(t, r.s.InUse(), "seed %d: rank %d holds space at the end", seed, i)
			for g, c := range r.held {
				require.Zero(t, c, "seed %d: rank %d granule %d", seed, i, g)
			}
		}
	}
}

// A peer over another network may have a buffer of another size: its
// reservations are checked against its own size, and its owed credit turns
// urgent at its own threshold.
func TestLedgerBufferPerPeer(t *testing.T) {
	l, err := NewLedger(testParams, 3)
	require.NoError(t, err)
	big := 4 * testParams.BufferBytes
	require.NoError(t, l.SetBuffer(2, big))
	require.Equal(t, big, l.Buffer(2))
	require.Equal(t, testParams.BufferBytes, l.Buffer(1))
	const hdr, payload = 24, 100
	n := uint32(testParams.Reservation(hdr, payload))
	beyond := Range{uint32(testParams.BufferBytes), n} // past the default buffer
	_, err = l.Arrival(2, beyond, hdr+payload, false)
	require.NoError(t, err, "inside peer 2's buffer")
	_, err = l.Arrival(1, beyond, hdr+payload, false)
	require.ErrorIs(t, err, ErrNotAllocated, "outside peer 1's")

	// As much owed as makes peer 1's credit urgent is not urgent for peer 2.
	for off := uint32(0); !Urgent(off, testParams.BufferBytes); off += n {
		l.Consumed(2, Range{off, n})
	}
	require.False(t, l.Urgent())
	require.Empty(t, l.TakeUrgent(nil))

	for _, bad := range []struct{ peer, bytes int }{{0, 100}, {0, 0}, {3, big}, {-1, big}} {
		require.ErrorIs(t, l.SetBuffer(bad.peer, bad.bytes), ErrBadSize, "%+v", bad)
	}
	s, err := NewSender(Params{BufferBytes: big, ReplyReserve: testParams.ReplyReserve, ExtLen: testParams.ExtLen,
		MinReply: testParams.MinReply}, l.Owed(2))
	require.NoError(t, err)
	g, ok, err := s.Reserve(hdr, big/2)
	require.NoError(t, err)
	require.True(t, ok, "a reservation only the larger buffer holds")
	_, err = l.Arrival(2, g.Space, hdr+big/2, false)
	require.NoError(t, err)
}
