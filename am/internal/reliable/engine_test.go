package reliable

import (
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/amgo-hpc/amgo/internal/wire"
)

// pkt is a copied transmission or delivery.
type pkt struct {
	peer int
	data []byte
}

// collect carries out e's Ready by copying: transmissions and deliveries.
func collect(e *Engine) (tx, rx []pkt, dead []error) {
	rd := e.Ready()
	for _, m := range rd.Messages {
		tx = append(tx, pkt{m.To, append([]byte(nil), m.Data...)})
	}
	for _, d := range rd.Deliveries {
		rx = append(rx, pkt{d.From, append([]byte(nil), d.Data...)})
	}
	dead = append(dead, rd.Dead...)
	e.Advance()
	return tx, rx, dead
}

func newPair(t *testing.T, cfg Config) (a, b *Engine) {
	cfg.Peers = 2
	cfg.Self = 0
	a, err := New(cfg)
	require.NoError(t, err)
	cfg.Self = 1
	b, err = New(cfg)
	require.NoError(t, err)
	return a, b
}

func decode(t *testing.T, b []byte) (wire.Header, []uint64) {
	var h wire.Header
	var args [wire.MaxArgs]uint64
	_, err := wire.Decode(b, &h, &args)
	require.NoError(t, err)
	return h, append([]uint64(nil), args[:h.NArgs]...)
}

// sequenced is pkt as a sender's engine transmits it: with the sequence
// extension after the core, carrying seq.
func sequenced(pkt []byte, seq uint32) []byte {
	out := make([]byte, 0, len(pkt)+wire.SeqExtLen)
	out = append(out, pkt[:wire.HeaderLen]...)
	binary.LittleEndian.PutUint16(out[4:], binary.LittleEndian.Uint16(out[4:])|wire.FlagSeq)
	out = binary.LittleEndian.AppendUint32(out, seq)
	out = binary.LittleEndian.AppendUint32(out, 0)
	return append(out, pkt[wire.HeaderLen:]...)
}

// feed hands every transmission to its destination engine.
func feed(t *testing.T, now time.Time, src int, to *Engine, tx []pkt) {
	for _, p := range tx {
		require.NoError(t, to.Receive(now, src, p.data))
	}
}

func TestHeaderOffsets(t *testing.T) {
	h := wire.Header{Kind: wire.KindRequestShort, Flags: wire.FlagSeq, Seq: 0x11223344, Ack: 0x55667788}
	b := make([]byte, h.EncodedLen())
	wire.Encode(b, &h, nil)
	require.Equal(t, h.Seq, binary.LittleEndian.Uint32(b[seqOffset:]), "wire's sequence extension moved: update seqOffset")
	require.Equal(t, h.Ack, binary.LittleEndian.Uint32(b[ackOffset:]), "wire's sequence extension moved: update ackOffset")
}

func TestNewRejectsBadConfig(t *testing.T) {
	for _, c := range []Config{{Peers: 0}, {Peers: 2, Self: 2}, {Peers: 2, Self: -1}, {Peers: 2, Window: MaxWindow + 1},
		{Peers: 2, Window: -1}, {Peers: 2, RTOMin: -1}, {Peers: 2, RTOMin: 2 * time.Second, RTOMax: time.Second}} {
		_, err := New(c)
		require.Error(t, err, "%+v", c)
	}
	e, err := New(Config{Peers: 3, Self: 1})
	require.NoError(t, err)
	c := e.Config()
	require.Equal(t, DefaultWindow, c.Window)
	require.Equal(t, DefaultDeadAfter, c.DeadAfter)
	require.Equal(t, uint32(1), c.InitialSeq)
}

