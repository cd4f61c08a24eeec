//go:build linux

package shm

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/amgo-hpc/amgo/am/transport"
	settings "github.com/amgo-hpc/amgo/am/transport/internal/opts"
	"github.com/amgo-hpc/amgo/internal/futex"
	"github.com/amgo-hpc/amgo/internal/membarrier"
	"github.com/amgo-hpc/amgo/internal/memcopy"
	"github.com/amgo-hpc/amgo/internal/release"
	"github.com/amgo-hpc/amgo/internal/ring"
)

func init() {
	transport.Register("shm", New)
}

// DefaultRingBytesFor is the default data area of each directed ring, in
// bytes, for a node of n ranks: 256 KiB up to 8 ranks, 128 KiB up to 32,
// DefaultRingBytes above. A peer's buffer is its ring's size (Caps), and an
// MPI message of up to a quarter of it goes eagerly, so larger rings carry
// larger messages without a rendezvous's system call; a rank touches the
// rings of the peers that send to it only (at most n-1 of them: about 2,
// 4 and 8 MiB at 8, 32 and 128 ranks).
func DefaultRingBytesFor(n int) int {
	switch {
	case n <= 8:
		return 256 << 10
	case n <= 32:
		return 128 << 10
	}
	return DefaultRingBytes
}

// Defaults.
const (
	// DefaultRingBytes is the data area of each directed ring, in bytes, on
	// a node of more than 32 ranks (DefaultRingBytesFor).
	DefaultRingBytes = 64 << 10
	// DefaultSpin is how long Wait polls before it sleeps on the futex.
	DefaultSpin = 15 * time.Microsecond
	// DefaultLapBytes is the short lap of each ring's small records, in
	// bytes (ring.Producer.SetLap: records of up to a quarter of it go back
	// to the ring's start once past it, while the consumer keeps up), so
	// that a stream of them stays in the first-level caches.
	DefaultLapBytes = 16 << 10
	// PutMin is the smallest store or get, in bytes, for which a CMA Put or
	// Get (one copy, one system call) beats packets through the rings (two
	// copies, each pulling cache lines from the other core); the crossover
	// of am store latency lies between 2 and 4 KiB (docs/performance.md).
	PutMin = 4 << 10
)

// File layout.
const (
	fileMagic   = 0x314d48536f676d61 // "amgoSHM1" little-endian
	fileVersion = 2
	hdrMagic    = 0    // uint64, stored last
	hdrVersion  = 8    // uint32
	hdrRank     = 12   // uint32
	hdrSize     = 16   // uint32
	hdrPid      = 20   // uint32
	hdrStride   = 24   // uint64: bytes per ring region
	hdrState    = 32   // uint32: stateOpen, stateClosed
	hdrBell     = 128  // futex.DoorbellLen bytes
	annOff      = 4096 // uint32: rings announced so far; slots follow
	annSlots    = annOff + 64
	hdrLen      = 4096
	stateOpen   = 1
	stateClosed = 2
	pageSize    = 4096
)

// ringsOff is where the rings start in the file of a job of size ranks: after
// the header page and the announcement area (a count and a slot per rank),
// rounded up to a page.
func ringsOff(size int) int {
	return annOff + (annSlots-annOff+4*size+pageSize-1)&^(pageSize-1)
}

// How often idle loops look for dead peers.
const (
	peerCheckEvery = 50 * time.Millisecond
	idleChecks     = 1 << 12 // empty Polls, or full Sends to one peer, between clock reads
)

