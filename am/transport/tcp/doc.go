// Package tcp is amgo's transport between processes on many hosts: one TCP
// connection per pair of ranks, driven with raw non-blocking system calls
// from the polling goroutine, with a per-job secret that every connection
// must prove before its traffic is accepted. It registers itself as "tcp";
// open it with transport.Open("tcp", bootstrap, opts) or New.
//
// # Addresses
//
// Each rank listens on one port of the interface the job uses: option
// "iface" or $AMGO_IFACE, an interface name (lo, eth0: its first IPv4
// address, else its first global IPv6 one) or an IP address; by default the
// IPv4 address the host name resolves to when it belongs to this host, else
// 127.0.0.1. It never listens on the unspecified address (0.0.0.0, ::). The
// rank publishes host:port under "amgo.tcp.<rank>" and fences; it connects to a
// peer only on its first Send or Put to it.
//
// # Handshake
//
// The job secret is $AMGO_JOB_SECRET (hex, at least 16 bytes; amrun draws
// one per job), else 16 random bytes that rank 0 draws and publishes as
// "amgo.secret" before the fence. Every connection starts with a
// challenge-response, so that the secret never crosses the network:
//
//	acceptor -> dialer  challenge  "amgoTCP1", version, rank, size, nonce A (16 bytes)
//	dialer -> acceptor  hello      "amgoTCP1", version, rank, size, nonce D,
//	                               HMAC-SHA256(secret, "amgo-tcp-hello" A D dialer acceptor size)
//	acceptor -> dialer  welcome    status, HMAC-SHA256(secret, "amgo-tcp-welcome" D A acceptor dialer status)
//
// (ranks, size, version and status are little-endian uint32.) The acceptor
// closes a connection whose hello is malformed, names another job size or
// carries a wrong proof, or that has not proved itself within
// HandshakeTimeout, and counts it in Stats.Refused; the dialer checks the
// welcome's proof in turn, so neither side talks to an impostor. A replayed
// hello fails because the acceptor's nonce is fresh.
//
// Exactly one connection joins a pair. When both ranks dial each other at
// once, the connection dialed by the lower rank is kept: the higher rank
// accepts it and abandons its own dial, and the lower rank answers the
// higher rank's hello with status "duplicate" and closes that connection, so
// neither side sees a failure.
//
// The dialer's side of the handshake runs on a short-lived connector
// goroutine (so that a Send's packet goes out even if the sender does not
// poll); the acceptor's side runs in Poll, a non-blocking step at a time:
// accepting writes the challenge and returns, and the hello is read when
// epoll reports it. Connections from outside the job therefore cost the
// progress path a few system calls each. At most MaxHandshakes accepted
// connections wait for their hello; the next one refuses the oldest, so a
// flood of silent connections holds a bounded number of descriptors.
//
// # Framing
//
// On an open connection every frame starts with a little-endian uint32 word:
//
//	0 .. MaxPacket   a packet of that many bytes follows (header, arguments
//	                 and payload as given to Send)
//	0x80000000       a put: destination address uint64, length uint64, then
//	                 the data
//	0xffffffff       goodbye: the sender closes cleanly
//
// Any other word, or a put longer than 2^40 bytes, closes the connection
// (Stats.Malformed) and fails the peer. A goodbye makes the peer's end a
// clean close: later Sends to it return transport.ErrPeer ("has closed"), and
// Poll reports nothing. An end of stream or reset without a goodbye makes
// Send, Put and Poll return an error wrapping transport.ErrPeer that names
// the rank (Poll after delivering the packets that arrived before).
//
// # Sending
//
// Send never blocks. When the connection is open and nothing waits before it,
// it writes the length word, header and payload with one
// sendmsg(MSG_DONTWAIT|MSG_NOSIGNAL) straight from the caller's slices; what
// the kernel does not take is copied to the peer's user-space send queue,
// which Poll, Wait and later Sends flush. When the queue holds sendq_bytes,
// Send returns transport.ErrWouldBlock (Stats.WouldBlocks).
//
// # Receiving
//
// Poll reads each open connection with read(2) on its non-blocking socket
// into a per-connection buffer (128 KiB, grown to hold a whole packet) and
// hands complete packets to the Receiver in place, without a copy. Up to four
// connections it reads each of them directly on every Poll, and keeps them
// out of the epoll set: a socket in an epoll set costs the kernel wake-up
// work on every arriving packet, on the sender's critical path (about 0.17 us
// per half round trip on loopback). Beyond four it puts them all in the set
// and asks epoll (with a zero timeout) which are readable. Every 16th Poll, and
// every Poll while no connection is open, it also takes epoll's events for
// the listening socket and the handshakes. No goroutine and no netpoller sit
// on the data path: the Go netpoller's wake-up costs 30-40 us on small VMs.
// Reads and sends of at most 512 KiB plus a put header (put data always moves
// in such pieces; only a packet or read buffer larger than that goes through
// the runtime), and the zero-timeout epoll_wait, are raw system calls
// (sys.go): they never sleep, so they skip the runtime's
// entersyscall/exitsyscall, which costs about 0.2 us per 8-byte half round
// trip here and, on a copy longer than sysmon's 20 us tick, a context switch
// (sysmon hands the P to another thread, which preempts the copying one).
//
// # Puts
//
// Put (transport.Putter) writes a put frame straight from the caller's
// buffer, at most 512 KiB per sendmsg, and returns when the kernel has taken
// the last byte. The receiver
// asks the PutResolver that package am installed (transport.PutTargeter) for
// the destination of (address, length) and reads the data off the socket
// straight into it: one copy on each side, as for any TCP transfer, and none
// in user space. A range the resolver refuses is read into a scratch buffer
// and dropped (Stats.PutsDropped). Because the connection is ordered, a packet
// sent after Put returns (am's store-done) is delivered after the data has
// landed. Data of a put may land before packets that preceded it are
// delivered (Poll reads ahead of delivery), never after. PutSend
// (transport.PutSender) writes such a packet in the same sendmsg as the
// data's last piece: one system call per store fewer.
//
// While the socket is full, Put reads its own input without delivering it
// (buffering up to 8 MiB of packets per connection), so that two ranks
// putting to each other cannot deadlock; it spins for 50 us, then sleeps in
// ppoll until the socket drains. Put needs a PutResolver on the sending rank
// as well (package am installs one on every rank); without one it returns
// transport.ErrPutUnsupported, as there is nothing that could name memory.
//
// # Waiting
//
// Wait returns at once if packets are waiting; otherwise it pumps the
// sockets for up to the spin time (option "spin", default 20 us) and then
// sleeps in ppoll on the epoll descriptor (the listening socket, handshakes,
// an eventfd that self-sends, queued output and changes to the set of open
// connections ring, and the open connections when there are more than four),
// on the open connections outside the epoll set, and on the sockets whose
// queued output waits for room, for at most the timeout. A connection that
// ends, with or without a goodbye, makes its socket readable and so wakes it.
// Wake (transport.Waker) ends a Wait in progress from another goroutine, or
// makes the next one return at once: it sets a flag the readiness check sees
// and writes the eventfd; package route's waiters use it to wake a rank that
// sleeps on tcp when its node's shared memory has traffic.
//
// # Concurrency
//
// As transport.Transport says: Sends to different destinations, Poll, Put and
// Wait may run concurrently (Sends to one destination are serialized by the
// caller). Poll holds a mutex for its whole run, Wait's spin and Put's input
// reading only try it. Close must not run concurrently with anything else.
//
// # Options
//
//	iface        interface name or IP address to listen on [AMGO_IFACE]
//	port         TCP port, default 0: any free port [AMGO_TCP_PORT]
//	sendq_bytes  bound of each peer's send queue, default 4 MiB; suffixes k
//	             and m allowed [AMGO_TCP_SENDQ_BYTES]
//	spin         how long Wait pumps before sleeping, a Go duration
//	             (default 20us) [AMGO_TCP_SPIN]
//	secret       the job secret in hex [AMGO_JOB_SECRET]
//	congestion   TCP congestion control: empty (the default) sets
//	             LocalCongestion, reno, on connections between ranks of
//	             one host and leaves the system's elsewhere; "system"
//	             never sets one; any other name (one of
//	             /proc/sys/net/ipv4/tcp_allowed_congestion_control, or
//	             any available one for root) is set on every connection,
//	             and New fails if the kernel refuses it
//	             [AMGO_TCP_CONGESTION]
//
// # Congestion control
//
// The kernel's default congestion control is often bbr, which paces every
// connection with timers. Between two ranks of one host (a loopback address,
// or the address this rank listens on) nothing is congested, and the pacing
// timers' softirqs and the reordering they cause halve the bandwidth of a
// stream (docs/transports.md), so those connections get reno unless option
// "congestion" says otherwise. Connections between hosts keep what the administrator chose.
//
// # Performance
//
// Measured on a 2-vCPU Firecracker VM over loopback (go test -bench, both
// ranks busy-polling in separate processes): see docs/transports.md.
package tcp
