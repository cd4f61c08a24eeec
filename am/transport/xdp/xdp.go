//go:build linux

package xdp

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"

	"github.com/amgo-hpc/amgo/am/transport"
	"github.com/amgo-hpc/amgo/am/transport/internal/dgram"
	"github.com/amgo-hpc/amgo/am/transport/internal/jobsecret"
	"github.com/amgo-hpc/amgo/am/transport/internal/netaddr"
	settings "github.com/amgo-hpc/amgo/am/transport/internal/opts"
	"github.com/amgo-hpc/amgo/am/transport/internal/selfq"
	"github.com/amgo-hpc/amgo/am/transport/internal/wakefd"
)

func init() {
	transport.Register("xdp", New)
}

// Sizes and defaults.
const (
	// FrameSize is the size of one UMEM chunk in bytes: one frame each.
	FrameSize = 4096
	// RxFrames and TxFrames are the UMEM chunks kept for receiving (all in
	// the fill ring when idle) and for sending; every ring has RingSize
	// entries.
	RxFrames = 1024
	TxFrames = 1024
	RingSize = 1024
	// maxFrame is the largest frame a chunk holds: the kernel puts a
	// received frame XDP_PACKET_HEADROOM bytes into its chunk.
	maxFrame = FrameSize - unix.XDP_PACKET_HEADROOM
	// sgChunks is how many chunks a frame may span where the kernel takes
	// frames over several chunks (AF_XDP multi-buffer, XDP_USE_SG: Linux
	// 6.6 and later), and sgMaxFrame the largest such frame, enough for a
	// jumbo MTU of 9000.
	sgChunks   = 3
	sgMaxFrame = sgChunks * maxFrame
	// MinPacket is the smallest packet size the interface's MTU must
	// allow, in bytes: package am needs a medium payload of 512 bytes after
	// the largest header.
	MinPacket = 1024
	// BufferBytes is the per-peer receive buffer package am keeps for xdp
	// peers (transport.Caps.BufferBytes), as udp's: 256 KiB (1 MiB moved
	// a few per cent less between nodes, docs/mpi.md).
	BufferBytes = 256 << 10
	// DefaultSpin is how long Wait polls the receive ring before it sleeps
	// in poll(2) (option "spin").
	DefaultSpin = 20 * time.Microsecond
	// SecretKey is the key under which rank 0 publishes the job secret it
	// drew when AMGO_JOB_SECRET is not set.
	SecretKey = "amgo.xdp.secret"
	// selfBytes bounds what a rank has sent itself and not yet polled, in
	// bytes (a packet more is always taken into an empty queue).
	selfBytes = 256 << 10
	// bindWait is how long New retries a bind that the kernel refuses
	// with EBUSY: a queue stays busy for tens of milliseconds after the
	// previous socket on it closed.
	bindWait = 2 * time.Second
)

// ErrUnavailable marks every failure to open the network for want of
// something this host lacks: the privilege (CAP_NET_RAW, CAP_BPF,
// CAP_NET_ADMIN), the kernel's AF_XDP sockets, an Ethernet interface.
var ErrUnavailable = errors.New("xdp: network unavailable")

// Stats are a transport's counters since New. Frames that fail a check are
// dropped and counted in exactly one of Short, Foreign, Misdirected and
// BadProof.
type Stats struct {
	// Sent and Received count frames sent and delivered (self-sends
	// included); BytesSent and BytesReceived their bytes, Ethernet header
	// included.
	Sent, Received, BytesSent, BytesReceived uint64
	// WouldBlocks counts Sends refused with transport.ErrWouldBlock (every
	// send slot in flight, or the self-send queue full).
	WouldBlocks uint64
	// SendErrors counts frames the kernel did not take at once for a
	// transient reason; they stay in the ring and go at a later kick.
	SendErrors uint64
	// Short counts frames shorter than the framing.
	Short uint64
	// Foreign counts frames addressed to another interface, with another
	// magic, or from an interface other than the claimed rank's.
	Foreign uint64
	// Misdirected counts frames naming a source outside the job or another
	// destination.
	Misdirected uint64
	// BadProof counts frames whose proof of membership is wrong.
	BadProof uint64
	// KernelDropped is the socket's rx_dropped plus rx_ring_full (frames the
	// kernel dropped for want of a free chunk or ring entry), from
	// XDP_STATISTICS.
	KernelDropped uint64
}

type counters struct {
	sent, received, bytesOut, bytesIn, wouldBlock, sendErrs atomic.Uint64
	drops                                                   dgram.Drops
}

