//go:build linux

package udp

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/amgo-hpc/amgo/am/transport"
	"github.com/amgo-hpc/amgo/am/transport/internal/dgram"
	"github.com/amgo-hpc/amgo/am/transport/internal/jobsecret"
	"github.com/amgo-hpc/amgo/am/transport/internal/netaddr"
	settings "github.com/amgo-hpc/amgo/am/transport/internal/opts"
	"github.com/amgo-hpc/amgo/am/transport/internal/wakefd"
)

func init() {
	transport.Register("udp", New)
}

// Defaults.
const (
	// DefaultSpin is how long Wait polls the socket before it sleeps in the
	// kernel (option "spin"): waking a sleeping thread costs 30-40 us on
	// small VMs.
	DefaultSpin = 20 * time.Microsecond
	// BufferBytes is the per-peer receive buffer package am keeps for udp
	// peers (transport.Caps.BufferBytes), 256 KiB: a hop costs
	// microseconds, so more in flight and larger medium requests pay.
	// tcp's 1 MiB measured no better here (docs/mpi.md): the reliability
	// layer's window of packets also bounds what is in flight.
	BufferBytes = 256 << 10
	// DefaultBufBytes is the size asked for the socket's send and receive
	// buffers, in bytes (option "buf_bytes"). The kernel caps it at
	// net.core.rmem_max and wmem_max unless the process may override them.
	DefaultBufBytes = 4 << 20
	// MinPacket is the smallest max_packet accepted, in bytes: package am
	// needs a medium payload of 512 bytes after the largest header.
	MinPacket = 1024
	// SecretKey is the key under which rank 0 publishes the job secret it
	// drew when AMGO_JOB_SECRET is not set.
	SecretKey = "amgo.udp.secret"
)

// Stats are a transport's counters since New. Datagrams that fail a check
// are dropped and counted in exactly one of Short, Foreign, Misdirected and
// BadProof.
type Stats struct {
	// Sent and Received count datagrams sent and delivered (self-sends
	// included); BytesSent and BytesReceived their bytes, framing included.
	Sent, Received, BytesSent, BytesReceived uint64
	// WouldBlocks counts Sends refused with transport.ErrWouldBlock (the
	// socket's send buffer was full).
	WouldBlocks uint64
	// SendErrors counts datagrams the kernel refused for another transient
	// reason (no route, no buffer); they are lost, as the network may lose.
	SendErrors uint64
	// Short counts datagrams shorter than the framing, or truncated.
	Short uint64
	// Foreign counts datagrams with a wrong magic or from an address other
	// than the claimed rank's: not from this job.
	Foreign uint64
	// Misdirected counts datagrams naming a source outside the job or
	// another destination.
	Misdirected uint64
	// BadProof counts datagrams whose proof of membership is wrong.
	BadProof uint64
}

type counters struct {
	sent, received, bytesOut, bytesIn, wouldBlock, sendErrs atomic.Uint64
	drops                                                   dgram.Drops
}

// Transport is one rank's UDP attachment. It implements transport.Transport.
type Transport struct {
	rank, size int
	caps       transport.Caps
	fd         int
	wake       *wakefd.Fd // Wake ends a Wait that sleeps in ppoll
	family     int
	laddr      string
	spin       time.Duration
	key        []byte
	pr         *Prover
	seq        atomic.Uint64 // the number of the next datagram sent (the proof's nonce)
	stripes    [sendStripes]sendStripe
	closed     atomic.Bool
	st         counters

	peers []peer

	// Owned by Poll (one goroutine at a time).
	rbuf   []byte
	rnonce [NonceLen]byte
	rsa    unix.RawSockaddrAny
	rslen  uint32
}

// sendStripes is the number of buffers Sends build datagrams in: a Send to
// rank dst uses stripe dst % sendStripes, so Sends to different ranks
// seldom wait for one another, and a rank's send buffers take at most
// sendStripes × 64 KiB whatever the job's size.
const sendStripes = 8

