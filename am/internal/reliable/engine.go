package reliable

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"time"

	"github.com/amgo-hpc/amgo/internal/wire"
)

// Defaults of Config's tunables, used where a field is zero.
const (
	// DefaultWindow is the number of unacknowledged packets per peer and
	// direction, and the size of the receiver's reorder buffer per peer.
	DefaultWindow = 128
	// MaxWindow is the largest Window: a standalone ack's selective-ack bitmap
	// (wire.MaxArgs 64-bit arguments) covers 1024 packets past the cumulative ack.
	MaxWindow = wire.MaxArgs * 64
	// DefaultRTOInit is the retransmission timeout before the first RTT sample.
	DefaultRTOInit = 20 * time.Millisecond
	// DefaultRTOMin is the smallest retransmission timeout. It stays above
	// DefaultAckDelay plus a LAN round trip so that a delayed ack does not cause
	// spurious retransmissions.
	DefaultRTOMin = 5 * time.Millisecond
	// DefaultRTOMax caps the exponential backoff of the retransmission timeout.
	DefaultRTOMax = time.Second
	// DefaultDeadAfter: a peer from which nothing arrives (no acknowledgement
	// progress, no packet at all) for this long while data to it is outstanding
	// is declared dead (3 s, so that the layers above report a failed rank
	// within 5 s).
	DefaultDeadAfter = 3 * time.Second
	// DefaultAckDelay is how long a receiver waits for an outgoing packet to
	// piggyback a cumulative ack on before it sends a standalone ack.
	DefaultAckDelay = time.Millisecond
	// DefaultProgressInterval: see Config.ProgressInterval.
	DefaultProgressInterval = time.Millisecond
	// DupThresh is the number of packets selectively acknowledged above an
	// unacknowledged one after which that one counts as lost and is retransmitted
	// at once (as TCP's fast retransmit, RFC 6675), without waiting for the timeout.
	DupThresh = 3
)

// Config sets up an Engine. Zero durations and a zero Window take the defaults.
type Config struct {
	// Peers is the number of ranks in the job (peers are 0..Peers-1, this rank
	// included: packets to oneself are sequenced like any other).
	Peers int
	// Self is this rank, 0..Peers-1; standalone acks carry it as their source.
	Self int
	// Window is the most unacknowledged packets per destination (the sender's
	// sliding window) and the receiver's reorder buffer per source, in packets,
	// 1..MaxWindow; default DefaultWindow. Every rank of a job must use the same.
	Window int
	// RTOMin, RTOMax bound the adaptive retransmission timeout; RTOInit is its
	// value before the first round-trip sample. Defaults DefaultRTOMin,
	// DefaultRTOMax, DefaultRTOInit.
	RTOMin, RTOMax, RTOInit time.Duration
	// DeadAfter: nothing from the peer for this long while data to it is
	// outstanding declares it dead. "Nothing" means no acknowledgement progress
	// and no valid packet at all: a live receiver that cannot take more (its
	// caller is not consuming) still answers every retransmission with an ack,
	// so back-pressure is never mistaken for death. Default DefaultDeadAfter.
	DeadAfter time.Duration
	// ProgressInterval is used by Wrap only: when no Send, Poll or Wait has run
	// for this long, a goroutine of the wrapped transport takes in arrivals,
	// acknowledges and retransmits on the caller's behalf. Zero means
	// DefaultProgressInterval; negative means no such goroutine.
	ProgressInterval time.Duration
	// AckDelay is the longest an acknowledgement waits for a packet to ride on
	// before a standalone ack carries it. Default DefaultAckDelay.
	AckDelay time.Duration
	// InitialSeq is the first sequence number of every stream (both directions,
	// every pair of ranks); 0 means 1. Every rank of a job must use the same. It
	// exists so that tests can start near 2^32 and cross the wrap.
	InitialSeq uint32
}

