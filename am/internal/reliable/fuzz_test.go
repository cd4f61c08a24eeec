package reliable

import (
	"testing"
	"time"

	"github.com/amgo-hpc/amgo/internal/wire"
)

// FuzzReceive feeds arbitrary bytes to an engine that has traffic in flight in
// both directions (packets outstanding to the source, some received from it out
// of order). Receive must never panic, must either accept or count every
// packet, and must keep its windows within bounds.
func FuzzReceive(f *testing.F) {
	data := sequenced(testPacket(1, 0, 0, 3), 1)
	f.Add(data)
	enc := func(h wire.Header, args ...uint64) []byte {
		h.NArgs = uint8(len(args))
		b := make([]byte, h.EncodedLen())
		wire.Encode(b, &h, args)
		return b
	}
	f.Add(enc(wire.Header{Kind: wire.KindAck, Src: 1, Flags: wire.FlagSeq, Ack: 3}, 0b101))
	f.Add(enc(wire.Header{Kind: wire.KindAck, Src: 1, Flags: wire.FlagSeq, Ack: 1<<32 - 1}))
	f.Add(enc(wire.Header{Kind: wire.KindRequestShort, Src: 1, Flags: wire.FlagSeq, Seq: 2, Ack: 2}))
	f.Add(enc(wire.Header{Kind: wire.KindRequestShort, Src: 1, Flags: wire.FlagSeq, Seq: 1 << 31}))
	f.Add(enc(wire.Header{Kind: wire.KindAck, Src: 1, Flags: wire.FlagFree | wire.FlagSeq, Seq: 3}))
	f.Add(enc(wire.Header{Kind: wire.KindRequestShort, Src: 1, Seq: 2})) // no sequence extension
	f.Add([]byte{})
	f.Add(make([]byte, wire.HeaderLen))
	f.Fuzz(func(t *testing.T, pkt []byte) {
		e, err := New(Config{Peers: 2, Self: 0, Window: 8})
		if err != nil {
			t.Fatal(err)
		}
		now := epoch
		for k := uint64(0); k < 5; k++ {
			if err := e.Send(now, 1, testPacket(0, 1, k, 4)); err != nil {
				t.Fatal(err)
			}
		}
		e.Ready()
		e.Advance()
		// Packets 3 and 5 from rank 1 arrived: 1, 2 and 4 are missing.
		for _, seq := range []uint32{3, 5} {
			p := sequenced(testPacket(1, 0, uint64(seq), 2), seq)
			if err := e.Receive(now, 1, p); err != nil {
				t.Fatal(err)
			}
		}
		before := e.Stats()
		err = e.Receive(now, 1, pkt)
		after := e.Stats()
		if err != nil && after.Malformed != before.Malformed+1 {
			t.Fatalf("error %v not counted", err)
		}
		st := e.PeerState(1)
		if st.Unacked < 0 || st.Unacked > 8 || st.Buffered < 0 || st.Buffered > 8 {
			t.Fatalf("state out of bounds: %+v", st)
		}
		e.Tick(now.Add(time.Second))
		rd := e.Ready()
		for _, m := range rd.Messages {
			var h wire.Header
			var args [wire.MaxArgs]uint64
			if _, err := wire.Decode(m.Data, &h, &args); err != nil {
				t.Fatalf("engine transmits an undecodable packet: %v", err)
			}
		}
		e.Advance()
	})
}
