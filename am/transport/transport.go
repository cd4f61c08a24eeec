// Package transport defines the small interface that every AM-like network
// implements for amgo, in the spirit of a GASNet conduit's core API: send a
// packet, poll for arrived packets, report capabilities, optionally put data
// straight into registered remote memory, and sleep until traffic arrives.
// Everything else (handlers, credits, ordering and reliability where a network
// lacks them) lives above it in package am. A transport imports nothing of am.
//
// Each network lives in its own package below this one (loop, shm, ...) and
// registers a Factory under its name, so that job.Open can pick one by name.
// docs/porting.md walks through a port; package transporttest is the
// conformance suite every transport runs.
package transport

import (
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"
)

// Caps describes what a network guarantees and offers.
type Caps struct {
	// Name is the network's registered name ("loop", "shm", ...).
	Name string
	// Ordered: packets from one peer arrive in the order they were sent.
	Ordered bool
	// Reliable: every packet sent arrives exactly once.
	Reliable bool
	// MaxPacket is the largest packet (encoded header, arguments and payload) one
	// Send accepts, in bytes.
	MaxPacket int
	// Put: the transport implements Putter (single-copy writes into registered
	// memory of a peer). A Putter may still refuse a particular peer at run time.
	Put bool
	// PutMin is the smallest store, in bytes, for which Put beats sending the data
	// in packets (a system call costs more than copying a few KiB twice); 0 means
	// Put is always the better path.
	PutMin int
	// Get: the transport implements Getter (single-copy reads from memory a peer
	// named). A Getter may still refuse a particular peer at run time. PutMin
	// is also the smallest transfer for which a Get beats packets.
	Get bool
	// Wakeup: Wait sleeps until traffic arrives rather than for the whole timeout.
	Wakeup bool
	// PutSend: the transport implements PutSender (put data travels in the
	// packet stream, and a packet can leave with its last piece).
	PutSend bool
	// Fill: the transport implements FillSender (a payload written in
	// place in the network's buffer).
	Fill bool
	// QueueBytes is the most packet bytes the network holds toward one
	// peer (a shared-memory ring's data area), stated by a network that
	// carries packets as opaque bytes in a bounded queue; 0 when it does
	// not say (a socket's kernel buffers grow, a layer such as am's
	// reliability layer edits the packets' headers). Package am sends
	// immediate requests, which reserve no room at the receiver, only over
	// a network that states it: the queue is then what bounds them.
	QueueBytes int
	// BufferBytes is the per-peer receive buffer, in bytes, that package am
	// keeps for the peers of this network unless its Config sets one for
	// every peer; 0: am's default (16 KiB). Its size bounds what a sender
	// has in flight to one peer and the largest medium request, and so the
	// MPI layer's eager limit towards peers without a single-copy read: a
	// network whose hop costs microseconds asks for more (tcp, udp).
	BufferBytes int
}

// Receiver takes arrived packets from Poll. An interface rather than a func so
// that a poll loop does not allocate a closure.
type Receiver interface {
	// Deliver handles one packet from rank src: the encoded header, its arguments
	// and the payload, contiguous. pkt is valid only until Deliver returns.
	Deliver(src int, pkt []byte)
}

// Transport is one rank's attachment to a network.
//
// Concurrency: Send calls for the same destination are serialized by the caller;
// Send calls for different destinations, Poll, and Wakeup-less Wait may run
// concurrently with each other. Poll is called by one goroutine at a time.
type Transport interface {
	// Rank is this process's rank in the job, 0..Size-1.
	Rank() int
	// Size is the number of ranks in the job.
	Size() int
	// Caps reports the network's guarantees.
	Caps() Caps
	// Send queues one packet for rank dst: hdr (an encoded wire header with its
	// arguments) followed by payload, together at most Caps().MaxPacket bytes.
	// Both slices may be reused as soon as Send returns. Send never blocks: it
	// returns ErrWouldBlock when the network cannot take the packet now; the
	// caller polls and tries again. Errors: ErrWouldBlock, ErrTooLarge, ErrPeer
	// (dst out of range or dead), ErrClosed.
	Send(dst int, hdr, payload []byte) error
	// Poll hands up to max arrived packets to r and returns how many it handed.
	// It never blocks. A packet that the network itself finds malformed is
	// dropped and counted, not returned as an error; errors are for a broken
	// network (ErrClosed, a dead peer).
	Poll(r Receiver, max int) (int, error)
	// Wait returns when traffic may have arrived or after about d, whichever
	// comes first; transports without Caps().Wakeup simply sleep briefly.
	// A spurious early return is allowed.
	Wait(d time.Duration) error
	// Close releases the transport's resources. Pending packets may be lost.
	Close() error
}