func (c *Config) setDefaults() error {
	if c.Peers < 1 {
		return fmt.Errorf("reliable: Peers %d, need at least 1", c.Peers)
	}
	if c.Self < 0 || c.Self >= c.Peers {
		return fmt.Errorf("reliable: Self %d out of range 0..%d", c.Self, c.Peers-1)
	}
	if c.Window == 0 {
		c.Window = DefaultWindow
	}
	if c.Window < 1 || c.Window > MaxWindow {
		return fmt.Errorf("reliable: Window %d out of range 1..%d", c.Window, MaxWindow)
	}
	def := func(d *time.Duration, v time.Duration, name string) error {
		if *d == 0 {
			*d = v
		}
		if *d < 0 {
			return fmt.Errorf("reliable: negative %s %v", name, *d)
		}
		return nil
	}
	for _, f := range []struct {
		d    *time.Duration
		v    time.Duration
		name string
	}{{&c.RTOMin, DefaultRTOMin, "RTOMin"}, {&c.RTOMax, DefaultRTOMax, "RTOMax"}, {&c.RTOInit, DefaultRTOInit, "RTOInit"},
		{&c.DeadAfter, DefaultDeadAfter, "DeadAfter"}, {&c.AckDelay, DefaultAckDelay, "AckDelay"}} {
		if err := def(f.d, f.v, f.name); err != nil {
			return err
		}
	}
	if c.ProgressInterval == 0 {
		c.ProgressInterval = DefaultProgressInterval
	}
	if c.RTOMin > c.RTOMax {
		return fmt.Errorf("reliable: RTOMin %v above RTOMax %v", c.RTOMin, c.RTOMax)
	}
	c.RTOInit = clampDur(c.RTOInit, c.RTOMin, c.RTOMax)
	if c.InitialSeq == 0 {
		c.InitialSeq = 1
	}
	return nil
}

// Errors returned by Engine methods. Test with errors.Is.
var (
	// ErrWindowFull: Window packets to this destination are unacknowledged. It is
	// back-pressure, never loss: the packet was not taken; poll (feed Receive and
	// Tick) and send it again.
	ErrWindowFull = errors.New("reliable: send window full")
	// ErrPeerDead is matched by the *DeadPeerError of a peer declared dead.
	ErrPeerDead = errors.New("reliable: peer declared dead")
	// ErrRank: a rank outside 0..Peers-1.
	ErrRank = errors.New("reliable: rank out of range")
	// ErrShortPacket: Send was given fewer bytes than a wire header.
	ErrShortPacket = errors.New("reliable: packet shorter than a wire header, or carrying the sequence extension this layer adds")
	// ErrMalformed: Receive dropped the packet because it does not decode, names
	// another source, has sequence number 0 but is not a standalone ack, lies
	// beyond the receive window, or acknowledges packets never sent. Counted in
	// Stats.Malformed.
	ErrMalformed = errors.New("reliable: malformed packet dropped")
)

// DeadPeerError reports a peer declared dead: nothing from it for
// Config.DeadAfter while packets to it were outstanding. It matches ErrPeerDead
// (the MPI analogue is MPI_ERR_PROC_FAILED).
type DeadPeerError struct {
	Rank    int           // the dead peer
	Silence time.Duration // time without a sign of life when declared
	Unacked int           // packets to it that were never acknowledged
}

func (e *DeadPeerError) Error() string {
	return fmt.Sprintf("reliable: rank %d declared dead: nothing received for %v with %d packets unacknowledged",
		e.Rank, e.Silence, e.Unacked)
}

// Is makes errors.Is(err, ErrPeerDead) true.
func (e *DeadPeerError) Is(target error) bool { return target == ErrPeerDead }

// Message is a packet to transmit.
type Message struct {
	To   int    // destination rank
	Data []byte // the whole packet; valid until AdvanceMessages (or Advance)
}

// Delivery is a packet to hand up, in order, exactly once.
type Delivery struct {
	From int    // source rank
	Data []byte // the whole packet as the sender's caller gave it (this layer's sequence extension removed); valid until AdvanceDeliveries (or Advance)
}

// Ready is what the engine wants done, collected by Ready or ReadyUpTo.
type Ready struct {
	// Messages to transmit, in order. Losing some is allowed (they are
	// retransmitted); reordering is allowed.
	Messages []Message
	// Deliveries to hand up, in order per source.
	Deliveries []Delivery
	// Dead lists peers declared dead since the last Ready, as *DeadPeerError.
	Dead []error
}

// Stats counts what the engine did. All counters are cumulative.
type Stats struct {
	Sent            uint64 // packets taken by Send
	Transmitted     uint64 // data packets handed out in Ready, retransmissions included
	Retransmits     uint64 // retransmissions queued (timeout and fast)
	FastRetransmits uint64 // retransmissions queued on selective-ack evidence
	Timeouts        uint64 // retransmission timer expiries
	AcksSent        uint64 // standalone acks handed out
	AcksReceived    uint64 // standalone acks processed
	Delivered       uint64 // packets handed up in order
	Duplicates      uint64 // data packets dropped because they were already received
	Reordered       uint64 // data packets buffered because an earlier one was missing
	Overruns        uint64 // data packets dropped because the receiver had not consumed earlier ones
	Malformed       uint64 // packets dropped as ErrMalformed
	FromDead        uint64 // packets dropped because their source was declared dead
	WindowFull      uint64 // Send calls refused with ErrWindowFull
	DeadPeers       uint64 // peers declared dead
}

