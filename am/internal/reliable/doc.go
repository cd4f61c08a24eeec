// Package reliable gives amgo ordered, exactly-once delivery per peer over a
// network that may lose, reorder and duplicate packets (UDP, a simulated
// network): the sequence numbers that MPI over SP AM says a network without
// ordered delivery needs (Chang, Czajkowski, Hawblitzel, Hu and von Eicken,
// "Low-Latency Communication on the IBM RISC System/6000 SP", Supercomputing
// 1996), done once, below package am, as SP AM and AMUDP do it.
//
// # Guarantees
//
// Between two ranks, in each direction: every packet that Send took is handed
// up exactly once, in the order Send took it, unchanged (the sequence
// extension this layer adds on the way is removed on arrival). Send never loses a packet to a full
// window: it refuses it (ErrWindowFull, transport.ErrWouldBlock through Wrap)
// and the caller retries. Memory is bounded: at most Window packets per peer
// wait for acknowledgement and at most Window received packets per peer wait in
// order or out of order. A peer from which nothing arrives for DeadAfter while
// packets to it are outstanding is declared dead (DeadPeerError, ErrPeerDead);
// its outstanding packets are dropped and further Sends to it fail.
//
// # Use
//
// The protocol is an Engine: a state machine in the style of go.etcd.io/raft.
// It does no I/O, starts no goroutine and reads no clock. The caller:
//
//  1. feeds it packets to send (Send) and packets from the network (Receive),
//     and the time with every call;
//  2. calls Tick when NextDeadline has passed;
//  3. collects Ready: Messages to transmit (losing some is fine), Deliveries to
//     hand up in order, Dead peers;
//  4. calls Advance (or AdvanceMessages and AdvanceDeliveries separately, when
//     deliveries are handed up outside a lock) once it has acted on them.
//
// In code:
//
//	e, _ := reliable.New(reliable.Config{Peers: n, Self: me})
//	e.Send(now, dst, pkt)               // or ErrWindowFull: poll, then retry
//	e.Receive(now, src, arrived)        // from the network
//	if !now.Before(e.NextDeadline()) { e.Tick(now) }
//	rd := e.Ready()
//	for _, m := range rd.Messages   { net.Send(m.To, m.Data) }
//	for _, d := range rd.Deliveries { up.Deliver(d.From, d.Data) }
//	e.Advance()
//
// Wrap does all of this for a transport.Transport whose Caps lack Ordered or
// Reliable, and returns a transport with both; package am calls it in am.New.
//
// # Algorithm
//
// Per destination, a sliding window of Window packets (SP AM, Chang et al.,
// SC'96, §"reliable, ordered delivery"; AMUDP's "thin reliability layer").
// Send stamps the next sequence number into Seq; sequence numbers start at
// Config.InitialSeq (1) and run through 2^32-1, then 1 again: 0 means "not
// sequenced". Internally each stream counts with 64 bits and maps a received
// 32-bit value to the count nearest the expected one (serial-number
// arithmetic, RFC 1982), so wrapping is invisible.
//
// Every packet to a peer carries the cumulative acknowledgement of that peer's
// stream in Ack: the next sequence number expected from it, stamped when the
// packet is handed out in Ready (retransmissions included). When no packet
// leaves to carry it, the receiver sends a standalone ack: at once when a
// quarter of the window is unacknowledged (SP AM's explicit ack), when a packet
// arrives out of order (SP AM's NACK, here a selective ack), or as a duplicate
// (our ack was lost), and otherwise AckDelay after the first unacknowledged
// arrival. A standalone ack also carries a selective-ack bitmap, so the sender
// learns exactly which packets after the first hole have arrived.
//
// The sender retransmits in two ways. Selectively, at once: a hole is lost when
// DupThresh (3) packets transmitted no earlier than it have been selectively
// acknowledged and it has been out longer than a reordering window of
// SRTT/4 + RTTVAR (RFC 6675's DupThresh with RACK's use of time, RFC 8985). On
// timeout: go-back-N over the window, skipping what was selectively
// acknowledged (SP AM's go-back-N), with the timeout doubled up to RTOMax.
// The timeout adapts to the round trip (Jacobson/Karels as in RFC 6298: SRTT,
// RTTVAR, RTO = SRTT + 4·RTTVAR within [RTOMin, RTOMax]); following Karn, no
// sample is taken from a packet that was retransmitted, and a backed-off
// timeout stays until a clean sample arrives.
//
// The receiver keeps a reorder buffer of Window slots per source: a packet
// below the next expected number, or one already buffered, is a duplicate
// (dropped, counted, re-acknowledged); one at or beyond the expected number
// plus Window is malformed (no correct sender sends it); one that fits but
// finds the buffer still full of packets the caller has not consumed is an
// overrun (dropped and acknowledged; the sender retransmits later). Malformed
// packets (not decodable by wire.Decode, a source that differs from the
// network's, Seq 0 on anything but a standalone ack, an Ack or selective ack
// of packets never sent, Seq beyond the window) are dropped and counted and
// change no state.
//
// Liveness: the dead-peer clock restarts on acknowledgement progress and on
// every valid packet from the peer. A peer whose caller has stopped consuming
// still answers retransmissions with acks, so back-pressure is never mistaken
// for death; a crashed peer answers nothing.
//
// # Wire use
//
// Data packets are the caller's packets with the wire header's sequence
// extension (wire.FlagSeq: Seq at bytes 24-27, Ack at 28-31) inserted after
// the 24-byte core; the receiving engine removes it before handing the packet
// up, so the caller gets back exactly the bytes it sent. The standalone ack is
// a wire packet of kind ack (6) with FlagSeq only, Seq 0, Ack as above, Len 0, and 0 to 16
// arguments: bit i of argument k set means packet Ack+1+64k+i has arrived. It
// is consumed by the engine and never handed up; package am's own acks
// (credit returns) always carry FlagFree and a sequence number. docs/wire.md,
// "Reliability layer", has the byte layout.
//
// # Tunables (Config)
//
//	Window           128 packets per peer and direction (1..1024)
//	RTOInit          20 ms before the first round-trip sample
//	RTOMin, RTOMax   5 ms, 1 s
//	AckDelay         1 ms
//	DeadAfter        3 s (so that am reports a failed rank within 5 s)
//	ProgressInterval 1 ms (Wrap only: the progress goroutine's period)
//	InitialSeq       1 (tests start near 2^32)
//
// Window, InitialSeq and the meaning of the fields must agree on every rank of
// a job; the timers need not.
//
// # Wrap
//
// The wrapped transport serializes the engine and the underlying Send/Poll
// behind one mutex and hands packets up with it released, so that a handler
// may send. Send that finds the window full first takes in what has arrived
// (acks may free the window), then returns transport.ErrWouldBlock. When no
// Send, Poll or Wait has run for ProgressInterval, a goroutine runs the
// protocol on the caller's behalf (arrivals wait in the engine for the next
// Poll), so that a rank that has stopped calling its transport still
// acknowledges and retransmits. Caps: Ordered and Reliable, MaxPacket of the
// network, no Put (a single-copy put over a lossy network would bypass this
// layer).
package reliable