// TestSeqStampedAckPiggybacked: Send stamps Seq 1, 2, ...; every packet to a
// peer carries the cumulative ack (next sequence number expected from it),
// stamped when it is handed out, retransmissions included.
func TestSeqStampedAckPiggybacked(t *testing.T) {
	a, b := newPair(t, Config{})
	now := epoch
	require.NoError(t, a.Send(now, 1, testPacket(0, 1, 0, 5)))
	require.NoError(t, a.Send(now, 1, testPacket(0, 1, 1, 5)))
	tx, _, _ := collect(a)
	require.Len(t, tx, 2)
	for i, p := range tx {
		h, _ := decode(t, p.data)
		require.Equal(t, uint32(i+1), h.Seq)
		require.Equal(t, uint32(1), h.Ack, "nothing received from 1 yet: next expected is 1")
	}
	feed(t, now, 0, b, tx)
	_, rx, _ := collect(b)
	require.Len(t, rx, 2)
	require.NoError(t, b.Send(now, 0, testPacket(1, 0, 0, 0)))
	tx, _, _ = collect(b)
	require.Len(t, tx, 1, "the data packet carries the ack: no standalone ack")
	h, _ := decode(t, tx[0].data)
	require.Equal(t, uint32(3), h.Ack)
	feed(t, now, 1, a, tx)
	require.Zero(t, a.PeerState(1).Unacked)
	require.Equal(t, uint64(0), b.Stats().AcksSent)
}

// TestWindowFullIsBackPressure: Window packets unacknowledged refuse the next
// Send with ErrWindowFull and take nothing; an ack makes room again.
func TestWindowFullIsBackPressure(t *testing.T) {
	a, b := newPair(t, Config{Window: 8})
	now := epoch
	for i := 0; i < 8; i++ {
		require.NoError(t, a.Send(now, 1, testPacket(0, 1, uint64(i), 10)))
	}
	require.ErrorIs(t, a.Send(now, 1, testPacket(0, 1, 8, 10)), ErrWindowFull)
	require.Equal(t, uint64(8), a.Stats().Sent)
	require.Equal(t, uint64(1), a.Stats().WindowFull)
	tx, _, _ := collect(a)
	require.Len(t, tx, 8, "the refused packet was not queued")
	feed(t, now, 0, b, tx)
	btx, rx, _ := collect(b)
	require.Len(t, rx, 8)
	require.NotEmpty(t, btx, "8 packets = a quarter of the window twice over: an ack at once")
	feed(t, now, 1, a, btx)
	require.NoError(t, a.Send(now, 1, testPacket(0, 1, 8, 10)))
}

// TestStandaloneAckWhenQuarterWindowUnacked follows SP AM: the receiver sends
// an explicit ack as soon as a quarter of the window is unacknowledged, and
// otherwise after AckDelay.
func TestStandaloneAckWhenQuarterWindowUnacked(t *testing.T) {
	a, b := newPair(t, Config{Window: 16, AckDelay: time.Millisecond})
	now := epoch
	for i := 0; i < 3; i++ {
		require.NoError(t, a.Send(now, 1, testPacket(0, 1, uint64(i), 0)))
	}
	tx, _, _ := collect(a)
	feed(t, now, 0, b, tx)
	btx, rx, _ := collect(b)
	require.Len(t, rx, 3)
	require.Empty(t, btx, "3 of 16: below a quarter, the ack waits")
	require.Equal(t, now.Add(time.Millisecond), b.NextDeadline(), "delayed ack due after AckDelay")
	require.NoError(t, a.Send(now, 1, testPacket(0, 1, 3, 0)))
	tx, _, _ = collect(a)
	feed(t, now, 0, b, tx)
	btx, _, _ = collect(b)
	require.Len(t, btx, 1, "4 of 16 = a quarter: ack at once")
	h, args := decode(t, btx[0].data)
	require.Equal(t, wire.KindAck, h.Kind)
	require.Zero(t, h.Seq)
	require.Equal(t, wire.FlagSeq, h.Flags, "the sequence extension only, no FlagFree: am's credit acks are different")
	require.Equal(t, uint32(5), h.Ack)
	require.Empty(t, args, "nothing out of order: no selective acks")
	feed(t, now, 1, a, btx)
	require.Zero(t, a.PeerState(1).Unacked)

	// One more: the delayed ack leaves at AckDelay, not before.
	require.NoError(t, a.Send(now, 1, testPacket(0, 1, 4, 0)))
	tx, _, _ = collect(a)
	feed(t, now, 0, b, tx)
	b.Tick(now.Add(time.Millisecond - 1))
	btx, _, _ = collect(b)
	require.Empty(t, btx)
	b.Tick(now.Add(time.Millisecond))
	btx, _, _ = collect(b)
	require.Len(t, btx, 1)
}

