package am

import (
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/amgo-hpc/amgo/am/internal/reliable"
	"github.com/amgo-hpc/amgo/am/transport"
	"github.com/amgo-hpc/amgo/flowctl"
	"github.com/amgo-hpc/amgo/handlers"
	"github.com/amgo-hpc/amgo/internal/cacheline"
	"github.com/amgo-hpc/amgo/internal/wire"
)

// Errors returned by endpoint operations, usable with errors.Is. Transport
// errors (transport.ErrPeer, transport.ErrClosed, ...) and handler-table errors
// (handlers.ErrUnknownHandler, handlers.ErrArgCount, ...) pass through wrapped.
var (
	ErrRank      = errors.New("am: invalid rank")
	ErrTooLarge  = errors.New("am: payload too large")
	ErrClosed    = errors.New("am: endpoint closed")
	ErrSegment   = errors.New("am: address not in a registered segment")
	ErrInHandler = errors.New("am: request from inside a handler would block")
	ErrConfig    = errors.New("am: invalid configuration")
	ErrNotMedium = errors.New("am: only a medium request's payload can be retained")
	// ErrPeerDead is matched by a *PeerError: a rank of the job has failed.
	ErrPeerDead = errors.New("am: peer failed")
)

// PeerError reports a rank that failed (its process died, its connection broke
// without a goodbye, or it closed its endpoint while the job still needed it),
// as the network reported it. It matches ErrPeerDead and, through Err,
// transport.ErrPeer. Once a rank is recorded dead, every later request to it
// fails at once with its PeerError (see DeadPeers).
type PeerError struct {
	Rank int   // the failed rank
	Err  error // the network's report
}

func (e *PeerError) Error() string { return fmt.Sprintf("am: rank %d failed: %v", e.Rank, e.Err) }

// Is makes errors.Is(err, ErrPeerDead) true.
func (e *PeerError) Is(target error) bool { return target == ErrPeerDead }

// Unwrap returns the network's report.
func (e *PeerError) Unwrap() error { return e.Err }

// Config tunes an endpoint. The zero value gives the defaults.
type Config struct {
	// BufferBytes is the receive buffer every endpoint preallocates for every peer
	// (MPI over SP AM keeps one 16 KiB buffer for every other process), in
	// bytes, a multiple of 64. Default 16 KiB (AMGO_BUFFER_BYTES).
	BufferBytes int
	// ReplyReserve is the room, in bytes, that every request reserves for its reply
	// besides its own size, so that a handler can always reply at once. It must be
	// at least wire.MaxHeaderLen (192) so that any short reply fits. Default 192.
	ReplyReserve int
	// SpinTime is how long a blocking wait polls before it sleeps on the
	// transport's wake-up. Default 20 us: a short spin catches nearly every
	// shared-memory reply, while waking a halted virtual CPU costs tens of
	// microseconds (docs/performance.md).
	SpinTime time.Duration
	// OnDrop, if set, is called on the polling goroutine for every incoming packet
	// that is dropped (malformed, unknown handler, bad reservation). By default
	// drops are logged with log/slog at warning level, at most once per second.
	OnDrop func(error)
	// Progress, if positive, starts a progress goroutine: when no goroutine has
	// polled the endpoint for that long, it polls, so that handlers run and
	// protocols advance (a rendezvous store, credit returns) while the program
	// computes for long stretches between calls (the timer that MPI over SP AM
	// proposes for programs with long gaps between MPI calls).
	// 0: off. AMGO_PROGRESS (a Go duration, e.g. 100us) sets it.
	Progress time.Duration
}

func (c *Config) fill() error {
	if c.BufferBytes == 0 {
		c.BufferBytes = flowctl.DefaultBufferBytes
	}
	if c.ReplyReserve == 0 {
		c.ReplyReserve = wire.MaxHeaderLen
	}
	if c.SpinTime == 0 {
		c.SpinTime = 20 * time.Microsecond
	}
	if c.BufferBytes%flowctl.Granule != 0 || c.BufferBytes < 1024 || c.BufferBytes > 1<<30 {
		return fmt.Errorf("%w: BufferBytes %d (a multiple of %d from 1 KiB to 1 GiB)", ErrConfig, c.BufferBytes, flowctl.Granule)
	}
	if c.ReplyReserve < wire.MaxHeaderLen || c.ReplyReserve > c.BufferBytes/2 {
		return fmt.Errorf("%w: ReplyReserve %d (from %d to half the buffer)", ErrConfig, c.ReplyReserve, wire.MaxHeaderLen)
	}
	return nil
}

// Stats are an endpoint's counters since it was created.
type Stats struct {
	RequestsSent, RepliesSent, AcksSent uint64 // packets sent, by kind
	RequestsRecv, RepliesRecv, AcksRecv uint64 // packets handled, by kind
	BytesSent, BytesRecv                uint64 // payload bytes of requests and replies
	// CreditStalls counts requests that found their space in the peer's buffer
	// taken and polled until replies freed some (back-pressure).
	CreditStalls uint64
	// Backlogged counts packets the network refused for the moment and that the
	// endpoint queued (replies and acks, which never wait for credit).
	Backlogged uint64
	// Drops counts incoming packets dropped (malformed, unknown handler, wrong
	// argument count, bad reservation or store address) and acks that could not
	// be sent (a closed or dead network).
	Drops uint64
	// UnknownHandler counts the drops for an unregistered handler index.
	UnknownHandler uint64
	// StoresPut and StoresPacketed count stores by path: single-copy Put, or
	// fragments through the network.
	StoresPut, StoresPacketed uint64
	// Gets counts completed single-copy Gets.
	Gets uint64
	// LastDrop describes the most recent drop ("" if none).
	LastDrop string
}

// sendCounters are kept per peer under the peer's lock.
type sendCounters struct {
	requests, replies, acks, bytes, stalls, backlogged, storesPut, storesPacketed uint64
}

// peer is the sender's state toward one rank, guarded by mu.
type peer struct {
	mu sync.Mutex
	// owed is the credit this rank owes the peer: space of the peer's
	// reservation in this rank's receive buffer that is free and not yet
	// returned, packed as off<<32 | bytes (0: none). The poller adds to it
	// (addFree); a request to the peer takes it (sendLocked), as do the
	// poller's acks and replies: always with Swap or CompareAndSwap, so a
	// range goes back exactly once. Outside mu: the poller never waits for a
	// sender.
	owed    atomic.Uint64
	win     *flowctl.Window
	putMu   sync.Mutex              // guards putHdr (putSend), taken before mu
	putHdr  [wire.MaxHeaderLen]byte // the store-done that putSend sends with a put's data
	scratch [wire.MaxHeaderLen]byte
	backlog [][]byte // packets refused by the transport, in order
	noPut   bool     // single-copy put refused for this peer
	c       sendCounters
	_       [64]byte
}

// Endpoint is one rank's attachment to the AM network: its handler table, its
// per-peer receive buffers and send windows, and the transport underneath.
// All methods are safe for concurrent use; handlers run only inside Poll.
type Endpoint struct {
	tr        transport.Transport
	putter    transport.Putter
	putSender transport.PutSender // the putter, when it can send a packet with a put's data
	getter    transport.Getter
	noGet     []atomic.Bool // by rank: single-copy get refused by the network for that peer
	gets      atomic.Uint64 // completed Gets
	caps      transport.Caps
	rank      int
	size      int
	cfg       Config
	table     handlers.Table
	maxMedium int
	maxPacket int

	peers    []peer
	recvBufs []byte // size × BufferBytes: the per-peer receive buffers

	segMu   sync.RWMutex
	segs    []segment
	pinners []*runtime.Pinner // unpinned, for reuse: registering allocates nothing in steady state

	pollMu sync.Mutex
	rx     rxState // guarded by pollMu

	backlogged atomic.Int32  // peers with a non-empty backlog
	polls      atomic.Uint64 // about every 16th completed poll: a waiter that sees none for long is inside a handler
	expect     atomic.Int64  // unix ns until which waiters spin rather than sleep (Expect)
	closed     atomic.Bool

	dropMu   sync.Mutex
	lastDrop string
	lastLog  time.Time

	bar barrierState

	dead      []atomic.Pointer[PeerError] // by rank: set once, when the rank is found dead
	deaths    atomic.Int64                // ranks recorded dead: the epoch blocked waits compare
	deadMu    sync.Mutex
	deadOrder []int        // dead ranks in the order they were recorded (deadMu)
	lastProbe atomic.Int64 // unix ns of the last liveness probe

	launcher Launcher // set by package job: the launcher of this rank's process
	abortJob func()   // set by RunJob: ends the in-process job

	progressHooks []func()      // run by the progress goroutine after its polls
	progressStop  chan struct{} // closed by Close
	progressDone  chan struct{}
	progressOnce  sync.Once
}

