// Package xdp is amgo's AF_XDP network: Active Messages in raw Ethernet
// frames that bypass the kernel's socket stack. An XDP program on the
// interface (assembled with cilium/ebpf's asm package: no C compiler at
// build time) redirects amgo's frames to the ranks' AF_XDP sockets, whose
// rings the ranks read and write in shared memory with the kernel; a send
// costs one sendto(2) that only kicks the transmit ring. Like udp, the
// network is unordered and lossy at its level: its Caps say neither
// Ordered nor Reliable, so package am wraps it in the reliability layer
// (am/internal/reliable). It registers itself as "xdp"; open it with
// transport.Open("xdp", bootstrap, opts) or New. It needs root (CAP_NET_RAW
// for the socket, CAP_BPF and CAP_NET_ADMIN for the program); without it,
// or on a kernel without AF_XDP, New fails with an error that wraps
// ErrUnavailable and names what is missing.
//
// # Frames
//
// A frame is an Ethernet header (the destination and source ranks'
// interface addresses, EtherType 0x88B5, IEEE 802's Local Experimental
// EtherType 1, or option "ethertype") followed by the framing of udp's
// datagrams with its own magic "amX1" and key label: source rank,
// destination rank, the sender's 64-bit frame number, the packet, and a
// 16-byte GMAC proof keyed from the job secret (AMGO_JOB_SECRET, else drawn
// by rank 0 and published as "amgo.xdp.secret"). A frame that is short, not
// addressed to this interface, of another EtherType or magic, from an
// interface other than the claimed rank's, misdirected, or wrongly proved is
// dropped and counted (Stats); DecodeFrame is that check and is fuzzed.
//
// Why an EtherType and not UDP: the ranks publish their interfaces' MAC
// addresses through PMI, so a frame needs neither ARP nor IP, the XDP
// program recognises amgo's frames by two bytes, and the host's own
// traffic (ARP, IP) passes the program untouched. The cost is that frames
// do not cross IP routers: the hosts of a job share one Ethernet segment,
// as the nodes of a cluster's network do.
//
// MaxPacket is the smallest MTU among the job's interfaces, plus the
// 14-byte Ethernet header, less the 50 bytes of framing: 1464 bytes on a
// 1500-byte MTU, 8964 on a jumbo MTU of 9000. A frame fits one 4096-byte
// UMEM chunk (3840 bytes: the kernel keeps 256 bytes of headroom) unless
// every rank's kernel has multi-buffer AF_XDP (XDP_USE_SG, Linux 6.6) and
// the MTU calls for more: then a frame spans up to three chunks (at most
// 11520 bytes), sent from three adjacent chunks as descriptors marked
// XDP_PKT_CONTD and gathered on arrival, since its proof covers it whole;
// option "sg" off keeps a frame per chunk. Package am fragments larger
// messages into stores of MaxPacket.
//
// # The program and its sockets
//
// The XDP program checks the EtherType and redirects the frame, through an
// XSKMAP indexed by rank, to the socket of the rank the frame names as its
// destination; a frame for no rank of this interface, and every frame of
// another EtherType, goes on to the kernel's stack. The program is attached
// through a BPF link, which the kernel detaches when its last descriptor
// closes, so a rank that is killed leaves nothing attached, and the next
// job on the interface starts at once (binding a queue right after its
// previous socket closed can fail with EBUSY for tens of milliseconds:
// New retries for up to 2 s). An interface carries one job: a second job's
// attach fails (EBUSY) with an error naming the cause. A program attached
// through netlink instead (by a tool, or an older loader) stays after its
// process exits; when the interface's slot is taken by such a program under
// amgo's name (ProgramName, "amgo_xdp"), which no running job can hold that
// way, New detaches it through rtnetlink and attaches its own; a program
// under another name is left alone and New fails.
//
// Option "mode" chooses the attach mode: "auto" (the default) uses generic
// mode on a veth, whose native mode only adds a hop through the veth's own
// ring and never offers zero-copy (measured slower), and else driver mode
// where the driver has it, falling back to generic; the socket binds in
// zero-copy mode when the driver offers it in driver mode, else in copy
// mode (Interface reports which).
//
// # Several ranks on one interface
//
// The kernel keeps one buffer pool (UMEM) per interface queue, so every
// socket bound to one queue must share one UMEM. The job's ranks on one
// interface (those that published the same MAC address) bind one queue
// (option "queue", default 0) and share: the first of them (the
// interface's leader) makes the UMEM in a memfd, with its fill and
// completion rings, attaches the program and binds; after a fence the
// others fetch, over an abstract Unix socket named after the job, the
// interface and the queue, the leader's socket, the memfd, the XSKMAP and
// the BPF link (SCM_RIGHTS), map the memfd, bind their own sockets with
// XDP_SHARED_UMEM and put them in the XSKMAP. Each rank holds the link and
// the leader's socket, so the program stays attached and the UMEM alive
// until the interface's last rank of the job leaves. Receive frames are one
// pool in the shared fill ring; each rank has its own send frames; the
// fill and completion rings, which the ranks share, are guarded by locks in
// a control page after the frames (umem.go). Ranks on one interface cannot
// reach each other through it (a frame leaves the interface, it does not
// come back): Send to one is a transport.ErrPeer; in a job over several
// nodes they talk over shm, and xdp carries the traffic between nodes
// (AMGO_NET=xdp).
//
// A NIC with several receive queues must steer amgo's EtherType to the
// queue the ranks bind (ethtool -N ... action QUEUE, or a single combined
// queue): the kernel hands a redirected frame only to a socket bound to the
// queue it arrived on. A veth has one queue.
//
// # Rings
//
// Each ring's producer and consumer words are shared with the kernel: a
// side loads the other's word before it touches the entries that word
// covers and stores its own after it has written or read them (ring.go).
// Send writes the frame into one of the rank's free send frames, puts its
// descriptor on the tx ring and kicks with sendto(MSG_DONTWAIT); copy mode
// transmits only inside that call. Reaping the completion ring marks frames
// free again; with every send frame in flight, Send returns
// transport.ErrWouldBlock. Poll reads the rx ring, checks and delivers each
// frame in place and returns the frames to the fill ring; it also kicks
// frames a transient refusal left in the tx ring. Sends to this rank itself
// go through a bounded in-process queue (256 KiB; internal/selfq, as tcp's) that Poll delivers.
//
// # Waiting
//
// Wait watches the rx ring's producer word for up to the spin time (option
// "spin", default 20 us), then sleeps in ppoll on the socket and an eventfd
// that Wake writes (transport.Waker); Sleep is Wait without the spin
// (transport.Sleeper).
//
// # Failures
//
// A peer that exits or crashes stops answering; the reliability layer
// declares it dead after DeadAfter (3 s) without acknowledgement while
// packets to it are outstanding, as over udp.
//
// # Options
//
//	iface      interface name, or an IP address of it [AMGO_IFACE]
//	queue      receive queue the job's ranks on the interface bind, default 0 [AMGO_XDP_QUEUE]
//	mode       XDP attach mode: auto, driver or generic [AMGO_XDP_MODE]
//	ethertype  the frames' EtherType, default 0x88b5 [AMGO_XDP_ETHERTYPE]
//	sg         frames over several chunks where the kernel has them: on (default) or off [AMGO_XDP_SG]
//	spin       how long Wait polls before sleeping, default 20us [AMGO_XDP_SPIN]
//	secret     the job secret in hex [AMGO_JOB_SECRET]
package xdp