// Transport is one rank's AF_XDP socket. Create it with New.
type Transport struct {
	rank, size int
	caps       transport.Caps
	fd         int
	wake       *wakefd.Fd // Wake ends a Wait that sleeps in ppoll
	closed     atomic.Bool
	spin       time.Duration
	ifname     string
	ifindex    int
	queue      int
	etherType  uint16
	mac        net.HardwareAddr
	macs       []net.HardwareAddr // by rank; nil for a rank this network does not reach
	pr         *dgram.Prover
	seq        atomic.Uint64 // the number of the next frame sent (the proof's nonce)
	att        *attachment
	zeroCopy   bool
	st         counters

	// The UMEM this rank shares with the job's other ranks on its
	// interface (umem.go).
	layout   umemLayout
	leader   bool // the first rank on the interface: made the UMEM
	slot     int  // this rank's place among them (its send frames)
	memfd    int
	s0       int    // a follower's copy of the leader's socket, else -1
	mem      []byte // the memfd's mapping: UMEM and control page
	umem     []byte // the UMEM's frames
	listener *net.UnixListener

	// Sending: the tx ring, this rank's send frames and the shared
	// completion ring.
	txMu   sync.Mutex
	tx     *ring
	comp   *ring
	txNext int          // the slot to try after txLast, 0..txPer-1
	txLast int          // the slot sent from last: tried first, while its lines are in the cache
	hold   atomic.Int32 // Holds not yet Flushed (transport.Batcher)
	nonce  [dgram.NonceLen]byte

	self selfq.Queue // self-sends, delivered by Poll

	// Owned by Poll (one goroutine at a time).
	rx, fill *ring
	rnonce   [dgram.NonceLen]byte
	partial  []byte // a frame over several chunks, gathered (cap sgMaxFrame)
}

// New opens rank b.Rank()'s AF_XDP transport for a job of b.Size() ranks;
// the result is a *Transport. It picks the interface (below), publishes its
// MAC address, MTU and queue under "amgo.xdp.<rank>" and calls b.Fence
// three times, so every rank must call New concurrently: after the first,
// the first rank on each interface makes the UMEM, attaches the XDP
// program and binds its socket; after the second, the interface's other
// ranks join its UMEM (package doc); the third ends the set-up. Without AMGO_JOB_SECRET, rank 0
// draws the job secret and publishes it under SecretKey. opts (each also
// read from the environment variable in brackets when absent):
//
//	iface      interface name, or an IP address of it [AMGO_IFACE]
//	queue      receive queue to bind, default 0 [AMGO_XDP_QUEUE]
//	mode       XDP attach mode: auto (driver, else generic), driver, generic [AMGO_XDP_MODE]
//	ethertype  the frames' EtherType, default 0x88b5 [AMGO_XDP_ETHERTYPE]
//	sg         frames over several chunks where the kernel has them: on (default) or off [AMGO_XDP_SG]
//	spin       how long Wait polls before sleeping, default 20us [AMGO_XDP_SPIN]
//	secret     the job secret in hex, at least 16 bytes [AMGO_JOB_SECRET]
//
// By default the interface is the one holding the address tcp and udp
// would bind (the host name's address when local). Errors: bad options,
// and failures that wrap ErrUnavailable, naming what is missing, when the
// host cannot run the network: no privilege, no AF_XDP in the kernel, an
// interface without an Ethernet address or with an MTU below MinPacket plus
// the framing, an interface that already has an XDP program; bootstrap
// failures; each naming the rank. A rank that fails still keeps the
// fences, so that the others fail rather than wait.
func New(b transport.Bootstrap, opts map[string]string) (transport.Transport, error) {
	t, err := open(b, opts)
	if err != nil {
		return nil, err
	}
	return t, nil
}

// noInterface is what a rank without a usable interface publishes.
const noInterface = "none"

// peerInfo is what a rank publishes: "MAC_MTU_queue_sg", sg 1 or 0
// (PMI-1's wire protocol carries no spaces in a value).
type peerInfo struct {
	mac   net.HardwareAddr
	mtu   int
	queue int
	sg    bool // the rank's kernel takes frames over several chunks
}

func (p peerInfo) String() string {
	sg := 0
	if p.sg {
		sg = 1
	}
	return fmt.Sprintf("%s_%d_%d_%d", p.mac, p.mtu, p.queue, sg)
}

func parsePeerInfo(s string) (peerInfo, error) {
	f := strings.Split(s, "_")
	if len(f) != 4 || (f[3] != "0" && f[3] != "1") {
		return peerInfo{}, fmt.Errorf("malformed %q", s)
	}
	mac, err := net.ParseMAC(f[0])
	if err != nil || len(mac) != 6 {
		return peerInfo{}, fmt.Errorf("malformed MAC address in %q", s)
	}
	mtu, err1 := strconv.Atoi(f[1])
	q, err2 := strconv.Atoi(f[2])
	if err1 != nil || err2 != nil {
		return peerInfo{}, fmt.Errorf("malformed %q", s)
	}
	return peerInfo{mac: mac, mtu: mtu, queue: q, sg: f[3] == "1"}, nil
}

// chooseInterface finds the interface named by option "iface" (a name or
// an address of it), else the one holding the address netaddr picks.
func chooseInterface(opts map[string]string) (*net.Interface, error) {
	s := strings.TrimSpace(settings.Get(opts, "iface", "AMGO_IFACE"))
	if s != "" {
		if _, err := netip.ParseAddr(s); err != nil {
			ifi, err := net.InterfaceByName(s)
			if err != nil {
				return nil, fmt.Errorf("iface %q is neither an IP address nor an interface: %w", s, err)
			}
			return ifi, nil
		}
	}
	ip, err := netaddr.Choose(opts)
	if err != nil {
		return nil, err
	}
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	for i := range ifs {
		addrs, _ := ifs[i].Addrs()
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				if x, ok := netip.AddrFromSlice(n.IP); ok && x.Unmap() == ip {
					return &ifs[i], nil
				}
			}
		}
	}
	return nil, fmt.Errorf("no interface holds address %s", ip)
}