// TestStandaloneAcksAreNeverDelivered: the engine consumes its own acks.
func TestStandaloneAcksAreNeverDelivered(t *testing.T) {
	a, b := newPair(t, Config{Window: 4})
	now := epoch
	require.NoError(t, a.Send(now, 1, testPacket(0, 1, 0, 0)))
	tx, _, _ := collect(a)
	feed(t, now, 0, b, tx)
	b.Tick(now.Add(time.Hour))
	btx, rx, _ := collect(b)
	require.Len(t, rx, 1)
	require.Len(t, btx, 1)
	feed(t, now, 1, a, btx)
	_, arx, _ := collect(a)
	require.Empty(t, arx)
	require.Equal(t, uint64(1), a.Stats().AcksReceived)
}

// TestSelectiveAckFastRetransmit: a lost packet is retransmitted on the
// evidence of DupThresh later packets selectively acknowledged, before its
// timeout; the others are not retransmitted.
func TestSelectiveAckFastRetransmit(t *testing.T) {
	a, b := newPair(t, Config{Window: 32, RTOInit: time.Second, RTOMax: 2 * time.Second})
	now := epoch
	for i := 0; i < 8; i++ {
		require.NoError(t, a.Send(now, 1, testPacket(0, 1, uint64(i), 20)))
	}
	tx, _, _ := collect(a)
	lost := tx[2]
	now = now.Add(10 * time.Millisecond)
	for i, p := range tx {
		if i == 2 {
			continue
		}
		require.NoError(t, b.Receive(now, 0, p.data))
		btx, rx, _ := collect(b)
		if i < 2 {
			require.Len(t, rx, 1)
			continue
		}
		require.Empty(t, rx, "packet %d waits for packet 2", i)
		require.Len(t, btx, 1, "out-of-order arrival: selective ack at once")
		h, args := decode(t, btx[0].data)
		require.Equal(t, uint32(3), h.Ack, "next expected: 3 (packet index 2)")
		require.Len(t, args, 1)
		require.Equal(t, uint64(1)<<(i-2)-1, args[0], "bit k = seq ack+1+k received")
		feed(t, now, 1, a, btx)
	}
	atx, _, _ := collect(a)
	require.Len(t, atx, 1, "exactly the hole is retransmitted")
	require.Equal(t, lost.data[seqOffset:seqOffset+4], atx[0].data[seqOffset:seqOffset+4])
	require.Equal(t, uint64(1), a.Stats().FastRetransmits)
	require.Zero(t, a.Stats().Timeouts)
	feed(t, now, 0, b, atx)
	btx, rx, _ := collect(b)
	require.Len(t, rx, 6)
	for k, p := range rx {
		checkPacket(t, 0, 0, 1, uint64(k+2), p.data)
	}
	b.Tick(now.Add(time.Second))
	btx2, _, _ := collect(b)
	feed(t, now, 1, a, append(btx, btx2...))
	require.Zero(t, a.PeerState(1).Unacked)
}