// Waker is implemented by transports whose Wait another goroutine can end
// early: Wake makes a Wait in progress return soon, or else the next Wait
// return at once (a wake is never lost). Package route sleeps on one network
// and has a waiter of each other network Wake it.
type Waker interface {
	Wake()
}

// Sleeper is implemented by transports whose Wait spins before it sleeps:
// Sleep is Wait without the spin, for a goroutine that watches the network
// on behalf of another (package route's waiters), beside which spinning
// would only take a processor from the ranks. Errors as Wait's.
type Sleeper interface {
	Sleep(d time.Duration) error
}

// Batcher is implemented by networks whose Send costs a system call that
// can carry a run of packets (xdp: one sendto transmits what its ring
// holds). Between Hold and the matching Flush, Send may keep packets in
// this process rather than hand each on at once; Flush hands on what is
// kept, and so does a Poll. Holds nest, and one goroutine's Hold may keep
// another's packets until that Flush. A caller holds only around a run of
// Sends it makes in one go (the fragments of one store), never across a
// return to code that may compute: a kept packet waits microseconds.
type Batcher interface {
	Hold()
	Flush() error
}

// PeerCapser is implemented by transports that reach different peers over
// different networks (package route): PeerCaps is what the network that
// reaches peer guarantees and offers. Caps is then what holds for every
// peer (MaxPacket the smallest, Put and Get when any peer has them).
type PeerCapser interface {
	PeerCaps(peer int) Caps
}

// Layouter is implemented by transports that know on which node each rank
// runs (package route's in-process jobs): Layout()[r] is rank r's node,
// numbered 0, 1, ... by each node's lowest rank.
type Layouter interface {
	Layout() []int
}

// Putter is implemented by transports with a single-copy path into memory that a
// peer has registered (shared memory: Cross Memory Attach; in-process: a copy).
type Putter interface {
	// Put copies data into rank dst's memory at address addr, which dst
	// registered. It returns when the data is in place. ErrPutUnsupported means
	// this peer cannot be reached this way (e.g. EPERM from process_vm_writev);
	// the caller falls back to sending the data in packets.
	Put(dst int, addr uintptr, data []byte) error
}

// PutSender is implemented by Putters whose put data travels in the same
// ordered stream as packets (tcp): PutSend is Put followed by Send(dst, hdr,
// payload), with the packet leaving together with the data's last piece (one
// system call rather than two), as am's store-done follows a rendezvous's
// data. The packet arrives after the data has landed. Errors as Put, plus
// Send's ErrTooLarge.
type PutSender interface {
	PutSend(dst int, addr uintptr, data, hdr, payload []byte) error
}

// Filler writes a packet's payload in place (FillSender).
type Filler interface {
	// Fill writes all of p, which it must not keep. It runs while the
	// network holds the packet's room and must not call into the network.
	Fill(p []byte)
}

// FillSender is implemented by networks that let the sender write a
// packet's payload straight into the network's own buffer (the record of a
// shared-memory ring): SendFill is Send with a payload of n bytes that
// f.Fill writes in place, saving the copy of a payload the caller would
// otherwise build first (packing non-contiguous data): GASNet-EX's
// negotiated-payload requests (gex_AM_PrepareRequestMedium). f is called
// at most once, and not at all when the packet cannot go (ErrWouldBlock,
// any error). Errors as Send's.
type FillSender interface {
	SendFill(dst int, hdr []byte, n int, f Filler) error
}

// Getter is implemented by transports with a single-copy path out of a peer's
// memory (shared memory: Cross Memory Attach; in-process: a copy): the
// receiver-driven half of a rendezvous, GASNet's RMA get.
type Getter interface {
	// Get copies len(buf) bytes at address addr in rank src's memory into buf
	// and returns when they are there. The memory must be what src named to
	// this rank and keeps alive and unchanged until told the get is done.
	// ErrGetUnsupported means this peer cannot be reached this way (e.g.
	// EPERM from process_vm_readv); the caller falls back to asking src to
	// send the data.
	Get(src int, addr uintptr, buf []byte) error
}