// PeerState is a snapshot of the engine's view of one peer, for tests and
// diagnostics.
type PeerState struct {
	RTO, SRTT, RTTVar time.Duration // retransmission timeout and round-trip estimates
	Unacked           int           // packets sent and not cumulatively acknowledged
	Buffered          int           // packets received and not yet consumed (in order or not)
	Dead              bool
}

// Byte offsets of the fields this layer writes in place: the sequence
// extension (wire.FlagSeq), which this layer inserts after the core of every
// packet it sends and removes from every packet it delivers.
const (
	seqOffset = wire.SeqOffset
	ackOffset = wire.AckOffset
)

// seqSpace is the number of wire sequence numbers: 1..2^32-1, 0 meaning "not
// sequenced". Internally every stream counts with 64 bits; on the wire the count
// n is wireSeq(n), and a received value is mapped back to the count nearest a
// reference (serial-number arithmetic, RFC 1982, modulo 2^32-1).
const seqSpace = 1<<32 - 1

func wireSeq(n uint64) uint32 { return uint32((n-1)%seqSpace) + 1 }

// unwrap returns the count whose wire value is w that lies nearest ref.
func unwrap(w uint32, ref uint64) (uint64, bool) {
	if w == 0 {
		return 0, false
	}
	d := int64(w) - int64(wireSeq(ref))
	const half = seqSpace / 2
	if d > half {
		d -= seqSpace
	} else if d < -half {
		d += seqSpace
	}
	n := int64(ref) + d
	if n < 1 {
		return 0, false
	}
	return uint64(n), true
}

type sendSlot struct {
	buf     []byte
	firstTx time.Time // when Send took it (RTT samples)
	lastTx  time.Time // last (re)transmission
	retx    bool      // retransmitted at least once: no RTT sample (Karn)
	sacked  bool      // selectively acknowledged
	queued  bool      // in txq, not yet handed out
}

type recvSlot struct {
	buf  []byte
	have bool
}

type peer struct {
	rank int32
	dead bool
	// Sender side: [sndUna, sndNext) are unacknowledged.
	sndUna, sndNext uint64
	snd             []sendSlot
	srtt, rttvar    time.Duration
	rto             time.Duration
	hasRTT          bool
	rtoAt           time.Time // retransmission timer; zero when disarmed
	aliveAt         time.Time // last sign of life: ack progress, any valid packet, or data becoming outstanding
	deadErr         *DeadPeerError

	// Receiver side: [rcvBase, rcvHanded) handed up, not consumed;
	// [rcvHanded, rcvNext) in order, waiting to be handed up; beyond rcvNext,
	// up to rcvHigh, out of order with holes. rcvHigh-rcvBase <= Window.
	rcvBase, rcvHanded, rcvNext, rcvHigh uint64
	rcv                                  []recvSlot
	ackOwed                              int       // packets received since an ack last left
	ackDueAt                             time.Time // delayed-ack deadline; zero when none
	ackNow                               bool      // a standalone ack is due
	ackQueued                            bool      // in ackq
	ackHanded                            bool      // ackBuf is in the handed-out Messages
	deliverQueued                        bool      // in deliverq
	handedListed                         bool      // in handedPeers
	active                               bool      // in active
	ackBuf                               [wire.MaxHeaderLen]byte
}

type txRef struct {
	peer int32
	n    uint64
}

// Engine is the reliability protocol of one rank: per-peer sequence numbers, a
// sliding window, cumulative and selective acknowledgements, adaptive
// retransmission and dead-peer detection. It does no I/O, starts no goroutine
// and reads no clock: the caller passes the time to every call and carries out
// what Ready returns. It is not safe for concurrent use.
type Engine struct {
	cfg     Config
	window  uint64
	quarter int
	peers   []peer
	pool    bufPool
	limbo   [][]byte // freed send buffers that handed-out Messages may still reference

	txq          []txRef
	ackq         []int32
	deliverq     []int32
	handedPeers  []int32
	ackHandedQ   []int32
	active       []int32
	deadq        []error
	rd           Ready
	stats        Stats
	hdr          wire.Header
	args         [wire.MaxArgs]uint64
	standaloneHd wire.Header
}

// New returns an engine for cfg (zero fields take the defaults). Errors: Peers
// < 1, Self out of range, Window outside 1..MaxWindow, a negative duration,
// RTOMin above RTOMax.
func New(cfg Config) (*Engine, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	e := &Engine{cfg: cfg, window: uint64(cfg.Window), quarter: max(1, cfg.Window/4),
		peers: make([]peer, cfg.Peers)}
	e.pool.limit = 4*cfg.Window + 64
	start := uint64(cfg.InitialSeq)
	for i := range e.peers {
		p := &e.peers[i]
		p.rank = int32(i)
		p.sndUna, p.sndNext = start, start
		p.rcvBase, p.rcvHanded, p.rcvNext, p.rcvHigh = start, start, start, start
		p.rto = cfg.RTOInit
	}
	return e, nil
}

