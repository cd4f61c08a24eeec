package wire

import (
	"slices"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

func encode(h Header, args []uint64, payload []byte) []byte {
	b := make([]byte, MaxHeaderLen+len(payload))
	n := Encode(b, &h, args)
	return append(b[:n], payload...)
}

func TestRoundTripEveryKind(t *testing.T) {
	for k := KindRequestShort; k < kindEnd; k++ {
		if k == KindRequestImmediate {
			continue // its own header: TestImmediateRoundTrip
		}
		for _, flags := range []uint16{0, FlagFree, FlagLast | FlagFree | FlagPiggyback | FlagSeq, FlagSeq, FlagPiggyback} {
			var payload []byte
			if k == KindRequestMedium || k == KindRequestStore || k == KindReplyMedium {
				payload = []byte("payload bytes")
			}
			args := []uint64{1, 1 << 63, 42}
			h := Header{Kind: k, Handler: 200, NArgs: 3, Flags: flags, Src: 7,
				Len: uint32(len(payload)), Seq: 9, Ack: 8, Off: 4096, Reserve: 320, Addr: 0xdeadbeef00,
				Frag: 1 << 20, Total: 3 << 20, FreeOff: 8192, FreeLen: 1024, Piggyback: 0x3ff0000000000000}
			pkt := encode(h, args, payload)
			want := h // what the extensions carry; the rest is left out
			ext := 0
			if flags&FlagSeq == 0 {
				want.Seq, want.Ack = 0, 0
			} else {
				ext += SeqExtLen
			}
			if !k.HasStoreExt() {
				want.Addr, want.Frag, want.Total = 0, 0, 0
			} else {
				ext += StoreExtLen
			}
			if flags&FlagFree == 0 || !k.IsRequest() {
				want.FreeOff, want.FreeLen = 0, 0
			} else {
				ext += FreeExtLen
			}
			if flags&FlagPiggyback == 0 {
				want.Piggyback = 0
			} else {
				ext += PiggybackExtLen
			}
			require.Len(t, pkt, HeaderLen+ext+24+len(payload))
			require.Equal(t, h.EncodedLen(), HeaderLen+ext+24)
			var got Header
			var gargs [MaxArgs]uint64
			p, err := Decode(pkt, &got, &gargs)
			require.NoError(t, err, "%s flags %#x", k, flags)
			require.Equal(t, want, got)
			require.Equal(t, args, gargs[:3])
			require.Equal(t, string(payload), string(p))
		}
	}
}

// The sequence extension sits where the reliability layer writes it.
func TestSeqOffsets(t *testing.T) {
	pkt := encode(Header{Kind: KindRequestStore, Flags: FlagSeq | FlagPiggyback, Seq: 0x11223344, Ack: 0x55667788, Piggyback: 7}, nil, nil)
	require.Equal(t, []byte{0x44, 0x33, 0x22, 0x11}, pkt[SeqOffset:SeqOffset+4])
	require.Equal(t, []byte{0x88, 0x77, 0x66, 0x55}, pkt[AckOffset:AckOffset+4])
	h := Header{Kind: KindStoreDone, Flags: flagAll, NArgs: MaxArgs}
	require.Equal(t, MaxHeaderLen, h.EncodedLen())
}

func TestDecodeRejectsMalformed(t *testing.T) {
	good := encode(Header{Kind: KindRequestMedium, NArgs: 1, Len: 4}, []uint64{5}, []byte("abcd"))
	mut := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	cases := map[string]struct {
		pkt  []byte
		want error
	}{
		"empty":          {nil, ErrShort},
		"short header":   {good[:HeaderLen-1], ErrShort},
		"version":        {mut(func(b []byte) []byte { b[0] = 1; return b }), ErrVersion},
		"kind zero":      {mut(func(b []byte) []byte { b[1] = 0; return b }), ErrKind},
		"kind too big":   {mut(func(b []byte) []byte { b[1] = byte(kindEnd); return b }), ErrKind},
		"too many args":  {mut(func(b []byte) []byte { b[3] = MaxArgs + 1; return b }), ErrArgs},
		"unknown flag":   {mut(func(b []byte) []byte { b[5] = 0x80; return b }), ErrFlags},
		"reserved bytes": {mut(func(b []byte) []byte { b[7] = 1; return b }), ErrFlags},
		"args cut":       {good[:HeaderLen+4], ErrShort},
		"payload short":  {good[:len(good)-1], ErrLength},
		"payload long":   {append(append([]byte(nil), good...), 'x'), ErrLength},
		"short with len": {encode(Header{Kind: KindRequestShort, Len: 1}, nil, []byte("x")), ErrLength},
		"done with len":  {encode(Header{Kind: KindStoreDone, Len: 1}, nil, []byte("x")), ErrLength},
		"seq ext cut":    {encode(Header{Kind: KindAck, Flags: FlagSeq}, nil, nil)[:HeaderLen+4], ErrShort},
		"store ext cut":  {encode(Header{Kind: KindStoreDone}, nil, nil)[:HeaderLen+15], ErrShort},
		"free ext cut":   {encode(Header{Kind: KindRequestShort, Flags: FlagFree}, nil, nil)[:HeaderLen+7], ErrShort},
	}
	for name, c := range cases {
		var h Header
		var a [MaxArgs]uint64
		_, err := Decode(c.pkt, &h, &a)
		require.ErrorIs(t, err, c.want, name)
	}
}

func TestKindStrings(t *testing.T) {
	require.Equal(t, "request-medium", KindRequestMedium.String())
	require.Equal(t, "kind(99)", Kind(99).String())
	require.True(t, KindStoreDone.IsRequest())
	require.True(t, KindReplyMedium.IsReply())
	require.False(t, KindAck.IsRequest() || KindAck.IsReply())
}

func TestEncodeDecodeAllocateNothing(t *testing.T) {
	b := make([]byte, MaxHeaderLen+8)
	args := []uint64{1, 2}
	h := Header{Kind: KindRequestMedium, NArgs: 2, Len: 8}
	var out Header
	var a [MaxArgs]uint64
	allocs := testing.AllocsPerRun(1000, func() {
		n := Encode(b, &h, args)
		_, _ = Decode(b[:n+8], &out, &a)
	})
	require.Zero(t, allocs)
}

// FuzzDecode: every input either decodes to a header that re-encodes to the
// same bytes, or yields an error; never a panic.
func FuzzDecode(f *testing.F) {
	f.Add(encode(Header{Kind: KindRequestShort, NArgs: 2}, []uint64{1, 2}, nil))
	f.Add(encode(Header{Kind: KindRequestMedium, Len: 3}, nil, []byte("abc")))
	f.Add(encode(Header{Kind: KindReplyShort, Flags: FlagFree, Off: 64, Reserve: 256}, nil, nil))
	f.Add(encode(Header{Kind: KindRequestStore, Flags: FlagLast, Addr: 1 << 40, Frag: 10, Total: 13, Len: 3}, nil, []byte("xyz")))
	f.Add(encode(Header{Kind: KindRequestMedium, Flags: FlagSeq | FlagPiggyback, Seq: 3, Ack: 2, Piggyback: 9, NArgs: 1, Len: 2}, []uint64{4}, []byte("hi")))
	f.Add(encode(Header{Kind: KindAck, Flags: FlagSeq, Ack: 5, NArgs: 2}, []uint64{1, 2}, nil))
	f.Add(encode(Header{Kind: KindRequestMedium, Flags: FlagFree | FlagPiggyback, Off: 256, Reserve: 512, FreeOff: 0, FreeLen: 256, Len: 2}, nil, []byte("hi")))
	f.Add(encode(Header{Kind: KindRequestImmediate, Handler: 9, NArgs: 3, Len: 8}, []uint64{1, 2, 3}, []byte("8 bytes!")))
	f.Add(encode(Header{Kind: KindRequestImmediate}, nil, nil))
	f.Add([]byte{})
	f.Add([]byte{1, 1, 0, 17})
	f.Fuzz(func(t *testing.T, pkt []byte) {
		var h Header
		var a [MaxArgs]uint64
		payload, err := Decode(pkt, &h, &a)
		if err != nil {
			return
		}
		again := encode(h, a[:h.NArgs], payload)
		if string(again) != string(pkt) {
			t.Fatalf("re-encoding differs:\n got %x\nwant %x", again, pkt)
		}
	})
}

// TestEncodeLayout pins the byte layout of docs/wire.md: a round trip alone
// would not notice Encode and Decode changing the format together.
func TestEncodeLayout(t *testing.T) {
	h := Header{Kind: KindRequestStore, Handler: 0xab, NArgs: 2, Flags: FlagSeq | FlagPiggyback | FlagLast | FlagFree,
		Src: 0x01020304, Len: 3, Seq: 0x11121314, Ack: 0x21222324, Off: 0x31323334, Reserve: 0x41424344,
		Addr: 0x5152535455565758, Frag: 0x61626364, Total: 0x71727374,
		FreeOff: 0xb1b2b3b4, FreeLen: 0xc1c2c3c4, Piggyback: 0x8182838485868788}
	var b [MaxHeaderLen]byte
	n := Encode(b[:], &h, []uint64{0x9192939495969798, 0xa1a2a3a4a5a6a7a8})
	want := []byte{
		Version, byte(KindRequestStore), 0xab, 2, byte(FlagSeq | FlagPiggyback | FlagLast | FlagFree), 0, 0, 0, // core: version, kind, handler, nargs, flags, reserved
		0x04, 0x03, 0x02, 0x01, 3, 0, 0, 0, // src, len
		0x34, 0x33, 0x32, 0x31, 0x44, 0x43, 0x42, 0x41, // off, reserve
		0x14, 0x13, 0x12, 0x11, 0x24, 0x23, 0x22, 0x21, // sequence extension: seq, ack
		0x58, 0x57, 0x56, 0x55, 0x54, 0x53, 0x52, 0x51, 0x64, 0x63, 0x62, 0x61, 0x74, 0x73, 0x72, 0x71, // store: addr, frag, total
		0xb4, 0xb3, 0xb2, 0xb1, 0xc4, 0xc3, 0xc2, 0xc1, // free: off, len
		0x88, 0x87, 0x86, 0x85, 0x84, 0x83, 0x82, 0x81, // piggyback
		0x98, 0x97, 0x96, 0x95, 0x94, 0x93, 0x92, 0x91, 0xa8, 0xa7, 0xa6, 0xa5, 0xa4, 0xa3, 0xa2, 0xa1, // arguments
	}
	require.Equal(t, want, b[:n])
	require.Equal(t, h.EncodedLen(), n)

	var got Header
	var args [MaxArgs]uint64
	payload, err := Decode(append(b[:n:n], 1, 2, 3), &got, &args)
	require.NoError(t, err)
	require.Equal(t, h, got)
	require.Equal(t, []uint64{0x9192939495969798, 0xa1a2a3a4a5a6a7a8}, args[:2])
	require.Equal(t, []byte{1, 2, 3}, payload)
}

// An immediate request: the 4-byte core, arguments, payload; through
// Encode/Decode and EncodeImmediate/DecodeImmediate alike.
func TestImmediateRoundTrip(t *testing.T) {
	args := []uint64{0x0102030405060708, 1 << 63}
	var b [ImmediateHeaderLen + 16]byte
	n := EncodeImmediate(b[:], 0xab, args)
	require.Equal(t, len(b), n)
	want := []byte{
		Version, byte(KindRequestImmediate), 0xab, 2, // version, kind, handler, nargs
		0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, 0, 0, 0, 0, 0, 0, 0, 0x80, // arguments
	}
	require.Equal(t, want, b[:n])
	pkt := append(b[:n:n], 'x', 'y', 'z')

	var a [MaxArgs]uint64
	handler, got, payload, err := DecodeImmediate(pkt, &a)
	require.NoError(t, err)
	require.Equal(t, uint8(0xab), handler)
	require.Equal(t, args, got)
	require.Equal(t, "xyz", string(payload))
	// Arguments at every alignment: read in place when 8-byte aligned (the
	// packet 4 bytes past a boundary), copied otherwise, the same values
	// either way.
	buf := make([]uint64, 8)
	raw := unsafe.Slice((*byte)(unsafe.Pointer(&buf[0])), 64)
	for off := range 8 {
		q := raw[off : off+len(pkt)]
		copy(q, pkt)
		_, _, _, inPlace := DecodeImmediateInPlace(q)
		require.Equal(t, off == 4, inPlace, "offset %d", off)
		_, got, payload, err := DecodeImmediate(q, &a)
		require.NoError(t, err, "offset %d", off)
		require.Equal(t, args, got, "offset %d", off)
		require.Equal(t, "xyz", string(payload), "offset %d", off)
		// And encoded at that offset: the same bytes at every alignment
		// (word stores where the machine allows them unaligned, bytes
		// elsewhere).
		clear(raw)
		require.Equal(t, n, EncodeImmediate(raw[off:off+n], 0xab, args), "offset %d", off)
		require.Equal(t, want, raw[off:off+n], "offset %d", off)
	}

	var h Header
	payload, err = Decode(pkt, &h, &a)
	require.NoError(t, err)
	require.Equal(t, Header{Kind: KindRequestImmediate, Handler: 0xab, NArgs: 2, Len: 3}, h)
	require.Equal(t, "xyz", string(payload))
	require.Equal(t, ImmediateHeaderLen+16, h.EncodedLen())
	require.Equal(t, pkt, encode(h, args, payload))
	require.False(t, KindRequestImmediate.IsRequest(), "takes no credit")
	var tiny [ImmediateHeaderLen]byte
	EncodeImmediate(tiny[:], 1, nil)
	payload, err = Decode(tiny[:], &h, &a) // shorter than the 24-byte core
	require.NoError(t, err)
	require.Empty(t, payload)
	require.Equal(t, Header{Kind: KindRequestImmediate, Handler: 1}, h)
	require.Equal(t, "request-immediate", KindRequestImmediate.String())

	mut := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), pkt...)) }
	for name, c := range map[string]struct {
		pkt  []byte
		want error
	}{
		"empty":         {nil, ErrShort},
		"short core":    {pkt[:ImmediateHeaderLen-1], ErrShort},
		"version":       {mut(func(b []byte) []byte { b[0] = 1; return b }), ErrVersion},
		"not immediate": {encode(Header{Kind: KindRequestShort}, nil, nil), ErrKind},
		"too many args": {mut(func(b []byte) []byte { b[3] = MaxArgs + 1; return b }), ErrArgs},
		"args cut":      {pkt[:ImmediateHeaderLen+12], ErrShort},
		"args cut more": {pkt[:ImmediateHeaderLen+15], ErrShort},
	} {
		_, _, _, err := DecodeImmediate(c.pkt, &a)
		require.ErrorIs(t, err, c.want, name)
		if name != "not immediate" {
			_, err = Decode(c.pkt, &h, &a)
			require.ErrorIs(t, err, c.want, name)
		}
	}
	require.Zero(t, testing.AllocsPerRun(1000, func() {
		n := EncodeImmediate(b[:], 1, args)
		_, _, _, _ = DecodeImmediate(b[:n], &a)
	}))
}