func open(b transport.Bootstrap, opts map[string]string) (*Transport, error) {
	rank, size := b.Rank(), b.Size()
	if size < 1 || rank < 0 || rank >= size {
		return nil, fmt.Errorf("xdp: bad job shape: rank %d of %d", rank, size)
	}
	spin, err := settings.Duration(opts, "spin", "AMGO_XDP_SPIN", DefaultSpin)
	if err != nil {
		return nil, fmt.Errorf("xdp: %w", err)
	}
	queue := 0
	if s := settings.Get(opts, "queue", "AMGO_XDP_QUEUE"); s != "" {
		if queue, err = strconv.Atoi(s); err != nil || queue < 0 || queue >= mapEntries {
			return nil, fmt.Errorf("xdp: queue %q: want a number from 0 to %d", s, mapEntries-1)
		}
	}
	mode := settings.Get(opts, "mode", "AMGO_XDP_MODE")
	if mode == "" {
		mode = "auto"
	}
	if mode != "auto" && mode != "driver" && mode != "generic" {
		return nil, fmt.Errorf("xdp: mode %q: want auto, driver or generic", mode)
	}
	etherType := uint16(EtherType)
	if s := settings.Get(opts, "ethertype", "AMGO_XDP_ETHERTYPE"); s != "" {
		v, err := strconv.ParseUint(s, 0, 16)
		if err != nil || v < 0x0600 {
			return nil, fmt.Errorf("xdp: ethertype %q: want a number from 0x0600 to 0xffff", s)
		}
		etherType = uint16(v)
	}
	sg := multiBuffer()
	switch v := settings.Get(opts, "sg", "AMGO_XDP_SG"); v {
	case "", "1", "on":
	case "0", "off":
		sg = false
	default:
		return nil, fmt.Errorf("xdp: sg %q: want on or off", v)
	}
	secret, err := jobsecret.Before(b, opts, SecretKey)
	if err != nil {
		return nil, fmt.Errorf("xdp: rank %d: %w", rank, err)
	}
	// A rank without a usable interface still publishes (that it has none)
	// and keeps the three fences, so that every rank fails rather than
	// waits.
	ifi, ierr := chooseInterface(opts)
	if ierr == nil && len(ifi.HardwareAddr) != 6 {
		ierr = fmt.Errorf("interface %s has no Ethernet address (set AMGO_IFACE to the interface that joins the hosts): %w",
			ifi.Name, ErrUnavailable)
	}
	var me peerInfo
	pub := noInterface
	if ierr == nil {
		me = peerInfo{mac: ifi.HardwareAddr, mtu: ifi.MTU, queue: queue, sg: sg}
		pub = me.String()
	}
	key := "amgo.xdp." + strconv.Itoa(rank)
	if err := b.Put(key, pub); err != nil {
		return nil, fmt.Errorf("xdp: rank %d: publish %s: %w", rank, key, err)
	}
	if err := b.Fence(); err != nil {
		return nil, fmt.Errorf("xdp: rank %d: fence after publishing: %w", rank, err)
	}
	if ierr != nil {
		_, _ = b.Fence(), b.Fence()
		return nil, fmt.Errorf("xdp: rank %d: %w", rank, ierr)
	}
	t := &Transport{rank: rank, size: size, fd: -1, memfd: -1, s0: -1, spin: spin, ifname: ifi.Name,
		ifindex: ifi.Index, queue: queue, etherType: etherType, mac: ifi.HardwareAddr, macs: make([]net.HardwareAddr, size)}
	// Failures from here on are kept until the job's ranks have passed the
	// two fences every rank keeps, so that one rank's failure never leaves
	// the others waiting.
	var ferr error
	fail := func(err error) {
		if ferr == nil {
			ferr = fmt.Errorf("xdp: rank %d: %w", rank, err)
		}
	}
	if secret == nil {
		if secret, err = jobsecret.After(b, SecretKey); err != nil {
			fail(err)
		}
	}
	mtu, sgAll := ifi.MTU, sg
	var group []int // the ranks on this interface, this one included, ascending
	for r := 0; r < size; r++ {
		p := me
		if r != rank {
			k := "amgo.xdp." + strconv.Itoa(r)
			v, err := b.Get(k)
			if err != nil {
				fail(fmt.Errorf("look up %s: %w", k, err))
				continue
			}
			if v == noInterface {
				fail(fmt.Errorf("rank %d has no usable interface (its own error says why): %w", r, ErrUnavailable))
				continue
			}
			if p, err = parsePeerInfo(v); err != nil {
				fail(fmt.Errorf("rank %d's address: %w", r, err))
				continue
			}
		}
		if string(p.mac) == string(me.mac) {
			if p.queue != queue {
				fail(fmt.Errorf("rank %d binds queue %d of interface %s and this rank queue %d: the ranks of one interface bind one queue", r, p.queue, ifi.Name, queue))
			}
			if r == rank {
				t.slot = len(group)
			}
			sgAll = sgAll && p.sg
			group = append(group, r) // the wire does not reach it: shm does, in a job over nodes
			continue
		}
		t.macs[r] = p.mac
		mtu = min(mtu, p.mtu)
		sgAll = sgAll && p.sg
	}
	frameMax := maxFrame
	if sgAll {
		frameMax = sgMaxFrame
	}
	maxPacket := min(mtu+EthHeader, frameMax) - Overhead
	if maxPacket < MinPacket {
		fail(fmt.Errorf("packets of at most %d bytes fit the interfaces' MTU %d, want %d: raise the MTU: %w",
			maxPacket, mtu, MinPacket, ErrUnavailable))
	}
	if secret != nil {
		if t.pr, err = newProver(secret); err != nil {
			fail(err)
		}
	}
	var seed [8]byte
	if _, err := rand.Read(seed[:]); err != nil {
		fail(fmt.Errorf("a random first frame number: %w", err))
	}
	t.seq.Store(binary.LittleEndian.Uint64(seed[:]))
	t.layout, t.leader = newLayout(len(group), sgAll && mtu+EthHeader > maxFrame), group[0] == rank
	if t.layout.span > 1 {
		t.partial = make([]byte, 0, sgMaxFrame)
	}
	name := shareName(b.JobID(), ifi.Name, queue)
	if ferr == nil && t.leader {
		if err := t.setupLeader(mode, name); err != nil {
			fail(err)
		}
	}
	if err := b.Fence(); err != nil {
		fail(fmt.Errorf("fence after the interfaces' first ranks opened: %w", err))
	}
	if ferr == nil && !t.leader {
		if err := t.setupFollower(name); err != nil {
			fail(fmt.Errorf("join rank %d's socket on %s: %w", group[0], ifi.Name, err))
		}
	}
	if err := b.Fence(); err != nil {
		fail(fmt.Errorf("fence after every rank opened: %w", err))
	}
	if t.listener != nil {
		t.listener.Close()
		t.listener = nil
	}
	if ferr != nil {
		t.release()
		return nil, ferr
	}
	t.caps = transport.Caps{Name: "xdp", MaxPacket: maxPacket, Wakeup: true, BufferBytes: BufferBytes}
	return t, nil
}