// Config returns the configuration with defaults filled in.
func (e *Engine) Config() Config { return e.cfg }

// Stats returns the counters.
func (e *Engine) Stats() Stats { return e.stats }

// PeerState returns the engine's view of rank r (the zero PeerState for a rank
// out of range).
func (e *Engine) PeerState(r int) PeerState {
	if r < 0 || r >= len(e.peers) {
		return PeerState{}
	}
	p := &e.peers[r]
	return PeerState{RTO: p.rto, SRTT: p.srtt, RTTVar: p.rttvar, Unacked: int(p.sndNext - p.sndUna),
		Buffered: int(p.rcvHigh - p.rcvBase), Dead: p.dead}
}

func (p *peer) ensure(window uint64) {
	if p.snd == nil {
		p.snd = make([]sendSlot, window)
		p.rcv = make([]recvSlot, window)
	}
}

func (e *Engine) sslot(p *peer, n uint64) *sendSlot { return &p.snd[n%e.window] }
func (e *Engine) rslot(p *peer, n uint64) *recvSlot { return &p.rcv[n%e.window] }

func (e *Engine) activate(p *peer) {
	if !p.active {
		p.active = true
		e.active = append(e.active, p.rank)
	}
}

// Send takes one packet (an encoded wire header, its arguments and payload) for
// rank dst: it copies it with this layer's sequence extension (wire.FlagSeq)
// inserted after the core, stamps the next sequence number into its Seq field
// and queues it for transmission (Ready). The Ack field is stamped when the
// packet is handed out. Errors: ErrRank, ErrShortPacket (shorter than a core
// header, or already carrying FlagSeq, which belongs to this layer),
// ErrWindowFull (back-pressure: nothing was taken), a *DeadPeerError
// (ErrPeerDead).
func (e *Engine) Send(now time.Time, dst int, pkt []byte) error {
	return e.SendParts(now, dst, pkt, nil)
}

// SendParts is Send for a packet given as the encoded header with its arguments
// followed by the payload, gathered into one copy.
func (e *Engine) SendParts(now time.Time, dst int, hdr, payload []byte) error {
	if uint(dst) >= uint(len(e.peers)) {
		return ErrRank
	}
	p := &e.peers[dst]
	if p.dead {
		return p.deadErr
	}
	n := len(hdr) + len(payload)
	if len(hdr) < wire.HeaderLen || binary.LittleEndian.Uint16(hdr[4:])&wire.FlagSeq != 0 {
		return ErrShortPacket
	}
	if p.sndNext-p.sndUna >= e.window {
		e.stats.WindowFull++
		return ErrWindowFull
	}
	p.ensure(e.window)
	seq := p.sndNext
	buf := e.pool.get(n + wire.SeqExtLen)
	copy(buf, hdr[:wire.HeaderLen])
	binary.LittleEndian.PutUint16(buf[4:], binary.LittleEndian.Uint16(hdr[4:])|wire.FlagSeq)
	binary.LittleEndian.PutUint32(buf[seqOffset:], wireSeq(seq))
	binary.LittleEndian.PutUint32(buf[ackOffset:], 0)
	at := wire.HeaderLen + wire.SeqExtLen
	copy(buf[at+copy(buf[at:], hdr[wire.HeaderLen:]):], payload)
	s := e.sslot(p, seq)
	*s = sendSlot{buf: buf, firstTx: now, lastTx: now, queued: true}
	e.txq = append(e.txq, txRef{peer: p.rank, n: seq})
	if p.sndUna == p.sndNext {
		p.aliveAt = now
		p.rtoAt = now.Add(p.rto)
	}
	p.sndNext++
	e.activate(p)
	e.stats.Sent++
	return nil
}

