package udp

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
)

// Datagram framing: every datagram is a 20-byte frame header, the packet
// (amgo wire header, arguments, payload) and a 16-byte proof of membership.
//
//	offset  size  field
//	0       4     magic "amU2" (little-endian 0x32556d61)
//	4       4     source rank, little-endian uint32
//	8       4     destination rank, little-endian uint32
//	12      8     the sender's datagram number, little-endian uint64
//	20      n     the packet
//	20+n    16    proof: the GMAC tag (AES-256-GCM with the datagram's
//	              bytes 0..20+n as additional data and nothing encrypted)
//	              under key, with the nonce bytes 4..8 then 12..20 (source
//	              rank, datagram number)
//
// key = HMAC-SHA256(job secret, "amgo-udp2 datagram key"): the secret itself
// never keys anything that crosses the network, and the tcp handshake's
// HMACs, keyed by the secret, cannot be replayed as datagram proofs.
//
// GMAC is a MAC only while no sender uses a nonce twice under one key
// (NIST SP 800-38D, §8): a nonce is the sender's rank and its own datagram
// number, which starts at a random value when the transport opens and
// counts up, so two datagrams of one job never share one. A receiver does
// not need nonces to be fresh: a replayed datagram is a duplicate, which the
// reliability layer above drops. GMAC was chosen over HMAC-SHA256 (the
// first framing, "amU1") for speed: with the CPU's carry-less multiply it
// proves 64 KiB in about a third of HMAC-SHA256's time (docs/transports.md).
const (
	// Magic is the first word of every datagram ("amU2" read as a
	// little-endian uint32).
	Magic = 0x32556d61
	// FrameHeader is the frame header's length in bytes.
	FrameHeader = 20
	// ProofLen is the length of the proof trailer in bytes.
	ProofLen = 16
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

// DeriveKey returns the 32-byte key that proves datagrams of the job whose
// secret is secret (NewProver's key).
func DeriveKey(secret []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("amgo-udp2 datagram key"))
	return m.Sum(nil)
}

// Prover proves datagrams and checks their proofs for one job. It is safe for
// concurrent use.
type Prover struct{ aead cipher.AEAD }

// NewProver returns the Prover for key (DeriveKey of the job secret).
// Errors: a key that is not 16, 24 or 32 bytes long.
func NewProver(key []byte) (*Prover, error) {
	b, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("udp: datagram key: %w", err)
	}
	g, err := cipher.NewGCM(b)
	if err != nil {
		return nil, fmt.Errorf("udp: datagram key: %w", err)
	}
	return &Prover{aead: g}, nil
}

// NonceLen is the length of a datagram's GCM nonce in bytes.
const NonceLen = 12

// nonce writes a datagram's GCM nonce into n: its source rank and number,
// read from its frame header fh. (The nonce lives in caller-supplied scratch
// because a local array handed to the AEAD interface would escape to the
// heap.)
func nonce(n *[NonceLen]byte, fh []byte) []byte {
	copy(n[0:4], fh[4:8])
	copy(n[4:12], fh[12:20])
	return n[:]
}

// putFrame writes the frame header of datagram number seq from src to dst
// into b (at least FrameHeader bytes).
func putFrame(b []byte, src, dst int, seq uint64) {
	binary.LittleEndian.PutUint32(b[0:], Magic)
	binary.LittleEndian.PutUint32(b[4:], uint32(src))
	binary.LittleEndian.PutUint32(b[8:], uint32(dst))
	binary.LittleEndian.PutUint64(b[12:], seq)
}

// seal appends the proof of d (a frame header and its packet) to d, using n
// as scratch. It does not allocate when d has ProofLen bytes of spare
// capacity.
func (pr *Prover) seal(d []byte, n *[NonceLen]byte) []byte {
	d = slices.Grow(d, ProofLen)
	tag := pr.aead.Seal(d[len(d):], nonce(n, d), nil, d)
	return d[:len(d)+len(tag)]
}

// AppendDatagram appends datagram number seq, carrying pkt from rank src to
// rank dst and proved with pr, to b.
func AppendDatagram(b []byte, pr *Prover, src, dst int, seq uint64, pkt []byte) []byte {
	b = slices.Grow(b, Overhead+len(pkt))
	start := len(b)
	b = b[:start+FrameHeader]
	putFrame(b[start:], src, dst, seq)
	b = append(b, pkt...)
	var n [NonceLen]byte
	return b[:start+len(pr.seal(b[start:], &n))]
}

// DecodeDatagram checks datagram d, received by rank self of a job of size
// ranks, and returns its source rank and the packet inside it (a sub-slice
// of d). pr proves the job's datagrams. It checks, in this order: the
// length (ErrShort), the magic (ErrForeign), the ranks (ErrMisdirected) and
// the proof (ErrProof, compared in constant time); it never panics, never
// modifies d and does not allocate. The packet itself is not decoded: that
// is package am's business.
func DecodeDatagram(d []byte, self, size int, pr *Prover, n *[NonceLen]byte) (src int, pkt []byte, err error) {
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
	tag := d[end:]
	if _, err := pr.aead.Open(tag[:0:0], nonce(n, d), tag, d[:end]); err != nil {
		return -1, nil, ErrProof
	}
	return int(s), d[FrameHeader:end], nil
}