// Transport is one rank's shared-memory attachment. It implements
// transport.Transport and transport.Putter.
type Transport struct {
	rank, size int
	caps       transport.Caps
	spin       time.Duration
	lap        int    // the rings' short lap for small records, bytes (ring.Producer.SetLap)
	own        []byte // this rank's file, mapped
	stride     int    // bytes per ring region in own
	bell       futex.Doorbell
	// The inbound rings that producers have announced (see connect), in
	// the order Poll found them: act has a slot per rank and act[:nAct] are
	// immutable once published, so Wait reads them while Poll adds more.
	act     []inbound
	nAct    atomic.Int32
	seen    atomic.Uint32    // announcement slots Poll has taken in
	ann     *atomic.Uint32   // own file's announcement count
	in      []*ring.Consumer // by source rank, nil until announced; Poll's
	peers   []peer
	pending func() bool
	woken   atomic.Bool // Wake was called: the next look of Wait returns
	// fence: Send puts a full barrier between publishing a record and
	// checking whether the receiver sleeps; false where the receiver's
	// sleep path runs membarrier.Heavy instead (internal/membarrier).
	fence bool

	closed    atomic.Bool
	anyDead   atomic.Bool
	deaths    atomic.Int32 // peers found dead
	reported  atomic.Int32 // deaths Poll has reported (Wait wakes only for newer ones)
	lastCheck atomic.Int64 // unix nanoseconds of the last dead-peer check

	// Written by every Poll: on cache lines of their own, away from what
	// concurrent Sends read.
	_    [128]byte
	next int // Poll's round-robin position
	// streak[src]: the last look at src's ring found a record (a stream is
	// arriving), so Poll takes a burst from it; after an empty look it
	// takes one record and returns (see Poll).
	streak []bool
	idle   int // empty Polls since the last dead-peer check
	// polls counts Polls (written by each, loaded by Sends): a Send to a
	// peer that finds it where the last Send to that peer left it is part
	// of a stream (streamTo).
	polls uint64
	// rx[src] counts the records Poll took from src's ring (written by
	// each Poll, loaded by Sends to src: streamTo).
	rx []uint64
	// recv is Poll's receiver as a ring.Receiver, converted once.
	recv ring.ReceiverOf[transport.Receiver]
	_    [80]byte
}

// inbound is an announced ring: its source rank and consumer.
type inbound struct {
	src int
	c   *ring.Consumer
}

// peer is what Send to one rank uses; padded so that Sends to different ranks
// on different goroutines do not share cache lines.
type peer struct {
	_     [64]byte
	mem   []byte         // its file, mapped (this rank's own mapping for itself)
	out   *ring.Producer // nil until the first Send (connect)
	cap   int            // data bytes of the ring to it
	bell  futex.Doorbell
	pid   int
	state *atomic.Uint32 // in its file header
	full  int            // consecutive full Sends
	polls uint64         // Transport.polls at the last Send to it (streamTo)
	rx    uint64         // Transport.rx[its rank] at the last Send to it (streamTo)
	rxAvg uint64         // records taken from it per Send to it, a moving average in 65536ths (streamsBack)
	dead  atomic.Bool
	noPut atomic.Bool // cross memory attach refused (puts and gets)
}