// Receive processes one packet that arrived from rank src. Acknowledgements in
// it are applied; a standalone ack is consumed; a data packet is buffered (it is
// copied: pkt may be reused on return) and, once every earlier one has arrived,
// queued for delivery. Duplicates, packets from a dead peer and packets that
// find no room because earlier ones were not consumed are dropped and counted,
// returning nil. Malformed packets are dropped and counted, returning
// ErrMalformed; Receive never panics on any input.
func (e *Engine) Receive(now time.Time, src int, pkt []byte) error {
	if uint(src) >= uint(len(e.peers)) {
		e.stats.Malformed++
		return ErrMalformed
	}
	if _, err := wire.Decode(pkt, &e.hdr, &e.args); err != nil {
		e.stats.Malformed++
		return ErrMalformed
	}
	h := &e.hdr
	if h.Src != uint32(src) || h.Flags&wire.FlagSeq == 0 {
		e.stats.Malformed++
		return ErrMalformed
	}
	p := &e.peers[src]
	if p.dead {
		e.stats.FromDead++
		return nil
	}
	p.ensure(e.window)

	// Validate everything before changing any state.
	var ackN uint64
	if h.Ack != 0 {
		var ok bool
		ackN, ok = unwrap(h.Ack, p.sndUna)
		if !ok || ackN > p.sndNext {
			e.stats.Malformed++
			return ErrMalformed
		}
	}
	standalone := h.Seq == 0
	var n uint64
	if standalone {
		if h.Kind != wire.KindAck || h.Flags != wire.FlagSeq || h.Ack == 0 {
			e.stats.Malformed++
			return ErrMalformed
		}
		for i := 0; i < int(h.NArgs); i++ {
			if w := e.args[i]; w != 0 && ackN+1+uint64(64*i+63-bits.LeadingZeros64(w)) >= p.sndNext {
				e.stats.Malformed++
				return ErrMalformed
			}
		}
	} else {
		var ok bool
		n, ok = unwrap(h.Seq, p.rcvNext)
		if !ok || n >= p.rcvNext+e.window {
			e.stats.Malformed++
			return ErrMalformed
		}
	}

	if now.After(p.aliveAt) {
		p.aliveAt = now
	}
	if h.Ack != 0 {
		e.onAck(now, p, ackN)
	}
	if standalone {
		e.stats.AcksReceived++
		e.onSack(now, p, ackN, e.args[:h.NArgs])
		return nil
	}
	e.onData(now, p, n, pkt)
	return nil
}

// onAck applies a cumulative acknowledgement: every packet before ackN arrived.
func (e *Engine) onAck(now time.Time, p *peer, ackN uint64) {
	if ackN <= p.sndUna {
		return
	}
	var sample time.Duration
	sampled := false
	for n := p.sndUna; n < ackN; n++ {
		s := e.sslot(p, n)
		if !s.retx && !s.sacked {
			sample, sampled = now.Sub(s.firstTx), true
		}
		e.freeTx(s.buf)
		*s = sendSlot{}
	}
	p.sndUna = ackN
	p.aliveAt = now
	if sampled {
		e.sampleRTT(p, sample)
	}
	if p.sndUna == p.sndNext {
		p.rtoAt = time.Time{}
	} else {
		p.rtoAt = now.Add(p.rto)
	}
}

// onSack applies a standalone ack's selective-ack bitmap (bit i of argument k:
// packet ackN+1+64k+i arrived) and retransmits the holes that DupThresh later
// packets have overtaken.
func (e *Engine) onSack(now time.Time, p *peer, ackN uint64, sack []uint64) {
	var sample time.Duration
	sampled, progress := false, false
	for k, w := range sack {
		for w != 0 {
			i := bits.TrailingZeros64(w)
			w &= w - 1
			n := ackN + 1 + uint64(64*k+i)
			if n < p.sndUna {
				continue
			}
			s := e.sslot(p, n)
			if s.sacked {
				continue
			}
			s.sacked, progress = true, true
			if !s.retx {
				sample, sampled = now.Sub(s.firstTx), true
			}
		}
	}
	if !progress {
		return
	}
	p.aliveAt = now
	if sampled {
		e.sampleRTT(p, sample)
	}
	// A hole is lost (RFC 6675's DupThresh, with RACK's use of time, RFC 8985)
	// when DupThresh packets transmitted no earlier than its own last
	// transmission have been selectively acknowledged, so that a retransmission
	// is not repeated on evidence older than itself, and it has been out for
	// longer than the reordering the network shows (reorderWindow).
	reo := e.reorderWindow(p)
	var latest [DupThresh]time.Time // the DupThresh latest transmissions selectively acknowledged above n
	above := 0
	for n := p.sndNext; n > p.sndUna; {
		n--
		s := e.sslot(p, n)
		if s.sacked {
			above++
			t := s.lastTx
			for i := range latest {
				if t.After(latest[i]) {
					latest[i], t = t, latest[i]
				}
			}
			continue
		}
		if above >= DupThresh && !latest[DupThresh-1].Before(s.lastTx) && now.Sub(s.lastTx) >= reo {
			e.queueRetransmit(now, p, n, s)
			e.stats.FastRetransmits++
		}
	}
}

// reorderWindow is how long a hole may stay unfilled behind later packets
// before it counts as lost: a quarter of the smoothed round trip (RACK's
// default) plus the round-trip deviation, which grows with the reordering the
// network shows.
func (e *Engine) reorderWindow(p *peer) time.Duration {
	if !p.hasRTT {
		return 0
	}
	return p.srtt/4 + p.rttvar
}

