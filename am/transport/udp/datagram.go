package udp

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
)

// Datagram framing: every datagram is a 12-byte frame header, the packet
// (amgo wire header, arguments, payload) and an 8-byte proof of membership.
//
//	offset  size  field
//	0       4     magic "amU1" (little-endian 0x31556d61)
//	4       4     source rank, little-endian uint32
//	8       4     destination rank, little-endian uint32
//	12      n     the packet
//	12+n    8     proof: HMAC-SHA256(key, bytes 0..12+n)[:8]
//
// key = HMAC-SHA256(job secret, "amgo-udp1 datagram key"): the secret itself
// never keys anything that crosses the network, and the tcp handshake's
// HMACs, keyed by the secret, cannot be replayed as datagram proofs.
const (
	// Magic is the first word of every datagram ("amU1" read as a
	// little-endian uint32).
	Magic = 0x31556d61
	// FrameHeader is the frame header's length in bytes.
	FrameHeader = 12
	// ProofLen is the length of the proof trailer in bytes.
	ProofLen = 8
	// Overhead is what the framing adds to a packet, in bytes.
	Overhead = FrameHeader + ProofLen
	// MaxDatagram is the largest UDP payload over IPv4, in bytes.
	MaxDatagram = 65507
	// MaxPacket is the largest packet one Send takes by default (option
	// "max_packet" lowers it), in bytes: MaxDatagram minus Overhead.
	MaxPacket = MaxDatagram - Overhead
)

// Errors of DecodeDatagram; a datagram that fails is dropped and counted
// (Stats), never returned by Poll.
var (
	// ErrShort: the datagram is shorter than its framing, or was truncated.
	ErrShort = errors.New("udp: datagram shorter than its framing")
	// ErrForeign: the magic is wrong, or the datagram came from an address
	// that is not the claimed rank's: it does not belong to this job.
	ErrForeign = errors.New("udp: datagram from outside the job")
	// ErrMisdirected: the source rank is outside the job or the destination
	// rank is not this one.
	ErrMisdirected = errors.New("udp: datagram names a rank outside the job or another destination")
	// ErrProof: the proof of membership is wrong (a forgery, corruption, or a
	// peer with another secret).
	ErrProof = errors.New("udp: datagram's proof of membership is wrong")
)

// DeriveKey returns the key that proves datagrams of the job whose secret is
// secret.
func DeriveKey(secret []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("amgo-udp1 datagram key"))
	return m.Sum(nil)
}

// newMAC returns a reusable HMAC-SHA256 keyed with key.
func newMAC(key []byte) hash.Hash { return hmac.New(sha256.New, key) }

// putFrame writes the frame header of a datagram from src to dst into b.
func putFrame(b *[FrameHeader]byte, src, dst int) {
	binary.LittleEndian.PutUint32(b[0:], Magic)
	binary.LittleEndian.PutUint32(b[4:], uint32(src))
	binary.LittleEndian.PutUint32(b[8:], uint32(dst))
}

// proof computes the proof of the concatenation of parts into sum (32 bytes
// of scratch) and returns its first ProofLen bytes. It does not allocate.
func proof(mac hash.Hash, sum *[sha256.Size]byte, parts ...[]byte) []byte {
	mac.Reset()
	for _, p := range parts {
		mac.Write(p)
	}
	return mac.Sum(sum[:0])[:ProofLen]
}

// AppendDatagram appends the datagram carrying pkt from rank src to rank dst,
// proved with mac (keyed with DeriveKey of the job secret), to b.
func AppendDatagram(b []byte, mac hash.Hash, src, dst int, pkt []byte) []byte {
	var fh [FrameHeader]byte
	var sum [sha256.Size]byte
	putFrame(&fh, src, dst)
	b = append(append(b, fh[:]...), pkt...)
	return append(b, proof(mac, &sum, fh[:], pkt)...)
}

// DecodeDatagram checks datagram d, received by rank self of a job of size
// ranks, and returns its source rank and the packet inside it (a sub-slice
// of d). mac is keyed with DeriveKey of the job secret; sum is scratch. It
// checks, in this order: the length (ErrShort), the magic (ErrForeign), the
// ranks (ErrMisdirected) and the proof (ErrProof, compared in constant
// time); it never panics and does not allocate. The packet itself is not
// decoded: that is package am's business.
func DecodeDatagram(d []byte, self, size int, mac hash.Hash, sum *[sha256.Size]byte) (src int, pkt []byte, err error) {
	if len(d) < Overhead {
		return -1, nil, fmt.Errorf("%w: %d bytes", ErrShort, len(d))
	}
	if binary.LittleEndian.Uint32(d) != Magic {
		return -1, nil, ErrForeign
	}
	s, dst := binary.LittleEndian.Uint32(d[4:]), binary.LittleEndian.Uint32(d[8:])
	if uint64(s) >= uint64(size) || uint64(dst) != uint64(self) {
		return -1, nil, ErrMisdirected
	}
	end := len(d) - ProofLen
	if !hmac.Equal(proof(mac, sum, d[:end]), d[end:]) {
		return -1, nil, ErrProof
	}
	return int(s), d[FrameHeader:end], nil
}
