package proto

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/amgo-hpc/amgo/mpiam/internal/match"
)

func TestEnvelopeLayout(t *testing.T) {
	e := Envelope{match.Envelope{Context: 7, Source: 3, Tag: 42, Seq: 9}, FlagSync}
	a0, a1 := e.Args()
	require.Equal(t, uint64(7)<<32|uint64(FlagSync)<<30|3, a0)
	require.Equal(t, uint64(9)<<32|42, a1)
	got, err := ParseEnvelope([]uint64{a0, a1})
	require.NoError(t, err)
	require.Equal(t, e, got)
	// The largest rank and both flags share the first word without overlap.
	e = Envelope{match.Envelope{Context: math.MaxUint32, Source: MaxSource, Tag: 1, Seq: 2}, FlagSync | FlagReady}
	got, err = ParseEnvelope(e.Append(nil))
	require.NoError(t, err)
	require.Equal(t, e, got)
	// Negative tags are the library's own traffic and survive the trip.
	e.Tag = -5
	got, err = ParseEnvelope(e.Append(nil))
	require.NoError(t, err)
	require.Equal(t, int32(-5), got.Tag)
}

func TestRoundTrips(t *testing.T) {
	rts := RTS{Env: Envelope{match.Envelope{Context: 2, Source: 1, Tag: 0, Seq: 1 << 31}, FlagReady}, Size: 1 << 40, SendID: 77, Addr: 0xdead000}
	r, err := ParseRTS(rts.Append(nil))
	require.NoError(t, err)
	require.Equal(t, rts, r)

	cts := CTS{SendID: 1, Addr: 2, Off: 4096, N: 8192, RecvID: 5, Flags: CTSMore}
	c, err := ParseCTS(cts.Append(nil))
	require.NoError(t, err)
	require.Equal(t, cts, c)
	_, _, _, ok := c.Stage()
	require.False(t, ok)

	staged := CTS{SendID: 1, Addr: 2, N: 8192, RecvID: 5, Flags: CTSMore | CTSPiece | StageFlags(128<<10, 0x1234, 4000000)}
	c, err = ParseCTS(staged.Append(nil))
	require.NoError(t, err)
	require.Equal(t, staged, c)
	off, gen, pid, ok := c.Stage()
	require.True(t, ok)
	require.Equal(t, []any{128 << 10, uint32(0x1234), uint32(4000000)}, []any{off, gen, pid})

	piece := Piece{RecvID: 9, Off: 1 << 20}
	pc, err := ParsePiece(piece.Append(nil))
	require.NoError(t, err)
	require.Equal(t, piece, pc)

	bar := Barrier{Context: 4, Round: 3}
	b, err := ParseBarrier(bar.Append(nil))
	require.NoError(t, err)
	require.Equal(t, bar, b)

	for _, th := range []Throttle{{On: true, Epoch: 3}, {On: false, Epoch: 3}} {
		got, err := ParseThrottle(th.Append(nil))
		require.NoError(t, err)
		require.Equal(t, th, got)
	}
	id, err := ParseID([]uint64{12})
	require.NoError(t, err)
	require.Equal(t, uint64(12), id)
}

// What no correct sender writes is refused, with ErrMalformed.
func TestMalformedMessagesAreRefused(t *testing.T) {
	env := Envelope{Envelope: match.Envelope{Context: 2, Source: 1}}.Append(nil)
	for name, f := range map[string]func() error{
		"short envelope":   func() error { _, err := ParseEnvelope([]uint64{1}); return err },
		"rts arguments":    func() error { _, err := ParseRTS(env); return err },
		"rts size":         func() error { _, err := ParseRTS(append(env, math.MaxUint64, 0, 0)); return err },
		"rts too long":     func() error { _, err := ParseRTS(append(env, 1, 0, 0, 0)); return err },
		"cts arguments":    func() error { _, err := ParseCTS([]uint64{1, 2, 3}); return err },
		"cts flags":        func() error { _, err := ParseCTS([]uint64{1, 2, 3, 4, 5, 8}); return err },
		"piece arguments":  func() error { _, err := ParsePiece([]uint64{1}); return err },
		"cts stage bits":   func() error { _, err := ParseCTS([]uint64{1, 2, 3, 4, 5, CTSStage | 8}); return err },
		"cts stage fields": func() error { _, err := ParseCTS([]uint64{1, 2, 3, 4, 5, 1 << 40}); return err },
		"cts overflow":     func() error { _, err := ParseCTS([]uint64{1, 2, math.MaxInt, 2, 5, 0}); return err },
		"id arguments":     func() error { _, err := ParseID(nil); return err },
		"barrier odd":      func() error { _, err := ParseBarrier([]uint64{3, 0}); return err },
		"barrier round":    func() error { _, err := ParseBarrier([]uint64{2, MaxBarrierRounds}); return err },
		"barrier context":  func() error { _, err := ParseBarrier([]uint64{1 << 33, 0}); return err },
		"throttle on":      func() error { _, err := ParseThrottle([]uint64{2, 0}); return err },
		"throttle missing": func() error { _, err := ParseThrottle([]uint64{1}); return err },
	} {
		require.ErrorIs(t, f(), ErrMalformed, name)
	}
}

// FuzzParse feeds arbitrary arguments to every Parse function: none panics,
// and what one accepts is written back by Append to the same arguments.
func FuzzParse(f *testing.F) {
	f.Add(uint8(0), uint8(2), uint64(7)<<32|1<<30|3, uint64(9)<<32|42, uint64(0), uint64(0), uint64(0), uint64(0))
	f.Add(uint8(1), uint8(5), uint64(2)<<32, uint64(0), uint64(1<<20), uint64(5), uint64(0x1000), uint64(0))
	f.Add(uint8(2), uint8(6), uint64(1), uint64(2), uint64(3), uint64(4), uint64(5), uint64(1))
	f.Add(uint8(3), uint8(2), uint64(4), uint64(3), uint64(0), uint64(0), uint64(0), uint64(0))
	f.Add(uint8(4), uint8(2), uint64(1), uint64(9), uint64(0), uint64(0), uint64(0), uint64(0))
	f.Add(uint8(5), uint8(2), uint64(3), uint64(1<<17), uint64(0), uint64(0), uint64(0), uint64(0))
	// Each parser returns what Append writes back for what it accepted.
	parsers := []func([]uint64) ([]uint64, error){
		func(a []uint64) ([]uint64, error) { m, err := ParseEnvelope(a); return m.Append(nil), err },
		func(a []uint64) ([]uint64, error) { m, err := ParseRTS(a); return m.Append(nil), err },
		func(a []uint64) ([]uint64, error) { m, err := ParseCTS(a); return m.Append(nil), err },
		func(a []uint64) ([]uint64, error) { m, err := ParseBarrier(a); return m.Append(nil), err },
		func(a []uint64) ([]uint64, error) { m, err := ParseThrottle(a); return m.Append(nil), err },
		func(a []uint64) ([]uint64, error) { m, err := ParsePiece(a); return m.Append(nil), err },
	}
	f.Fuzz(func(t *testing.T, kind, n uint8, a0, a1, a2, a3, a4, a5 uint64) {
		args := []uint64{a0, a1, a2, a3, a4, a5}[:min(int(n), 6)]
		back, err := parsers[int(kind)%len(parsers)](args)
		if err != nil {
			return
		}
		if kind%uint8(len(parsers)) == 0 {
			args = args[:EnvelopeArgs] // an envelope is the first three of a message's arguments
		}
		require.Equal(t, args, back)
	})
}
