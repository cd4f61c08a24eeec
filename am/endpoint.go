package am

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/amgo-hpc/amgo/am/internal/reliable"
	"github.com/amgo-hpc/amgo/am/transport"
	"github.com/amgo-hpc/amgo/flowctl"
	"github.com/amgo-hpc/amgo/handlers"
	"github.com/amgo-hpc/amgo/internal/cacheline"
	"github.com/amgo-hpc/amgo/internal/locks"
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
	// ErrArg: an argument no call could use (a nil filler, a negative length).
	ErrArg = errors.New("am: invalid argument")
	// ErrSeq: under Config.Seq, two goroutines called into the endpoint at
	// once; its state may be corrupt, and every call after fails.
	ErrSeq = errors.New("am: two goroutines inside an endpoint that was promised one call at a time (Config.Seq)")
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
	// BufferBytes is the receive buffer every endpoint keeps for every peer
	// (MPI over SP AM keeps one 16 KiB buffer for every other process), in
	// bytes, a multiple of 64 (AMGO_BUFFER_BYTES). 0: each peer's network
	// chooses (transport.Caps.BufferBytes: 1 MiB over tcp, 256 KiB over udp
	// and xdp, the ring's size over shm and loop), else 16 KiB (sim). The
	// buffer bounds what a sender has in flight to one peer and the largest
	// medium request (MaxMediumTo).
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
	// Yield makes a blocking wait give its processor away between polls
	// (sched_yield(2)) while it spins, instead of polling flat out, and sleep
	// on the transport without the transport's own spin: for a node with
	// more ranks than processors, where a spinning rank keeps the rank it
	// waits for off the processor (Open MPI's mpi_yield_when_idle).
	// package job sets it when this node has more ranks than the rank may
	// use processors, or from AMGO_YIELD.
	Yield bool
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
	// Seq is the client's promise to make one call into the endpoint at a
	// time, from one goroutine or from several in turn with a
	// happens-before edge between them (GASNet-EX's GASNET_SEQ and
	// GASNET_PARSYNC modes; what mpiam declares for MPI's ThreadSingle to
	// ThreadSerialized). The endpoint then guards its per-peer send state
	// and its poll with plain flags instead of locks: no locked
	// instruction on a message's path. A call that finds another
	// goroutine inside the endpoint is recorded, and every later call
	// fails with ErrSeq. Ignored when Progress is set: the progress
	// goroutine polls beside the client (Sequential reports what holds).
	Seq bool
	// NoImmediate turns immediate requests off (RequestImmediate then
	// always answers false and its caller sends a medium request): for
	// measuring the path they replace, and for tests of it
	// (AMGO_IMMEDIATE=0).
	NoImmediate bool
}

func (c *Config) fill() error {
	if c.ReplyReserve == 0 {
		c.ReplyReserve = wire.MaxHeaderLen
	}
	if c.SpinTime == 0 {
		c.SpinTime = 20 * time.Microsecond
	}
	if c.ReplyReserve < wire.MaxHeaderLen {
		return fmt.Errorf("%w: ReplyReserve %d (from %d to half the buffer)", ErrConfig, c.ReplyReserve, wire.MaxHeaderLen)
	}
	if c.BufferBytes != 0 {
		return c.checkBuffer(c.BufferBytes, "BufferBytes")
	}
	return c.checkBuffer(flowctl.DefaultBufferBytes, "the default buffer")
}

// checkBuffer checks a per-peer buffer size (what names it: the
// configuration's field or a network's choice).
func (c *Config) checkBuffer(n int, what string) error {
	if n%flowctl.Granule != 0 || n < 1024 || n > 1<<30 {
		return fmt.Errorf("%w: %s %d (a multiple of %d from 1 KiB to 1 GiB)", ErrConfig, what, n, flowctl.Granule)
	}
	if c.ReplyReserve > n/2 {
		return fmt.Errorf("%w: ReplyReserve %d (from %d to half the buffer, %s %d)", ErrConfig, c.ReplyReserve, wire.MaxHeaderLen, what, n)
	}
	return nil
}