// sendStripe is where Sends build a datagram (its proof needs it
// contiguous); padded against false sharing between stripes.
type sendStripe struct {
	_     [64]byte
	mu    sync.Mutex
	buf   []byte // MaxDatagram bytes, made by the first Send through this stripe
	nonce [NonceLen]byte
	_     [64]byte
}

// peer is a rank's address.
type peer struct {
	sa    unix.RawSockaddrAny // the peer's address, also to check arrivals
	salen uint32
}

// New opens rank b.Rank()'s UDP transport for a job of b.Size() ranks; the
// result is a *Transport. It binds a non-blocking datagram socket to one port
// of the interface the job uses, publishes host:port under "amgo.udp.<rank>"
// and calls b.Fence once, so every rank must call New concurrently. Without
// AMGO_JOB_SECRET, rank 0 draws the job secret and publishes it under
// SecretKey. opts (each also read from the environment variable in brackets
// when absent):
//
//	iface       interface name or IP address to bind to [AMGO_IFACE]
//	port        UDP port, default 0 (any) [AMGO_UDP_PORT]
//	spin        how long Wait polls before sleeping, default 20us [AMGO_UDP_SPIN]
//	buf_bytes   socket buffer sizes, default 4 MiB; suffixes k and m [AMGO_UDP_BUF_BYTES]
//	max_packet  largest packet, MinPacket..MaxPacket, default MaxPacket [AMGO_UDP_MAX_PACKET]
//	secret      the job secret in hex, at least 16 bytes [AMGO_JOB_SECRET]
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
		return nil, fmt.Errorf("udp: bad job shape: rank %d of %d", rank, size)
	}
	bufBytes, err := settings.Bytes(opts, "buf_bytes", "AMGO_UDP_BUF_BYTES", DefaultBufBytes, 64<<10, 1<<30)
	if err != nil {
		return nil, err
	}
	maxPacket, err := settings.Bytes(opts, "max_packet", "AMGO_UDP_MAX_PACKET", MaxPacket, MinPacket, MaxPacket)
	if err != nil {
		return nil, err
	}
	spin, err := settings.Duration(opts, "spin", "AMGO_UDP_SPIN", DefaultSpin)
	if err != nil {
		return nil, fmt.Errorf("udp: %w", err)
	}
	port, err := settings.Port(opts, "port", "AMGO_UDP_PORT")
	if err != nil {
		return nil, fmt.Errorf("udp: %w", err)
	}
	secret, err := jobsecret.Before(b, opts, SecretKey)
	if err != nil {
		return nil, fmt.Errorf("udp: rank %d: %w", rank, err)
	}
	ip, err := netaddr.Choose(opts)
	if err != nil {
		return nil, fmt.Errorf("udp: rank %d: %w", rank, err)
	}
	t := &Transport{rank: rank, size: size, fd: -1, spin: spin, peers: make([]peer, size),
		rbuf: make([]byte, 1<<16)}
	fail := func(err error) (*Transport, error) {
		t.wake.Close()
		if t.fd >= 0 {
			unix.Close(t.fd)
		}
		return nil, fmt.Errorf("udp: rank %d: %w", rank, err)
	}
	if t.wake, err = wakefd.Open(); err != nil {
		return fail(err)
	}
	if err := t.bind(ip, port, bufBytes); err != nil {
		return fail(err)
	}
	key := "amgo.udp." + strconv.Itoa(rank)
	if err := b.Put(key, t.laddr); err != nil {
		return fail(fmt.Errorf("publish %s: %w", key, err))
	}
	if err := b.Fence(); err != nil {
		return fail(fmt.Errorf("fence after publishing: %w", err))
	}
	if secret == nil {
		if secret, err = jobsecret.After(b, SecretKey); err != nil {
			return fail(err)
		}
	}
	t.key = DeriveKey(secret)
	if t.pr, err = NewProver(t.key); err != nil {
		return fail(err)
	}
	var seed [8]byte
	if _, err := rand.Read(seed[:]); err != nil {
		return fail(fmt.Errorf("a random first datagram number: %w", err))
	}
	t.seq.Store(binary.LittleEndian.Uint64(seed[:]))
	for r := 0; r < size; r++ {
		v := t.laddr
		if r != rank {
			k := "amgo.udp." + strconv.Itoa(r)
			if v, err = b.Get(k); err != nil {
				return fail(fmt.Errorf("look up %s: %w", k, err))
			}
		}
		ap, err := netip.ParseAddrPort(v)
		if err != nil {
			return fail(fmt.Errorf("rank %d's address %q: %w", r, v, err))
		}
		if ap.Addr().Unmap().Is4() != (t.family == unix.AF_INET) {
			return fail(fmt.Errorf("rank %d's address %s is of another IP version than ours (%s): set AMGO_IFACE alike on every host", r, ap, t.laddr))
		}
		p := &t.peers[r]
		p.salen = rawSockaddr(&p.sa, ap)
	}
	t.caps = transport.Caps{Name: "udp", MaxPacket: maxPacket, Wakeup: true, BufferBytes: BufferBytes}
	return t, nil
}