// rxState is the receive side, used only by the polling goroutine.
type rxState struct {
	hdr     wire.Header
	args    [wire.MaxArgs]uint64
	tok     handlers.Token
	payload []byte
	kind    wire.Kind
	dirty   []int  // sources owed credit (peer.owed; possibly returned since)
	isDirty []bool // by source: in dirty
	urgent  bool   // a pending free reached a quarter of the buffer: sent before the next delivery or poll
	idle    int    // polls in a row that found nothing
	busy    int    // polls that delivered something
	lastErr error  // the last peer failure Poll returned, and its rank (a cache:
	lastBad int    // networks repeat a dead peer's error on every idle poll)
	c       struct{ requests, replies, acks, bytes, drops uint64 }
}

// packOwed and unpackOwed convert a free range to and from peer.owed's word.
func packOwed(off, n uint32) uint64 { return uint64(off)<<32 | uint64(n) }

func unpackOwed(w uint64) (off, n uint32) { return uint32(w >> 32), uint32(w) }

// piggybackFreeMin is the smallest payload, in bytes, of a request that
// carries the credit owed to its destination however little it is: below it
// a request carries a free only once the owed range reaches a quarter of the
// buffer, when an ack would go anyway. The free extension's 8 bytes would
// make an 8-byte MPI message two cache lines in a ring instead of one.
const piggybackFreeMin = 256

// New makes an endpoint over an open transport. Register handlers, then
// communicate; the table is sealed by the first request or poll.
func New(tr transport.Transport, cfg Config) (*Endpoint, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	caps := tr.Caps()
	if !caps.Ordered || !caps.Reliable {
		// A network without ordered or reliable delivery gets sequence
		// numbers, acknowledgements and retransmission here, once, for every
		// such network (package reliable).
		w, err := reliable.Wrap(tr, reliable.Config{}, nil)
		if err != nil {
			return nil, fmt.Errorf("am: reliability layer over %s: %w", caps.Name, err)
		}
		tr, caps = w, w.Caps()
	}
	// Off other objects' cache lines: goroutine ranks share one heap
	// (internal/cacheline).
	ep := cacheline.New[Endpoint]()
	*ep = Endpoint{
		tr:       tr,
		caps:     caps,
		rank:     tr.Rank(),
		size:     tr.Size(),
		cfg:      cfg,
		peers:    cacheline.Slice[peer](tr.Size()),
		recvBufs: make([]byte, tr.Size()*cfg.BufferBytes),
		dead:     make([]atomic.Pointer[PeerError], tr.Size()),
	}
	if p, ok := tr.(transport.Putter); ok && caps.Put {
		ep.putter = p
		ep.putSender, _ = tr.(transport.PutSender)
	}
	if g, ok := tr.(transport.Getter); ok && caps.Get {
		ep.getter = g
		ep.noGet = make([]atomic.Bool, tr.Size())
	}
	if pt, ok := tr.(transport.PutTargeter); ok {
		pt.SetPutResolver(func(addr uint64, n int) ([]byte, error) { return ep.lookupRegion(addr, uint64(n)) })
	}
	ep.maxPacket = caps.MaxPacket
	// A medium must fit in one packet and, with its header and reply room, in the buffer.
	ep.maxMedium = min(caps.MaxPacket, cfg.BufferBytes-cfg.ReplyReserve) - wire.MaxHeaderLen
	ep.maxMedium &^= 7
	if ep.maxMedium < 512 {
		return nil, fmt.Errorf("%w: MaxMedium would be %d bytes (network packets %d, buffer %d); GASNet requires at least 512",
			ErrConfig, ep.maxMedium, caps.MaxPacket, cfg.BufferBytes)
	}
	for i := range ep.peers {
		w, err := flowctl.NewWindow(cfg.BufferBytes)
		if err != nil {
			return nil, err
		}
		ep.peers[i].win = w
	}
	ep.rx.isDirty = cacheline.Slice[bool](ep.size)
	ep.rx.dirty = cacheline.Slice[int](ep.size)[:0]
	if err := ep.registerInternal(); err != nil {
		return nil, err
	}
	if _, err := ep.table.RegisterReserved(handlers.Entry{Index: probeHandler, Name: "am.probe", NArgs: 0,
		Fn: func(*handlers.Token, []uint64, []byte) {}}); err != nil {
		return nil, err
	}
	return ep, nil
}

// Rank is this endpoint's rank, 0..Size-1.
func (ep *Endpoint) Rank() int { return ep.rank }

// Size is the number of ranks in the job.
func (ep *Endpoint) Size() int { return ep.size }

// Transport returns the network underneath (for its capabilities and tests).
func (ep *Endpoint) Transport() transport.Transport { return ep.tr }

// MaxMedium is the largest medium payload, in bytes, with any argument count:
// what fits the per-peer buffer with a header and the reply room, and one
// network packet. At least 512 (GASNet's minimum).
func (ep *Endpoint) MaxMedium() int { return ep.maxMedium }

// MaxStore is the largest Store payload in bytes (4 GiB - 1: the header's Total field).
const MaxStore = 1<<32 - 1

// BufferBytes is the per-peer receive buffer size in bytes.
func (ep *Endpoint) BufferBytes() int { return ep.cfg.BufferBytes }

// Register adds a handler to the endpoint's table (see package handlers). It
// must be called before communication starts, identically on every rank.
// Errors: handlers.ErrStarted, ErrIndexInUse, ErrIndexReserved, ErrBadEntry.
func (ep *Endpoint) Register(e handlers.Entry) (handlers.Index, error) {
	return ep.table.Register(e)
}

// Handlers gives access to the handler table (counters, lookups).
func (ep *Endpoint) Handlers() *handlers.Table { return &ep.table }

func (ep *Endpoint) checkDst(dst int) error {
	if dst < 0 || dst >= ep.size {
		return fmt.Errorf("%w: %d (job has %d ranks)", ErrRank, dst, ep.size)
	}
	if ep.closed.Load() {
		return ErrClosed
	}
	if pe := ep.dead[dst].Load(); pe != nil {
		return pe
	}
	return nil
}

// RequestShort sends a short request: handler h runs at rank dst with args (at
// most 16). It returns once the request is handed to the network; it polls while
// dst's buffer has no room (back-pressure). Errors: ErrRank, ErrClosed,
// handlers.ErrUnknownHandler, handlers.ErrArgCount, ErrInHandler, transport errors.
func (ep *Endpoint) RequestShort(dst int, h handlers.Index, args ...uint64) error {
	if h > handlers.MaxClientIndex {
		return fmt.Errorf("%w: %d", handlers.ErrIndexReserved, h)
	}
	return ep.requestShort(dst, h, args)
}

// RequestShortPiggyback is RequestShort with a tool value piggybacked in the
// packet's header (one value per message, in the same packet, never an extra
// message: the header-extension scheme of TAU's overhead compensation); the
// handler reads it with Token.Piggyback.
func (ep *Endpoint) RequestShortPiggyback(dst int, h handlers.Index, pb uint64, args ...uint64) error {
	if h > handlers.MaxClientIndex {
		return fmt.Errorf("%w: %d", handlers.ErrIndexReserved, h)
	}
	if err := ep.checkDst(dst); err != nil {
		return err
	}
	if err := ep.table.CheckSend(h, len(args)); err != nil {
		return err
	}
	hdr := wire.Header{Kind: wire.KindRequestShort, Handler: uint8(h), NArgs: uint8(len(args)), Src: uint32(ep.rank),
		Flags: wire.FlagPiggyback, Piggyback: pb}
	return ep.sendRequest(dst, &hdr, args, nil)
}

