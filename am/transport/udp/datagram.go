package udp

import (
	"github.com/amgo-hpc/amgo/am/transport/internal/dgram"
)

// Datagram framing: every datagram is a 20-byte frame header, the packet
// (amgo wire header, arguments, payload) and a 16-byte proof of membership,
// as package dgram lays out (docs/transports.md), with udp's magic:
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
// HMACs, keyed by the secret, cannot be replayed as datagram proofs. GMAC
// was chosen over HMAC-SHA256 (the first framing, "amU1") for speed: with
// the CPU's carry-less multiply it proves 64 KiB in about a third of
// HMAC-SHA256's time (docs/transports.md).
const (
	// Magic is the first word of every datagram ("amU2" read as a
	// little-endian uint32).
	Magic = 0x32556d61
	// FrameHeader is the frame header's length in bytes.
	FrameHeader = dgram.FrameHeader
	// ProofLen is the length of the proof trailer in bytes.
	ProofLen = dgram.ProofLen
	// Overhead is what the framing adds to a packet, in bytes.
	Overhead = dgram.Overhead
	// MaxDatagram is the largest UDP payload over IPv4, in bytes.
	MaxDatagram = 65507
	// MaxPacket is the largest packet one Send takes by default (option
	// "max_packet" lowers it), in bytes: MaxDatagram minus Overhead.
	MaxPacket = MaxDatagram - Overhead
	// NonceLen is the length of a datagram's GCM nonce in bytes.
	NonceLen = dgram.NonceLen
	// keyLabel derives the datagram key from the job secret.
	keyLabel = "amgo-udp2 datagram key"
)

// Errors of DecodeDatagram; a datagram that fails is dropped and counted
// (Stats), never returned by Poll.
var (
	// ErrShort: the datagram is shorter than its framing, or was truncated.
	ErrShort = dgram.ErrShort
	// ErrForeign: the magic is wrong, or the datagram came from an address
	// that is not the claimed rank's: it does not belong to this job.
	ErrForeign = dgram.ErrForeign
	// ErrMisdirected: the source rank is outside the job or the destination
	// rank is not this one.
	ErrMisdirected = dgram.ErrMisdirected
	// ErrProof: the proof of membership is wrong (a forgery, corruption, or a
	// peer with another secret).
	ErrProof = dgram.ErrProof
)

// Prover proves udp datagrams of one job and checks their proofs. It is
// safe for concurrent use.
type Prover = dgram.Prover

// DeriveKey returns the 32-byte key that proves udp datagrams of the job
// whose secret is secret (NewProver's key).
func DeriveKey(secret []byte) []byte { return dgram.DeriveKey(secret, keyLabel) }

// NewProver returns the Prover of udp datagrams for key (DeriveKey of the
// job secret). Errors: a key that is not 16, 24 or 32 bytes long.
func NewProver(key []byte) (*Prover, error) { return dgram.NewProver(key, Magic) }

// AppendDatagram appends datagram number seq, carrying pkt from rank src to
// rank dst and proved with pr, to b.
func AppendDatagram(b []byte, pr *Prover, src, dst int, seq uint64, pkt []byte) []byte {
	return pr.Append(b, src, dst, seq, pkt)
}

// DecodeDatagram checks datagram d, received by rank self of a job of size
// ranks, and returns its source rank and the packet inside it (a sub-slice
// of d). pr proves the job's datagrams. It checks, in this order: the
// length (ErrShort), the magic (ErrForeign), the ranks (ErrMisdirected) and
// the proof (ErrProof, compared in constant time); it never panics, never
// modifies d and does not allocate. The packet itself is not decoded: that
// is package am's business.
func DecodeDatagram(d []byte, self, size int, pr *Prover, n *[NonceLen]byte) (src int, pkt []byte, err error) {
	return pr.Decode(d, self, size, n)
}
