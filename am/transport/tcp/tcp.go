//go:build linux

package tcp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/amgo-hpc/amgo/am/transport"
	"github.com/amgo-hpc/amgo/am/transport/internal/jobsecret"
	"github.com/amgo-hpc/amgo/am/transport/internal/netaddr"
	settings "github.com/amgo-hpc/amgo/am/transport/internal/opts"
	"github.com/amgo-hpc/amgo/am/transport/internal/selfq"
)

func init() {
	transport.Register("tcp", New)
}

// Limits and defaults.
const (
	// MaxPacket is the largest packet (header, arguments and payload) one Send
	// takes, in bytes.
	MaxPacket = 1 << 20
	// PutMin is the smallest store, in bytes, for which Put beats packets:
	// above it, store fragments (each most of the 16 KiB per-peer buffer)
	// would travel one per acknowledgement, while a put frame streams
	// (several times the bandwidth from 16 KiB on; docs/performance.md);
	// below it the extra frame and the receiver's lookup cost more.
	PutMin = 4 << 10
	// BufferBytes is the per-peer receive buffer package am keeps for tcp
	// peers (transport.Caps.BufferBytes), 1 MiB: a hop costs microseconds
	// here, so medium requests of up to 64 KiB (one copy into the socket
	// and one out) beat a rendezvous's extra round trip, as with Open MPI's
	// TCP eager limit, and sixteen of them fit in flight (62 of 16 KiB,
	// nearly a whole window of osu's bandwidth test; docs/mpi.md measures
	// 256 KiB against 1 MiB). It is credit, not memory: the data waits in
	// the sockets' buffers.
	BufferBytes = 1 << 20
	// DefaultSendQueue is the default bound of each peer's user-space send
	// queue, in bytes (option "sendq_bytes").
	DefaultSendQueue = 4 << 20
	// DefaultSpin is how long Wait polls before it sleeps in the kernel
	// (option "spin"): waking a sleeping thread costs 30-40 us on small VMs.
	DefaultSpin = 20 * time.Microsecond
	// LocalCongestion is the TCP congestion control set, by default, on a
	// connection whose two ends are on one host (option "congestion"): the
	// kernel's default here, bbr, paces every connection, and on loopback,
	// where nothing is congested, the pacing timers and the reordering they
	// cause cost about half the bandwidth (docs/transports.md). Every kernel
	// has reno, and any user may set it.
	LocalCongestion = "reno"
	// HandshakeTimeout is how long an accepted connection may take to prove
	// membership of the job before it is refused.
	HandshakeTimeout = 10 * time.Second
)

// Frame length words (little-endian uint32 before every frame).
const (
	wordPut = 0x8000_0000 // put: addr uint64, n uint64, then n bytes of data
	wordBye = 0xffff_ffff // goodbye: the sender closes cleanly
	putHdr  = 20          // word, addr, n
)

// readLimit bounds the undelivered packets one connection's read buffer holds
// while Put reads input without delivering it, in bytes.
const readLimit = 8 << 20

// initialRead is the initial size of a connection's read buffer.
const initialRead = 128 << 10

// directMax is the number of open connections up to which Poll reads each of
// them directly instead of asking epoll which are readable. Up to it the open
// connections stay out of the epoll set (Wait ppolls them one by one): a
// socket in an epoll set costs the kernel wake-up work on every packet that
// arrives, on the sender's critical path (about 0.17 us per half round trip
// on loopback).
const directMax = 4

// Stats are a transport's counters since New. Bytes count frame bytes on
// open connections (length words included); handshakes are not counted.
type Stats struct {
	// Refused counts incoming connections closed without a valid proof of job
	// membership: garbage, a wrong magic or version, a wrong HMAC, a
	// handshake that timed out.
	Refused uint64
	// Malformed counts open connections closed because their peer sent an
	// invalid frame (a length above MaxPacket, an unknown frame word).
	Malformed uint64
	// Duplicates counts connections closed by the simultaneous-dial tie-break.
	Duplicates uint64
	// Accepted and Dialed count connections that completed the handshake.
	Accepted, Dialed uint64
	// BytesSent and BytesReceived count frame bytes written and read.
	BytesSent, BytesReceived uint64
	// PacketsSent and PacketsReceived count packets (self-sends included).
	PacketsSent, PacketsReceived uint64
	// WouldBlocks counts Sends refused with transport.ErrWouldBlock.
	WouldBlocks uint64
	// PutsSent and PutsReceived count single-copy puts; PutsDropped counts
	// received puts whose range the PutResolver refused (their data was
	// read and discarded).
	PutsSent, PutsReceived, PutsDropped uint64
}

