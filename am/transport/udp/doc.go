// Package udp is amgo's unordered, lossy network between processes on many
// hosts: one non-blocking UDP socket per rank, driven with raw system calls
// from the polling goroutine, and a per-job secret proved in every datagram.
// It is an AM platform without ordered delivery: its Caps say
// neither Ordered nor Reliable, so package am wraps it in the reliability
// layer (am/internal/reliable: sequence numbers, acknowledgements,
// retransmission, duplicate suppression), exactly once, as for sim. It
// registers itself as "udp"; open it with transport.Open("udp", bootstrap,
// opts) or New.
//
// # Addresses
//
// Each rank binds one port of the interface the job uses, chosen as package
// tcp chooses it: option "iface" or $AMGO_IFACE (an interface name, whose
// first IPv4 address, else first global IPv6 one, is used, or an IP address);
// by default the IPv4 address the host name resolves to when it belongs to
// this host, else 127.0.0.1. Never the unspecified address. The rank
// publishes host:port under "amgo.udp.<rank>" and fences once; there are no
// connections.
//
// # Datagrams and membership
//
// The job secret is $AMGO_JOB_SECRET (hex, at least 16 bytes; amrun draws
// one per job), else 16 random bytes that rank 0 draws and publishes under
// "amgo.udp.secret" before the fence. Every datagram carries one packet:
//
//	offset  size  field
//	0       4     magic "amU2" (little-endian uint32 0x32556d61)
//	4       4     source rank (little-endian uint32)
//	8       4     destination rank
//	12      8     the sender's datagram number (little-endian uint64)
//	20      n     the packet: amgo wire header, arguments, payload
//	20+n    16    proof: the GMAC tag of bytes 0 .. 20+n
//
// The proof is AES-256-GCM used as a MAC (GMAC, NIST SP 800-38D): nothing
// is encrypted, the datagram's bytes are the additional authenticated data,
// the key is HMAC-SHA256(secret, "amgo-udp2 datagram key") and the 12-byte
// nonce is the source rank and the datagram number. GMAC is only as strong
// as its nonces are unique: a sender numbers its datagrams from a random
// 64-bit value drawn when it opens, so no two datagrams of a job share a
// nonce. Poll drops and counts (Stats) every datagram that is shorter than
// the framing or truncated (Short), lacks the magic or comes from an
// address other than the one the claimed source rank published (Foreign),
// names a source outside the job or another destination (Misdirected), or
// carries a wrong proof (BadProof), checked in constant time;
// DecodeDatagram is that check and is fuzzed (FuzzDatagram). A forged
// datagram needs the secret; a replayed one is a duplicate that the
// reliability layer discards (its sequence number is behind or already
// buffered). The proof costs about 0.13 us for a 64-byte packet and runs at
// about 5 GB/s for large ones on the CI VM (BenchmarkProof), against 0.3 us
// and 1.4 GB/s for the HMAC-SHA256 of the first framing ("amU1").
//
// MaxPacket is 65507 (the largest UDP payload over IPv4) minus the 36 bytes
// of framing: 65471. On a real network such a datagram is sent as IP
// fragments, and losing one loses all: option "max_packet" (for example 1436
// on an Ethernet MTU of 1500: 1500 minus 20 bytes of IPv4 header, 8 of UDP
// and 36 of framing) keeps datagrams unfragmented.
//
// # Sending
//
// Send copies the frame header and the caller's two slices into one of 8
// send buffers (the one of dst modulo 8, made on first use; GMAC needs the
// bytes it proves contiguous, and copying 64 KiB costs a fraction of proving
// it), appends the proof and writes the datagram with one
// sendto(MSG_DONTWAIT): no allocation, and at most 8 × 64 KiB of buffers
// whatever the job's size. A full socket send buffer (EAGAIN) returns
// transport.ErrWouldBlock (Stats.WouldBlocks; the reliability layer counts
// such a packet as lost and retransmits it); ENOBUFS, unreachable hosts and
// the like lose the datagram silently (Stats.SendErrors), as the network may.
// A rank sends to itself through its own socket like to anyone else.
//
// # Receiving
//
// Poll calls recvfrom(MSG_DONTWAIT|MSG_TRUNC) into one 64 KiB buffer until
// the socket is empty or it has delivered max packets, and hands each packet
// up in place. There is no goroutine and no netpoller on the data path: the
// Go netpoller's wake-up costs 30-40 us on small VMs, against 3-4 us for a
// busy-polled datagram (docs/transports.md).
//
// # Waiting
//
// Wait polls the socket with ppoll and a zero timeout for up to the spin
// time (option "spin", default 20 us), then sleeps in ppoll until the socket
// is readable or the timeout passes (Caps.Wakeup). Wake (transport.Waker)
// writes an eventfd that the same ppoll watches, and sets a flag, so that a
// Wake before a Wait makes that Wait return at once.
//
// # Failures
//
// UDP has no connection to lose: a peer that exits or crashes simply stops
// answering, and the reliability layer declares it dead after DeadAfter
// (3 s) without acknowledgement while packets to it are outstanding (an
// error wrapping transport.ErrPeer naming the rank).
//
// # Concurrency
//
// As transport.Transport says: Sends to different destinations, Poll and
// Wait may run concurrently (Sends to destinations of the same send buffer
// take turns at its lock). Close must not run concurrently with anything
// else.
//
// # Options
//
//	iface       interface name or IP address to bind to [AMGO_IFACE]
//	port        UDP port, default 0: any free port [AMGO_UDP_PORT]
//	spin        how long Wait polls before sleeping, a Go duration (default 20us) [AMGO_UDP_SPIN]
//	buf_bytes   SO_RCVBUF and SO_SNDBUF (the FORCE variants when permitted), default 4 MiB [AMGO_UDP_BUF_BYTES]
//	max_packet  largest packet, 1024..65471, default 65471 [AMGO_UDP_MAX_PACKET]
//	secret      the job secret in hex [AMGO_JOB_SECRET]
package udp