func (e *Engine) queueRetransmit(now time.Time, p *peer, n uint64, s *sendSlot) {
	s.retx = true
	s.lastTx = now
	e.stats.Retransmits++
	if !s.queued {
		s.queued = true
		e.txq = append(e.txq, txRef{peer: p.rank, n: n})
	}
}

// sampleRTT updates the estimators with one round-trip sample (Jacobson/Karels,
// as RFC 6298 §2) and recomputes the timeout, which undoes any backoff.
func (e *Engine) sampleRTT(p *peer, r time.Duration) {
	if r < 0 {
		r = 0
	}
	if !p.hasRTT {
		p.srtt, p.rttvar, p.hasRTT = r, r/2, true
	} else {
		d := p.srtt - r
		if d < 0 {
			d = -d
		}
		p.rttvar = (3*p.rttvar + d) / 4
		p.srtt = (7*p.srtt + r) / 8
	}
	p.rto = clampDur(p.srtt+4*p.rttvar, e.cfg.RTOMin, e.cfg.RTOMax)
}

func clampDur(d, lo, hi time.Duration) time.Duration { return min(max(d, lo), hi) }

// onData stores data packet n from p and advances the in-order point.
func (e *Engine) onData(now time.Time, p *peer, n uint64, pkt []byte) {
	if n < p.rcvNext {
		e.stats.Duplicates++
		e.ackSoon(p) // the sender missed our ack
		return
	}
	if n >= p.rcvBase+e.window {
		e.stats.Overruns++ // no room until the caller consumes; the sender retransmits
		e.ackSoon(p)       // and learns that we are alive
		return
	}
	s := e.rslot(p, n)
	if s.have {
		e.stats.Duplicates++
		e.ackSoon(p)
		return
	}
	// Keep the packet as the sender's caller gave it: without the sequence
	// extension (Receive checked that it has one).
	s.buf = e.pool.get(len(pkt) - wire.SeqExtLen)
	copy(s.buf, pkt[:wire.HeaderLen])
	binary.LittleEndian.PutUint16(s.buf[4:], binary.LittleEndian.Uint16(pkt[4:])&^wire.FlagSeq)
	copy(s.buf[wire.HeaderLen:], pkt[wire.HeaderLen+wire.SeqExtLen:])
	s.have = true
	if n >= p.rcvHigh {
		p.rcvHigh = n + 1
	}
	p.ackOwed++
	if n == p.rcvNext {
		for p.rcvNext < p.rcvHigh && e.rslot(p, p.rcvNext).have {
			p.rcvNext++
		}
		if !p.deliverQueued {
			p.deliverQueued = true
			e.deliverq = append(e.deliverq, p.rank)
		}
	} else {
		e.stats.Reordered++
		e.ackSoon(p) // a hole: tell the sender at once (SP AM's NACK, as a SACK)
		return
	}
	if p.ackOwed >= e.quarter {
		e.ackSoon(p) // SP AM: ack when a quarter of the window is unacknowledged
	} else if p.ackDueAt.IsZero() {
		p.ackDueAt = now.Add(e.cfg.AckDelay)
		e.activate(p)
	}
}

// ackSoon queues a standalone ack for the next Ready (unless a data packet to
// p carries the cumulative ack first and no selective ack is needed).
func (e *Engine) ackSoon(p *peer) {
	p.ackNow = true
	if !p.ackQueued {
		p.ackQueued = true
		e.ackq = append(e.ackq, p.rank)
	}
}

// Tick runs the timers due at now: retransmission on timeout (go-back-N over
// the packets not selectively acknowledged, with exponential backoff of the
// timeout), delayed standalone acks, and dead-peer detection.
func (e *Engine) Tick(now time.Time) {
	keep := e.active[:0]
	for _, r := range e.active {
		p := &e.peers[r]
		if p.dead {
			p.active = false
			continue
		}
		if p.sndUna != p.sndNext {
			if silence := now.Sub(p.aliveAt); silence >= e.cfg.DeadAfter {
				e.declareDead(p, silence)
				p.active = false
				continue
			}
			if !p.rtoAt.IsZero() && !now.Before(p.rtoAt) {
				e.timeout(now, p)
			}
		}
		if !p.ackDueAt.IsZero() && !now.Before(p.ackDueAt) {
			p.ackDueAt = time.Time{}
			e.ackSoon(p)
		}
		if p.sndUna != p.sndNext || !p.ackDueAt.IsZero() {
			keep = append(keep, r)
		} else {
			p.active = false
		}
	}
	e.active = keep
}