type counters struct {
	refused, malformed, duplicates, accepted, dialed atomic.Uint64
	bytesOut, bytesIn, pktsOut, pktsIn, wouldBlock   atomic.Uint64
	putsOut, putsIn, putsDropped                     atomic.Uint64
}

// Transport is one rank's TCP attachment. It implements transport.Transport,
// transport.Putter and transport.PutTargeter.
type Transport struct {
	rank, size int
	caps       transport.Caps
	secret     []byte
	spin       time.Duration
	sendq      int
	addrs      []unix.Sockaddr // peers' listening addresses
	family     int
	ip         netip.Addr // the address this rank listens on
	ccAll      string     // congestion control for every connection ("" = the system's)
	ccLocal    string     // congestion control for same-host connections ("" = the system's)
	lfd        int        // listening socket
	epfd       int
	efd        int // eventfd: wakes Wait for self-sends and queued output
	laddr      string

	resolver atomic.Pointer[transport.PutResolver]
	// direct holds the descriptors of the open connections that are not in
	// the epoll set (all of them while there are at most directMax), for
	// Wait and Put to sleep on; replaced, never modified.
	direct   atomic.Pointer[[]int32]
	closed   atomic.Bool
	sleepers atomic.Int32
	woken    atomic.Bool // Wake was called: the next look of Wait returns
	anyDead  atomic.Bool
	avail    atomic.Bool // complete packets wait in read buffers (set under pollMu)
	st       counters

	peers []peer

	// Dials in the handshake, driven by the connector goroutine, and dials
	// that opened, handed to the poller.
	dialMu     sync.Mutex
	dials      []*conn
	connecting bool
	connWG     sync.WaitGroup
	newOpen    []*conn
	nNew       atomic.Int32

	self selfq.Queue

	// Owned by the poller (pollMu): Poll, Wait's spin, Put's progress.
	pollMu sync.Mutex
	open   []*conn // open connections, and dead ones still holding packets
	hs     []*conn // connections in the handshake
	byFd   map[int]*conn
	dirty  bool // open changed since syncPolled
	evs    [64]unix.EpollEvent
	tick   uint
	next   int
	drop   []byte // scratch for refused puts
}

// peer is the sending side towards one rank; padded against false sharing
// between Sends to different ranks.
type peer struct {
	_       [64]byte
	mu      sync.Mutex
	c       *conn // open connection
	dialing *conn // our dial, in the handshake
	out     []byte
	head    int
	putting bool  // a Put streams on c: others only queue
	err     error // the peer failed: every later Send and Put returns it
	gone    bool  // the peer closed cleanly
	pending atomic.Bool
	putMu   sync.Mutex // serializes Puts to this peer
	_       [64]byte
}

// New opens rank b.Rank()'s TCP transport for a job of b.Size() ranks; the
// result is a *Transport. It listens on one port of the interface the job
// uses, publishes host:port under "amgo.tcp.<rank>" and calls b.Fence once, so
// every rank must call New concurrently. Without AMGO_JOB_SECRET, rank 0 draws
// the job secret and publishes it as "amgo.secret". opts (each also read from
// the environment variable in brackets when absent):
//
//	iface        interface name or IP address to listen on [AMGO_IFACE]
//	port         TCP port to listen on, default 0 (any) [AMGO_TCP_PORT]
//	sendq_bytes  bound of each peer's send queue, default 4 MiB [AMGO_TCP_SENDQ_BYTES]
//	spin         how long Wait polls before sleeping, default 20us [AMGO_TCP_SPIN]
//	secret       the job secret in hex [AMGO_JOB_SECRET]
//
// Errors: bad options or secret, no usable interface, socket failures, and
// bootstrap failures, each naming the rank.
func New(b transport.Bootstrap, opts map[string]string) (transport.Transport, error) {
	t, err := open(b, opts)
	if err != nil {
		return nil, err
	}
	return t, nil
}