// PutResolver maps a destination named by a peer's Put (an address inside a
// segment this rank registered, and a length in bytes) to the local memory to
// write, or an error when the range is not registered.
type PutResolver func(addr uint64, n int) ([]byte, error)

// PutTargeter is implemented by transports whose single-copy put is completed
// by the receiving side (tcp reads the data off the socket straight into the
// destination): package am gives them the resolver of its segment table, so
// that every put is checked before a byte is written.
type PutTargeter interface {
	SetPutResolver(r PutResolver)
}

// Errors shared by every transport; wrap them with detail.
var (
	ErrWouldBlock     = errors.New("transport: send would block")
	ErrTooLarge       = errors.New("transport: packet larger than the network's maximum")
	ErrPeer           = errors.New("transport: no such peer")
	ErrClosed         = errors.New("transport: closed")
	ErrPutUnsupported = errors.New("transport: single-copy put not available for this peer")
	ErrGetUnsupported = errors.New("transport: single-copy get not available for this peer")
	// ErrFillUnsupported: the network that reaches this peer cannot take a
	// payload written in place (FillSender); the caller builds it and sends.
	ErrFillUnsupported = errors.New("transport: payload in place not available for this peer")
)

// PeerError is how a transport reports a peer it cannot reach: a rank out of
// the job's range, a peer that closed, or one that failed (a process that
// exited without closing, a connection that broke, nothing acknowledged for
// too long). Every error about a peer that Send, Put, Get or Poll returns is a
// *PeerError (it matches ErrPeer), so that package am learns which rank failed
// from the error's type, never from its text.
type PeerError struct {
	Rank int   // the peer's rank (as named by the caller, for one out of range)
	Err  error // what happened, worded by the transport
}

// PeerErrorf returns a *PeerError for rank, its text formatted as by
// fmt.Errorf (%w wraps a cause).
func PeerErrorf(rank int, format string, args ...any) error {
	return &PeerError{Rank: rank, Err: fmt.Errorf(format, args...)}
}

// Error returns the transport's words.
func (e *PeerError) Error() string { return e.Err.Error() }

// Unwrap returns the transport's error, for errors.Is and errors.As.
func (e *PeerError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrPeer) true.
func (e *PeerError) Is(target error) bool { return target == ErrPeer }

// Bootstrap is what a transport needs from the launcher to find its peers: the
// job's shape and a key-value space with a fence, as PMI-1 provides
// (put, barrier, get). Keys are global to the job: prefix them with the rank.
type Bootstrap interface {
	// Rank is this process's rank, 0..Size-1.
	Rank() int
	// Size is the number of ranks in the job.
	Size() int
	// JobID names the job uniquely on this host (PMI's kvsname).
	JobID() string
	// Put publishes key=value to every rank (visible after the next Fence).
	Put(key, value string) error
	// Fence is a barrier over all ranks; Puts before it are visible to Gets after it.
	Fence() error
	// Get reads a value that some rank Put before a Fence.
	Get(key string) (string, error)
}

// Factory opens the transport of one rank over a bootstrap. opts are the
// transport's own settings as key=value strings (from AMGO_* environment variables
// or configuration); unknown keys are ignored.
type Factory func(b Bootstrap, opts map[string]string) (Transport, error)

var (
	regMu     sync.Mutex
	factories = map[string]Factory{}
)

// Register makes a network available to Open under name. It is called from the
// network package's init; registering one name twice panics (a programming error
// at init time, as with database/sql.Register).
func Register(name string, f Factory) {
	regMu.Lock()
	defer regMu.Unlock()
	if _, dup := factories[name]; dup {
		panic("transport: Register called twice for " + name)
	}
	factories[name] = f
}

// Names lists the registered networks, sorted.
func Names() []string {
	regMu.Lock()
	defer regMu.Unlock()
	var ns []string
	for n := range factories {
		ns = append(ns, n)
	}
	sort.Strings(ns)
	return ns
}

// Open opens the network registered under name for this rank.
func Open(name string, b Bootstrap, opts map[string]string) (Transport, error) {
	regMu.Lock()
	f, ok := factories[name]
	regMu.Unlock()
	if !ok {
		return nil, fmt.Errorf("transport: unknown network %q (have %v)", name, Names())
	}
	return f(b, opts)
}