func (e *Engine) timeout(now time.Time, p *peer) {
	e.stats.Timeouts++
	p.rto = min(2*p.rto, e.cfg.RTOMax)
	for n := p.sndUna; n < p.sndNext; n++ {
		if s := e.sslot(p, n); !s.sacked {
			e.queueRetransmit(now, p, n, s)
		}
	}
	p.rtoAt = now.Add(p.rto)
}

func (e *Engine) declareDead(p *peer, silence time.Duration) {
	p.dead = true
	p.deadErr = &DeadPeerError{Rank: int(p.rank), Silence: silence, Unacked: int(p.sndNext - p.sndUna)}
	for n := p.sndUna; n < p.sndNext; n++ {
		s := e.sslot(p, n)
		e.freeTx(s.buf)
		*s = sendSlot{}
	}
	p.sndUna = p.sndNext
	p.rtoAt, p.ackDueAt, p.ackNow = time.Time{}, time.Time{}, false
	e.deadq = append(e.deadq, p.deadErr)
	e.stats.DeadPeers++
}

// NextDeadline returns the earliest time at which Tick has work (a
// retransmission timeout, a delayed ack, a dead-peer deadline), or the zero
// time when no timer is armed. Work that is due already (HasReady) is not a
// deadline: collect it with Ready.
func (e *Engine) NextDeadline() time.Time {
	var d time.Time
	earlier := func(t time.Time) {
		if !t.IsZero() && (d.IsZero() || t.Before(d)) {
			d = t
		}
	}
	for _, r := range e.active {
		p := &e.peers[r]
		if p.dead {
			continue
		}
		if p.sndUna != p.sndNext {
			earlier(p.rtoAt)
			earlier(p.aliveAt.Add(e.cfg.DeadAfter))
		}
		earlier(p.ackDueAt)
	}
	return d
}

// HasReady reports whether Ready would return anything new: packets to
// transmit, in-order packets to deliver, or dead peers.
func (e *Engine) HasReady() bool {
	return len(e.txq) > 0 || len(e.ackq) > 0 || len(e.deliverq) > 0 || len(e.deadq) > 0
}

// HasDeliveries reports whether in-order packets wait to be handed up.
func (e *Engine) HasDeliveries() bool { return len(e.deliverq) > 0 }

// Ready returns everything to do now; see ReadyUpTo.
func (e *Engine) Ready() Ready { return e.ReadyUpTo(-1) }

// ReadyUpTo returns what the caller must do now: transmit Messages, hand up
// Deliveries (at most maxDeliveries newly handed ones; none when 0, all when
// negative), and report Dead peers. Each Message to a peer carries, in its Ack
// field, the cumulative acknowledgement as of this call. The returned slices
// accumulate everything handed out since the last AdvanceMessages (Messages,
// Dead) and AdvanceDeliveries (Deliveries), and stay valid until then.
func (e *Engine) ReadyUpTo(maxDeliveries int) Ready {
	for _, t := range e.txq {
		p := &e.peers[t.peer]
		if p.dead || t.n < p.sndUna || t.n >= p.sndNext {
			continue
		}
		s := e.sslot(p, t.n)
		if !s.queued {
			continue
		}
		s.queued = false
		if s.sacked {
			continue
		}
		binary.LittleEndian.PutUint32(s.buf[ackOffset:], wireSeq(p.rcvNext))
		p.ackOwed, p.ackDueAt = 0, time.Time{}
		p.ackNow = p.ackNow && p.rcvHigh > p.rcvNext // the selective part cannot ride on data
		e.rd.Messages = append(e.rd.Messages, Message{To: int(t.peer), Data: s.buf})
		e.stats.Transmitted++
	}
	e.txq = e.txq[:0]
	for _, r := range e.ackq {
		p := &e.peers[r]
		p.ackQueued = false
		if !p.ackNow || p.dead {
			continue
		}
		p.ackNow, p.ackOwed, p.ackDueAt = false, 0, time.Time{}
		n := e.encodeAck(p)
		e.stats.AcksSent++
		if p.ackHanded {
			continue // rewritten in place; already in Messages
		}
		p.ackHanded = true
		e.ackHandedQ = append(e.ackHandedQ, r)
		e.rd.Messages = append(e.rd.Messages, Message{To: int(r), Data: p.ackBuf[:n]})
	}
	e.ackq = e.ackq[:0]

	handed, i := 0, 0
	for ; i < len(e.deliverq) && (maxDeliveries < 0 || handed < maxDeliveries); i++ {
		p := &e.peers[e.deliverq[i]]
		for p.rcvHanded < p.rcvNext && (maxDeliveries < 0 || handed < maxDeliveries) {
			e.rd.Deliveries = append(e.rd.Deliveries, Delivery{From: int(p.rank), Data: e.rslot(p, p.rcvHanded).buf})
			p.rcvHanded++
			handed++
		}
		if !p.handedListed {
			p.handedListed = true
			e.handedPeers = append(e.handedPeers, p.rank)
		}
		if p.rcvHanded < p.rcvNext {
			break // limit reached inside this peer: it stays first
		}
		p.deliverQueued = false
	}
	e.deliverq = e.deliverq[:copy(e.deliverq, e.deliverq[i:])]
	e.stats.Delivered += uint64(handed)

	e.rd.Dead = append(e.rd.Dead, e.deadq...)
	clear(e.deadq)
	e.deadq = e.deadq[:0]
	return e.rd
}