// New opens rank b.Rank()'s shared-memory transport for a job of b.Size() ranks
// on this host; the result is a *Transport. It calls b.Fence twice, so every
// rank must call New concurrently. opts: see the package documentation. Errors:
// bad options, file system and mmap failures, and peers' files that are
// missing, foreign or malformed, each naming the rank and path.
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
		return nil, fmt.Errorf("shm: bad job shape: rank %d of %d", rank, size)
	}
	ringBytes, err := settings.Bytes(opts, "ring_bytes", "AMGO_SHM_RING_BYTES", DefaultRingBytesFor(size), 1, 1<<30)
	if err != nil {
		return nil, err
	}
	if ringBytes < ring.MinCapacity || ringBytes > 1<<30 {
		return nil, fmt.Errorf("shm: ring_bytes %d out of range [%d, %d]", ringBytes, ring.MinCapacity, 1<<30)
	}
	ringBytes = roundPow2(ringBytes)
	spin, err := settings.Duration(opts, "spin", "AMGO_SHM_SPIN", DefaultSpin)
	if err != nil {
		return nil, fmt.Errorf("shm: %w", err)
	}
	lapBytes, err := settings.Bytes(opts, "lap_bytes", "AMGO_SHM_LAP_BYTES", DefaultLapBytes, 0, 1<<30) // 0: no short lap
	if err != nil {
		return nil, err
	}
	// Allow CMA from peers on hosts with Yama ptrace_scope=1. EINVAL: no Yama;
	// any other failure only means Puts to us may fail with EPERM, which
	// callers handle by falling back to packets.
	_ = unix.Prctl(unix.PR_SET_PTRACER, unix.PR_SET_PTRACER_ANY, 0, 0, 0)

	dir, ownDir, err := jobDir(b, opts)
	if err != nil {
		return nil, err
	}
	stride := (ring.RegionSize(ringBytes) + pageSize - 1) &^ (pageSize - 1)
	fileLen := ringsOff(size) + size*stride
	prefix := settings.Get(opts, "prefix", "")
	if strings.ContainsRune(prefix, '/') {
		return nil, fmt.Errorf("shm: file name prefix %q has a slash", prefix)
	}
	path := filepath.Join(dir, fmt.Sprintf("%sshm.%d", prefix, rank))
	own, err := createFile(path, fileLen)
	if err != nil {
		return nil, err
	}
	// The rings are formatted by their producers on first use (connect):
	// a ring nobody sends on costs no page.
	t := &Transport{rank: rank, size: size, spin: spin, lap: lapBytes, own: own, stride: stride, fence: !membarrier.Enabled(),
		act: make([]inbound, size), ann: u32(own, annOff),
		in: make([]*ring.Consumer, size), peers: make([]peer, size), streak: make([]bool, size), rx: make([]uint64, size)}
	t.pending = t.arrived
	fail := func(err error) (*Transport, error) {
		os.Remove(path)
		t.unmap()
		return nil, err
	}
	if t.bell, err = futex.NewDoorbell(own[hdrBell:]); err != nil {
		return fail(err)
	}
	u32(own, hdrVersion).Store(fileVersion)
	u32(own, hdrRank).Store(uint32(rank))
	u32(own, hdrSize).Store(uint32(size))
	u32(own, hdrPid).Store(uint32(os.Getpid()))
	u64(own, hdrStride).Store(uint64(stride))
	u32(own, hdrState).Store(stateOpen)
	u64(own, hdrMagic).Store(fileMagic)

	key := "amgo.shm." + strconv.Itoa(rank)
	if err := b.Put(key, path); err != nil {
		return fail(fmt.Errorf("shm: rank %d: publish %s: %w", rank, key, err))
	}
	if err := b.Fence(); err != nil {
		return fail(fmt.Errorf("shm: rank %d: fence after publishing: %w", rank, err))
	}
	maxPacket := int(^uint(0) >> 1)
	for dst := 0; dst < size; dst++ {
		p := &t.peers[dst]
		if dst == rank {
			p.mem = own
		} else {
			k := "amgo.shm." + strconv.Itoa(dst)
			ppath, err := b.Get(k)
			if err != nil {
				return fail(fmt.Errorf("shm: rank %d: look up %s: %w", rank, k, err))
			}
			if p.mem, err = mapPeer(ppath, dst, size); err != nil {
				return fail(fmt.Errorf("shm: rank %d: %w", rank, err))
			}
		}
		pstride := int(u64(p.mem, hdrStride).Load())
		if pstride < ring.RegionSize(ring.MinCapacity) || pstride%8 != 0 || ringsOff(size)+size*pstride > len(p.mem) {
			return fail(fmt.Errorf("shm: rank %d: rank %d's file has ring stride %d in %d bytes", rank, dst, pstride, len(p.mem)))
		}
		p.cap = ring.FitCapacity(pstride)
		if p.bell, err = futex.NewDoorbell(p.mem[hdrBell:]); err != nil {
			return fail(err)
		}
		p.pid = int(u32(p.mem, hdrPid).Load())
		p.state = u32(p.mem, hdrState)
		maxPacket = min(maxPacket, ring.MaxRecord(p.cap))
	}
	if err := b.Fence(); err != nil {
		return fail(fmt.Errorf("shm: rank %d: fence after mapping: %w", rank, err))
	}
	if err := os.Remove(path); err != nil {
		t.unmap()
		return nil, fmt.Errorf("shm: rank %d: unlink %s: %w", rank, path, err)
	}
	if ownDir {
		os.Remove(dir) // succeeds for the last rank to get here; the others' files are gone too
	}
	t.caps = transport.Caps{Name: "shm", Ordered: true, Reliable: true, MaxPacket: maxPacket,
		QueueBytes: ringBytes, Put: true, Get: true, PutMin: PutMin, Wakeup: true, Fill: true,
		// A peer's buffer as large as the ring that carries its packets:
		// eager MPI messages of a quarter of it fit (a 16 KiB buffer held
		// one of 8 KiB).
		BufferBytes: ringBytes}
	t.lastCheck.Store(time.Now().UnixNano())
	return t, nil
}

func roundPow2(n int) int {
	c := 1
	for c < n {
		c <<= 1
	}
	return c
}

// jobDir returns the directory for this job's files and whether New created it
// (and so should remove it).
func jobDir(b transport.Bootstrap, opts map[string]string) (string, bool, error) {
	if d := settings.Get(opts, "dir", "AMGO_JOB_DIR"); d != "" {
		return d, false, nil
	}
	id := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.' {
			return r
		}
		return '_'
	}, b.JobID())
	if id == "" || strings.Trim(id, ".") == "" {
		return "", false, fmt.Errorf("shm: job id %q unusable as a directory name; set AMGO_JOB_DIR", b.JobID())
	}
	uid := os.Getuid()
	dir := filepath.Join("/dev/shm", fmt.Sprintf("amgo-%s-%d", id, uid))
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return "", false, fmt.Errorf("shm: create job directory: %w", err)
	}
	// /dev/shm is world-writable: make sure nobody else prepared the directory.
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return "", false, fmt.Errorf("shm: job directory: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR || int(st.Uid) != uid || st.Mode&0o077 != 0 {
		return "", false, fmt.Errorf("shm: job directory %s is not a private directory of uid %d (mode %#o, owner %d)",
			dir, uid, st.Mode, st.Uid)
	}
	return dir, true, nil
}