// TestRTOBackoffAndRecovery: each timeout retransmits and doubles the timeout
// up to RTOMax; a fresh RTT sample afterwards brings it back down.
func TestRTOBackoffAndRecovery(t *testing.T) {
	cfg := Config{RTOInit: 10 * time.Millisecond, RTOMin: time.Millisecond, RTOMax: 80 * time.Millisecond, DeadAfter: time.Hour}
	a, b := newPair(t, cfg)
	now := epoch
	require.NoError(t, a.Send(now, 1, testPacket(0, 1, 0, 0)))
	tx, _, _ := collect(a)
	require.Len(t, tx, 1)
	require.Equal(t, now.Add(10*time.Millisecond), a.NextDeadline())
	want := []time.Duration{20, 40, 80, 80, 80}
	for i, w := range want {
		now = a.NextDeadline()
		a.Tick(now.Add(-1))
		tx, _, _ = collect(a)
		require.Empty(t, tx, "timeout %d: nothing before the deadline", i)
		a.Tick(now)
		tx, _, _ = collect(a)
		require.Len(t, tx, 1, "timeout %d retransmits", i)
		require.Equal(t, w*time.Millisecond, a.PeerState(1).RTO, "timeout %d", i)
		require.Equal(t, now.Add(w*time.Millisecond), a.NextDeadline())
	}
	require.Equal(t, uint64(len(want)), a.Stats().Timeouts)
	// The network heals: the retransmission arrives and is acknowledged.
	feed(t, now, 0, b, tx)
	b.Tick(now.Add(time.Hour))
	btx, _, _ := collect(b)
	feed(t, now.Add(time.Millisecond), 1, a, btx)
	require.Zero(t, a.PeerState(1).Unacked)
	require.Equal(t, 80*time.Millisecond, a.PeerState(1).RTO, "Karn: no sample from a retransmitted packet, backoff kept")
	// A fresh packet with a 2 ms round trip gives a sample: RTO recovers.
	require.NoError(t, a.Send(now, 1, testPacket(0, 1, 1, 0)))
	tx, _, _ = collect(a)
	feed(t, now, 0, b, tx)
	b.Tick(now.Add(time.Hour))
	btx, _, _ = collect(b)
	feed(t, now.Add(2*time.Millisecond), 1, a, btx)
	st := a.PeerState(1)
	require.Equal(t, 2*time.Millisecond, st.SRTT)
	require.Equal(t, time.Millisecond, st.RTTVar)
	require.Equal(t, 6*time.Millisecond, st.RTO, "srtt + 4 rttvar")
	require.True(t, a.NextDeadline().IsZero(), "nothing outstanding: no timer")
}

// TestKarnNoSampleFromRetransmission: an ack for a packet that was
// retransmitted is ambiguous and gives no RTT sample; the next clean packet does.
func TestKarnNoSampleFromRetransmission(t *testing.T) {
	a, b := newPair(t, Config{RTOInit: 10 * time.Millisecond, RTOMin: time.Millisecond, DeadAfter: time.Hour})
	now := epoch
	require.NoError(t, a.Send(now, 1, testPacket(0, 1, 0, 0)))
	first, _, _ := collect(a)
	now = now.Add(10 * time.Millisecond)
	a.Tick(now)
	retx, _, _ := collect(a)
	require.Len(t, retx, 1)
	// The original was only late: it arrives and is acked 1 ms after the retransmission.
	feed(t, now, 0, b, first)
	b.Tick(now.Add(time.Hour))
	btx, _, _ := collect(b)
	feed(t, now.Add(time.Millisecond), 1, a, btx)
	st := a.PeerState(1)
	require.Zero(t, st.Unacked)
	require.Zero(t, st.SRTT, "no sample: 1 ms and 11 ms are both plausible")
	require.Equal(t, 20*time.Millisecond, st.RTO, "backed-off timeout kept")
	feed(t, now, 0, b, retx)
	require.Equal(t, uint64(1), b.Stats().Duplicates)

	now = now.Add(time.Second)
	require.NoError(t, a.Send(now, 1, testPacket(0, 1, 1, 0)))
	tx, _, _ := collect(a)
	feed(t, now, 0, b, tx)
	b.Tick(now.Add(time.Hour))
	btx, _, _ = collect(b)
	feed(t, now.Add(3*time.Millisecond), 1, a, btx)
	require.Equal(t, 3*time.Millisecond, a.PeerState(1).SRTT)
}