// encodeAck writes p's standalone ack into p.ackBuf and returns its length:
// kind ack, flags FlagSeq only, Seq 0, Ack = next sequence number expected, and as many
// 64-bit arguments as the selective-ack bitmap needs (bit i of argument k:
// packet Ack+1+64k+i has arrived).
func (e *Engine) encodeAck(p *peer) int {
	var sack [wire.MaxArgs]uint64
	nargs := 0
	for n := p.rcvNext + 1; n < p.rcvHigh; n++ {
		if e.rslot(p, n).have {
			i := n - p.rcvNext - 1
			sack[i/64] |= 1 << (i % 64)
			nargs = int(i/64) + 1
		}
	}
	h := &e.standaloneHd
	*h = wire.Header{Kind: wire.KindAck, NArgs: uint8(nargs), Src: uint32(e.cfg.Self), Flags: wire.FlagSeq, Ack: wireSeq(p.rcvNext)}
	return wire.Encode(p.ackBuf[:], h, sack[:nargs])
}

// Advance tells the engine that the caller acted on everything Ready returned:
// AdvanceMessages and AdvanceDeliveries.
func (e *Engine) Advance() {
	e.AdvanceMessages()
	e.AdvanceDeliveries()
}

// AdvanceMessages tells the engine that the Messages and Dead handed out so far
// were acted on; their buffers may be reused. Deliveries stay valid.
func (e *Engine) AdvanceMessages() {
	clear(e.rd.Messages)
	e.rd.Messages = e.rd.Messages[:0]
	clear(e.rd.Dead)
	e.rd.Dead = e.rd.Dead[:0]
	for _, r := range e.ackHandedQ {
		e.peers[r].ackHanded = false
	}
	e.ackHandedQ = e.ackHandedQ[:0]
	for i, b := range e.limbo {
		e.pool.put(b)
		e.limbo[i] = nil
	}
	e.limbo = e.limbo[:0]
}

// AdvanceDeliveries tells the engine that the Deliveries handed out so far were
// consumed: their buffers are reused and the receive window moves past them.
func (e *Engine) AdvanceDeliveries() {
	for _, r := range e.handedPeers {
		p := &e.peers[r]
		for n := p.rcvBase; n < p.rcvHanded; n++ {
			s := e.rslot(p, n)
			e.pool.put(s.buf)
			*s = recvSlot{}
		}
		p.rcvBase = p.rcvHanded
		p.handedListed = false
	}
	e.handedPeers = e.handedPeers[:0]
	clear(e.rd.Deliveries)
	e.rd.Deliveries = e.rd.Deliveries[:0]
}

// freeTx recycles a send buffer, unless handed-out Messages may still refer to it.
func (e *Engine) freeTx(b []byte) {
	if b == nil {
		return
	}
	if len(e.rd.Messages) > 0 {
		e.limbo = append(e.limbo, b)
		return
	}
	e.pool.put(b)
}

// bufPool recycles packet buffers in power-of-two size classes from 256 bytes,
// keeping at most limit per class.
type bufPool struct {
	classes [24][][]byte
	limit   int
}

const minBufShift = 8

func bufClass(n int) int {
	if n <= 1<<minBufShift {
		return 0
	}
	return bits.Len(uint(n-1)) - minBufShift
}

func (bp *bufPool) get(n int) []byte {
	c := bufClass(n)
	if c >= len(bp.classes) {
		return make([]byte, n)
	}
	if l := bp.classes[c]; len(l) > 0 {
		b := l[len(l)-1]
		l[len(l)-1] = nil
		bp.classes[c] = l[:len(l)-1]
		return b[:n]
	}
	return make([]byte, n, 1<<(c+minBufShift))
}

func (bp *bufPool) put(b []byte) {
	if b == nil {
		return
	}
	c := bufClass(cap(b))
	if c >= len(bp.classes) || cap(b) != 1<<(c+minBufShift) || len(bp.classes[c]) >= bp.limit {
		return
	}
	bp.classes[c] = append(bp.classes[c], b[:0])
}