// createFile creates path with mode 0600 (replacing a stale file of ours),
// sizes it to n bytes and maps it.
func createFile(path string, n int) ([]byte, error) {
	flags := unix.O_RDWR | unix.O_CREAT | unix.O_EXCL | unix.O_NOFOLLOW | unix.O_CLOEXEC
	fd, err := unix.Open(path, flags, 0o600)
	if errors.Is(err, unix.EEXIST) { // left by a crashed run with the same job id
		os.Remove(path)
		fd, err = unix.Open(path, flags, 0o600)
	}
	if err != nil {
		return nil, fmt.Errorf("shm: create %s: %w", path, err)
	}
	defer unix.Close(fd)
	if err := unix.Fchmod(fd, 0o600); err != nil { // umask may have narrowed it; never widen beyond 0600
		os.Remove(path)
		return nil, fmt.Errorf("shm: chmod %s: %w", path, err)
	}
	if err := unix.Ftruncate(fd, int64(n)); err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("shm: size %s to %d bytes: %w", path, n, err)
	}
	mem, err := unix.Mmap(fd, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("shm: map %s (%d bytes): %w", path, n, err)
	}
	return mem, nil
}

// mapPeer maps rank dst's file and checks its header.
func mapPeer(path string, dst, size int) ([]byte, error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open rank %d's file %s: %w", dst, path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("stat rank %d's file %s: %w", dst, path, err)
	}
	if int(st.Uid) != os.Getuid() || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size < int64(ringsOff(size)) {
		return nil, fmt.Errorf("rank %d's file %s: owner %d, mode %#o, %d bytes: not a job file of uid %d",
			dst, path, st.Uid, st.Mode, st.Size, os.Getuid())
	}
	mem, err := unix.Mmap(fd, 0, int(st.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map rank %d's file %s: %w", dst, path, err)
	}
	if u64(mem, hdrMagic).Load() != fileMagic || u32(mem, hdrVersion).Load() != fileVersion ||
		u32(mem, hdrRank).Load() != uint32(dst) || u32(mem, hdrSize).Load() != uint32(size) {
		err := fmt.Errorf("rank %d's file %s: bad header (magic %#x version %d rank %d size %d)", dst, path,
			u64(mem, hdrMagic).Load(), u32(mem, hdrVersion).Load(), u32(mem, hdrRank).Load(), u32(mem, hdrSize).Load())
		unix.Munmap(mem)
		return nil, err
	}
	return mem, nil
}

func u32(b []byte, off int) *atomic.Uint32 { return (*atomic.Uint32)(unsafe.Pointer(&b[off])) }
func u64(b []byte, off int) *atomic.Uint64 { return (*atomic.Uint64)(unsafe.Pointer(&b[off])) }

// Rank is this rank, 0..Size-1.
func (t *Transport) Rank() int { return t.rank }

// Size is the number of ranks in the job.
func (t *Transport) Size() int { return t.size }

// Caps: ordered, reliable, with wake-up, Put and Get; MaxPacket is about half of
// ring_bytes.
func (t *Transport) Caps() transport.Caps { return t.caps }

// Send copies hdr and payload into the ring to dst and wakes dst if it sleeps.
// It does not allocate. Errors: transport.ErrTooLarge, transport.ErrWouldBlock
// (ring full: poll and retry), transport.ErrPeer (dst out of range, closed,
// dead, or its ring corrupt), transport.ErrClosed.
func (t *Transport) Send(dst int, hdr, payload []byte) error {
	if uint(dst) < uint(len(t.peers)) {
		// outTo's and pushed's common case in this frame: a connected,
		// live peer whose ring takes the record.
		p := &t.peers[dst]
		if out := p.out; out != nil && !t.closed.Load() && !p.dead.Load() &&
			len(hdr)+len(payload) <= t.caps.MaxPacket && t.streamTo(dst, p, out) && out.Push(hdr, payload) {
			p.full = 0
			if t.fence {
				out.Fence() // the record visible before the sleep check (ring.Producer.Fence)
			}
			p.bell.Ring()
			return nil
		}
	}
	// Everything else, a full ring included, which this push tries again
	// and reports.
	p, err := t.outTo(dst, len(hdr)+len(payload))
	if err != nil {
		return err
	}
	return t.pushed(dst, p, p.out.Push(hdr, payload))
}