// openSocket makes this rank's AF_XDP socket and the eventfd Wake writes.
func (t *Transport) openSocket() error {
	var err error
	if t.wake, err = wakefd.Open(); err != nil {
		return err
	}
	if t.fd, err = unix.Socket(unix.AF_XDP, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0); err != nil {
		switch {
		case errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES):
			return fmt.Errorf("socket(AF_XDP): %w: needs CAP_NET_RAW (run as root): %w", err, ErrUnavailable)
		case errors.Is(err, unix.EAFNOSUPPORT):
			return fmt.Errorf("socket(AF_XDP): %w: the kernel has no AF_XDP sockets (CONFIG_XDP_SOCKETS): %w", err, ErrUnavailable)
		}
		return fmt.Errorf("socket(AF_XDP): %w", err)
	}
	return nil
}

// offsets returns where socket fd's rings keep their words and entries.
func offsets(fd int) (unix.XDPMmapOffsets, error) {
	var off unix.XDPMmapOffsets
	ol := uint32(unsafe.Sizeof(off))
	if _, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_XDP, unix.XDP_MMAP_OFFSETS,
		uintptr(unsafe.Pointer(&off)), uintptr(unsafe.Pointer(&ol)), 0); e != 0 {
		return off, fmt.Errorf("XDP_MMAP_OFFSETS: %w", e)
	}
	if ol != uint32(unsafe.Sizeof(off)) {
		return off, fmt.Errorf("XDP_MMAP_OFFSETS: the kernel's layout has %d bytes, want %d (a kernel older than 5.4): %w", ol, unsafe.Sizeof(off), ErrUnavailable)
	}
	return off, nil
}

// ringSizes sizes socket fd's rings.
func ringSizes(fd int, rings ...int) error {
	for _, o := range rings {
		if err := unix.SetsockoptInt(fd, unix.SOL_XDP, o, RingSize); err != nil {
			return fmt.Errorf("size ring %d: %w", o, err)
		}
	}
	return nil
}

// mapOwnRings maps this rank's rx and tx rings.
func (t *Transport) mapOwnRings() error {
	off, err := offsets(t.fd)
	if err != nil {
		return err
	}
	ds := uint32(unsafe.Sizeof(unix.XDPDesc{}))
	if t.rx, err = mapRing(t.fd, off.Rx, unix.XDP_PGOFF_RX_RING, RingSize, ds); err != nil {
		return err
	}
	t.tx, err = mapRing(t.fd, off.Tx, unix.XDP_PGOFF_TX_RING, RingSize, ds)
	return err
}

// mapSharedRings maps the UMEM's fill and completion rings, which belong
// to socket fd (the leader's).
func (t *Transport) mapSharedRings(fd int) error {
	off, err := offsets(fd)
	if err != nil {
		return err
	}
	if t.fill, err = mapRing(fd, off.Fr, unix.XDP_UMEM_PGOFF_FILL_RING, RingSize, 8); err != nil {
		return err
	}
	t.comp, err = mapRing(fd, off.Cr, unix.XDP_UMEM_PGOFF_COMPLETION_RING, RingSize, 8)
	return err
}