// bufferFor is the per-peer buffer for a peer over a network with caps c.
func (c *Config) bufferFor(caps transport.Caps) int {
	switch {
	case c.BufferBytes != 0:
		return c.BufferBytes
	case caps.BufferBytes != 0:
		return caps.BufferBytes
	}
	return flowctl.DefaultBufferBytes
}

// Stats are an endpoint's counters since it was created.
type Stats struct {
	RequestsSent, RepliesSent, AcksSent uint64 // packets sent, by kind
	RequestsRecv, RepliesRecv, AcksRecv uint64 // packets handled, by kind
	BytesSent, BytesRecv                uint64 // payload bytes of requests and replies
	// ImmediateSent and ImmediateRecv count the immediate requests among
	// RequestsSent and RequestsRecv (RequestImmediate).
	ImmediateSent, ImmediateRecv uint64
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
	requests, replies, acks, bytes, stalls, backlogged, storesPut, storesPacketed, immediate uint64
}

// peerNet is what the network that reaches one peer offers (the job's
// network, or the peer's own under package route); fixed at New.
type peerNet struct {
	maxMedium int  // MaxMediumTo
	putMin    int  // Caps.PutMin
	put, get  bool // single-copy put and get
	putSend   bool // PutSender: a store-done leaves with the data
	fill      bool // FillSender: a medium's payload written in place (RequestMediumFill)
	immediate bool // immediate requests: an ordered, reliable network with a bounded queue of opaque packets
	name      string
	buffer    int // per-peer buffer in bytes, both ways (Config.BufferBytes or the network's)
}

// peer is the sender's state toward one rank, guarded by mu.
type peer struct {
	mu locks.Mutex // a plain flag under Config.Seq
	// cr is the credit toward the peer: the space this rank holds in the
	// peer's buffer, and the credit it owes the peer and carries back on
	// requests (whose flowctl.Owed the poller's Ledger adds to without mu:
	// the poller never waits for a sender).
	cr      *flowctl.Sender
	putMu   sync.Mutex              // guards putHdr (putSend), taken before mu
	putHdr  [wire.MaxHeaderLen]byte // the store-done that putSend sends with a put's data
	scratch [wire.MaxHeaderLen]byte
	backlog [][]byte // packets refused by the transport, in order
	noPut   bool     // single-copy put refused for this peer
	immRun  int      // immediate requests sent since RequestImmediate last polled
	c       sendCounters
	_       [64]byte
}