// rawSockaddr fills sa with ap and returns its length.
func rawSockaddr(sa *unix.RawSockaddrAny, ap netip.AddrPort) uint32 {
	*sa = unix.RawSockaddrAny{}
	a := ap.Addr().Unmap()
	if a.Is4() {
		s := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		s.Family = unix.AF_INET
		putPort(&s.Port, ap.Port())
		s.Addr = a.As4()
		return unix.SizeofSockaddrInet4
	}
	s := (*unix.RawSockaddrInet6)(unsafe.Pointer(sa))
	s.Family = unix.AF_INET6
	putPort(&s.Port, ap.Port())
	s.Addr = a.As16()
	return unix.SizeofSockaddrInet6
}

// putPort stores port in network byte order.
func putPort(p *uint16, port uint16) {
	b := (*[2]byte)(unsafe.Pointer(p))
	b[0], b[1] = byte(port>>8), byte(port)
}

// sameAddr reports whether the address a datagram came from is the one
// published by the rank it claims to be.
func sameAddr(from *unix.RawSockaddrAny, fromLen uint32, p *peer) bool {
	switch p.sa.Addr.Family {
	case unix.AF_INET:
		if fromLen < unix.SizeofSockaddrInet4 || from.Addr.Family != unix.AF_INET {
			return false
		}
		f, w := (*unix.RawSockaddrInet4)(unsafe.Pointer(from)), (*unix.RawSockaddrInet4)(unsafe.Pointer(&p.sa))
		return f.Port == w.Port && f.Addr == w.Addr
	case unix.AF_INET6:
		if fromLen < unix.SizeofSockaddrInet6 || from.Addr.Family != unix.AF_INET6 {
			return false
		}
		f, w := (*unix.RawSockaddrInet6)(unsafe.Pointer(from)), (*unix.RawSockaddrInet6)(unsafe.Pointer(&p.sa))
		return f.Port == w.Port && f.Addr == w.Addr
	}
	return false
}

// bind opens the socket, sizes its buffers and binds it.
func (t *Transport) bind(ip netip.Addr, port, bufBytes int) error {
	var err error
	t.family = unix.AF_INET
	if ip.Is6() {
		t.family = unix.AF_INET6
	}
	if t.fd, err = unix.Socket(t.family, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0); err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	for _, o := range [][2]int{{unix.SO_RCVBUFFORCE, unix.SO_RCVBUF}, {unix.SO_SNDBUFFORCE, unix.SO_SNDBUF}} {
		if unix.SetsockoptInt(t.fd, unix.SOL_SOCKET, o[0], bufBytes) != nil {
			_ = unix.SetsockoptInt(t.fd, unix.SOL_SOCKET, o[1], bufBytes)
		}
	}
	ap := netip.AddrPortFrom(ip, uint16(port))
	var sa unix.Sockaddr
	if ip.Is4() {
		sa = &unix.SockaddrInet4{Port: port, Addr: ip.As4()}
	} else {
		sa = &unix.SockaddrInet6{Port: port, Addr: ip.As16()}
	}
	if err := unix.Bind(t.fd, sa); err != nil {
		return fmt.Errorf("bind %s: %w", ap, err)
	}
	got, err := unix.Getsockname(t.fd)
	if err != nil {
		return fmt.Errorf("getsockname: %w", err)
	}
	switch s := got.(type) {
	case *unix.SockaddrInet4:
		t.laddr = netip.AddrPortFrom(netip.AddrFrom4(s.Addr), uint16(s.Port)).String()
	case *unix.SockaddrInet6:
		t.laddr = netip.AddrPortFrom(netip.AddrFrom16(s.Addr), uint16(s.Port)).String()
	}
	return nil
}