// setupLeader makes the socket, the UMEM and its four rings, attaches the
// program, binds, and serves the interface's other ranks on the Unix
// socket name.
func (t *Transport) setupLeader(mode, name string) error {
	if err := t.openSocket(); err != nil {
		return err
	}
	_ = rlimit.RemoveMemlock()
	if err := t.makeUMEM(); err != nil {
		return err
	}
	n := t.layout.umemBytes()
	reg := unix.XDPUmemReg{Addr: uint64(uintptr(unsafe.Pointer(&t.umem[0]))), Len: uint64(n), Size: FrameSize}
	if _, _, e := unix.Syscall6(unix.SYS_SETSOCKOPT, uintptr(t.fd), unix.SOL_XDP, unix.XDP_UMEM_REG,
		uintptr(unsafe.Pointer(&reg)), unsafe.Sizeof(reg), 0); e != 0 {
		if e == unix.ENOMEM || e == unix.EPERM {
			return fmt.Errorf("register the UMEM (%d bytes): %w (it is locked memory: RLIMIT_MEMLOCK or CAP_IPC_LOCK): %w", n, e, ErrUnavailable)
		}
		return fmt.Errorf("register the UMEM: %w", e)
	}
	if err := ringSizes(t.fd, unix.XDP_UMEM_FILL_RING, unix.XDP_UMEM_COMPLETION_RING, unix.XDP_RX_RING, unix.XDP_TX_RING); err != nil {
		return err
	}
	if err := t.mapSharedRings(t.fd); err != nil {
		return err
	}
	if err := t.mapOwnRings(); err != nil {
		return err
	}
	// The receive frames, the first RxFrames, all go to the fill ring.
	for i := range uint32(RxFrames) {
		*t.fill.addr(i) = uint64(i) * FrameSize
	}
	t.fill.prod.Store(RxFrames)
	var err error
	if t.att, err = attach(t.ifindex, t.ifname, t.etherType, mode, t.size); err != nil {
		if errors.Is(err, errNeedPrivilege) || errors.Is(err, errTaken) {
			return fmt.Errorf("%w: %w", err, ErrUnavailable)
		}
		return err
	}
	if err := t.bind(); err != nil {
		return err
	}
	if err := t.att.xsks.Put(uint32(t.rank), uint32(t.fd)); err != nil {
		return fmt.Errorf("register the socket in the XSKMAP: %w", err)
	}
	if t.layout.k > 1 {
		l, err := net.ListenUnix("unix", &net.UnixAddr{Name: name, Net: "unix"})
		if err != nil {
			return fmt.Errorf("listen for the interface's other ranks on %s: %w", name, err)
		}
		t.listener = l
		go t.share(l)
	}
	return nil
}

// setupFollower joins the interface leader's UMEM: its socket binds with
// XDP_SHARED_UMEM and has its own rx and tx rings.
func (t *Transport) setupFollower(name string) error {
	if err := t.openSocket(); err != nil {
		return err
	}
	fds, msg, err := fetchShared(name)
	if err != nil {
		return fmt.Errorf("fetch the UMEM: %w", err)
	}
	t.s0, t.memfd = fds[0], fds[1]
	var mode string
	var span, txPer int
	if _, err := fmt.Sscanf(msg, "%s %d %d", &mode, &span, &txPer); err != nil || span != t.layout.span || txPer != t.layout.txPer {
		unix.Close(fds[2])
		unix.Close(fds[3])
		return fmt.Errorf("the leader's UMEM layout %q is not this rank's (%d %d)", msg, t.layout.span, t.layout.txPer)
	}
	t.att = &attachment{mode: mode}
	if t.att.xsks, err = ebpf.NewMapFromFD(fds[2]); err != nil {
		unix.Close(fds[2])
		unix.Close(fds[3])
		return fmt.Errorf("the leader's XSKMAP: %w", err)
	}
	if t.att.lnk, err = link.NewFromFD(fds[3]); err != nil {
		unix.Close(fds[3])
		return fmt.Errorf("the leader's XDP link: %w", err)
	}
	if err := t.mapUMEM(); err != nil {
		return err
	}
	if err := ringSizes(t.fd, unix.XDP_RX_RING, unix.XDP_TX_RING); err != nil {
		return err
	}
	if err := t.mapSharedRings(t.s0); err != nil {
		return err
	}
	if err := t.mapOwnRings(); err != nil {
		return err
	}
	if err := t.bindShared(); err != nil {
		return err
	}
	if err := t.att.xsks.Put(uint32(t.rank), uint32(t.fd)); err != nil {
		return fmt.Errorf("register the socket in the XSKMAP: %w", err)
	}
	return nil
}

// bind binds the socket to the interface's queue: zero-copy when the
// driver offers it (the XDP program attached in driver mode), else copy
// mode; with XDP_USE_SG when frames span several chunks.
func (t *Transport) bind() error {
	flags := []uint16{unix.XDP_COPY}
	if t.att.mode == "driver" {
		flags = []uint16{unix.XDP_ZEROCOPY, unix.XDP_COPY}
	}
	var err error
	for _, f := range flags {
		if t.layout.span > 1 {
			f |= unix.XDP_USE_SG
		}
		if err = t.bindAs(&unix.SockaddrXDP{Flags: f, Ifindex: uint32(t.ifindex), QueueID: uint32(t.queue)}); err == nil {
			return nil
		}
	}
	if errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("bind to %s queue %d: %w (has the interface that many queues?)", t.ifname, t.queue, err)
	}
	return fmt.Errorf("bind to %s queue %d: %w", t.ifname, t.queue, err)
}