func open(b transport.Bootstrap, opts map[string]string) (*Transport, error) {
	rank, size := b.Rank(), b.Size()
	if size < 1 || rank < 0 || rank >= size {
		return nil, fmt.Errorf("tcp: bad job shape: rank %d of %d", rank, size)
	}
	sendq, err := settings.Bytes(opts, "sendq_bytes", "AMGO_TCP_SENDQ_BYTES", DefaultSendQueue, 1, 1<<30)
	if err != nil {
		return nil, err
	}
	spin, err := settings.Duration(opts, "spin", "AMGO_TCP_SPIN", DefaultSpin)
	if err != nil {
		return nil, fmt.Errorf("tcp: %w", err)
	}
	port, err := settings.Port(opts, "port", "AMGO_TCP_PORT")
	if err != nil {
		return nil, fmt.Errorf("tcp: %w", err)
	}
	cc := settings.Get(opts, "congestion", "AMGO_TCP_CONGESTION")
	secret, err := jobsecret.Before(b, opts, "amgo.secret")
	if err != nil {
		return nil, fmt.Errorf("tcp: rank %d: %w", rank, err)
	}
	ip, err := netaddr.Choose(opts)
	if err != nil {
		return nil, fmt.Errorf("tcp: rank %d: %w", rank, err)
	}
	t := &Transport{rank: rank, size: size, secret: secret, spin: spin, sendq: sendq,
		lfd: -1, epfd: -1, efd: -1, peers: make([]peer, size), byFd: map[int]*conn{},
		addrs: make([]unix.Sockaddr, size), ip: ip}
	switch cc {
	case "":
		t.ccLocal = LocalCongestion
	case "system":
	default:
		t.ccAll = cc
	}
	fail := func(err error) (*Transport, error) {
		t.closeFds()
		return nil, fmt.Errorf("tcp: rank %d: %w", rank, err)
	}
	if err := t.listen(ip, port); err != nil {
		return fail(err)
	}
	if t.ccAll != "" {
		// Try it on the listening socket, so that a name the kernel does
		// not know or does not allow fails here rather than on every
		// connection.
		if err := unix.SetsockoptString(t.lfd, unix.IPPROTO_TCP, unix.TCP_CONGESTION, t.ccAll); err != nil {
			return fail(fmt.Errorf("congestion control %q (option congestion, AMGO_TCP_CONGESTION): %v "+
				"(see /proc/sys/net/ipv4/tcp_allowed_congestion_control)", t.ccAll, err))
		}
	}
	key := "amgo.tcp." + strconv.Itoa(rank)
	if err := b.Put(key, t.laddr); err != nil {
		return fail(fmt.Errorf("publish %s: %w", key, err))
	}
	if err := b.Fence(); err != nil {
		return fail(fmt.Errorf("fence after publishing: %w", err))
	}
	if t.secret == nil {
		if t.secret, err = jobsecret.After(b, "amgo.secret"); err != nil {
			return fail(err)
		}
	}
	for r := 0; r < size; r++ {
		if r == rank {
			continue
		}
		k := "amgo.tcp." + strconv.Itoa(r)
		v, err := b.Get(k)
		if err != nil {
			return fail(fmt.Errorf("look up %s: %w", k, err))
		}
		ap, err := netip.ParseAddrPort(v)
		if err != nil {
			return fail(fmt.Errorf("rank %d's address %q: %w", r, v, err))
		}
		t.addrs[r] = sockaddr(ap)
	}
	t.caps = transport.Caps{Name: "tcp", Ordered: true, Reliable: true, MaxPacket: MaxPacket, PutSend: true,
		Put: true, PutMin: PutMin, Wakeup: true, BufferBytes: BufferBytes}
	return t, nil
}

// setCongestion sets the congestion control of connection fd to peer address
// sa (see LocalCongestion and option "congestion"). A kernel that refuses
// leaves the system's: the connection works either way.
func (t *Transport) setCongestion(fd int, sa unix.Sockaddr) {
	cc := t.ccAll
	if cc == "" && t.ccLocal != "" && t.sameHost(sa) {
		cc = t.ccLocal
	}
	if cc != "" {
		_ = unix.SetsockoptString(fd, unix.IPPROTO_TCP, unix.TCP_CONGESTION, cc)
	}
}

// sameHost reports whether sa is this host: a loopback address or the address
// this rank listens on (the ranks of one host listen on the same address).
func (t *Transport) sameHost(sa unix.Sockaddr) bool {
	var a netip.Addr
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		a = netip.AddrFrom4(sa.Addr)
	case *unix.SockaddrInet6:
		a = netip.AddrFrom16(sa.Addr).Unmap()
	default:
		return false
	}
	return a.IsLoopback() || a == t.ip.Unmap()
}