// TestDeadPeerAfterDeadAfterNotBefore: a peer that acknowledges nothing for
// DeadAfter while data is outstanding is declared dead at DeadAfter, not a
// nanosecond earlier; Send to it then fails with ErrPeerDead naming it.
func TestDeadPeerAfterDeadAfterNotBefore(t *testing.T) {
	a, _ := newPair(t, Config{DeadAfter: 3 * time.Second, RTOMax: 500 * time.Millisecond})
	now := epoch
	require.NoError(t, a.Send(now, 1, testPacket(0, 1, 0, 0)))
	collect(a)
	for at := now; at.Before(now.Add(3 * time.Second)); at = a.NextDeadline() {
		require.False(t, a.NextDeadline().After(now.Add(3*time.Second)), "the dead-peer deadline bounds the timers")
		a.Tick(at)
		_, _, dead := collect(a)
		require.Empty(t, dead, "declared dead %v after the last progress", at.Sub(now))
	}
	a.Tick(now.Add(3*time.Second - 1))
	_, _, dead := collect(a)
	require.Empty(t, dead)
	a.Tick(now.Add(3 * time.Second))
	_, _, dead = collect(a)
	require.Len(t, dead, 1)
	require.ErrorIs(t, dead[0], ErrPeerDead)
	var de *DeadPeerError
	require.True(t, errors.As(dead[0], &de))
	require.Equal(t, 1, de.Rank)
	require.Equal(t, 3*time.Second, de.Silence)
	require.Equal(t, 1, de.Unacked)
	require.Contains(t, dead[0].Error(), "rank 1")
	err := a.Send(now, 1, testPacket(0, 1, 1, 0))
	require.ErrorIs(t, err, ErrPeerDead)
	require.Same(t, de, err)
	require.True(t, a.PeerState(1).Dead)
	require.True(t, a.NextDeadline().IsZero())
	require.NoError(t, a.Receive(now, 1, sequenced(testPacket(1, 0, 0, 0), 1)))
	require.Equal(t, uint64(1), a.Stats().FromDead)
}

// TestIdlePeerIsNotDeclaredDead: silence is death only while data waits.
func TestIdlePeerIsNotDeclaredDead(t *testing.T) {
	a, b := newPair(t, Config{DeadAfter: time.Second})
	now := epoch
	require.NoError(t, a.Send(now, 1, testPacket(0, 1, 0, 0)))
	tx, _, _ := collect(a)
	feed(t, now, 0, b, tx)
	b.Tick(now.Add(time.Second))
	btx, _, _ := collect(b)
	feed(t, now, 1, a, btx)
	a.Tick(now.Add(time.Hour))
	_, _, dead := collect(a)
	require.Empty(t, dead)
	require.True(t, a.NextDeadline().IsZero())
}

// TestAckProgressPostponesDeath: each acknowledgement restarts the dead-peer
// clock, so a peer that keeps acknowledging is never declared dead although
// data to it is outstanding all the time.
func TestAckProgressPostponesDeath(t *testing.T) {
	a, b := newPair(t, Config{DeadAfter: time.Second, RTOInit: 10 * time.Second, RTOMax: 10 * time.Second})
	now := epoch
	require.NoError(t, a.Send(now, 1, testPacket(0, 1, 0, 0)))
	prev, _, _ := collect(a)
	for k := uint64(1); k < 10; k++ {
		now = now.Add(900 * time.Millisecond)
		require.NoError(t, a.Send(now, 1, testPacket(0, 1, k, 0)))
		tx, _, _ := collect(a)
		feed(t, now, 0, b, prev) // the previous packet arrives late and is acknowledged
		b.Tick(now.Add(time.Hour))
		btx, _, _ := collect(b)
		feed(t, now, 1, a, btx)
		require.Equal(t, 1, a.PeerState(1).Unacked)
		a.Tick(now.Add(999 * time.Millisecond))
		_, _, dead := collect(a)
		require.Empty(t, dead, "packet %d", k)
		prev = tx
	}
	a.Tick(now.Add(time.Second))
	_, _, dead := collect(a)
	require.Len(t, dead, 1, "and without progress it dies")
}