// Addr is the host:port this rank's socket is bound to.
func (t *Transport) Addr() string { return t.laddr }

// Rank is this rank, 0..Size-1.
func (t *Transport) Rank() int { return t.rank }

// Size is the number of ranks in the job.
func (t *Transport) Size() int { return t.size }

// Caps: neither ordered nor reliable (package am adds both), wake-up, no
// Put; MaxPacket as the option "max_packet" says (default MaxPacket).
func (t *Transport) Caps() transport.Caps { return t.caps }

// Stats returns a snapshot of the counters.
func (t *Transport) Stats() Stats {
	s := &t.st
	st := Stats{Sent: s.sent.Load(), Received: s.received.Load(), BytesSent: s.bytesOut.Load(),
		BytesReceived: s.bytesIn.Load(), WouldBlocks: s.wouldBlock.Load(), SendErrors: s.sendErrs.Load()}
	st.Short, st.Foreign, st.Misdirected, st.BadProof = s.drops.Snapshot()
	return st
}

// Send sends one datagram to dst with one sendto(MSG_DONTWAIT): the frame
// header, hdr and payload are copied into one of sendStripes buffers, since
// the proof (GMAC) needs them contiguous. A datagram the kernel drops for a transient
// reason (no buffer, no route) is lost and counted, as a lossy network may
// lose it. It does not allocate. Errors: transport.ErrTooLarge,
// transport.ErrWouldBlock (the socket's send buffer is full: poll and
// retry), transport.ErrPeer (dst out of range), transport.ErrClosed, and
// unexpected socket errors.
func (t *Transport) Send(dst int, hdr, payload []byte) error {
	if t.closed.Load() {
		return transport.ErrClosed
	}
	if uint(dst) >= uint(t.size) {
		return transport.PeerErrorf(dst, "udp: send from rank %d to rank %d of %d", t.rank, dst, t.size)
	}
	n := len(hdr) + len(payload)
	if n > t.caps.MaxPacket {
		return fmt.Errorf("udp: send %d bytes to rank %d, max %d: %w", n, dst, t.caps.MaxPacket, transport.ErrTooLarge)
	}
	st := &t.stripes[dst%sendStripes]
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.buf == nil {
		st.buf = make([]byte, MaxDatagram)
	}
	d := st.buf[:FrameHeader]
	t.pr.PutFrame(d, t.rank, dst, t.seq.Add(1))
	d = t.pr.Seal(append(append(d, hdr...), payload...), &st.nonce)
	p := &t.peers[dst]
	for {
		_, _, e := unix.Syscall6(unix.SYS_SENDTO, uintptr(t.fd), uintptr(unsafe.Pointer(&d[0])), uintptr(len(d)),
			unix.MSG_DONTWAIT, uintptr(unsafe.Pointer(&p.sa)), uintptr(p.salen))
		switch e {
		case 0:
			t.st.sent.Add(1)
			t.st.bytesOut.Add(uint64(len(d)))
			return nil
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			t.st.wouldBlock.Add(1)
			return transport.ErrWouldBlock
		case unix.ENOBUFS, unix.ENOMEM, unix.ECONNREFUSED, unix.EHOSTUNREACH, unix.ENETUNREACH, unix.EHOSTDOWN, unix.ENETDOWN:
			t.st.sendErrs.Add(1)
			return nil
		}
		if t.closed.Load() {
			return transport.ErrClosed
		}
		return fmt.Errorf("udp: send from rank %d to rank %d: %w", t.rank, dst, e)
	}
}