func sockaddr(ap netip.AddrPort) unix.Sockaddr {
	a := ap.Addr().Unmap()
	if a.Is4() {
		return &unix.SockaddrInet4{Port: int(ap.Port()), Addr: a.As4()}
	}
	return &unix.SockaddrInet6{Port: int(ap.Port()), Addr: a.As16()}
}

// listen opens the listening socket, the epoll instance and the eventfd.
func (t *Transport) listen(ip netip.Addr, port int) error {
	var err error
	t.family = unix.AF_INET
	if ip.Is6() {
		t.family = unix.AF_INET6
	}
	if t.lfd, err = unix.Socket(t.family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0); err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	_ = unix.SetsockoptInt(t.lfd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
	if err := unix.Bind(t.lfd, sockaddr(netip.AddrPortFrom(ip, uint16(port)))); err != nil {
		return fmt.Errorf("bind %s: %w", netip.AddrPortFrom(ip, uint16(port)), err)
	}
	if err := unix.Listen(t.lfd, 1024); err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	sa, err := unix.Getsockname(t.lfd)
	if err != nil {
		return fmt.Errorf("getsockname: %w", err)
	}
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		t.laddr = netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(sa.Port)).String()
	case *unix.SockaddrInet6:
		t.laddr = netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), uint16(sa.Port)).String()
	}
	if t.epfd, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
		return fmt.Errorf("epoll_create1: %w", err)
	}
	if t.efd, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC); err != nil {
		return fmt.Errorf("eventfd: %w", err)
	}
	for _, fd := range []int{t.lfd, t.efd} {
		if err := unix.EpollCtl(t.epfd, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}); err != nil {
			return fmt.Errorf("epoll_ctl: %w", err)
		}
	}
	return nil
}

// Addr is the host:port this rank listens on.
func (t *Transport) Addr() string { return t.laddr }

// Rank is this rank, 0..Size-1.
func (t *Transport) Rank() int { return t.rank }

// Size is the number of ranks in the job.
func (t *Transport) Size() int { return t.size }

// Caps: ordered, reliable, with wake-up and Put; MaxPacket is 1 MiB.
func (t *Transport) Caps() transport.Caps { return t.caps }

// SetPutResolver installs the function that maps the destination of a peer's
// Put to local memory (package am installs its segment table's). Puts that
// arrive without a resolver, or that it refuses, are read and dropped.
func (t *Transport) SetPutResolver(r transport.PutResolver) {
	if r == nil {
		t.resolver.Store(nil)
		return
	}
	t.resolver.Store(&r)
}

// Stats returns a snapshot of the counters.
func (t *Transport) Stats() Stats {
	s := &t.st
	return Stats{Refused: s.refused.Load(), Malformed: s.malformed.Load(), Duplicates: s.duplicates.Load(),
		Accepted: s.accepted.Load(), Dialed: s.dialed.Load(),
		BytesSent: s.bytesOut.Load(), BytesReceived: s.bytesIn.Load(),
		PacketsSent: s.pktsOut.Load(), PacketsReceived: s.pktsIn.Load(), WouldBlocks: s.wouldBlock.Load(),
		PutsSent: s.putsOut.Load(), PutsReceived: s.putsIn.Load(), PutsDropped: s.putsDropped.Load()}
}

// Wake makes a Wait in progress return, or else the next one return at once
// (transport.Waker): another goroutine's way to end this network's sleep,
// as package route's waiters do when another network has traffic.
func (t *Transport) Wake() {
	t.woken.Store(true)
	t.wake()
}

// wake interrupts a Wait that sleeps in the kernel.
func (t *Transport) wake() {
	if t.sleepers.Load() > 0 {
		var one = [8]byte{1}
		unix.Write(t.efd, one[:])
	}
}