// TestStalledReceiverIsNotDead: a receiver whose caller consumes nothing drops
// what it has no room for but answers each retransmission with an ack, so its
// sender sees back-pressure, not death, however long it lasts.
func TestStalledReceiverIsNotDead(t *testing.T) {
	a, b := newPair(t, Config{Window: 4, DeadAfter: time.Second, RTOMax: 200 * time.Millisecond})
	now := epoch
	for k := uint64(0); k < 4; k++ {
		require.NoError(t, a.Send(now, 1, testPacket(0, 1, k, 0)))
	}
	exchangeNoConsume := func() {
		rd := a.ReadyUpTo(-1)
		var tx []pkt
		for _, m := range rd.Messages {
			tx = append(tx, pkt{m.To, append([]byte(nil), m.Data...)})
		}
		a.Advance()
		feed(t, now, 0, b, tx)
		rd = b.ReadyUpTo(0) // b's caller never consumes
		var btx []pkt
		for _, m := range rd.Messages {
			btx = append(btx, pkt{m.To, append([]byte(nil), m.Data...)})
		}
		b.AdvanceMessages()
		feed(t, now, 1, a, btx)
	}
	exchangeNoConsume()
	for k := uint64(4); k < 8; k++ {
		require.NoError(t, a.Send(now, 1, testPacket(0, 1, k, 0)))
	}
	exchangeNoConsume()
	require.ErrorIs(t, a.Send(now, 1, testPacket(0, 1, 8, 0)), ErrWindowFull)
	for i := 0; i < 100; i++ { // 10 simulated seconds
		now = now.Add(100 * time.Millisecond)
		a.Tick(now)
		b.Tick(now)
		exchangeNoConsume()
		require.False(t, a.PeerState(1).Dead, "at %v", now.Sub(epoch))
	}
	require.NotZero(t, b.Stats().Overruns)
	rd := b.Ready()
	require.Len(t, rd.Deliveries, 4)
	b.Advance()
}

// TestDuplicateAndStalePacketsCounted: a packet received twice, or again after
// it was delivered and consumed, is dropped, counted, and re-acknowledged.
func TestDuplicateAndStalePacketsCounted(t *testing.T) {
	a, b := newPair(t, Config{})
	now := epoch
	for i := 0; i < 3; i++ {
		require.NoError(t, a.Send(now, 1, testPacket(0, 1, uint64(i), 3)))
	}
	tx, _, _ := collect(a)
	require.NoError(t, b.Receive(now, 0, tx[2].data)) // out of order
	require.NoError(t, b.Receive(now, 0, tx[2].data)) // duplicate while buffered
	require.Equal(t, uint64(1), b.Stats().Duplicates)
	require.NoError(t, b.Receive(now, 0, tx[0].data))
	require.NoError(t, b.Receive(now, 0, tx[1].data))
	_, rx, _ := collect(b)
	require.Len(t, rx, 3)
	require.NoError(t, b.Receive(now, 0, tx[0].data)) // stale: delivered and consumed
	require.NoError(t, b.Receive(now, 0, tx[1].data))
	btx, rx, _ := collect(b)
	require.Empty(t, rx)
	require.Equal(t, uint64(3), b.Stats().Duplicates)
	require.Equal(t, uint64(3), b.Stats().Delivered)
	require.NotEmpty(t, btx, "a duplicate means our ack was lost: ack at once")
	h, _ := decode(t, btx[len(btx)-1].data)
	require.Equal(t, uint32(4), h.Ack)
}