// RequestMediumPiggyback is RequestMedium with a tool value piggybacked in the
// packet's header, read by the handler with Token.Piggyback.
func (ep *Endpoint) RequestMediumPiggyback(dst int, h handlers.Index, payload []byte, pb uint64, args ...uint64) error {
	return ep.requestMedium(dst, h, payload, wire.FlagPiggyback, pb, args)
}

// requestShort is RequestShort without the client index check (am's own handlers).
func (ep *Endpoint) requestShort(dst int, h handlers.Index, args []uint64) error {
	if err := ep.checkDst(dst); err != nil {
		return err
	}
	if h == barrierHandler && ep.deaths.Load() > 0 {
		// A barrier is over every rank: with one dead it can never complete.
		return ep.firstDead()
	}
	if err := ep.table.CheckSend(h, len(args)); err != nil {
		return err
	}
	hdr := wire.Header{Kind: wire.KindRequestShort, Handler: uint8(h), NArgs: uint8(len(args)), Src: uint32(ep.rank)}
	return ep.sendRequest(dst, &hdr, args, nil)
}

// RequestMedium sends a medium request: payload (at most MaxMedium bytes) lands
// in the space this rank allocated in its receive buffer at dst, and handler h
// runs there with args and the payload, which stays valid until the handler
// returns (or until released, if the handler retains it). payload may be reused
// when RequestMedium returns. Errors as RequestShort, plus ErrTooLarge.
func (ep *Endpoint) RequestMedium(dst int, h handlers.Index, payload []byte, args ...uint64) error {
	return ep.requestMedium(dst, h, payload, 0, 0, args)
}

func (ep *Endpoint) requestMedium(dst int, h handlers.Index, payload []byte, flags uint16, pb uint64, args []uint64) error {
	if err := ep.checkDst(dst); err != nil {
		return err
	}
	if len(payload) > ep.maxMedium {
		return fmt.Errorf("%w: medium of %d bytes to rank %d (MaxMedium %d)", ErrTooLarge, len(payload), dst, ep.maxMedium)
	}
	if h > handlers.MaxClientIndex {
		return fmt.Errorf("%w: %d", handlers.ErrIndexReserved, h)
	}
	if err := ep.table.CheckSend(h, len(args)); err != nil {
		return err
	}
	hdr := wire.Header{Kind: wire.KindRequestMedium, Handler: uint8(h), NArgs: uint8(len(args)),
		Src: uint32(ep.rank), Len: uint32(len(payload)), Flags: flags, Piggyback: pb}
	return ep.sendRequest(dst, &hdr, args, payload)
}

// Store is SP AM's am_store (GASNet-EX RequestLong): it
// writes data into rank dst's memory at addr, an address inside a segment that
// dst registered (Segment.Addr plus an offset) and passed to this rank, and then
// runs handler h at dst with args and the stored region as payload. Where the
// network offers a single-copy put (shared memory: Cross Memory Attach), the
// data moves once, straight from data into the destination; otherwise it travels
// in fragments of at most MaxMedium bytes through the per-peer buffer. Store
// returns when data may be reused. Errors as RequestShort, plus ErrTooLarge and
// transport errors of the put.
//
// As with GASNet's dest_addr and with RDMA, addr must come from dst: on
// networks with a single-copy put the data is written before dst can check
// the address (dst then drops the store's handler and counts it); on the
// others dst checks every fragment against its segments and drops what falls
// outside. A store into a segment dst has unregistered is undefined on the
// single-copy path.
func (ep *Endpoint) Store(dst int, h handlers.Index, addr uint64, data []byte, args ...uint64) error {
	if err := ep.checkDst(dst); err != nil {
		return err
	}
	if uint64(len(data)) > MaxStore {
		return fmt.Errorf("%w: store of %d bytes (max %d)", ErrTooLarge, len(data), uint64(MaxStore))
	}
	if h > handlers.MaxClientIndex {
		return fmt.Errorf("%w: %d", handlers.ErrIndexReserved, h)
	}
	if err := ep.table.CheckSend(h, len(args)); err != nil {
		return err
	}
	total := uint32(len(data))
	p := &ep.peers[dst]
	if ep.putter != nil && len(data) > 0 && len(data) >= ep.caps.PutMin {
		p.mu.Lock()
		noPut := p.noPut
		p.mu.Unlock()
		if !noPut {
			hdr := wire.Header{Kind: wire.KindStoreDone, Handler: uint8(h), NArgs: uint8(len(args)),
				Src: uint32(ep.rank), Addr: addr, Total: total}
			sent, err := ep.putSend(dst, p, &hdr, args, addr, data)
			if !sent && err == nil {
				err = ep.putter.Put(dst, uintptr(addr), data)
			}
			switch {
			case sent:
				return nil
			case err == nil:
				p.mu.Lock()
				p.c.storesPut++
				p.mu.Unlock()
				return ep.sendRequest(dst, &hdr, args, nil)
			case errors.Is(err, transport.ErrPutUnsupported):
				p.mu.Lock()
				p.noPut = true
				p.mu.Unlock()
			default:
				if pe := ep.peerFailed(dst, err); pe != nil {
					return pe
				}
				return fmt.Errorf("am: store of %d bytes to rank %d at %#x: %w", len(data), dst, addr, err)
			}
		}
	}
	p.mu.Lock()
	p.c.storesPacketed++
	p.mu.Unlock()
	chunk := ep.maxMedium
	for frag := 0; ; frag += chunk {
		n := min(chunk, len(data)-frag)
		last := frag+n == len(data)
		hdr := wire.Header{Kind: wire.KindRequestStore, Handler: uint8(h), Src: uint32(ep.rank),
			Len: uint32(n), Addr: addr, Frag: uint32(frag), Total: total}
		var a []uint64
		if last {
			hdr.Flags = wire.FlagLast
			hdr.NArgs = uint8(len(args))
			a = args
		}
		if err := ep.sendRequest(dst, &hdr, a, data[frag:frag+n]); err != nil {
			return err
		}
		if last {
			return nil
		}
	}
}

// putSend puts data at addr in dst and sends the store-done h with it in one
// call of the network (transport.PutSender), when the network can and the
// store-done's credit is free now. sent false and err nil: it did nothing
// (no PutSender, no credit now, queued responses to dst first, or dst
// dead); the caller puts and then sends the store-done as a request, which
// waits for credit. Errors are the put's; the reservation is undone.
func (ep *Endpoint) putSend(dst int, p *peer, h *wire.Header, args []uint64, addr uint64, data []byte) (sent bool, err error) {
	if ep.putSender == nil || ep.dead[dst].Load() != nil {
		return false, nil
	}
	if !ep.table.Sealed() {
		ep.table.Seal() // communication has started (as in sendRequest)
		ep.startProgress()
	}
	res := flowctl.RoundUp(h.EncodedLen() + wire.FreeExtLen + ep.cfg.ReplyReserve)
	// The header goes in p.putHdr under p.putMu (a local array would escape
	// through the interface call: an allocation per store); the transport
	// serializes puts to one peer anyway.
	p.putMu.Lock()
	defer p.putMu.Unlock()
	buf := &p.putHdr
	p.mu.Lock()
	if len(p.backlog) > 0 {
		p.mu.Unlock()
		return false, nil
	}
	off, ok, err := p.win.Alloc(res)
	if err != nil || !ok {
		p.mu.Unlock()
		return false, nil
	}
	h.Off, h.Reserve = off, uint32(res)
	n := wire.Encode(buf[:], h, args)
	// Counted before it leaves: dst may run the handler before PutSend returns.
	p.c.requests++
	p.c.storesPut++
	p.mu.Unlock()
	// Outside p.mu: the put may wait for the socket to drain.
	if err := ep.putSender.PutSend(dst, uintptr(addr), data, buf[:n], nil); err != nil {
		p.mu.Lock()
		_ = p.win.Free(off, uint32(res))
		p.c.requests--
		p.c.storesPut--
		p.mu.Unlock()
		return false, err
	}
	return true, nil
}