// bindShared binds a follower's socket to the leader's queue and UMEM.
func (t *Transport) bindShared() error {
	err := t.bindAs(&unix.SockaddrXDP{Flags: unix.XDP_SHARED_UMEM, Ifindex: uint32(t.ifindex),
		QueueID: uint32(t.queue), SharedUmemFD: uint32(t.s0)})
	if err != nil {
		return fmt.Errorf("bind to %s queue %d sharing the UMEM: %w", t.ifname, t.queue, err)
	}
	return nil
}

// bindAs binds the socket to sa, retrying for up to bindWait while the
// kernel answers EBUSY (a queue stays busy for tens of milliseconds after
// its previous socket closed), and then asks the kernel whether the
// socket is in zero-copy mode.
func (t *Transport) bindAs(sa *unix.SockaddrXDP) error {
	deadline := time.Now().Add(bindWait)
	for {
		err := unix.Bind(t.fd, sa)
		if errors.Is(err, unix.EBUSY) && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
			continue
		}
		if err != nil {
			return err
		}
		var o uint32
		ol := uint32(4)
		if _, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(t.fd), unix.SOL_XDP, unix.XDP_OPTIONS,
			uintptr(unsafe.Pointer(&o)), uintptr(unsafe.Pointer(&ol)), 0); e == 0 {
			t.zeroCopy = o&unix.XDP_OPTIONS_ZEROCOPY != 0
		}
		return nil
	}
}

// release frees what setup made.
func (t *Transport) release() {
	if t.listener != nil {
		t.listener.Close()
	}
	if t.att != nil {
		if t.att.xsks != nil && t.fd >= 0 {
			_ = t.att.xsks.Delete(uint32(t.rank))
		}
		t.att.close()
	}
	for _, r := range []*ring{t.fill, t.comp, t.rx, t.tx} {
		r.unmap()
	}
	t.wake.Close()
	for _, fd := range []int{t.fd, t.s0, t.memfd} {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
	if t.mem != nil {
		_ = unix.Munmap(t.mem)
		t.mem, t.umem = nil, nil
	}
}

// Rank is this rank, 0..Size-1.
func (t *Transport) Rank() int { return t.rank }

// Size is the number of ranks in the job.
func (t *Transport) Size() int { return t.size }

// Caps: neither ordered nor reliable (package am adds both), wake-up, no
// Put; MaxPacket as the smallest MTU among the job's interfaces allows,
// less the framing (at most 3840 bytes of frame in one chunk, 11520 over
// sgChunks with multi-buffer AF_XDP).
func (t *Transport) Caps() transport.Caps { return t.caps }

// Interface names the interface, its queue, the XDP attach mode ("driver"
// or "generic") and whether the socket is in zero-copy mode.
func (t *Transport) Interface() (name string, queue int, mode string, zeroCopy bool) {
	return t.ifname, t.queue, t.att.mode, t.zeroCopy
}

// Stats returns a snapshot of the counters.
func (t *Transport) Stats() Stats {
	s := &t.st
	st := Stats{Sent: s.sent.Load(), Received: s.received.Load(), BytesSent: s.bytesOut.Load(),
		BytesReceived: s.bytesIn.Load(), WouldBlocks: s.wouldBlock.Load(), SendErrors: s.sendErrs.Load()}
	st.Short, st.Foreign, st.Misdirected, st.BadProof = s.drops.Snapshot()
	if !t.closed.Load() {
		var ks unix.XDPStatistics
		l := uint32(unsafe.Sizeof(ks))
		if _, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(t.fd), unix.SOL_XDP, unix.XDP_STATISTICS,
			uintptr(unsafe.Pointer(&ks)), uintptr(unsafe.Pointer(&l)), 0); e == 0 {
			st.KernelDropped = ks.Rx_dropped + ks.Rx_ring_full
		}
	}
	return st
}

