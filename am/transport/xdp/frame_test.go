package xdp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/amgo-hpc/amgo/am/transport/internal/dgram"
)

var (
	testMACs = []net.HardwareAddr{{2, 0, 0, 0, 0, 1}, {2, 0, 0, 0, 0, 2}, {2, 0, 0, 0, 0, 3}, {2, 0, 0, 0, 0, 4}}
	testKey  = dgram.DeriveKey([]byte("0123456789abcdef"), keyLabel)
)

func mustProver(t testing.TB, secret string) *dgram.Prover {
	pr, err := newProver([]byte(secret))
	require.NoError(t, err)
	return pr
}

// appendFrame builds the frame Send builds.
func appendFrame(pr *dgram.Prover, src, dst int, seq uint64, pkt []byte) []byte {
	f := make([]byte, EthHeader, EthHeader+dgram.Overhead+len(pkt))
	putEth(f, testMACs[dst], testMACs[src], EtherType)
	return append(f[:EthHeader], pr.Append(nil, src, dst, seq, pkt)...)
}

// DecodeFrame accepts exactly the job's frames to this interface and counts
// every other kind under its reason.
func TestDecodeFrame(t *testing.T) {
	pr := mustProver(t, "0123456789abcdef")
	other := mustProver(t, "another job's secret")
	good := appendFrame(pr, 0, 1, 7, []byte("hello"))
	var n [dgram.NonceLen]byte
	src, pkt, err := DecodeFrame(good, 1, 4, testMACs[1], testMACs, EtherType, pr, &n)
	require.NoError(t, err)
	require.Equal(t, 0, src)
	require.Equal(t, "hello", string(pkt))

	mutate := func(f func(b []byte)) []byte {
		b := bytes.Clone(good)
		f(b)
		return b
	}
	for _, c := range []struct {
		name  string
		frame []byte
		want  error
	}{
		{"short", good[:Overhead-1], dgram.ErrShort},
		{"to another interface", mutate(func(b []byte) { b[5] ^= 1 }), dgram.ErrForeign},
		{"another EtherType", mutate(func(b []byte) { b[12] = 0x08; b[13] = 0 }), dgram.ErrForeign},
		{"another magic", mutate(func(b []byte) { b[EthHeader] ^= 1 }), dgram.ErrForeign},
		{"from an interface not the rank's", mutate(func(b []byte) { copy(b[6:12], testMACs[2]) }), dgram.ErrForeign},
		{"another job", appendFrame(other, 0, 1, 8, []byte("hello")), dgram.ErrProof},
		{"source outside the job", mutate(func(b []byte) { binary.LittleEndian.PutUint32(b[EthHeader+4:], 9) }), dgram.ErrMisdirected},
		{"another destination", mutate(func(b []byte) { binary.LittleEndian.PutUint32(b[EthHeader+8:], 2) }), dgram.ErrMisdirected},
		{"payload flipped", mutate(func(b []byte) { b[EthHeader+dgram.FrameHeader] ^= 1 }), dgram.ErrProof},
		{"proof flipped", mutate(func(b []byte) { b[len(b)-1] ^= 1 }), dgram.ErrProof},
	} {
		src, pkt, err := DecodeFrame(c.frame, 1, 4, testMACs[1], testMACs, EtherType, pr, &n)
		require.ErrorIs(t, err, c.want, c.name)
		require.Equal(t, -1, src, c.name)
		require.Nil(t, pkt, c.name)
	}
	// A rank the wire does not reach (nil address) is never a source.
	macs := append([]net.HardwareAddr(nil), testMACs...)
	macs[0] = nil
	_, _, err = DecodeFrame(good, 1, 4, testMACs[1], macs, EtherType, pr, &n)
	require.ErrorIs(t, err, dgram.ErrForeign)
}

// FuzzFrame feeds arbitrary bytes to DecodeFrame as rank 1 of a job of 4:
// it must never panic or modify its input, and whatever it accepts must be
// exactly the frame that Send makes for the source and packet it returned
// and the frame number in it.
func FuzzFrame(f *testing.F) {
	pr, err := dgram.NewProver(testKey, Magic)
	if err != nil {
		f.Fatal(err)
	}
	for _, src := range []int{0, 2, 3} {
		f.Add(appendFrame(pr, src, 1, uint64(src)<<40+5, []byte("a packet")))
	}
	f.Add(appendFrame(pr, 0, 1, 1<<63, nil))
	f.Add(append(bytes.Clone(testMACs[1]), 2, 0, 0, 0, 0, 1, 0x88, 0xb5, 'a', 'm', 'X', '1'))
	f.Fuzz(func(t *testing.T, d []byte) {
		in := bytes.Clone(d)
		var n [dgram.NonceLen]byte
		src, pkt, err := DecodeFrame(d, 1, 4, testMACs[1], testMACs, EtherType, pr, &n)
		if !bytes.Equal(in, d) {
			t.Fatal("DecodeFrame modified its input")
		}
		if err != nil {
			if pkt != nil || src != -1 {
				t.Fatalf("error %v with a result", err)
			}
			if !errors.Is(err, dgram.ErrShort) && !errors.Is(err, dgram.ErrForeign) &&
				!errors.Is(err, dgram.ErrMisdirected) && !errors.Is(err, dgram.ErrProof) {
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
		seq := binary.LittleEndian.Uint64(d[EthHeader+12:])
		if want := appendFrame(pr, src, 1, seq, pkt); !bytes.Equal(want, d) {
			t.Fatalf("accepted %x, which is not the frame %x", d, want)
		}
	})
}