// Poll receives datagrams with recvfrom(MSG_DONTWAIT) into one buffer and
// hands the packet inside each to r in place, up to max of them. A datagram
// that fails a check (DecodeDatagram, and its source address against the
// claimed rank's) is dropped and counted in Stats. It does not allocate and
// never sleeps. Errors: transport.ErrClosed, and unexpected socket errors.
func (t *Transport) Poll(r transport.Receiver, max int) (int, error) {
	if t.closed.Load() {
		return 0, transport.ErrClosed
	}
	got := 0
	for got < max {
		t.rslen = unix.SizeofSockaddrAny
		n, _, e := unix.Syscall6(unix.SYS_RECVFROM, uintptr(t.fd), uintptr(unsafe.Pointer(&t.rbuf[0])), uintptr(len(t.rbuf)),
			unix.MSG_DONTWAIT|unix.MSG_TRUNC, uintptr(unsafe.Pointer(&t.rsa)), uintptr(unsafe.Pointer(&t.rslen)))
		switch e {
		case 0:
		case unix.EAGAIN:
			return got, nil
		case unix.EINTR, unix.ECONNREFUSED:
			continue
		default:
			if t.closed.Load() {
				return got, transport.ErrClosed
			}
			return got, fmt.Errorf("udp: rank %d: receive: %w", t.rank, e)
		}
		if int(n) > len(t.rbuf) {
			t.st.drops.Count(dgram.ErrShort)
			continue
		}
		d := t.rbuf[:n]
		src, pkt, err := DecodeDatagram(d, t.rank, t.size, t.pr, &t.rnonce)
		if err == nil && !sameAddr(&t.rsa, t.rslen, &t.peers[src]) {
			err = ErrForeign
		}
		if err != nil {
			t.st.drops.Count(err)
			continue
		}
		t.st.received.Add(1)
		t.st.bytesIn.Add(uint64(n))
		r.Deliver(src, pkt)
		got++
	}
	return got, nil
}

// Wait returns when a datagram may have arrived, when Wake is called (or was
// called since the last Wait), or after about d: it polls the socket (ppoll
// with a zero timeout) for up to the spin time, then sleeps in ppoll until
// the socket or the wake eventfd is readable or d passes. Errors:
// transport.ErrClosed.
func (t *Transport) Wait(d time.Duration) error {
	if t.closed.Load() {
		return transport.ErrClosed
	}
	if t.wake.Woken() {
		t.wake.Drain(true)
		return nil
	}
	fds := [2]unix.PollFd{{Fd: int32(t.fd), Events: unix.POLLIN}, {Fd: int32(t.wake.FD()), Events: unix.POLLIN}}
	defer func() { t.wake.Drain(fds[1].Revents&unix.POLLIN != 0) }()
	start := time.Now()
	var ts unix.Timespec
	for i := 0; ; i++ {
		fds[0].Revents, fds[1].Revents = 0, 0
		if k, _ := unix.Ppoll(fds[:], &ts, nil); k > 0 {
			return nil
		}
		el := time.Since(start)
		if el >= d {
			return nil
		}
		if el >= t.spin {
			break
		}
	}
	left := d - time.Since(start)
	if left <= 0 {
		return nil
	}
	ts = unix.NsecToTimespec(int64(left))
	fds[0].Revents, fds[1].Revents = 0, 0
	if _, err := unix.Ppoll(fds[:], &ts, nil); err != nil && err != unix.EINTR {
		if t.closed.Load() {
			return transport.ErrClosed
		}
		return fmt.Errorf("udp: rank %d: ppoll: %w", t.rank, err)
	}
	return nil
}

// Wake makes a Wait in progress return, or else the next one return at once
// (transport.Waker): another goroutine's way to end this network's sleep,
// as package route's waiters do when another network has traffic.
func (t *Transport) Wake() { t.wake.Wake() }

// Close closes the socket; datagrams in flight are lost. It must not run
// concurrently with the other methods. Closing twice is a no-op.
func (t *Transport) Close() error {
	if t.closed.Swap(true) {
		return nil
	}
	t.wake.Close()
	return unix.Close(t.fd)
}
