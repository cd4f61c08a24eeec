package am

import (
	"testing"

	"github.com/amgo-hpc/amgo/handlers"
	"github.com/amgo-hpc/amgo/internal/wire"
)

// FuzzDeliver feeds arbitrary packets to an endpoint's receive path (decode,
// credit frees, reservation checks, store destinations, dispatch): it must drop
// what is malformed and never panic.
func FuzzDeliver(f *testing.F) {
	enc := func(h wire.Header, args []uint64, payload []byte) []byte {
		b := make([]byte, wire.MaxHeaderLen+len(payload))
		n := wire.Encode(b, &h, args)
		return append(b[:n], payload...)
	}
	f.Add(enc(wire.Header{Kind: wire.KindRequestShort, Handler: 1, NArgs: 1, Reserve: 256}, []uint64{7}, nil))
	f.Add(enc(wire.Header{Kind: wire.KindRequestMedium, Handler: 2, Len: 3, Reserve: 320}, nil, []byte("abc")))
	f.Add(enc(wire.Header{Kind: wire.KindRequestStore, Handler: 1, Flags: wire.FlagLast, Len: 2, Total: 2, Reserve: 320}, nil, []byte("hi")))
	f.Add(enc(wire.Header{Kind: wire.KindReplyShort, Handler: 1, Flags: wire.FlagFree, Reserve: 256}, nil, nil))
	f.Add(enc(wire.Header{Kind: wire.KindAck, Flags: wire.FlagFree, Off: 64, Reserve: 64}, nil, nil))
	f.Add(enc(wire.Header{Kind: wire.KindRequestMedium, Handler: 2, Flags: wire.FlagFree, Len: 3, Off: 256, Reserve: 320, FreeOff: 0, FreeLen: 256}, nil, []byte("abc")))
	f.Add(enc(wire.Header{Kind: wire.KindRequestImmediate, Handler: 1, NArgs: 2, Len: 3}, []uint64{1, 2}, []byte("abc")))
	f.Add(enc(wire.Header{Kind: wire.KindRequestImmediate, Handler: 2, Len: 1}, nil, []byte("x")))
	f.Fuzz(func(t *testing.T, pkt []byte) {
		net := newFakeNet(2)
		var eps []*Endpoint
		for _, tr := range net.transports() {
			ep, err := New(tr, Config{OnDrop: func(error) {}})
			if err != nil {
				t.Fatal(err)
			}
			_, _ = ep.Register(handlers.Entry{Index: 1, Name: "reply", NArgs: handlers.AnyArgs, Fn: func(tok *handlers.Token, a []uint64, p []byte) {
				_ = tok.ReplyMedium(2, p)
			}})
			_, _ = ep.Register(handlers.Entry{Index: 2, Name: "retain", NArgs: handlers.AnyArgs, Fn: func(tok *handlers.Token, a []uint64, p []byte) {
				if _, r, err := tok.Retain(); err == nil {
					_ = ep.Release(r)
				}
			}})
			eps = append(eps, ep)
		}
		seg, _ := eps[1].RegisterSegment(make([]byte, 256))
		defer func() { _ = eps[1].UnregisterSegment(seg) }()
		net.inject(0, 1, pkt)
		for i := 0; i < 3; i++ {
			_, _ = eps[1].Poll()
			_, _ = eps[0].Poll()
		}
	})
}