// CanGet reports whether Get from rank src can move n bytes with the network's
// single copy: the network offers it (Caps.Get), n is at least Caps.PutMin
// (below it a system call costs more than copying packets), and src has not
// refused it (EPERM from Cross Memory Attach) or failed.
func (ep *Endpoint) CanGet(src, n int) bool {
	return ep.getter != nil && n > 0 && n >= ep.caps.PutMin && uint(src) < uint(ep.size) &&
		!ep.noGet[src].Load() && ep.dead[src].Load() == nil && !ep.closed.Load()
}

// Get is a blocking single-copy read (GASNet-EX gex_RMA_GetBlocking; SP AM's
// am_get without its completion handler): it
// copies len(buf) bytes at addr in rank src's memory into buf and returns
// when they are there. It runs no handler at either end and sends no packet:
// the owner learns that the read is done only from a request the caller sends
// afterwards (the rendezvous protocol's fin). addr must name memory that src
// gave to this rank and keeps alive and unchanged until then; like a Store's
// destination on single-copy networks it cannot be checked by src.
//
// Only networks with a single-copy read have Get (shared memory: Cross Memory
// Attach; in-process: a copy); elsewhere ask src to Store the data instead.
// Errors: ErrRank, ErrClosed, a *PeerError for a failed src, and an error
// wrapping transport.ErrGetUnsupported when the network or this peer has no
// single-copy read (see CanGet; a refusal is remembered), or the network's
// error for an unmapped range.
func (ep *Endpoint) Get(src int, addr uint64, buf []byte) error {
	if err := ep.checkDst(src); err != nil {
		return err
	}
	if ep.getter == nil {
		return fmt.Errorf("am: get from rank %d over %s: %w", src, ep.caps.Name, transport.ErrGetUnsupported)
	}
	if len(buf) == 0 {
		return nil
	}
	if ep.noGet[src].Load() {
		return fmt.Errorf("am: get from rank %d: refused earlier: %w", src, transport.ErrGetUnsupported)
	}
	err := ep.getter.Get(src, uintptr(addr), buf)
	switch {
	case err == nil:
		ep.gets.Add(1)
		return nil
	case errors.Is(err, transport.ErrGetUnsupported):
		ep.noGet[src].Store(true)
		return fmt.Errorf("am: get of %d bytes from rank %d: %w", len(buf), src, err)
	default:
		if pe := ep.peerFailed(src, err); pe != nil {
			return pe
		}
		return fmt.Errorf("am: get of %d bytes from rank %d at %#x: %w", len(buf), src, addr, err)
	}
}

// sendRequest takes credit at dst and sends one request, polling while there is
// no room.
func (ep *Endpoint) sendRequest(dst int, h *wire.Header, args []uint64, payload []byte) error {
	if !ep.table.Sealed() {
		ep.table.Seal() // communication has started
		ep.startProgress()
	}
	// Room for the free extension too: sendLocked decides whether the
	// request carries one only once it has its reservation.
	res := flowctl.RoundUp(h.EncodedLen() + wire.FreeExtLen + len(payload) + ep.cfg.ReplyReserve)
	p := &ep.peers[dst]
	if ep.dead[dst].Load() == nil && p.mu.TryLock() {
		// The common case, without the wait's pacing: the peer's lock is
		// free, nothing is backlogged and the window has room.
		if len(p.backlog) == 0 {
			if credit, err := ep.sendLocked(dst, p, h, args, payload, res); credit && err == nil {
				p.mu.Unlock()
				return nil
			} // else the loop below waits, retries or reports
		}
		p.mu.Unlock()
	}
	return ep.sendRequestWait(dst, p, h, args, payload, res)
}

// sendLocked reserves res bytes of dst's window and sends the request; p.mu
// is held. credit false: the window is full now. err: the reservation can
// never fit (from flowctl), or the network refused the packet (credit true;
// the reservation is undone).
func (ep *Endpoint) sendLocked(dst int, p *peer, h *wire.Header, args []uint64, payload []byte, res int) (credit bool, err error) {
	off, ok, err := p.win.Alloc(res)
	if err != nil || !ok {
		return false, err
	}
	h.Off, h.Reserve = off, uint32(res)
	// Carry the credit owed to dst (see piggybackFreeMin).
	h.Flags &^= wire.FlagFree
	if w := p.owed.Load(); w != 0 && (len(payload) >= piggybackFreeMin || int(uint32(w)) >= ep.cfg.BufferBytes/4) {
		if w = p.owed.Swap(0); w != 0 {
			h.Flags |= wire.FlagFree
			h.FreeOff, h.FreeLen = unpackOwed(w)
		}
	}
	n := wire.Encode(p.scratch[:], h, args)
	if err := ep.tr.Send(dst, p.scratch[:n], payload); err != nil {
		_ = p.win.Free(off, uint32(res))
		if h.Flags&wire.FlagFree != 0 {
			// The credit must still go back: as an ack, queued behind
			// whatever the network refused (dropped if dst is dead).
			h.Flags &^= wire.FlagFree
			ep.backlogAckLocked(dst, p, h.FreeOff, h.FreeLen)
		}
		return true, err
	}
	p.c.requests++
	p.c.bytes += uint64(len(payload))
	return true, nil
}

// sendRequestWait is sendRequest's loop for a request that must wait for the
// peer's lock, for credit or for the network, polling meanwhile.
func (ep *Endpoint) sendRequestWait(dst int, p *peer, h *wire.Header, args []uint64, payload []byte, res int) error {
	var b backoff
	defer b.end()
	stalled := false // waited for credit (not for the network)
	for {
		if pe := ep.dead[dst].Load(); pe != nil {
			return pe
		}
		p.mu.Lock()
		if len(p.backlog) > 0 {
			ep.flushBacklogLocked(dst, p)
		}
		if len(p.backlog) == 0 {
			credit, err := ep.sendLocked(dst, p, h, args, payload, res)
			switch {
			case credit && err == nil:
				if stalled {
					p.c.stalls++
				}
				p.mu.Unlock()
				return nil
			case !credit && err != nil:
				p.mu.Unlock()
				return err
			case !credit:
				stalled = true
			case !errors.Is(err, transport.ErrWouldBlock):
				p.mu.Unlock()
				if pe := ep.peerFailed(dst, err); pe != nil {
					return pe
				}
				return fmt.Errorf("am: request to rank %d: %w", dst, err)
			}
		}
		p.mu.Unlock()
		if err := ep.progress(&b); err != nil && !errors.Is(err, ErrPeerDead) {
			return err // another rank's death does not stop a request to dst
		}
	}
}

// sendResponse sends a reply or ack to dst. It never waits: when the network
// cannot take the packet now it is queued (in order) and sent by a later poll.
func (ep *Endpoint) sendResponse(dst int, h *wire.Header, args []uint64, payload []byte) error {
	if pe := ep.dead[dst].Load(); pe != nil {
		return pe
	}
	p := &ep.peers[dst]
	p.mu.Lock()
	defer p.mu.Unlock()
	n := wire.Encode(p.scratch[:], h, args)
	if h.Kind == wire.KindAck {
		p.c.acks++
	} else {
		p.c.replies++
		p.c.bytes += uint64(len(payload))
	}
	if len(p.backlog) > 0 {
		ep.flushBacklogLocked(dst, p)
	}
	if len(p.backlog) == 0 {
		err := ep.tr.Send(dst, p.scratch[:n], payload)
		if err == nil {
			return nil
		}
		if !errors.Is(err, transport.ErrWouldBlock) {
			if pe := ep.peerFailed(dst, err); pe != nil {
				return pe
			}
			return fmt.Errorf("am: %s to rank %d: %w", h.Kind, dst, err)
		}
	}
	ep.enqueueLocked(p, p.scratch[:n], payload)
	return nil
}