// SendFill implements transport.FillSender: Send with the payload of n
// bytes written by f straight into the ring's record (ring.Producer.PushFill).
// Errors as Send's.
func (t *Transport) SendFill(dst int, hdr []byte, n int, f transport.Filler) error {
	if n < 0 || f == nil {
		return fmt.Errorf("shm: SendFill of %d bytes with filler %v", n, f)
	}
	p, err := t.outTo(dst, len(hdr)+n)
	if err != nil {
		return err
	}
	t.streamTo(dst, p, p.out)
	return t.pushed(dst, p, p.out.PushFill(hdr, n, f))
}

// streamTo tells out, the ring to rank dst (peer p), whether the record
// about to go is part of a stream: no Poll since the last Send to p
// (ring.Producer.Streaming, which then spares the producer its zeroing
// ahead); and whether records also stream the other way, from dst, in
// which case the ring's short lap pauses (ring.Producer.PauseLap; see
// streamsBack). A short lap speeds a stream one way but slows traffic both
// ways, such as osu bibw, by up to a tenth (docs/performance.md, "A short
// lap for small records"). It returns true, so that Send's common case can
// call it within its condition.
func (t *Transport) streamTo(dst int, p *peer, out *ring.Producer) bool {
	polls := atomic.LoadUint64(&t.polls)
	out.Streaming(polls == p.polls)
	p.polls = polls
	if t.lap > 0 {
		rx := atomic.LoadUint64(&t.rx[dst])
		var back bool
		p.rxAvg, back = streamsBack(p.rxAvg, rx-p.rx)
		p.rx = rx
		out.PauseLap(back)
	}
	return true
}

// streamsBack updates avg, a moving average of the records taken from a
// peer per Send to it in 65536ths, with the n records taken since the last
// Send, each Send weighing a 64th, and reports whether records stream back
// from that peer: more than a quarter of one per Send. The slow average
// keeps a window of Sends that follows a wait which took as many records
// (osu bibw) paused throughout, while one acknowledgement per window of a
// one-way stream leaves it far below.
func streamsBack(avg, n uint64) (uint64, bool) {
	avg += min(n, 64)<<10 - avg>>6
	return avg, avg > 1<<14
}