// TestMalformedPacketsDroppedAndCounted: nothing that fails validation changes
// state or panics.
func TestMalformedPacketsDroppedAndCounted(t *testing.T) {
	a, b := newPair(t, Config{Window: 8})
	now := epoch
	require.NoError(t, a.Send(now, 1, testPacket(0, 1, 0, 3)))
	tx, _, _ := collect(a)
	good := tx[0].data
	mod := func(f func(h *wire.Header, args []uint64) []uint64) []byte {
		h, args := decode(t, good)
		args = f(&h, args)
		h.NArgs = uint8(len(args))
		h.Len = 0
		if h.Kind == wire.KindRequestMedium {
			h.Kind = wire.KindRequestShort
		}
		out := make([]byte, h.EncodedLen())
		wire.Encode(out, &h, args)
		return out
	}
	cases := map[string]struct {
		src int
		b   []byte
	}{
		"empty":               {0, nil},
		"short":               {0, good[:20]},
		"bad version":         {0, append([]byte{9}, good[1:]...)},
		"truncated payload":   {0, good[:len(good)-1]},
		"source mismatch":     {1, good},
		"source out of range": {7, good},
		"seq beyond window": {0, mod(func(h *wire.Header, a []uint64) []uint64 {
			h.Seq = 1 + 8
			return a
		})},
		"ack of unsent packets": {0, mod(func(h *wire.Header, a []uint64) []uint64 {
			h.Ack = 5
			return a
		})},
		"seq 0 data": {0, mod(func(h *wire.Header, a []uint64) []uint64 {
			h.Seq = 0
			return a
		})},
		"ack with FlagFree unsequenced": {0, mod(func(h *wire.Header, a []uint64) []uint64 {
			h.Seq, h.Kind, h.Flags = 0, wire.KindAck, wire.FlagFree
			return nil
		})},
		"standalone ack without ack": {0, mod(func(h *wire.Header, a []uint64) []uint64 {
			h.Seq, h.Kind, h.Ack = 0, wire.KindAck, 0
			return nil
		})},
		"sack of unsent packet": {0, mod(func(h *wire.Header, a []uint64) []uint64 {
			h.Seq, h.Kind, h.Ack = 0, wire.KindAck, 1
			return []uint64{1 << 3}
		})},
	}
	want := uint64(0)
	for name, c := range cases {
		require.ErrorIs(t, b.Receive(now, c.src, c.b), ErrMalformed, name)
		want++
		require.Equal(t, want, b.Stats().Malformed, name)
	}
	btx, rx, _ := collect(b)
	require.Empty(t, btx)
	require.Empty(t, rx)
	require.Zero(t, b.PeerState(0).Buffered)
	// The good packet still goes through.
	require.NoError(t, b.Receive(now, 0, good))
	_, rx, _ = collect(b)
	require.Len(t, rx, 1)
}

// TestOverrunWhenReceiverDoesNotConsume: the receiver holds at most Window
// packets per peer that the caller has not consumed; beyond that it drops
// (counted) and the sender retransmits later.
func TestOverrunWhenReceiverDoesNotConsume(t *testing.T) {
	a, b := newPair(t, Config{Window: 4})
	now := epoch
	send := func(k uint64) {
		require.NoError(t, a.Send(now, 1, testPacket(0, 1, k, 0)))
		tx, _, _ := collect(a)
		feed(t, now, 0, b, tx)
		btx, _, _ := collect(a) // nothing
		require.Empty(t, btx)
	}
	for k := uint64(0); k < 4; k++ {
		send(k)
	}
	rd := b.ReadyUpTo(0) // the caller is busy: transmits acks, consumes nothing
	require.Empty(t, rd.Deliveries)
	acks := []pkt{}
	for _, m := range rd.Messages {
		acks = append(acks, pkt{m.To, append([]byte(nil), m.Data...)})
	}
	b.AdvanceMessages()
	feed(t, now, 1, a, acks)
	send(4)
	require.Equal(t, uint64(1), b.Stats().Overruns)
	require.Equal(t, 4, b.PeerState(0).Buffered)
	rd = b.ReadyUpTo(2)
	require.Len(t, rd.Deliveries, 2)
	rd = b.ReadyUpTo(5)
	require.Len(t, rd.Deliveries, 4, "Deliveries accumulate until AdvanceDeliveries")
	b.AdvanceDeliveries()
	b.AdvanceMessages()
	a.Tick(now.Add(time.Second))
	tx, _, _ := collect(a)
	feed(t, now, 0, b, tx)
	_, rx, _ := collect(b)
	require.Len(t, rx, 1)
	checkPacket(t, 0, 0, 1, 4, rx[0].data)
}