// enqueueLocked appends a copy of the packet (hdr, payload) to p's backlog,
// which a later poll sends in order; p.mu is held.
func (ep *Endpoint) enqueueLocked(p *peer, hdr, payload []byte) {
	if len(p.backlog) == 0 {
		ep.backlogged.Add(1)
	}
	pkt := make([]byte, 0, len(hdr)+len(payload))
	pkt = append(append(pkt, hdr...), payload...)
	p.backlog = append(p.backlog, pkt)
	p.c.backlogged++
}

// backlogAckLocked queues an ack returning [off,+n) to dst behind its
// backlog; p.mu is held. The next flush of the backlog sends it.
func (ep *Endpoint) backlogAckLocked(dst int, p *peer, off, n uint32) {
	if ep.dead[dst].Load() != nil {
		return
	}
	h := wire.Header{Kind: wire.KindAck, Src: uint32(ep.rank), Flags: wire.FlagFree, Off: off, Reserve: n}
	k := wire.Encode(p.scratch[:], &h, nil) // the refused request's header is no longer needed
	ep.enqueueLocked(p, p.scratch[:k], nil)
	p.c.acks++
}

// flushBacklogLocked sends queued responses to dst in order; p.mu is held.
func (ep *Endpoint) flushBacklogLocked(dst int, p *peer) {
	var h wire.Header
	var args [wire.MaxArgs]uint64
	for len(p.backlog) > 0 {
		pkt := p.backlog[0]
		payload, _ := wire.Decode(pkt, &h, &args) // encoded by us: cannot fail
		if err := ep.tr.Send(dst, pkt[:len(pkt)-len(payload)], payload); err != nil {
			if !errors.Is(err, transport.ErrWouldBlock) && ep.peerFailed(dst, err) != nil {
				// dst is gone: what it was owed can never be delivered.
				clear(p.backlog)
				p.backlog = nil
				ep.backlogged.Add(-1)
			}
			return
		}
		p.backlog[0] = nil
		p.backlog = p.backlog[1:]
		if len(p.backlog) == 0 {
			p.backlog = nil
			ep.backlogged.Add(-1)
		}
	}
}

// Poll is am_poll: it drains arrived packets and runs their handlers on the
// calling goroutine, and returns how many packets it handled. It never blocks;
// if another goroutine is polling it returns 0 at once. Errors come from the
// network (a dead peer, a closed transport); dropped packets are counted in
// Stats, not returned.
func (ep *Endpoint) Poll() (int, error) {
	if !ep.pollMu.TryLock() {
		return 0, nil
	}
	defer ep.pollMu.Unlock()
	return ep.pollLocked()
}

const pollBatch = 64

func (ep *Endpoint) pollLocked() (int, error) {
	if !ep.table.Sealed() {
		ep.table.Seal()
		ep.startProgress()
	}
	if ep.backlogged.Load() > 0 {
		for i := range ep.peers {
			p := &ep.peers[i]
			p.mu.Lock()
			if len(p.backlog) > 0 {
				ep.flushBacklogLocked(i, p)
			}
			p.mu.Unlock()
		}
	}
	if ep.rx.urgent {
		ep.sendUrgentFrees()
	}
	n, err := ep.tr.Poll((*receiver)(ep), pollBatch)
	if err != nil {
		err = ep.pollFailure(err)
	}
	// Credit returns for requests answered without a reply wait, coalesced,
	// for a reply to carry them, until they reach a quarter of the buffer, or
	// until the endpoint has found nothing to do for idleFlushPolls polls in a
	// row: an ack per message would put a second packet on every one-way
	// message's path (SP AM likewise acks "when one-quarter of the window
	// remains unacknowledged").
	if n > 0 {
		// A poll that delivers shows it finishes polls every 16 (an atomic
		// add per poll would sit on every message's path).
		ep.rx.idle = 0
		if ep.rx.busy++; ep.rx.busy%16 == 0 {
			ep.polls.Add(1)
		}
	} else if ep.rx.idle++; ep.rx.idle >= idleFlushPolls && len(ep.rx.dirty) > 0 {
		ep.flushFrees()
	} else if ep.rx.idle%64 == 0 {
		ep.polls.Add(1) // an idle poller shows it finishes polls, now and then
	}
	return n, err
}

// idleFlushPolls is the number of empty polls in a row after which pending
// credit returns are sent (about a microsecond of idling).
const idleFlushPolls = 32

// receiver adapts the endpoint to transport.Receiver without exporting Deliver.
type receiver Endpoint

func (r *receiver) Deliver(src int, pkt []byte) { (*Endpoint)(r).deliver(src, pkt) }

func (ep *Endpoint) deliver(src int, pkt []byte) {
	rx := &ep.rx
	if rx.urgent {
		ep.sendUrgentFrees()
	}
	h := &rx.hdr
	payload, err := wire.Decode(pkt, h, &rx.args)
	if err != nil {
		ep.drop(fmt.Errorf("am: packet from rank %d: %w", src, err))
		return
	}
	if int(h.Src) != src || src < 0 || src >= ep.size {
		ep.drop(fmt.Errorf("am: packet from rank %d claims source %d", src, h.Src))
		return
	}
	args := rx.args[:h.NArgs]
	if h.Flags&wire.FlagFree != 0 {
		off, n := h.Off, h.Reserve // a reply's or an ack's
		if h.Kind.IsRequest() {
			off, n = h.FreeOff, h.FreeLen // a request's own reservation is in Off, Reserve
		}
		p := &ep.peers[src]
		p.mu.Lock()
		err := p.win.Free(off, n)
		p.mu.Unlock()
		if err != nil {
			ep.drop(fmt.Errorf("am: %s from rank %d: %w", h.Kind, src, err))
			return
		}
	}
	switch h.Kind {
	case wire.KindAck:
		rx.c.acks++
	case wire.KindReplyShort, wire.KindReplyMedium:
		rx.c.replies++
		rx.c.bytes += uint64(len(payload))
		rx.tok.Begin(ep, src, false)
		if h.Flags&wire.FlagPiggyback != 0 {
			rx.tok.SetPiggyback(h.Piggyback)
		}
		ep.dispatch(h.Handler, args, payload)
	case wire.KindRequestShort, wire.KindRequestMedium, wire.KindRequestStore, wire.KindStoreDone:
		// Room for the reply: the reservation less the packet and less the
		// free extension's room when the packet does not use it (sendRequest
		// reserves it always), so MaxReply does not depend on whether the
		// request carried credit.
		room := int(h.Reserve) - len(pkt)
		if h.Flags&wire.FlagFree == 0 {
			room -= wire.FreeExtLen
		}
		if uint64(h.Off)+uint64(h.Reserve) > uint64(ep.cfg.BufferBytes) || h.Off%flowctl.Granule != 0 ||
			h.Reserve%flowctl.Granule != 0 || room < wire.MaxHeaderLen {
			ep.drop(fmt.Errorf("am: %s from rank %d with bad reservation [%d,+%d) for %d bytes", h.Kind, src, h.Off, h.Reserve, len(pkt)))
			return
		}
		if h.Kind == wire.KindRequestStore || h.Kind == wire.KindStoreDone {
			region, err := ep.storeRegion(h, payload)
			if err != nil {
				ep.drop(fmt.Errorf("am: %s from rank %d: %w", h.Kind, src, err))
				ep.addFree(src, h.Off, h.Reserve)
				return
			}
			if h.Kind == wire.KindRequestStore && h.Flags&wire.FlagLast == 0 {
				ep.addFree(src, h.Off, h.Reserve)
				return
			}
			payload = region
		}
		rx.c.requests++
		rx.c.bytes += uint64(len(payload))
		tok := &rx.tok
		tok.Begin(ep, src, true)
		if h.Flags&wire.FlagPiggyback != 0 {
			tok.SetPiggyback(h.Piggyback)
		}
		tok.ReqOff, tok.ReqLen = h.Off, h.Reserve
		tok.MaxReply = room
		rx.payload = payload
		rx.kind = h.Kind
		ep.dispatch(h.Handler, args, payload)
		rx.payload = nil
		if !tok.Replied() && !tok.IsRetained() {
			ep.addFree(src, h.Off, h.Reserve)
		}
	}
}