// Send sends one frame to dst: the Ethernet header, the frame header, hdr,
// payload and the proof are written into a free send slot of the UMEM,
// its descriptor(s) go on the tx ring, and sendto(MSG_DONTWAIT) has the
// kernel transmit it (copy mode transmits only inside that call). It does
// not allocate. Errors: transport.ErrTooLarge, transport.ErrWouldBlock
// (every send slot in flight: poll and retry), transport.ErrPeer (dst out
// of range, or a rank on this rank's own interface, which the wire cannot
// reach), transport.ErrClosed, and unexpected socket errors.
func (t *Transport) Send(dst int, hdr, payload []byte) error {
	if t.closed.Load() {
		return transport.ErrClosed
	}
	if uint(dst) >= uint(t.size) {
		return transport.PeerErrorf(dst, "xdp: send from rank %d to rank %d of %d", t.rank, dst, t.size)
	}
	n := len(hdr) + len(payload)
	if n > t.caps.MaxPacket {
		return fmt.Errorf("xdp: send %d bytes to rank %d, max %d: %w", n, dst, t.caps.MaxPacket, transport.ErrTooLarge)
	}
	if dst == t.rank {
		return t.sendSelf(hdr, payload)
	}
	mac := t.macs[dst]
	if mac == nil {
		return transport.PeerErrorf(dst, "xdp: rank %d is on rank %d's own interface %s, which frames cannot reach", dst, t.rank, t.ifname)
	}
	t.txMu.Lock()
	defer t.txMu.Unlock()
	t.reap() // frees the slot sent from last, when done: reused while warm
	slot, ok := t.takeSlot()
	if !ok {
		t.kick()
		t.reap()
		if slot, ok = t.takeSlot(); !ok {
			t.st.wouldBlock.Add(1)
			return transport.ErrWouldBlock
		}
	}
	// The tx ring has room: it holds only the descriptors of this rank's
	// frames in flight, at most txPer*span <= RingSize of them.
	addr := uint64(RxFrames+slot*t.layout.span) * FrameSize
	end := addr + uint64(t.layout.span)*FrameSize
	chunk := t.umem[addr:end:end]
	putEth(chunk, mac, t.mac, t.etherType)
	d := chunk[EthHeader : EthHeader+dgram.FrameHeader]
	t.pr.PutFrame(d, t.rank, dst, t.seq.Add(1))
	d = t.pr.Seal(append(append(d, hdr...), payload...), &t.nonce)
	size := EthHeader + len(d)
	for off := 0; ; off += FrameSize {
		// A frame larger than a chunk goes as several descriptors, all but
		// the last marked XDP_PKT_CONTD (its slot's chunks are adjacent).
		l := min(FrameSize, size-off)
		var opt uint32
		if off+l < size {
			opt = unix.XDP_PKT_CONTD
		}
		*t.tx.desc(t.tx.local) = unix.XDPDesc{Addr: addr + uint64(off), Len: uint32(l), Options: opt}
		t.tx.local++
		if opt == 0 {
			// The slot's word (set to 1 by takeSlot) counts the
			// descriptors the kernel has yet to complete.
			t.busy(slot).Store(uint32(off/FrameSize + 1))
			break
		}
	}
	t.tx.publish()
	t.st.sent.Add(1)
	t.st.bytesOut.Add(uint64(size))
	if t.hold.Load() > 0 && t.tx.local-t.tx.cons.Load() < maxHeld {
		return nil // Flush or Poll kicks
	}
	return t.kick()
}

// maxHeld is how many frames a held Send leaves in the tx ring before it
// kicks anyway: the kernel transmits up to 32 per sendto in copy mode.
const maxHeld = 32

// Hold makes Sends keep their frames in the tx ring, up to maxHeld of
// them, until the matching Flush or a Poll (transport.Batcher): one
// sendto then transmits the run.
func (t *Transport) Hold() { t.hold.Add(1) }

// Flush ends a Hold; when no Hold remains it kicks what the tx ring holds.
// Errors: as Send's.
func (t *Transport) Flush() error {
	if t.hold.Add(-1) > 0 || !t.tx.waiting() {
		return nil
	}
	t.txMu.Lock()
	defer t.txMu.Unlock()
	err := t.kick()
	t.reap()
	return err
}

// kick has the kernel transmit what the tx ring holds. A transient refusal
// leaves the frames in the ring for the next kick (Poll kicks while frames
// wait). Called with txMu held.
func (t *Transport) kick() error {
	for {
		_, _, e := unix.Syscall6(unix.SYS_SENDTO, uintptr(t.fd), 0, 0, unix.MSG_DONTWAIT, 0, 0)
		switch e {
		case 0:
			return nil
		case unix.EINTR:
			continue
		case unix.EAGAIN, unix.EBUSY, unix.ENOBUFS, unix.ENOMEM, unix.ENETDOWN, unix.ENXIO:
			t.st.sendErrs.Add(1)
			return nil
		}
		if t.closed.Load() {
			return transport.ErrClosed
		}
		return fmt.Errorf("xdp: rank %d: transmit: %w", t.rank, e)
	}
}

// takeSlot finds one of this rank's send slots not in flight, the one it
// sent from last if it can, marks it in flight and returns its index among
// the interface's slots. Called with txMu held.
func (t *Transport) takeSlot() (int, bool) {
	per, base := t.layout.txPer, t.slot*t.layout.txPer
	j := t.txLast
	for range per + 1 {
		if w := t.busy(base + j); w.Load() == 0 {
			w.Store(1)
			t.txLast, t.txNext = j, (j+1)%per
			return base + j, true
		}
		j, t.txNext = t.txNext, (t.txNext+1)%per
	}
	return 0, false
}

// reap takes the frames the kernel has finished sending off the completion
// ring, which the interface's ranks share, and counts each off its slot's
// word, whoever's the slot is. When another rank holds the ring's lock, it is
// reaping: reap returns at once.
func (t *Transport) reap() {
	if !t.comp.waiting() {
		return
	}
	lk := t.word(ctrlComp)
	if !lk.CompareAndSwap(0, 1) {
		return
	}
	c, p := t.comp.cons.Load(), t.comp.prod.Load()
	span := t.layout.span
	total := t.layout.k * t.layout.txPer * span
	for ; c != p; c++ {
		// A slot's word counts its frame's descriptors not yet
		// completed: the slot is free when the last one is.
		if i := int(*t.comp.addr(c)/FrameSize) - RxFrames; i >= 0 && i < total {
			t.busy(i / span).Add(^uint32(0))
		}
	}
	t.comp.cons.Store(c)
	spinUnlock(lk)
}