// outTo checks a packet of n bytes to dst and returns dst's peer with its
// outbound ring attached (connect). Errors as Send's.
func (t *Transport) outTo(dst, n int) (*peer, error) {
	if t.closed.Load() {
		return nil, transport.ErrClosed
	}
	if uint(dst) >= uint(t.size) {
		return nil, transport.PeerErrorf(dst, "shm: send from rank %d to rank %d of %d", t.rank, dst, t.size)
	}
	if n > t.caps.MaxPacket {
		return nil, fmt.Errorf("shm: send %d bytes to rank %d, max %d: %w", n, dst, t.caps.MaxPacket, transport.ErrTooLarge)
	}
	p := &t.peers[dst]
	if p.dead.Load() {
		return nil, t.deadErr(dst)
	}
	if p.out == nil {
		if err := t.connect(dst, p); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// pushed finishes a send to dst whose push returned ok: the bell rung, or
// why the record could not go.
func (t *Transport) pushed(dst int, p *peer, ok bool) error {
	if ok {
		p.full = 0
		if t.fence {
			p.out.Fence() // the record visible before the sleep check (ring.Producer.Fence)
		}
		p.bell.Ring()
		return nil
	}
	if err := p.out.Err(); err != nil {
		return transport.PeerErrorf(dst, "shm: rank %d's ring from rank %d: %v", dst, t.rank, err)
	}
	if p.state.Load() == stateClosed {
		return transport.PeerErrorf(dst, "shm: send to rank %d, which has closed", dst)
	}
	if p.full++; p.full%idleChecks == 0 {
		t.checkPeers(false)
		if p.dead.Load() {
			return t.deadErr(dst)
		}
	}
	return transport.ErrWouldBlock
}

// connect formats the ring from this rank in dst's file, attaches to it and
// announces it to dst: a slot taken with an atomic add on dst's count, then
// this rank's number (plus one) stored in it, which publishes the formatted
// ring (Poll in dst attaches when it sees the slot). Called by the first Send
// to dst. Errors: transport.ErrPeer when dst's file has no room for the
// announcement.
func (t *Transport) connect(dst int, p *peer) error {
	pstride := int(u64(p.mem, hdrStride).Load())
	off := ringsOff(t.size) + t.rank*pstride
	region := p.mem[off : off+pstride]
	// Format it zeroing every line (the file is zero already): the ring's
	// pages fault in and its lines are in this core's cache now, once,
	// rather than one cold line per record over its first lap, which with
	// 256 KiB rings showed in a benchmark's default iterations (osu latency
	// 8 B 0.13 -> 0.19 us, docs/performance.md).
	if err := ring.Init(region); err != nil {
		return transport.PeerErrorf(dst, "shm: ring from rank %d in rank %d's file: %v", t.rank, dst, err)
	}
	out, err := ring.NewProducer(region)
	if err != nil {
		return transport.PeerErrorf(dst, "shm: ring from rank %d in rank %d's file: %v", t.rank, dst, err)
	}
	out.SetLap(t.lap)
	slot := u32(p.mem, annOff).Add(1) - 1
	if slot >= uint32(t.size) {
		return transport.PeerErrorf(dst, "shm: rank %d's file has %d ring announcements for %d ranks", dst, slot+1, t.size)
	}
	u32(p.mem, annSlots+4*int(slot)).Store(uint32(t.rank) + 1)
	p.out = out
	return nil
}

// discover attaches to the rings announced since the last look (Poll's
// goroutine). A slot counted but not yet written is taken on a later look.
func (t *Transport) discover() error {
	n := t.ann.Load()
	for seen := t.seen.Load(); seen < n && seen < uint32(t.size); seen++ {
		v := u32(t.own, annSlots+4*int(seen)).Load()
		if v == 0 {
			return nil // its producer is between the add and the store
		}
		src := int(v - 1)
		if src >= t.size || t.in[src] != nil {
			return transport.PeerErrorf(min(src, t.size-1), "shm: rank %d's announcement slot %d names rank %d twice or out of range", t.rank, seen, src)
		}
		off := ringsOff(t.size) + src*t.stride
		c, err := ring.NewConsumer(t.own[off : off+t.stride])
		if err != nil {
			return transport.PeerErrorf(src, "shm: rank %d's ring from rank %d: %v", t.rank, src, err)
		}
		// Map the ring's pages into this process now, rather than one minor
		// fault per page on a message's way when records first go past the
		// part a short lap kept them in (a 4 KiB ping-pong after smaller
		// messages, 5 % slower). Best effort: before Linux 5.14 the faults
		// come as they did.
		_ = unix.Madvise(t.own[off:off+t.stride], unix.MADV_POPULATE_READ)
		t.in[src] = c
		k := t.nAct.Load()
		t.act[k] = inbound{src: src, c: c}
		t.nAct.Store(k + 1)
		t.seen.Store(seen + 1)
	}
	return nil
}

func (t *Transport) deadErr(r int) error {
	return transport.PeerErrorf(r, "shm: rank %d (pid %d) exited without closing", r, t.peers[r].pid)
}

// Poll hands up to max arrived packets to r, in place, visiting the inbound
// rings round-robin: one packet from a ring whose last look found nothing, up
// to ring.BurstMax from one that is streaming (ring.Consumer.Take). It does not
// allocate. Errors: transport.ErrClosed,
// transport.ErrPeer when a peer corrupted its ring or died without closing
// (after the packets it left have been delivered).
func (t *Transport) Poll(r transport.Receiver, max int) (int, error) {
	if t.closed.Load() {
		return 0, transport.ErrClosed
	}
	if t.ann.Load() != t.seen.Load() {
		if err := t.discover(); err != nil {
			return 0, err
		}
	}
	n, nact := 0, int(t.nAct.Load())
	rr := t.recv.Of(r)
	for k := 0; k < nact && n < max; k++ {
		in := t.act[t.next]
		if t.next++; t.next == nact {
			t.next = 0
		}
		src, c := in.src, in.c
		got := ring.Take(c, rr, src, &t.streak[src], max-n)
		if got > 0 {
			release.Store64(&t.rx[src], t.rx[src]+uint64(got)) // one goroutine polls at a time
		}
		if got == 0 {
			if err := c.Err(); err != nil {
				return n, transport.PeerErrorf(src, "shm: rank %d's ring from rank %d: %v", t.rank, src, err)
			}
		}
		n += got
	}
	// Counted once the deliveries are done, so that what a handler sent
	// during them does not make the caller's next Send look like a stream's
	// (streamTo). One goroutine polls at a time: a plain increment.
	release.Store64(&t.polls, t.polls+1)
	if n > 0 {
		t.idle = 0
		return n, nil
	}
	if t.idle++; t.idle%idleChecks == 0 {
		t.checkPeers(false)
	}
	if t.anyDead.Load() {
		for src := range t.peers {
			if !t.peers[src].dead.Load() {
				continue
			}
			if c := t.in[src]; c != nil {
				if _, left := c.Peek(); left {
					continue // what it left first
				}
			}
			t.reported.Store(t.deaths.Load())
			return 0, t.deadErr(src)
		}
	}
	return 0, nil
}

// arrived reports whether any inbound ring seems to hold a packet (or a peer
// has died since Poll last reported a death): Wait's readiness check. A death
// already reported does not keep Wait from sleeping, so ranks that wait on
// after a failure do not spin a core.
func (t *Transport) arrived() bool {
	for _, in := range t.act[:t.nAct.Load()] {
		if in.c.Pending() {
			return true
		}
	}
	return t.ann.Load() != t.seen.Load() || t.deaths.Load() != t.reported.Load() || t.woken.Load()
}

// Wake makes a Wait in progress return, or else the next one return at once
// (transport.Waker): it rings this rank's own doorbell.
func (t *Transport) Wake() {
	t.woken.Store(true)
	t.bell.Ring()
}

// checkPeers looks for peers that exited without closing, at most every
// peerCheckEvery unless force. Safe to call from any goroutine.
func (t *Transport) checkPeers(force bool) {
	now := time.Now().UnixNano()
	last := t.lastCheck.Load()
	if !force && now-last < int64(peerCheckEvery) || !t.lastCheck.CompareAndSwap(last, now) {
		return
	}
	for r := range t.peers {
		p := &t.peers[r]
		if r == t.rank || p.dead.Load() || p.pid <= 0 {
			continue
		}
		if err := unix.Kill(p.pid, 0); errors.Is(err, unix.ESRCH) && p.state.Load() != stateClosed {
			p.dead.Store(true)
			t.anyDead.Store(true)
			t.deaths.Add(1)
		}
	}
}

// Wait polls the inbound rings for about the spin time, then sleeps on this
// rank's doorbell until a peer sends or d passes. When it times out it also
// looks for dead peers, which the next Poll reports. Errors:
// transport.ErrClosed, futex failures.
func (t *Transport) Wait(d time.Duration) error { return t.wait(t.spin, d) }

// Sleep is Wait without the spin: it sleeps on the doorbell at once
// (transport.Sleeper).
func (t *Transport) Sleep(d time.Duration) error { return t.wait(0, d) }

func (t *Transport) wait(spin, d time.Duration) error {
	if t.closed.Load() {
		return transport.ErrClosed
	}
	ok, err := t.bell.Wait(t.pending, spin, d)
	if t.woken.Load() {
		t.woken.Store(false)
		ok = true
	}
	if !ok {
		t.checkPeers(false)
	}
	return err
}

// Put writes data into rank dst's memory at addr with process_vm_writev (a
// plain copy for this rank itself) and returns when it is there. addr..addr+
// len(data) must lie in memory dst registered and keeps alive. Errors: an error
// wrapping transport.ErrPutUnsupported when dst refuses CMA (EPERM; remembered
// for later Puts and Gets), transport.ErrPeer (dst out of range or gone),
// transport.ErrClosed, and a plain error for an address range not mapped in dst
// (EFAULT).
func (t *Transport) Put(dst int, addr uintptr, data []byte) error {
	return t.cma("put", dst, addr, data)
}

// Get reads len(buf) bytes at addr in rank src's memory into buf with
// process_vm_readv (a plain copy for this rank itself) and returns when they
// are there: the receiver-driven single copy of a rendezvous. addr..addr+
// len(buf) must lie in memory src named and keeps alive. Errors as Put's, with
// transport.ErrGetUnsupported for a peer that refuses CMA.
func (t *Transport) Get(src int, addr uintptr, buf []byte) error {
	return t.cma("get", src, addr, buf)
}

// cma moves local to (put) or from (get) rank r's memory at addr with Cross
// Memory Attach, continuing after partial transfers and EINTR.
func (t *Transport) cma(op string, r int, addr uintptr, local []byte) error {
	if t.closed.Load() {
		return transport.ErrClosed
	}
	if uint(r) >= uint(t.size) {
		return transport.PeerErrorf(r, "shm: %s from rank %d with rank %d of %d", op, t.rank, r, t.size)
	}
	if len(local) == 0 {
		return nil
	}
	if r == t.rank {
		// This process's own memory: only here is addr a pointer.
		remoteMem := unsafe.Slice((*byte)(*(*unsafe.Pointer)(unsafe.Pointer(&addr))), len(local))
		if op == "put" {
			memcopy.Copy(remoteMem, local)
		} else {
			memcopy.Copy(local, remoteMem)
		}
		return nil
	}
	unsupported := transport.ErrPutUnsupported
	if op == "get" {
		unsupported = transport.ErrGetUnsupported
	}
	p := &t.peers[r]
	if p.noPut.Load() {
		return fmt.Errorf("shm: %s with rank %d (pid %d): CMA refused earlier: %w", op, r, p.pid, unsupported)
	}
	for off := 0; off < len(local); {
		n, err := processVM(op == "put", p.pid, local[off:], addr+uintptr(off))
		switch {
		case err == nil && n > 0:
			off += n
		case errors.Is(err, unix.EINTR):
		case errors.Is(err, unix.EPERM), errors.Is(err, unix.ENOSYS):
			p.noPut.Store(true)
			return fmt.Errorf("shm: %s with rank %d (pid %d): cross memory attach: %v: %w", op, r, p.pid, err, unsupported)
		case errors.Is(err, unix.ESRCH):
			return transport.PeerErrorf(r, "shm: %s with rank %d (pid %d): process gone", op, r, p.pid)
		case errors.Is(err, unix.EFAULT):
			return fmt.Errorf("shm: %s with rank %d (pid %d): address range [%#x, %#x) not mapped there (or the local buffer is bad): %w",
				op, r, p.pid, addr+uintptr(off), addr+uintptr(len(local)), err)
		case err == nil:
			return fmt.Errorf("shm: %s with rank %d (pid %d) at %#x: no progress after %d of %d bytes", op, r, p.pid, addr, off, len(local))
		default:
			return fmt.Errorf("shm: %s with rank %d (pid %d) at %#x, %d bytes: %w", op, r, p.pid, addr, len(local), err)
		}
	}
	return nil
}

// rawCMAMax is the largest Cross Memory Attach transfer, in bytes, made with a
// raw system call, one that does not tell the Go scheduler that the thread may
// block: it saves the scheduler's bookkeeping around the call (about 65 ns of a
// 16 KiB get's 800 ns on the 2-vCPU test machine). A call this size takes a few
// microseconds; larger ones go through the scheduler so that a long copy (or a
// page fault in it) does not hold up other goroutines or a garbage collection.
const rawCMAMax = 64 << 10

// processVM copies local to (write) or from rank memory at remote in process
// pid with one process_vm_writev or process_vm_readv call and returns the
// bytes moved. local must not be empty.
func processVM(write bool, pid int, local []byte, remote uintptr) (int, error) {
	liov := [1]unix.Iovec{{Base: &local[0]}}
	liov[0].SetLen(len(local))
	riov := [1]unix.RemoteIovec{{Base: remote, Len: len(local)}}
	if len(local) > rawCMAMax {
		if write {
			return unix.ProcessVMWritev(pid, liov[:], riov[:], 0)
		}
		return unix.ProcessVMReadv(pid, liov[:], riov[:], 0)
	}
	trap := uintptr(unix.SYS_PROCESS_VM_READV)
	if write {
		trap = unix.SYS_PROCESS_VM_WRITEV
	}
	n, _, errno := syscall.RawSyscall6(trap, uintptr(pid), uintptr(unsafe.Pointer(&liov[0])), 1,
		uintptr(unsafe.Pointer(&riov[0])), 1, 0)
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}

// Close marks this rank closed in its file (so that peers do not take its exit
// for a crash) and unmaps every file. It must not run concurrently with other
// methods; afterwards they return transport.ErrClosed. Closing twice is a no-op.
func (t *Transport) Close() error {
	if t.closed.Swap(true) {
		return nil
	}
	u32(t.own, hdrState).Store(stateClosed)
	return t.unmap()
}

func (t *Transport) unmap() error {
	var first error
	for r := range t.peers {
		if m := t.peers[r].mem; m != nil && r != t.rank {
			if err := unix.Munmap(m); err != nil && first == nil {
				first = fmt.Errorf("shm: unmap rank %d's file: %w", r, err)
			}
			t.peers[r].mem = nil
		}
	}
	if t.own != nil {
		if err := unix.Munmap(t.own); err != nil && first == nil {
			first = fmt.Errorf("shm: unmap own file: %w", err)
		}
		t.own = nil
	}
	return first
}

var (
	_ transport.Putter = (*Transport)(nil)
	_ transport.Getter = (*Transport)(nil)
)