func (ep *Endpoint) dispatch(idx uint8, args []uint64, payload []byte) {
	if err := ep.table.Dispatch(&ep.rx.tok, handlers.Index(idx), args, payload); err != nil {
		ep.drop(err)
	}
}

// addFree records that space [off,+n) of src's buffer here is consumed and
// owed back to src (peer.owed); adjacent frees coalesce into one range. The
// range goes back with the next request to src that carries it (sendLocked),
// the next reply to src when adjacent (Reply), or as an ack: once it reaches a
// quarter of the buffer, before the next packet is delivered or at the start
// of the next poll, whichever comes first (sendUrgentFrees); otherwise when
// the endpoint idles (flushFrees). Not from the delivery that filled the
// quarter: when that packet is the last that arrived (a ping-pong), its
// handler's work is what the caller waits for, the caller's answer usually
// carries the range, and on a network where a send is a system call an ack
// sat in front of the answer; while packets stream in, the next delivery
// sends it.
func (ep *Endpoint) addFree(src int, off, n uint32) {
	w := &ep.peers[src].owed
	total := n
	for {
		old := w.Load()
		if o, l := unpackOwed(old); l != 0 && o+l == off {
			if w.CompareAndSwap(old, packOwed(o, l+n)) {
				total = l + n
				break
			}
			continue // a request took the range meanwhile
		}
		if prev := w.Swap(packOwed(off, n)); prev != 0 {
			ep.sendAck(src, prev) // not adjacent: the older range goes alone
		}
		break
	}
	if !ep.rx.isDirty[src] {
		ep.rx.isDirty[src] = true
		ep.rx.dirty = append(ep.rx.dirty, src)
	}
	if int(total) >= ep.cfg.BufferBytes/4 {
		ep.rx.urgent = true
	}
}

// sendUrgentFrees returns the owed ranges that reached a quarter of the
// buffer as acks (see addFree) and drops the sources owed nothing from the
// dirty list.
func (ep *Endpoint) sendUrgentFrees() {
	ep.rx.urgent = false
	dirty := ep.rx.dirty[:0]
	for _, src := range ep.rx.dirty {
		w := &ep.peers[src].owed
		if _, n := unpackOwed(w.Load()); int(n) >= ep.cfg.BufferBytes/4 {
			if v := w.Swap(0); v != 0 {
				ep.sendAck(src, v)
			}
		}
		if w.Load() != 0 {
			dirty = append(dirty, src)
		} else {
			ep.rx.isDirty[src] = false
		}
	}
	ep.rx.dirty = dirty
}

// flushFrees returns every owed range as an ack.
func (ep *Endpoint) flushFrees() {
	for _, src := range ep.rx.dirty {
		if v := ep.peers[src].owed.Swap(0); v != 0 {
			ep.sendAck(src, v)
		}
		ep.rx.isDirty[src] = false
	}
	ep.rx.dirty = ep.rx.dirty[:0]
}

// sendAck returns the owed range w (packOwed) to dst in an ack.
func (ep *Endpoint) sendAck(dst int, w uint64) {
	if ep.dead[dst].Load() != nil {
		return // credit for a dead rank: nobody to return it to
	}
	off, n := unpackOwed(w)
	h := wire.Header{Kind: wire.KindAck, Src: uint32(ep.rank), Flags: wire.FlagFree, Off: off, Reserve: n}
	if err := ep.sendResponse(dst, &h, nil, nil); err != nil {
		ep.drop(err)
	}
}

// Reply implements handlers.Replier; handlers call it through their token.
func (ep *Endpoint) Reply(tok *handlers.Token, h handlers.Index, payload []byte, medium bool) error {
	args := tok.ReplyArgs()
	if err := ep.table.CheckSend(h, len(args)); err != nil {
		return err
	}
	src := tok.Source()
	hdr := wire.Header{Kind: wire.KindReplyShort, Handler: uint8(h), NArgs: uint8(len(args)), Src: uint32(ep.rank),
		Flags: wire.FlagFree, Off: tok.ReqOff, Reserve: tok.ReqLen}
	if pb, ok := tok.ReplyPiggyback(); ok {
		hdr.Flags |= wire.FlagPiggyback
		hdr.Piggyback = pb
	}
	if size := hdr.EncodedLen() + len(payload); size > tok.MaxReply {
		return fmt.Errorf("%w: reply of %d bytes with %d arguments to rank %d (room for %d)",
			ErrTooLarge, len(payload), len(args), tok.Source(), tok.MaxReply)
	}
	if medium {
		hdr.Kind = wire.KindReplyMedium
		hdr.Len = uint32(len(payload))
	} else {
		payload = nil
	}
	// Carry the credit owed to src for earlier requests too when it is
	// adjacent (and no request took it meanwhile).
	w := &ep.peers[src].owed
	if old := w.Load(); old != 0 {
		if o, l := unpackOwed(old); o+l == tok.ReqOff && w.CompareAndSwap(old, 0) {
			hdr.Off, hdr.Reserve = o, l+tok.ReqLen
		}
	}
	return ep.sendResponse(src, &hdr, args, payload)
}

// Retain implements handlers.Replier: it keeps a medium request's payload in
// the per-peer receive buffer, in the sender's own space, until Release.
func (ep *Endpoint) Retain(tok *handlers.Token) ([]byte, handlers.Retained, error) {
	if ep.rx.kind != wire.KindRequestMedium {
		return nil, handlers.Retained{}, fmt.Errorf("%w (this is a %s)", ErrNotMedium, ep.rx.kind)
	}
	src := tok.Source()
	base := src * ep.cfg.BufferBytes
	buf := ep.recvBufs[base+int(tok.ReqOff) : base+int(tok.ReqOff)+len(ep.rx.payload)]
	copy(buf, ep.rx.payload)
	return buf, handlers.Retained{Src: src, Off: tok.ReqOff, Len: tok.ReqLen}, nil
}

// Release frees a payload that a handler retained: the space returns to its
// sender, which answers the request. Call it once per Retained, from any
// goroutine, inside a handler or outside. The retained bytes must not be used
// afterwards. Errors: ErrRank or ErrConfig for a handle Retain did not make,
// transport errors.
func (ep *Endpoint) Release(r handlers.Retained) error {
	if err := ep.checkDst(r.Src); err != nil {
		return err
	}
	if r.Len == 0 || r.Off%flowctl.Granule != 0 || r.Len%flowctl.Granule != 0 || uint64(r.Off)+uint64(r.Len) > uint64(ep.cfg.BufferBytes) {
		return fmt.Errorf("%w: not a retained payload: [%d,+%d) from rank %d", ErrConfig, r.Off, r.Len, r.Src)
	}
	h := wire.Header{Kind: wire.KindAck, Src: uint32(ep.rank), Flags: wire.FlagFree, Off: r.Off, Reserve: r.Len}
	return ep.sendResponse(r.Src, &h, nil, nil)
}

var dropLogEvery = time.Second

func (ep *Endpoint) drop(err error) {
	ep.rx.c.drops++
	ep.dropMu.Lock()
	ep.lastDrop = err.Error()
	log := ep.cfg.OnDrop == nil && time.Since(ep.lastLog) >= dropLogEvery
	if log {
		ep.lastLog = time.Now()
	}
	ep.dropMu.Unlock()
	if ep.cfg.OnDrop != nil {
		ep.cfg.OnDrop(err)
	} else if log {
		slog.Warn("amgo: dropped packet", "rank", ep.rank, "err", err)
	}
}

