package xdp

import (
	"encoding/binary"
	"net"

	"github.com/amgo-hpc/amgo/am/transport/internal/dgram"
)

// Frame layout: an Ethernet header and a datagram of package dgram's
// framing (docs/transports.md):
//
//	offset  size  field
//	0       6     destination MAC address (the receiving rank's interface)
//	6       6     source MAC address (the sending rank's interface)
//	12      2     EtherType, big-endian (EtherType: 0x88B5 by default)
//	14      4     magic "amX1" (little-endian 0x31586d61)
//	18      4     source rank, little-endian uint32
//	22      4     destination rank
//	26      8     the sender's datagram number, little-endian uint64
//	34      n     the packet: amgo wire header, arguments, payload
//	34+n    16    proof: the GMAC tag of bytes 14 .. 34+n
const (
	// EthHeader is the Ethernet header's length in bytes (no VLAN tag).
	EthHeader = 14
	// EtherType is the EtherType of amgo's frames unless option
	// "ethertype" says otherwise: IEEE 802's Local Experimental
	// EtherType 1, which no protocol is assigned.
	EtherType = 0x88B5
	// Magic is the first word after the Ethernet header ("amX1" read as a
	// little-endian uint32).
	Magic = 0x31586d61
	// Overhead is what the framing adds to a packet, in bytes.
	Overhead = EthHeader + dgram.Overhead
	// keyLabel derives the frames' proof key from the job secret.
	keyLabel = "amgo-xdp1 frame key"
)

// putEth writes the Ethernet header of a frame from src to dst into b.
func putEth(b []byte, dst, src net.HardwareAddr, etherType uint16) {
	copy(b[0:6], dst)
	copy(b[6:12], src)
	binary.BigEndian.PutUint16(b[12:14], etherType)
}

// DecodeFrame checks frame f, received by rank self of a job of size ranks
// whose interface has address mac, and returns the source rank and the
// packet inside it (a sub-slice of f). pr proves the job's frames, macs[r]
// is rank r's interface address and etherType the job's EtherType. A frame
// is refused when it is shorter than the framing (dgram.ErrShort), is
// addressed to another interface, has another EtherType or magic or comes
// from an interface other than the claimed rank's (dgram.ErrForeign),
// names a source outside the job or another destination
// (dgram.ErrMisdirected), or carries a wrong proof (dgram.ErrProof). It
// never panics, never modifies f and does not allocate on success.
func DecodeFrame(f []byte, self, size int, mac net.HardwareAddr, macs []net.HardwareAddr, etherType uint16,
	pr *dgram.Prover, n *[dgram.NonceLen]byte) (src int, pkt []byte, err error) {
	if len(f) < Overhead {
		return -1, nil, dgram.ErrShort
	}
	if !sameMAC(f[0:6], mac) || binary.BigEndian.Uint16(f[12:14]) != etherType {
		return -1, nil, dgram.ErrForeign
	}
	src, pkt, err = pr.Decode(f[EthHeader:], self, size, n)
	if err != nil {
		return -1, nil, err
	}
	if src >= len(macs) || !sameMAC(f[6:12], macs[src]) {
		return -1, nil, dgram.ErrForeign
	}
	return src, pkt, nil
}

// sameMAC reports whether the 6 bytes at a are address b (which may be
// nil or short: then false), in two loads rather than a call to memequal.
func sameMAC(a []byte, b net.HardwareAddr) bool {
	return len(b) == 6 && binary.LittleEndian.Uint32(a) == binary.LittleEndian.Uint32(b) &&
		binary.LittleEndian.Uint16(a[4:]) == binary.LittleEndian.Uint16(b[4:])
}

// newProver returns the prover of the job's frames.
func newProver(secret []byte) (*dgram.Prover, error) {
	return dgram.NewProver(dgram.DeriveKey(secret, keyLabel), Magic)
}