// Endpoint is one rank's attachment to the AM network: its handler table, its
// per-peer receive buffers and send windows, and the transport underneath.
// All methods are safe for concurrent use, unless Config.Seq promised one
// call at a time; handlers run only inside Poll.
type Endpoint struct {
	tr        transport.Transport
	putter    transport.Putter
	putSender transport.PutSender       // the putter, when it can send a packet with a put's data
	batcher   transport.Batcher         // the network, when it can send a run of packets in one call
	filler    transport.FillSender      // the network, when it takes a payload written in place
	sleep     func(time.Duration) error // a blocked wait's sleep: tr.Wait, or tr's Sleep with Config.Yield
	getter    transport.Getter
	noGet     []atomic.Bool // by rank: single-copy get refused by the network for that peer
	gets      atomic.Uint64 // completed Gets
	caps      transport.Caps
	rank      int
	size      int
	cfg       Config
	table     handlers.Table
	maxMedium int
	maxBuffer int // the largest per-peer buffer
	immQueue  int // the largest network queue toward a peer that takes immediate requests
	maxPacket int

	peers  []peer
	nets   []peerNet // by rank: what the network that reaches it offers
	layout []int     // by rank: its node (SetLayout; nil: one node)

	segMu   sync.RWMutex
	segs    []segment
	pinners []*runtime.Pinner // unpinned, for reuse: registering allocates nothing in steady state

	pollMu locks.Mutex // a plain flag under Config.Seq
	rx     rxState     // guarded by pollMu
	seq    *locks.Seq  // Config.Seq in force (nil: locks)

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
	hdr  wire.Header
	args [wire.MaxArgs]uint64
	tok  handlers.Token
	// immTok is the token of immediate requests on the fast path
	// (receiver.Deliver): prepared once by BeginImmediate, only its source
	// changes per message.
	immTok  handlers.Token
	payload []byte
	kind    wire.Kind
	credit  *flowctl.Ledger // the credit this rank owes its senders
	// retain[src] is the receive buffer of src (Config.BufferBytes) in
	// which retained medium payloads live, made by the first Retain of a
	// payload from src: the space accounting needs no memory behind it
	// (payloads are handed to handlers where the network delivered them).
	retain  [][]byte
	acks    []flowctl.Ack // scratch for the acks the ledger decides
	idle    int           // polls in a row that found nothing
	busy    int           // polls that delivered something
	lastErr error         // the last peer failure Poll returned, and its rank (a cache:
	lastBad int           // networks repeat a dead peer's error on every idle poll)
	c       struct{ requests, replies, acks, bytes, drops, immediate uint64 }
}

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
		tr:    tr,
		caps:  caps,
		rank:  tr.Rank(),
		size:  tr.Size(),
		cfg:   cfg,
		peers: cacheline.Slice[peer](tr.Size()),
		dead:  make([]atomic.Pointer[PeerError], tr.Size()),
	}
	if cfg.Seq && cfg.Progress <= 0 {
		ep.seq = locks.NewSeq()
		ep.pollMu.SetSeq(ep.seq)
		for i := range ep.peers {
			ep.peers[i].mu.SetSeq(ep.seq)
		}
	}
	ep.sleep = tr.Wait
	if sl, ok := tr.(transport.Sleeper); ok && cfg.Yield {
		ep.sleep = sl.Sleep // the network's spin would not yield
	}
	if p, ok := tr.(transport.Putter); ok && caps.Put {
		ep.putter = p
		ep.putSender, _ = tr.(transport.PutSender)
	}
	if g, ok := tr.(transport.Getter); ok && caps.Get {
		ep.getter = g
	}
	ep.batcher, _ = tr.(transport.Batcher)
	ep.filler, _ = tr.(transport.FillSender)
	ep.noGet = make([]atomic.Bool, tr.Size())
	if pt, ok := tr.(transport.PutTargeter); ok {
		pt.SetPutResolver(func(addr uint64, n int) ([]byte, error) { return ep.lookupRegion(addr, uint64(n)) })
	}
	ep.maxPacket = caps.MaxPacket
	if l := layoutOf(tr); l != nil {
		if err := ep.SetLayout(l); err != nil {
			return nil, err
		}
	}
	// Per peer, what its network offers: a medium must fit in one packet
	// of that network and, with its header and reply room, in the buffer.
	pc, perPeer := tr.(transport.PeerCapser)
	ep.nets = make([]peerNet, ep.size)
	ep.maxMedium = int(^uint(0) >> 1)
	for r := range ep.nets {
		c := caps
		if perPeer {
			c = pc.PeerCaps(r)
		}
		buf := cfg.bufferFor(c)
		if err := cfg.checkBuffer(buf, c.Name+"'s buffer"); err != nil {
			return nil, err
		}
		mm := (min(c.MaxPacket, buf-cfg.ReplyReserve) - wire.MaxHeaderLen) &^ 7
		if mm < 512 {
			return nil, fmt.Errorf("%w: MaxMedium to rank %d over %s would be %d bytes (network packets %d, buffer %d); GASNet requires at least 512",
				ErrConfig, r, c.Name, mm, c.MaxPacket, buf)
		}
		ep.nets[r] = peerNet{maxMedium: mm, putMin: c.PutMin, put: ep.putter != nil && c.Put,
			get: ep.getter != nil && c.Get, putSend: ep.putSender != nil && (c.PutSend || !perPeer), name: c.Name, buffer: buf,
			fill: ep.filler != nil && (c.Fill || !perPeer),
			// c is ordered and reliable here (a network that is not is
			// wrapped, and the wrapper states no QueueBytes).
			immediate: !cfg.NoImmediate && c.QueueBytes > 0 && c.MaxPacket >= MaxImmediate+wire.ImmediateHeaderLen+8*wire.MaxArgs}
		if ep.nets[r].immediate {
			ep.immQueue = max(ep.immQueue, c.QueueBytes)
		}
		ep.maxMedium = min(ep.maxMedium, mm)
		ep.maxBuffer = max(ep.maxBuffer, buf)
	}
	fp := flowctl.Params{BufferBytes: flowctl.DefaultBufferBytes, ReplyReserve: cfg.ReplyReserve,
		ExtLen: wire.FreeExtLen, MinReply: wire.MaxHeaderLen}
	var err error
	if ep.rx.credit, err = flowctl.NewLedger(fp, ep.size); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	ep.rx.acks = cacheline.Slice[flowctl.Ack](ep.size)[:0]
	ep.rx.immTok.BeginImmediate((*replier)(ep), 0)
	for i := range ep.peers {
		// The peer's network is the same both ways, so the peer sizes its
		// buffer here as this rank sizes its own there.
		pp := fp
		pp.BufferBytes = ep.nets[i].buffer
		if err := ep.rx.credit.SetBuffer(i, pp.BufferBytes); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrConfig, err)
		}
		if ep.peers[i].cr, err = flowctl.NewSender(pp, ep.rx.credit.Owed(i)); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrConfig, err)
		}
	}
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