// Stats returns the endpoint's counters. Receive-side counters are read under the
// poll lock, so Stats waits for a running poll to finish.
func (ep *Endpoint) Stats() Stats {
	var s Stats
	for i := range ep.peers {
		p := &ep.peers[i]
		p.mu.Lock()
		s.RequestsSent += p.c.requests
		s.RepliesSent += p.c.replies
		s.AcksSent += p.c.acks
		s.BytesSent += p.c.bytes
		s.CreditStalls += p.c.stalls
		s.Backlogged += p.c.backlogged
		s.StoresPut += p.c.storesPut
		s.StoresPacketed += p.c.storesPacketed
		p.mu.Unlock()
	}
	ep.pollMu.Lock()
	s.RequestsRecv = ep.rx.c.requests
	s.RepliesRecv = ep.rx.c.replies
	s.AcksRecv = ep.rx.c.acks
	s.BytesRecv = ep.rx.c.bytes
	s.Drops = ep.rx.c.drops
	ep.pollMu.Unlock()
	s.Gets = ep.gets.Load()
	s.UnknownHandler = ep.table.Unknown()
	ep.dropMu.Lock()
	s.LastDrop = ep.lastDrop
	ep.dropMu.Unlock()
	return s
}

// backoff paces a blocking wait: poll hot, then poll and yield the processor
// now and then, for SpinTime, then sleep on the transport's wake-up so that a
// waiting rank gives its core away. A wait that ends must call end.
type backoff struct {
	spins     int
	yieldAt   int // the poll from which the wait yields every 16 polls
	long      bool
	start     time.Time
	stalled   time.Time // when the poll lock was first found busy with no poll finishing since
	lastPolls uint64
	asleep    time.Time // when this wait first slept: a long wait probes for dead peers
}

// Pacing of a blocking wait, in polls (a poll takes tens of nanoseconds): the
// first hotPolls run back to back. A wait that lasts longer counts itself in
// longWaiters; if fewer goroutines of the process wait so than GOMAXPROCS, it
// goes on polling without yielding up to soloPolls (a Gosched costs several
// polls' time and delays noticing an arrival, which shows in waits of about a
// microsecond); otherwise (ranks as goroutines, several
// waiting goroutines per rank) it yields every 16 polls from hotPolls on, so
// that the goroutine that will answer gets a processor.
const (
	hotPolls  = 64
	soloPolls = 512
)

// longWaiters counts the goroutines of this process in a wait that has lasted
// past hotPolls polls.
var longWaiters atomic.Int32

// end ends a wait: it stops counting as a long waiter.
func (b *backoff) end() {
	if b.long {
		b.long = false
		longWaiters.Add(-1)
	}
}

// progress polls once on behalf of a blocked caller and paces the retry.
func (ep *Endpoint) progress(b *backoff) error {
	if ep.closed.Load() {
		return ErrClosed
	}
	if ep.pollMu.TryLock() {
		n, err := ep.pollLocked()
		ep.pollMu.Unlock()
		if err != nil {
			return err
		}
		if n > 0 {
			b.spins = 0
			return nil
		}
		b.stalled = time.Time{}
	} else if polls := ep.polls.Load(); polls != b.lastPolls || b.stalled.IsZero() {
		b.lastPolls = polls
		b.stalled = time.Now()
	} else if b.spins%1024 == 0 && time.Since(b.stalled) > 2*time.Second {
		// The poll lock has been held for seconds by a poll that delivers
		// nothing more: this goroutine is inside a handler and asked for
		// something that needs a poll. Report it rather than hang.
		return ErrInHandler
	}
	b.spins++
	if b.spins < hotPolls {
		return nil
	}
	if b.spins == hotPolls {
		b.start = time.Now()
		if !b.long {
			b.long = true
			b.yieldAt = hotPolls
			if int(longWaiters.Add(1)) < runtime.GOMAXPROCS(0) {
				b.yieldAt = soloPolls
			}
		}
	}
	if b.spins%64 != 0 || time.Since(b.start) < ep.cfg.SpinTime || time.Now().UnixNano() < ep.expect.Load() {
		if b.spins%16 == 0 && b.spins >= b.yieldAt {
			runtime.Gosched()
		}
		return nil
	}
	if b.asleep.IsZero() {
		b.asleep = time.Now()
	} else if time.Since(b.asleep) >= probeEvery {
		if pe := ep.maybeProbe(); pe != nil {
			return pe
		}
	}
	if ep.pollMu.TryLock() {
		err := ep.tr.Wait(time.Millisecond)
		ep.pollMu.Unlock()
		return err
	}
	time.Sleep(10 * time.Microsecond)
	return nil
}

// Expect tells the endpoint that traffic is due within d (a transfer of known
// size is under way): until then blocking waits keep polling instead of sleeping
// on the network's wake-up, which costs tens of microseconds on a halted
// virtual CPU. A layer that asked a peer for a large store calls it
// with the store's expected duration.
func (ep *Endpoint) Expect(d time.Duration) {
	until := time.Now().Add(d).UnixNano()
	for {
		old := ep.expect.Load()
		if old >= until || ep.expect.CompareAndSwap(old, until) {
			return
		}
	}
}

// PollUntil polls until cond returns true (GASNET_BLOCKUNTIL): hot at first,
// then sleeping on the network's wake-up. cond is evaluated on the calling
// goroutine between polls. Errors: ErrClosed, network errors, ErrInHandler,
// and a *PeerError (errors.Is ErrPeerDead) when a rank is found dead while it
// waits and cond still does not hold: every blocked PollUntil returns then,
// whichever goroutine noticed the death, so that a wait that depends on the
// dead rank cannot spin for ever; the caller decides whether to wait again.
// A PollUntil that starts after a death is not failed by it (DeadPeers lists
// the dead ranks).
func (ep *Endpoint) PollUntil(cond func() bool) error {
	if cond() {
		return nil
	}
	epoch := ep.deaths.Load()
	// The first hotPolls polls run without the pacing's bookkeeping (a
	// message's answer is usually found among them); errors, deaths and a
	// busy poll lock leave for the paced loop, which handles them.
	for range hotPolls {
		if !ep.pollMu.TryLock() {
			break
		}
		_, err := ep.pollLocked()
		ep.pollMu.Unlock()
		if err != nil || ep.deaths.Load() != epoch {
			break
		}
		if cond() {
			return nil
		}
	}
	return ep.pollUntilPaced(cond, epoch)
}

// pollUntilPaced is PollUntil past its hot polls: paced by backoff.
func (ep *Endpoint) pollUntilPaced(cond func() bool, epoch int64) error {
	var b backoff
	defer b.end()
	for !cond() {
		err := ep.progress(&b)
		if err != nil && !errors.Is(err, ErrPeerDead) {
			return err
		}
		if err != nil || ep.deaths.Load() != epoch {
			if cond() {
				return nil
			}
			return ep.deadSince(epoch)
		}
	}
	return nil
}

// Drain polls until every request this endpoint sent has been answered (its
// buffer space at every peer is free again) or d passes. It returns the number
// of peers still holding space.
func (ep *Endpoint) Drain(d time.Duration) int {
	deadline := time.Now().Add(d)
	busy := func() int {
		n := 0
		for i := range ep.peers {
			if ep.dead[i].Load() != nil {
				continue // a dead rank returns no credit
			}
			p := &ep.peers[i]
			p.mu.Lock()
			if p.win.InUse() > 0 || len(p.backlog) > 0 {
				n++
			}
			p.mu.Unlock()
		}
		return n
	}
	var b backoff
	defer b.end()
	for time.Now().Before(deadline) {
		if busy() == 0 {
			return 0
		}
		if err := ep.progress(&b); err != nil && !errors.Is(err, ErrPeerDead) {
			break
		}
	}
	return busy()
}

// OnProgress registers f to run after each poll of the progress goroutine
// (Config.Progress), outside any handler: a layer above am runs there the
// work its handlers deferred (in MPI over SP AM, the list of stores that any
// polling MPI call performs). Register before
// communication starts. f must not block for long.
func (ep *Endpoint) OnProgress(f func()) {
	ep.progressHooks = append(ep.progressHooks, f)
}