// Send queues one packet for dst and writes it to the socket at once when the
// connection is open and nothing is queued before it (no copy then). The first
// Send to a peer dials it; the packet waits in the queue until the handshake
// is done. It does not allocate on success. Errors: transport.ErrTooLarge,
// transport.ErrWouldBlock (sendq_bytes queued: poll and retry),
// transport.ErrPeer (dst out of range, unreachable, failed or closed),
// transport.ErrClosed.
func (t *Transport) Send(dst int, hdr, payload []byte) error {
	if t.closed.Load() {
		return transport.ErrClosed
	}
	if uint(dst) >= uint(t.size) {
		return transport.PeerErrorf(dst, "tcp: send from rank %d to rank %d of %d", t.rank, dst, t.size)
	}
	n := len(hdr) + len(payload)
	if n > MaxPacket {
		return fmt.Errorf("tcp: send %d bytes to rank %d, max %d: %w", n, dst, MaxPacket, transport.ErrTooLarge)
	}
	if dst == t.rank {
		return t.sendSelf(hdr, payload)
	}
	p := &t.peers[dst]
	p.mu.Lock()
	err := t.sendLocked(p, dst, hdr, payload)
	p.mu.Unlock()
	return err
}

func (t *Transport) sendLocked(p *peer, dst int, hdr, payload []byte) error {
	if p.err != nil {
		return p.err
	}
	if p.gone {
		return transport.PeerErrorf(dst, "tcp: send to rank %d, which has closed", dst)
	}
	if p.c == nil && p.dialing == nil {
		if err := t.dial(p, dst); err != nil {
			return err
		}
	}
	n := len(hdr) + len(payload)
	var lw [4]byte
	binary.LittleEndian.PutUint32(lw[:], uint32(n))
	queued := len(p.out) - p.head
	if p.c != nil && !p.putting {
		if queued > 0 {
			if err := t.flushLocked(p, dst); err != nil {
				return err
			}
			queued = len(p.out) - p.head
		}
		if queued == 0 {
			k, err := sendv(p.c.fd, lw[:], hdr, payload)
			if err != nil {
				return t.failLocked(p, dst, err)
			}
			t.st.bytesOut.Add(uint64(k))
			t.st.pktsOut.Add(1)
			if k == 4+n {
				return nil
			}
			// The kernel took part of it: queue the rest.
			p.out = appendTail(p.out, k, lw[:], hdr, payload)
			p.pending.Store(true)
			t.wake()
			return nil
		}
	}
	if queued > 0 && queued+4+n > t.sendq {
		t.st.wouldBlock.Add(1)
		return transport.ErrWouldBlock
	}
	if p.head > 0 && p.head >= cap(p.out)/2 {
		m := copy(p.out, p.out[p.head:])
		p.out, p.head = p.out[:m], 0
	}
	p.out = append(append(append(p.out, lw[:]...), hdr...), payload...)
	t.st.pktsOut.Add(1)
	p.pending.Store(true)
	t.wake()
	return nil
}

// appendTail appends the bytes of the concatenation of bufs after the first
// skip to out.
func appendTail(out []byte, skip int, bufs ...[]byte) []byte {
	for _, b := range bufs {
		if skip >= len(b) {
			skip -= len(b)
			continue
		}
		out = append(out, b[skip:]...)
		skip = 0
	}
	return out
}

// sendv writes up to three buffers with one sendmsg(MSG_DONTWAIT|MSG_NOSIGNAL)
// and returns the bytes written; EAGAIN counts as 0 bytes and no error.
func sendv(fd int, a, b, c []byte) (int, error) {
	return sendvec(fd, &[maxIov][]byte{a, b, c})
}

// maxIov is the most buffers sendvec writes with one call.
const maxIov = 5