// TestReadyBuffersStayValidUntilAdvance: acknowledgements that arrive between
// Ready and Advance do not recycle buffers the caller still holds.
func TestReadyBuffersStayValidUntilAdvance(t *testing.T) {
	a, b := newPair(t, Config{Window: 4})
	now := epoch
	require.NoError(t, a.Send(now, 1, testPacket(0, 1, 0, 100)))
	rd := a.Ready()
	require.Len(t, rd.Messages, 1)
	held := rd.Messages[0].Data
	want := append([]byte(nil), held...)
	require.NoError(t, b.Receive(now, 0, held))
	b.Tick(now.Add(time.Hour))
	btx, _, _ := collect(b)
	feed(t, now, 1, a, btx) // acks the held packet
	require.NoError(t, a.Send(now, 1, testPacket(0, 1, 1, 100)))
	require.Equal(t, want, held, "buffer reused before Advance")
	a.Advance()
}

// TestSteadyStateAllocatesNothing: a packet's round trip through two engines
// (send, transmit, receive, deliver, ack) allocates nothing once warm.
func TestSteadyStateAllocatesNothing(t *testing.T) {
	a, b := newPair(t, Config{Window: 64})
	p := testPacket(0, 1, 7, 200)
	now := epoch
	round := func() {
		now = now.Add(time.Microsecond)
		if err := a.Send(now, 1, p); err != nil {
			t.Fatal(err)
		}
		for _, m := range a.Ready().Messages {
			b.Receive(now, 0, m.Data)
		}
		a.Advance()
		b.Tick(now.Add(time.Hour))
		rd := b.Ready()
		if len(rd.Deliveries) != 1 {
			t.Fatalf("%d deliveries", len(rd.Deliveries))
		}
		for _, m := range rd.Messages {
			a.Receive(now, 1, m.Data)
		}
		b.Advance()
		a.Tick(now)
	}
	for i := 0; i < 200; i++ {
		round()
	}
	require.Zero(t, testing.AllocsPerRun(1000, round))
}

// BenchmarkEnginePacket measures the engine's cost per packet: one Send,
// Ready and Advance at the sender, one Receive, Ready and Advance at the
// receiver, and a standalone ack every quarter window (Window 128), processed
// by the sender.
func BenchmarkEnginePacket(b *testing.B) {
	for _, size := range []int{0, 1024} {
		b.Run(map[int]string{0: "header+2args", 1024: "1KiB"}[size], func(b *testing.B) {
			x, err := New(Config{Peers: 2, Self: 0})
			require.NoError(b, err)
			y, err := New(Config{Peers: 2, Self: 1})
			require.NoError(b, err)
			p := testPacket(0, 1, 7, size)
			now := epoch
			b.SetBytes(int64(len(p)))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := x.Send(now, 1, p); err != nil {
					b.Fatal(err)
				}
				for _, m := range x.Ready().Messages {
					y.Receive(now, 0, m.Data)
				}
				x.Advance()
				for _, m := range y.Ready().Messages {
					x.Receive(now, 1, m.Data)
				}
				y.Advance()
			}
		})
	}
}

// TestStandaloneAckBytesAsDocumented checks the example in docs/wire.md,
// "Reliability layer": rank 1 expects 7 from rank 0 and holds 9 and 10.
func TestStandaloneAckBytesAsDocumented(t *testing.T) {
	a, b := newPair(t, Config{})
	now := epoch
	for k := uint64(0); k < 10; k++ {
		require.NoError(t, a.Send(now, 1, testPacket(0, 1, k, 0)))
	}
	tx, _, _ := collect(a)
	for _, i := range []int{0, 1, 2, 3, 4, 5, 8, 9} { // sequence numbers 1..6, 9, 10
		require.NoError(t, b.Receive(now, 0, tx[i].data))
	}
	btx, _, _ := collect(b)
	require.NotEmpty(t, btx)
	want := []byte{
		0x04, 0x06, 0x00, 0x01, 0x08, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // core: v4, ack, 1 arg, FlagSeq, src 1
		0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // off, reserve
		0x00, 0x00, 0x00, 0x00, 0x07, 0x00, 0x00, 0x00, // sequence extension: seq 0, ack 7
		0x06, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // selective acks: 9 and 10
	}
	require.Equal(t, want, btx[len(btx)-1].data)
}
