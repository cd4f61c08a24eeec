// Package dgram is the framing that amgo's datagram networks (udp, xdp)
// wrap every packet in: a frame header naming the source and destination
// ranks and the datagram's number, the packet, and a proof of membership of
// the job (a GMAC tag). Each network has its own magic (the first word,
// which also versions the framing) and its own key label, so that one
// network's datagrams are never accepted by another.
//
//	offset  size  field
//	0       4     magic (little-endian uint32, the network's)
//	4       4     source rank, little-endian uint32
//	8       4     destination rank, little-endian uint32
//	12      8     the sender's datagram number, little-endian uint64
//	20      n     the packet (amgo wire header, arguments, payload)
//	20+n    16    proof: the GMAC tag (AES-256-GCM with bytes 0..20+n as
//	              additional data and nothing encrypted), nonce bytes 4..8
//	              then 12..20 (source rank, datagram number)
//
// The key is HMAC-SHA256(job secret, label): the secret itself never keys
// anything that crosses the network. GMAC is a MAC only while no sender uses
// a nonce twice under one key (NIST SP 800-38D, §8): a sender numbers its
// datagrams from a random 64-bit value drawn when it opens, so two datagrams
// of one job never share a nonce. A receiver does not need nonces to be
// fresh: a replayed datagram is a duplicate, which am's reliability layer
// drops.
package dgram

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
)

// Sizes of the framing, in bytes.
const (
	// FrameHeader is the frame header's length.
	FrameHeader = 20
	// ProofLen is the length of the proof trailer.
	ProofLen = 16
	// Overhead is what the framing adds to a packet.
	Overhead = FrameHeader + ProofLen
	// NonceLen is the length of a datagram's GCM nonce.
	NonceLen = 12
)

// Errors of Decode; a datagram that fails is dropped and counted by its
// network, never returned by Poll.
var (
	// ErrShort: the datagram is shorter than its framing, or was truncated.
	ErrShort = errors.New("datagram shorter than its framing")
	// ErrForeign: the magic is wrong, or the datagram came from an address
	// that is not the claimed rank's: it does not belong to this job.
	ErrForeign = errors.New("datagram from outside the job")
	// ErrMisdirected: the source rank is outside the job or the destination
	// rank is not this one.
	ErrMisdirected = errors.New("datagram names a rank outside the job or another destination")
	// ErrProof: the proof of membership is wrong (a forgery, corruption, or a
	// peer with another secret).
	ErrProof = errors.New("datagram's proof of membership is wrong")
)

// DeriveKey returns the 32-byte key that proves one network's datagrams of
// the job whose secret is secret: HMAC-SHA256(secret, label).
func DeriveKey(secret []byte, label string) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(label))
	return m.Sum(nil)
}

// Prover frames and proves datagrams of one network and job, and checks
// them. It is safe for concurrent use.
type Prover struct {
	aead  cipher.AEAD
	magic uint32
}

// NewProver returns the Prover for key (DeriveKey of the job secret) and
// the network's magic. Errors: a key that is not 16, 24 or 32 bytes long.
func NewProver(key []byte, magic uint32) (*Prover, error) {
	b, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("datagram key: %w", err)
	}
	g, err := cipher.NewGCM(b)
	if err != nil {
		return nil, fmt.Errorf("datagram key: %w", err)
	}
	return &Prover{aead: g, magic: magic}, nil
}

// nonce writes a datagram's GCM nonce into n: its source rank and number,
// read from its frame header fh. (The nonce lives in caller-supplied scratch
// because a local array handed to the AEAD interface would escape to the
// heap.)
func nonce(n *[NonceLen]byte, fh []byte) []byte {
	copy(n[0:4], fh[4:8])
	copy(n[4:12], fh[12:20])
	return n[:]
}

// PutFrame writes the frame header of datagram number seq from src to dst
// into b (at least FrameHeader bytes).
func (pr *Prover) PutFrame(b []byte, src, dst int, seq uint64) {
	binary.LittleEndian.PutUint32(b[0:], pr.magic)
	binary.LittleEndian.PutUint32(b[4:], uint32(src))
	binary.LittleEndian.PutUint32(b[8:], uint32(dst))
	binary.LittleEndian.PutUint64(b[12:], seq)
}

// Seal appends the proof of d (a frame header and its packet) to d, using n
// as scratch. It does not allocate when d has ProofLen bytes of spare
// capacity.
func (pr *Prover) Seal(d []byte, n *[NonceLen]byte) []byte {
	d = slices.Grow(d, ProofLen)
	tag := pr.aead.Seal(d[len(d):], nonce(n, d), nil, d)
	return d[:len(d)+len(tag)]
}

// Append appends datagram number seq, carrying pkt from rank src to rank
// dst, to b.
func (pr *Prover) Append(b []byte, src, dst int, seq uint64, pkt []byte) []byte {
	b = slices.Grow(b, Overhead+len(pkt))
	start := len(b)
	b = b[:start+FrameHeader]
	pr.PutFrame(b[start:], src, dst, seq)
	b = append(b, pkt...)
	var n [NonceLen]byte
	return b[:start+len(pr.Seal(b[start:], &n))]
}

// Decode checks datagram d, received by rank self of a job of size ranks,
// and returns its source rank and the packet inside it (a sub-slice of d).
// It checks, in this order: the length (ErrShort), the magic (ErrForeign),
// the ranks (ErrMisdirected) and the proof (ErrProof, compared in constant
// time); it never panics, never modifies d and does not allocate. The
// packet itself is not decoded: that is package am's business.
func (pr *Prover) Decode(d []byte, self, size int, n *[NonceLen]byte) (src int, pkt []byte, err error) {
	if len(d) < Overhead {
		return -1, nil, fmt.Errorf("%w: %d bytes", ErrShort, len(d))
	}
	if binary.LittleEndian.Uint32(d) != pr.magic {
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

// Drops counts the datagrams a network dropped, each under the reason
// Decode (or the network's own checks) gave. Safe for concurrent use.
type Drops struct {
	short, foreign, misdirected, badProof atomic.Uint64
}

// Count counts a dropped datagram under err's reason: ErrShort, ErrForeign,
// ErrMisdirected, or else ErrProof.
func (d *Drops) Count(err error) {
	switch {
	case errors.Is(err, ErrShort):
		d.short.Add(1)
	case errors.Is(err, ErrForeign):
		d.foreign.Add(1)
	case errors.Is(err, ErrMisdirected):
		d.misdirected.Add(1)
	default:
		d.badProof.Add(1)
	}
}

// Snapshot returns the counts: short, foreign, misdirected, bad proof.
func (d *Drops) Snapshot() (short, foreign, misdirected, badProof uint64) {
	return d.short.Load(), d.foreign.Load(), d.misdirected.Load(), d.badProof.Load()
}