// sendvec is sendv of up to maxIov buffers (empty ones are skipped).
func sendvec(fd int, bufs *[maxIov][]byte) (int, error) {
	var iov [maxIov]unix.Iovec
	k, size := 0, 0
	for i := range bufs {
		if s := bufs[i]; len(s) > 0 {
			iov[k].Base = &s[0]
			iov[k].SetLen(len(s))
			k++
			size += len(s)
		}
	}
	if k == 0 {
		return 0, nil
	}
	msg := unix.Msghdr{Iov: &iov[0], Iovlen: uint64(k)}
	raw := size <= rawMax // see rawMax
	for {
		var n uintptr
		var e syscall.Errno
		if raw {
			n, _, e = unix.RawSyscall(unix.SYS_SENDMSG, uintptr(fd), uintptr(unsafe.Pointer(&msg)),
				unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
		} else {
			n, _, e = unix.Syscall(unix.SYS_SENDMSG, uintptr(fd), uintptr(unsafe.Pointer(&msg)),
				unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
		}
		runtime.KeepAlive(bufs)
		switch e {
		case 0:
			return int(n), nil
		case unix.EAGAIN:
			return 0, nil
		case unix.EINTR:
			continue
		}
		return 0, e
	}
}

// flushLocked writes queued output to p's open connection until the kernel
// pushes back. p.mu is held.
func (t *Transport) flushLocked(p *peer, dst int) error {
	if p.err != nil {
		return p.err
	}
	if p.c == nil || p.putting {
		return nil
	}
	for p.head < len(p.out) {
		k, err := sendv(p.c.fd, p.out[p.head:], nil, nil)
		if err != nil {
			return t.failLocked(p, dst, err)
		}
		if k == 0 {
			return nil
		}
		t.st.bytesOut.Add(uint64(k))
		p.head += k
	}
	p.out, p.head = p.out[:0], 0
	p.pending.Store(false)
	return nil
}

// failLocked records that the connection to dst broke and returns the error
// that Send, Put and Poll report from now on. The poller closes the socket.
func (t *Transport) failLocked(p *peer, dst int, cause error) error {
	if p.err == nil {
		if p.gone {
			p.err = transport.PeerErrorf(dst, "tcp: rank %d has closed", dst)
		} else {
			p.err = transport.PeerErrorf(dst, "tcp: connection from rank %d to rank %d lost (%v): the peer exited or failed",
				t.rank, dst, cause)
			t.anyDead.Store(true)
		}
		p.out, p.head = p.out[:0], 0
		p.pending.Store(false)
	}
	return p.err
}

func (t *Transport) sendSelf(hdr, payload []byte) error {
	if !t.self.Push(hdr, payload, t.sendq) {
		t.st.wouldBlock.Add(1)
		return transport.ErrWouldBlock
	}
	t.st.pktsOut.Add(1)
	t.wake()
	return nil
}

// Poll writes queued output, accepts connections, advances handshakes, reads
// every connection with non-blocking system calls and hands up to max packets
// to r, straight from the read buffers (no copy). It does not allocate once
// connections are open. Errors: transport.ErrClosed; an error wrapping
// transport.ErrPeer naming the rank when a connection broke without a clean
// close (after the packets that arrived on it were delivered).
func (t *Transport) Poll(r transport.Receiver, max int) (int, error) {
	if t.closed.Load() {
		return 0, transport.ErrClosed
	}
	t.pollMu.Lock()
	defer t.pollMu.Unlock()
	t.flushAll()
	n := t.deliver(r, max)
	if n < max {
		t.pump()
		n += t.deliver(r, max-n)
	}
	t.setAvail()
	if n == 0 && t.anyDead.Load() {
		return 0, t.deadErr()
	}
	return n, nil
}

// flushAll writes queued output to every peer that has some.
func (t *Transport) flushAll() {
	for dst := range t.peers {
		p := &t.peers[dst]
		if p.pending.Load() {
			p.mu.Lock()
			t.flushLocked(p, dst)
			p.mu.Unlock()
		}
	}
}

// deadErr returns the error of a failed peer none of whose packets remain.
func (t *Transport) deadErr() error {
	for dst := range t.peers {
		p := &t.peers[dst]
		p.mu.Lock()
		err := p.err
		gone := p.gone
		p.mu.Unlock()
		if err == nil || gone {
			continue
		}
		held := false
		for _, c := range t.open {
			if c.rank == dst && c.r < c.scan {
				held = true
			}
		}
		if !held {
			return err
		}
	}
	return nil
}

// deliver hands up to max packets to r: self-sends first, then the open
// connections round-robin, a burst from each.
func (t *Transport) deliver(r transport.Receiver, max int) int {
	n, _ := t.self.Deliver(r, t.rank, max)
	t.st.pktsIn.Add(uint64(n))
	for round := 0; n < max && len(t.open) > 0; round++ {
		got := n
		for k := 0; k < len(t.open) && n < max; k++ {
			if t.next >= len(t.open) {
				t.next = 0
			}
			c := t.open[t.next]
			t.next++
			n += c.deliver(r, min(max-n, 16))
		}
		if n == got {
			break
		}
	}
	// Forget dead connections whose packets are all delivered.
	for i := 0; i < len(t.open); i++ {
		if c := t.open[i]; c.fd < 0 && c.r >= c.scan {
			t.open = append(t.open[:i], t.open[i+1:]...)
			t.dirty = true
			i--
		}
	}
	return n
}

// setAvail records whether packets wait in read buffers, for Wait.
func (t *Transport) setAvail() {
	avail := false
	for _, c := range t.open {
		if c.r < c.scan {
			avail = true
			break
		}
	}
	t.avail.Store(avail)
}

// pump moves bytes without delivering packets: new dials, accepts, handshakes
// and reads. pollMu is held.
func (t *Transport) pump() {
	if t.nNew.Load() > 0 {
		t.dialMu.Lock()
		for _, c := range t.newOpen {
			t.open = append(t.open, c)
			t.byFd[c.fd] = c
		}
		t.newOpen = t.newOpen[:0]
		t.nNew.Store(0)
		t.dialMu.Unlock()
		t.dirty = true
	}
	t.syncPolled()
	t.tick++
	direct := len(t.open) <= directMax
	// Listening socket and handshakes every 16th poll once connections are
	// open: connections in their handshake (a peer's, or silent ones from
	// outside the job) must not cost every poll a system call.
	if !direct || len(t.open) == 0 || t.tick%16 == 0 {
		t.events()
	}
	if direct {
		for i := 0; i < len(t.open); i++ {
			if c := t.open[i]; c.fd >= 0 {
				c.read()
			}
		}
	}
	if len(t.hs) > 0 && t.tick%64 == 0 {
		t.expireHandshakes()
	}
	t.syncPolled()
}

// syncPolled, after the open connections changed, keeps them out of the
// epoll set while there are at most directMax (Poll reads them directly and
// Wait ppolls them) and puts them all in it beyond, publishes the
// descriptors outside it for Wait, and wakes a sleeping Wait so that it
// sleeps on the new set. pollMu is held.
func (t *Transport) syncPolled() {
	if !t.dirty {
		return
	}
	t.dirty = false
	direct := len(t.open) <= directMax
	var fds []int32
	for i := 0; i < len(t.open); i++ {
		c := t.open[i]
		if c.fd < 0 {
			continue
		}
		switch {
		case direct && c.polled:
			unix.EpollCtl(t.epfd, unix.EPOLL_CTL_DEL, c.fd, nil)
			c.polled = false
		case !direct && !c.polled:
			if err := unix.EpollCtl(t.epfd, unix.EPOLL_CTL_ADD, c.fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(c.fd)}); err != nil {
				c.eof = true
				c.lost(err) // keeps its packets for delivery
				continue
			}
			c.polled = true
		}
		if !c.polled {
			fds = append(fds, int32(c.fd))
		}
	}
	t.direct.Store(&fds)
	t.wake()
}

// sleepFds appends what a sleeper waits on for input: the epoll descriptor
// and the open connections outside it.
func (t *Transport) sleepFds(fds []unix.PollFd) []unix.PollFd {
	fds = append(fds, unix.PollFd{Fd: int32(t.epfd), Events: unix.POLLIN})
	if d := t.direct.Load(); d != nil {
		for _, fd := range *d {
			fds = append(fds, unix.PollFd{Fd: fd, Events: unix.POLLIN})
		}
	}
	return fds
}

// events handles what epoll reports ready now.
func (t *Transport) events() {
	n, err := epollReady(t.epfd, t.evs[:])
	if err != nil {
		return
	}
	for i := 0; i < n; i++ {
		fd := int(t.evs[i].Fd)
		switch fd {
		case t.lfd:
			t.accept()
		case t.efd:
			var b [8]byte
			unix.Read(t.efd, b[:])
		default:
			if c := t.byFd[fd]; c != nil {
				if c.state == stOpen {
					c.read()
				} else {
					c.handshake()
				}
			}
		}
	}
}

// Wait returns at once when packets are waiting or Wake was called;
// otherwise it polls the
// sockets for up to the spin time (when no other goroutine is polling), then
// sleeps in ppoll on the epoll descriptor (the listening socket, handshakes,
// the eventfd that self-sends, new connections and connection changes ring,
// and the open connections when there are more than directMax), on the open
// connections outside the epoll set and on the sockets with queued output
// until something happens or d passes. Errors: transport.ErrClosed.
func (t *Transport) Wait(d time.Duration) error {
	if t.closed.Load() {
		return transport.ErrClosed
	}
	if t.ready() {
		t.woken.Store(false)
		return nil
	}
	start := time.Now()
	if spin := min(t.spin, d); spin > 0 {
		for time.Since(start) < spin {
			if !t.pollMu.TryLock() {
				return nil // another goroutine polls: let the caller poll again
			}
			t.flushAll()
			t.pump()
			t.setAvail()
			t.pollMu.Unlock()
			if t.ready() {
				t.woken.Store(false)
				return nil
			}
		}
	}
	left := d - time.Since(start)
	if left <= 0 {
		return nil
	}
	t.sleepers.Add(1)
	var buf [8]unix.PollFd
	fds := t.sleepFds(buf[:0]) // after sleepers: see syncPolled
	for dst := range t.peers {
		p := &t.peers[dst]
		if p.pending.Load() {
			p.mu.Lock()
			if p.c != nil && !p.putting && len(p.out) > p.head {
				fds = append(fds, unix.PollFd{Fd: int32(p.c.fd), Events: unix.POLLOUT})
			}
			p.mu.Unlock()
		}
	}
	if !t.ready() {
		ts := unix.NsecToTimespec(left.Nanoseconds())
		_, err := unix.Ppoll(fds, &ts, nil)
		if err != nil && !errors.Is(err, unix.EINTR) {
			t.sleepers.Add(-1)
			return fmt.Errorf("tcp: ppoll: %w", err)
		}
	}
	t.sleepers.Add(-1)
	var b [8]byte
	unix.Read(t.efd, b[:])
	t.woken.Store(false)
	return nil
}

// ready reports whether Poll has something to deliver or report, or a dial
// has opened that Poll has not yet taken over (it is in no set Wait sleeps on).
func (t *Transport) ready() bool {
	return t.self.Pending() || t.avail.Load() || t.anyDead.Load() || t.nNew.Load() > 0 || t.woken.Load()
}

// Close flushes what it can (for up to a second), sends every open
// connection a goodbye frame so that peers do not take the close for a
// failure, waits briefly for the peers to close in turn, and closes every
// socket. It must not run concurrently with other methods; afterwards they
// return transport.ErrClosed. Closing twice is a no-op.
func (t *Transport) Close() error {
	if t.closed.Swap(true) {
		return nil
	}
	t.connWG.Wait() // the connector closes the dials still in the handshake
	t.pollMu.Lock()
	defer t.pollMu.Unlock()
	t.pump() // take over the dials that opened
	deadline := time.Now().Add(time.Second)
	var bye [4]byte
	binary.LittleEndian.PutUint32(bye[:], wordBye)
	for dst := range t.peers {
		p := &t.peers[dst]
		p.mu.Lock()
		if c := p.c; c != nil && p.err == nil {
			out := append(p.out[p.head:], bye[:]...)
			for len(out) > 0 && time.Now().Before(deadline) {
				k, err := sendv(c.fd, out, nil, nil)
				if err != nil {
					break
				}
				out = out[k:]
				if len(out) > 0 {
					waitFd(c.fd, unix.POLLOUT, time.Millisecond)
				}
			}
			unix.Shutdown(c.fd, unix.SHUT_WR)
		}
		p.out, p.head = nil, 0
		p.mu.Unlock()
	}
	// Wait until every peer's kernel has acknowledged our goodbye (our send
	// queue is empty) while discarding what arrives, so that closing neither
	// drops the goodbye nor resets a connection that holds unread data.
	linger := time.Now().Add(time.Second)
	for {
		busy := false
		for _, c := range t.open {
			if c.fd < 0 || c.eof {
				continue
			}
			c.discard()
			if q, err := unix.IoctlGetInt(c.fd, unix.SIOCOUTQ); err == nil && q > 0 && !c.eof {
				busy = true
			}
		}
		if !busy || time.Now().After(linger) {
			break
		}
		time.Sleep(50 * time.Microsecond)
	}
	t.closeFds()
	return nil
}

// closeFds closes every descriptor.
func (t *Transport) closeFds() {
	for _, c := range append(append(t.open, t.hs...), t.newOpen...) {
		if c.fd >= 0 {
			unix.Close(c.fd)
			c.fd = -1
		}
	}
	for _, fd := range []int{t.lfd, t.epfd, t.efd} {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
	t.lfd, t.epfd, t.efd = -1, -1, -1
}

// waitFd waits up to d for events on fd.
func waitFd(fd int, events int16, d time.Duration) {
	fds := [1]unix.PollFd{{Fd: int32(fd), Events: events}}
	ts := unix.NsecToTimespec(d.Nanoseconds())
	unix.Ppoll(fds[:], &ts, nil)
}

var (
	_ transport.Putter      = (*Transport)(nil)
	_ transport.PutTargeter = (*Transport)(nil)
)