// BenchmarkDecodeImmediate decodes an MPI eager message's immediate
// request: three arguments and 8 payload bytes.
func BenchmarkDecodeImmediate(b *testing.B) {
	pkt := encode(Header{Kind: KindRequestImmediate, Handler: 9, NArgs: 2, Len: 8}, []uint64{1, 2}, []byte("8 bytes!"))
	var args [MaxArgs]uint64
	for b.Loop() {
		if _, _, _, err := DecodeImmediate(pkt, &args); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecode decodes an MPI eager message's packet: a medium request
// with three arguments and 8 payload bytes, no extension.
func BenchmarkDecode(b *testing.B) {
	pkt := encode(Header{Kind: KindRequestMedium, Handler: 9, NArgs: 3, Src: 1, Len: 8, Off: 64, Reserve: 64},
		[]uint64{1, 2, 3}, []byte("8 bytes!"))
	var h Header
	var args [MaxArgs]uint64
	for b.Loop() {
		if _, err := Decode(pkt, &h, &args); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEncodeImmediate encodes an MPI eager message's immediate
// request header: three arguments.
func BenchmarkEncodeImmediate(b *testing.B) {
	var buf [ImmediateHeaderLen + 8*MaxArgs]byte
	args := []uint64{1, 2, 3}
	for b.Loop() {
		EncodeImmediate(buf[:], 9, args)
	}
}

// FuzzDecodeImmediateInPlace: wherever DecodeImmediateInPlace accepts a
// packet (at any alignment), DecodeImmediate decodes it to the same handler,
// arguments and payload; wherever DecodeImmediate refuses one, so does
// DecodeImmediateInPlace. Never a panic.
func FuzzDecodeImmediateInPlace(f *testing.F) {
	f.Add(encode(Header{Kind: KindRequestImmediate, Handler: 9, NArgs: 3, Len: 8}, []uint64{1, 2, 3}, []byte("8 bytes!")), 0)
	f.Add(encode(Header{Kind: KindRequestImmediate, Handler: 1, NArgs: 1}, []uint64{7}, nil), 3)
	f.Add(encode(Header{Kind: KindRequestImmediate}, nil, nil), 0)
	f.Add([]byte{1, 8, 0, 17, 0, 0, 0, 0}, 0)
	f.Add(encode(Header{Kind: KindRequestImmediate, Handler: 9, NArgs: 2, Len: 8}, []uint64{1, 2}, []byte("8 bytes!")), 4)
	f.Fuzz(func(t *testing.T, pkt []byte, off int) {
		buf := make([]uint64, (len(pkt)+15)/8)
		raw := unsafe.Slice((*byte)(unsafe.Pointer(&buf[0])), 8*len(buf))
		q := raw[uint(off)%8:][:len(pkt)]
		copy(q, pkt)
		var a [MaxArgs]uint64
		h, args, payload, err := DecodeImmediate(q, &a)
		ih, iargs, ipayload, ok := DecodeImmediateInPlace(q)
		if !ok {
			return
		}
		if err != nil {
			t.Fatalf("in place accepted what DecodeImmediate refuses (%v): %x", err, pkt)
		}
		if ih != h || !slices.Equal(iargs, args) || string(ipayload) != string(payload) {
			t.Fatalf("in place decoded %d %v %x, DecodeImmediate %d %v %x", ih, iargs, ipayload, h, args, payload)
		}
	})
}