// startProgress starts the progress goroutine once, if configured.
func (ep *Endpoint) startProgress() {
	if ep.cfg.Progress <= 0 {
		return
	}
	ep.progressOnce.Do(func() {
		ep.progressStop = make(chan struct{})
		ep.progressDone = make(chan struct{})
		go ep.progressLoop(ep.cfg.Progress)
	})
}

func (ep *Endpoint) progressLoop(every time.Duration) {
	defer close(ep.progressDone)
	t := time.NewTicker(every)
	defer t.Stop()
	last := ep.polls.Load()
	for {
		select {
		case <-ep.progressStop:
			return
		case <-t.C:
		}
		if cur := ep.polls.Load(); cur != last {
			last = cur // someone is polling: nothing to do
			continue
		}
		for i := 0; i < 64; i++ {
			n, err := ep.Poll()
			if err != nil || n == 0 {
				break
			}
		}
		for _, f := range ep.progressHooks {
			f()
		}
		ep.flushPending()
		last = ep.polls.Load()
	}
}

// stopProgress ends the progress goroutine, if it runs.
func (ep *Endpoint) stopProgress() {
	ep.progressOnce.Do(func() {}) // no goroutine may start after this
	if ep.progressStop != nil {
		select {
		case <-ep.progressStop:
		default:
			close(ep.progressStop)
		}
		<-ep.progressDone
	}
}

// flushPending sends the credit returns this endpoint still owes its peers.
func (ep *Endpoint) flushPending() {
	ep.pollMu.Lock()
	defer ep.pollMu.Unlock()
	if len(ep.rx.dirty) > 0 {
		ep.flushFrees()
	}
}

// Close drains outstanding requests (for up to a second), unregisters every
// segment, then closes the transport. Later calls fail with ErrClosed.
func (ep *Endpoint) Close() error {
	if ep.closed.Load() {
		return ErrClosed
	}
	ep.flushPending()
	ep.Drain(time.Second)
	ep.closed.Store(true)
	ep.stopProgress()
	ep.pollMu.Lock()
	defer ep.pollMu.Unlock()
	ep.unregisterAll()
	return ep.tr.Close()
}

// Dead peers.
//
// A network reports a failed rank as an error wrapping transport.ErrPeer, from
// Send or Put to that rank, or from Poll. The endpoint records the rank once
// (peerFailed), fails every later request to it at once (checkDst), drops what
// it owed the rank, and makes every blocked PollUntil return the rank's
// *PeerError (the deaths epoch). A network that repeats the report on every
// Poll (shm and tcp do, while nothing else arrives) is heard once: later
// reports of a known death are swallowed, so that traffic from live ranks keeps
// flowing. Networks that cannot see a silent peer die (loop: a closed rank; tcp
// without a connection to it; the reliability layer with nothing outstanding)
// are covered by a liveness probe: a wait that has found nothing for
// probeEvery sends each live peer a probe packet (a short reply to a no-op
// handler, no credit), and a Send that fails with transport.ErrPeer records the
// rank.

// probeHandler is the reserved no-op handler of liveness probes.
const probeHandler handlers.Index = 254

// probeEvery is how long a blocked wait finds nothing before the endpoint
// probes its peers, and how often it probes at most.
var probeEvery = 500 * time.Millisecond

// DeadPeers lists the ranks recorded dead, in the order they were found.
func (ep *Endpoint) DeadPeers() []int {
	ep.deadMu.Lock()
	defer ep.deadMu.Unlock()
	return append([]int(nil), ep.deadOrder...)
}

// PeerFailure returns rank's *PeerError if the rank has been recorded dead, nil
// otherwise.
func (ep *Endpoint) PeerFailure(rank int) error {
	if rank < 0 || rank >= ep.size {
		return nil
	}
	if pe := ep.dead[rank].Load(); pe != nil {
		return pe
	}
	return nil
}

// Deaths is the number of ranks recorded dead so far: a layer above compares it
// with the value it last acted on to learn of new deaths with one atomic load.
func (ep *Endpoint) Deaths() int { return int(ep.deaths.Load()) }

// peerFailed records that rank failed if err reports it (wraps
// transport.ErrPeer), and returns the rank's *PeerError; nil when err is
// another kind of error. The first report of a rank is kept.
func (ep *Endpoint) peerFailed(rank int, err error) *PeerError {
	if !errors.Is(err, transport.ErrPeer) || rank < 0 || rank >= ep.size || rank == ep.rank {
		return nil
	}
	if pe := ep.dead[rank].Load(); pe != nil {
		return pe
	}
	var pe *PeerError
	if !errors.As(err, &pe) || pe.Rank != rank {
		pe = &PeerError{Rank: rank, Err: err}
	}
	ep.deadMu.Lock()
	if ep.dead[rank].CompareAndSwap(nil, pe) {
		ep.deadOrder = append(ep.deadOrder, rank)
		ep.deaths.Add(1)
	}
	ep.deadMu.Unlock()
	return ep.dead[rank].Load()
}

// pollFailure turns an error from the network's Poll into what Poll returns: a
// new death as its *PeerError (once), a known death as nil, anything else as is.
// Runs under pollMu.
func (ep *Endpoint) pollFailure(err error) error {
	if !errors.Is(err, transport.ErrPeer) {
		return err
	}
	rank := -1
	if err == ep.rx.lastErr {
		rank = ep.rx.lastBad
	} else if rank = failedRank(err, ep.rank, ep.size); rank >= 0 {
		ep.rx.lastErr, ep.rx.lastBad = err, rank
	}
	if rank < 0 {
		return err // a failure the network does not attribute: report it as is
	}
	if ep.dead[rank].Load() != nil {
		return nil
	}
	return ep.peerFailed(rank, err)
}

// failedRank returns the rank a network's peer error names: the
// *transport.PeerError in its chain (the transport contract) or am's own
// *PeerError; -1 if there is none, or it names this rank or one outside the
// job.
func failedRank(err error, self, size int) int {
	r := -1
	var te *transport.PeerError
	var pe *PeerError
	switch {
	case errors.As(err, &pe):
		r = pe.Rank
	case errors.As(err, &te):
		r = te.Rank
	}
	if r < 0 || r >= size || r == self {
		return -1
	}
	return r
}

// firstDead returns the *PeerError of the first rank recorded dead.
func (ep *Endpoint) firstDead() error {
	ep.deadMu.Lock()
	defer ep.deadMu.Unlock()
	if len(ep.deadOrder) == 0 {
		return nil
	}
	return ep.dead[ep.deadOrder[0]].Load()
}

// deadSince returns the *PeerError of the first rank recorded dead after the
// first epoch deaths.
func (ep *Endpoint) deadSince(epoch int64) error {
	ep.deadMu.Lock()
	defer ep.deadMu.Unlock()
	if int(epoch) >= len(ep.deadOrder) {
		return nil
	}
	return ep.dead[ep.deadOrder[epoch]].Load()
}

// maybeProbe sends a liveness probe to every peer not known dead, at most once
// per probeEvery for the endpoint, and returns the *PeerError of the first
// rank it finds dead. A peer whose lock is busy, or whose network refuses the
// probe for now, is being talked to: it is skipped.
func (ep *Endpoint) maybeProbe() error {
	now := time.Now().UnixNano()
	last := ep.lastProbe.Load()
	if now-last < int64(probeEvery) || !ep.lastProbe.CompareAndSwap(last, now) {
		return nil
	}
	h := wire.Header{Kind: wire.KindReplyShort, Handler: uint8(probeHandler), Src: uint32(ep.rank)}
	var found error
	for dst := range ep.peers {
		if dst == ep.rank || ep.dead[dst].Load() != nil {
			continue
		}
		p := &ep.peers[dst]
		if !p.mu.TryLock() {
			continue
		}
		var err error
		if len(p.backlog) == 0 {
			n := wire.Encode(p.scratch[:], &h, nil)
			err = ep.tr.Send(dst, p.scratch[:n], nil)
		}
		p.mu.Unlock()
		if err != nil && !errors.Is(err, transport.ErrWouldBlock) {
			if pe := ep.peerFailed(dst, err); pe != nil && found == nil {
				found = pe
			}
		}
	}
	return found
}