// sendSelf queues a packet for this rank's own Poll.
func (t *Transport) sendSelf(hdr, payload []byte) error {
	if !t.self.Push(hdr, payload, selfBytes) {
		t.st.wouldBlock.Add(1)
		return transport.ErrWouldBlock
	}
	t.st.sent.Add(1)
	t.st.bytesOut.Add(uint64(len(hdr) + len(payload)))
	return nil
}

// Poll hands up to max arrived packets to r, each in place in its chunk,
// and returns the chunks to the fill ring. A frame that fails a check
// (DecodeFrame) is dropped and counted in Stats. It also kicks frames a
// transient refusal left in the tx ring. It does not allocate and never
// sleeps. Errors: transport.ErrClosed.
func (t *Transport) Poll(r transport.Receiver, max int) (int, error) {
	if t.closed.Load() {
		return 0, transport.ErrClosed
	}
	got := t.pollSelf(r, max)
	if avail := t.rx.ready(); avail > 0 && got < max {
		first := t.rx.local
		var n uint32
		for n < avail && got < max {
			dd := t.rx.desc(first + n)
			n++
			addr, size := dd.Addr, uint64(dd.Len)
			if addr+size > uint64(len(t.umem)) {
				t.st.drops.Count(dgram.ErrShort)
				t.partial = t.partial[:0]
				continue
			}
			frame := t.umem[addr : addr+size]
			if dd.Options&unix.XDP_PKT_CONTD != 0 || len(t.partial) > 0 {
				// A frame over several chunks (multi-buffer): gathered
				// here, since its proof covers it whole.
				if len(t.partial)+len(frame) > sgMaxFrame {
					t.st.drops.Count(dgram.ErrShort)
					t.partial = t.partial[:0]
					continue
				}
				t.partial = append(t.partial, frame...)
				if dd.Options&unix.XDP_PKT_CONTD != 0 {
					continue
				}
				frame = t.partial
			}
			src, pkt, err := DecodeFrame(frame, t.rank, t.size, t.mac, t.macs, t.etherType, t.pr, &t.rnonce)
			if err == nil {
				t.st.received.Add(1)
				t.st.bytesIn.Add(uint64(len(frame)))
				r.Deliver(src, pkt)
				got++
			} else {
				t.st.drops.Count(err)
			}
			t.partial = t.partial[:0]
		}
		// The chunks go back to the fill ring, which the interface's ranks
		// share, then the rx ring's entries to the kernel.
		lk := t.word(ctrlFill)
		spinLock(lk)
		p := t.fill.prod.Load()
		for i := range n {
			*t.fill.addr(p + i) = t.rx.desc(first+i).Addr &^ (FrameSize - 1)
		}
		t.fill.prod.Store(p + n)
		spinUnlock(lk)
		t.rx.local = first + n
		t.rx.release()
	}
	if t.tx.waiting() && t.txMu.TryLock() {
		t.kick()
		t.reap()
		t.txMu.Unlock()
	}
	return got, nil
}

// pollSelf delivers packets this rank sent itself.
func (t *Transport) pollSelf(r transport.Receiver, max int) int {
	n, bytes := t.self.Deliver(r, t.rank, max)
	if n > 0 {
		t.st.received.Add(uint64(n))
		t.st.bytesIn.Add(uint64(bytes))
	}
	return n
}

// Wait returns when a frame may have arrived, when Wake is called (or was
// called since the last Wait), or after about d: it watches the rx ring's
// producer word for up to the spin time, then sleeps in ppoll until the
// socket or the wake eventfd is readable or d passes. Errors:
// transport.ErrClosed.
func (t *Transport) Wait(d time.Duration) error {
	return t.wait(d, t.spin)
}

// Sleep is Wait without the spin (transport.Sleeper).
func (t *Transport) Sleep(d time.Duration) error { return t.wait(d, 0) }

func (t *Transport) wait(d, spin time.Duration) error {
	if t.closed.Load() {
		return transport.ErrClosed
	}
	if t.wake.Woken() {
		t.wake.Drain(true)
		return nil
	}
	if t.rx.waiting() || t.self.Pending() {
		return nil
	}
	if spin > 0 {
		start := time.Now()
		for i := 0; ; i++ {
			if t.rx.waiting() || t.wake.Woken() {
				return nil
			}
			if i&63 == 63 {
				el := time.Since(start)
				if el >= d {
					return nil
				}
				if el >= spin {
					d -= el
					break
				}
			}
		}
	}
	fds := [2]unix.PollFd{{Fd: int32(t.fd), Events: unix.POLLIN}, {Fd: int32(t.wake.FD()), Events: unix.POLLIN}}
	ts := unix.NsecToTimespec(int64(d))
	if _, err := unix.Ppoll(fds[:], &ts, nil); err != nil && err != unix.EINTR {
		if t.closed.Load() {
			return transport.ErrClosed
		}
		return fmt.Errorf("xdp: rank %d: ppoll: %w", t.rank, err)
	}
	t.wake.Drain(fds[1].Revents&unix.POLLIN != 0)
	return nil
}

// Wake makes a Wait in progress return, or else the next one return at once
// (transport.Waker).
func (t *Transport) Wake() { t.wake.Wake() }

// Close detaches the XDP program, closes the socket and releases the UMEM;
// frames in flight are lost. It must not run concurrently with the other methods. Closing twice
// is a no-op.
func (t *Transport) Close() error {
	if t.closed.Swap(true) {
		return nil
	}
	t.release()
	return nil
}