// Sequential reports whether the endpoint runs under Config.Seq's promise
// (asked for, and no progress goroutine beside the client).
func (ep *Endpoint) Sequential() bool { return ep.seq != nil }

// Size is the number of ranks in the job.
func (ep *Endpoint) Size() int { return ep.size }

// Transport returns the network underneath (for its capabilities and tests).
func (ep *Endpoint) Transport() transport.Transport { return ep.tr }

// MaxMedium is the largest medium payload, in bytes, with any argument count,
// to every peer: what fits the per-peer buffer with a header and the reply
// room, and one packet of every network of the job. At least 512 (GASNet's
// minimum).
func (ep *Endpoint) MaxMedium() int { return ep.maxMedium }

// MaxMediumTo is MaxMedium toward rank dst alone (GASNet-EX's
// gex_AM_MaxRequestMedium for one peer): in a job over several networks
// (package route) it follows dst's network. 0 for a rank out of range.
func (ep *Endpoint) MaxMediumTo(dst int) int {
	if uint(dst) >= uint(ep.size) {
		return 0
	}
	return ep.nets[dst].maxMedium
}

// Network names the network that reaches rank dst ("shm", "tcp", ...; ""
// for a rank out of range).
func (ep *Endpoint) Network(dst int) string {
	if uint(dst) >= uint(ep.size) {
		return ""
	}
	return ep.nets[dst].name
}

// MaxStore is the largest Store payload in bytes (4 GiB - 1: the header's Total field).
const MaxStore = 1<<32 - 1

// BufferBytes is the largest per-peer receive buffer in bytes (peers over
// different networks may have different ones: BufferBytesTo).
func (ep *Endpoint) BufferBytes() int { return ep.maxBuffer }

// BufferBytesTo is the receive buffer in bytes that this rank and peer keep
// for each other (Config.BufferBytes, else what their network chooses), 0
// for a rank out of range.
func (ep *Endpoint) BufferBytesTo(peer int) int {
	if uint(peer) >= uint(ep.size) {
		return 0
	}
	return ep.nets[peer].buffer
}

// Register adds a handler to the endpoint's table (see package handlers). It
// must be called before communication starts, identically on every rank.
// Errors: handlers.ErrStarted, ErrIndexInUse, ErrIndexReserved, ErrBadEntry.
func (ep *Endpoint) Register(e handlers.Entry) (handlers.Index, error) {
	return ep.table.Register(e)
}

// Handlers gives access to the handler table (counters, lookups).
func (ep *Endpoint) Handlers() *handlers.Table { return &ep.table }

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
