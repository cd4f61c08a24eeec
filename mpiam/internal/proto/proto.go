// Package proto is the codec of the messages MPI sends over Active Messages:
// every message's arguments (64-bit AM handler arguments) are written and read
// here, and nowhere else, in the manner of quic-go's wire frames. A message's
// payload (eager data, stored rendezvous data) travels as the AM payload and
// is not this package's.
//
// Each message type has an Append method, which appends its arguments to a
// slice, and a Parse function, which reads them back and rejects what no
// correct sender writes (a wrong argument count, unknown flag bits, a size or
// range that does not fit) with an error wrapping ErrMalformed. Decoding
// allocates nothing. docs/mpi.md, "Messages on the wire", lays the arguments
// out field by field.
package proto

import (
	"errors"
	"fmt"
	"math"

	"github.com/amgo-hpc/amgo/mpiam/internal/match"
)

// ErrMalformed is wrapped by every error of a Parse function.
var ErrMalformed = errors.New("proto: malformed MPI message")

// Message flags, in bits 30 and 31 of an envelope's first argument (above
// the source rank).
const (
	FlagSync  = 1 << iota // synchronous send: the sender waits for the match
	FlagReady             // ready send: the receive must already be posted

	knownFlags = FlagSync | FlagReady
)

// MaxSource is the largest source rank an envelope carries: the rank takes
// bits 0-29 of the first argument, the flags bits 30-31, so a communicator
// holds at most 2^30 ranks.
const MaxSource = 1<<30 - 1

// flagShift is the position of the flags in an envelope's first argument.
const flagShift = 30

// CTSMore, in a clear-to-send's flags: another message (a pulled notice or a
// further clear-to-send) follows for the same send; without it, this
// clear-to-send is the receiver's final word.
const CTSMore = 1

// CTSStage, in a clear-to-send's flags: the receiver's staging buffer is a
// file that the two ranks, on one node, can both map (a shared stage), and
// the sender may pack the part straight into it and then send the data
// notice instead of storing. The rest of the flags say where: bits 4-15 the
// part's offset in the file in 4 KiB units, bits 16-31 the file's
// generation, bits 32-63 the receiver's process id (StageFlags, CTS.Stage).
// Addr names the same memory as a registered segment, for a sender that
// cannot map the file.
const CTSStage = 2

// CTSPiece, in a clear-to-send's flags: the receiver stages the data and
// asks for it a piece at a time, up to two pieces at once; the sender
// answers each with a piece notice (Piece: the receiver's request id and
// the piece's offset in the message), which names the piece whatever order
// the clear-to-sends arrived in.
const CTSPiece = 4

// StageUnit is the unit of a shared stage's offset in a clear-to-send, in
// bytes.
const StageUnit = 4096

// StageFlags is the CTSStage flag with its fields: the part at byte off
// (a multiple of StageUnit, below 4096 units) of generation gen of process
// pid's stage.
func StageFlags(off int, gen, pid uint32) uint64 {
	return CTSStage | uint64(off/StageUnit)<<4 | uint64(gen&0xffff)<<16 | uint64(pid)<<32
}

// Stage reads a clear-to-send's shared stage: the part's offset in bytes,
// the file's generation and the receiver's process id; ok is false without
// CTSStage.
func (m CTS) Stage() (off int, gen, pid uint32, ok bool) {
	if m.Flags&CTSStage == 0 {
		return 0, 0, 0, false
	}
	return int(m.Flags>>4&0xfff) * StageUnit, uint32(m.Flags >> 16 & 0xffff), uint32(m.Flags >> 32), true
}

// Argument counts of the messages.
const (
	EnvelopeArgs = 2 // eager: envelope only
	RTSArgs      = 5
	CTSArgs      = 6
	IDArgs       = 1 // data, fin and pulled notices: one request id
	PieceArgs    = 2 // piece notice: request id, offset
	BarrierArgs  = 2
	ThrottleArgs = 2
	// AllreduceAMArgs: a small allreduce's message over active messages.
	AllreduceAMArgs = 2
)

// Envelope is what a point-to-point message is matched on, plus its mode
// flags: communicator context id (even for point-to-point, odd for a
// collective's traffic), the sender's rank in the communicator, the tag, the
// sender's sequence number on (context, destination), and the flags. The
// matched fields are the matching engine's own envelope, embedded, so that
// the receive path hands them on without a copy: a struct of at most four
// fields at each level stays in registers, where a flat one of five lives
// in memory and is copied with 16-byte moves that stall on the 4-byte
// stores that built it.
//
// Arguments: a0 = context<<32 | flags<<30 | source (0 to MaxSource),
// a1 = seq<<32 | tag (as uint32): two words, so that an 8-byte eager
// message with its immediate request's header fits a 32-byte ring record
// (docs/wire.md).
type Envelope struct {
	match.Envelope
	Flags uint64
}

// Args returns the envelope's two arguments. The source must be between 0
// and MaxSource and the flags known ones (the sender's to ensure).
func (e Envelope) Args() (a0, a1 uint64) {
	return uint64(e.Context)<<32 | e.Flags<<flagShift | uint64(uint32(e.Source)), uint64(uint32(e.Tag)) | uint64(e.Seq)<<32
}

// Append appends the envelope's arguments to b.
func (e Envelope) Append(b []uint64) []uint64 {
	a0, a1 := e.Args()
	return append(b, a0, a1)
}

// ParseEnvelope reads an envelope from the first two arguments of a. The
// source is a rank (bits 0-29 of a0) and the flags (bits 30-31) known ones,
// which the layout guarantees; whether the rank and context exist is the
// receiver's to check.
func ParseEnvelope(a []uint64) (Envelope, error) {
	if e, ok := EnvelopeOf(a); ok {
		return e, nil
	}
	return Envelope{}, envelopeErr(a)
}

// EnvelopeOf is ParseEnvelope without the error, small enough to inline on
// an arrival's path: false when ParseEnvelope would refuse a (it says why).
func EnvelopeOf(a []uint64) (Envelope, bool) {
	if len(a) < EnvelopeArgs {
		return Envelope{}, false
	}
	return Envelope{match.Envelope{Context: uint32(a[0] >> 32), Source: int32(uint32(a[0]) & MaxSource), Tag: int32(uint32(a[1])), Seq: uint32(a[1] >> 32)}, a[0] >> flagShift & knownFlags}, true
}

// envelopeErr says why ParseEnvelope refused a.
func envelopeErr(a []uint64) error {
	return fmt.Errorf("%w: envelope of %d arguments, want %d", ErrMalformed, len(a), EnvelopeArgs)
}

// RTS is a rendezvous request-to-send: the envelope, the message size in
// bytes, the sender's request id, and the send buffer's address offered for
// the receiver to read with a single copy (0: none).
type RTS struct {
	Env    Envelope
	Size   uint64
	SendID uint64
	Addr   uint64
}

// Append appends the request-to-send's five arguments to b.
func (m *RTS) Append(b []uint64) []uint64 {
	return append(m.Env.Append(b), m.Size, m.SendID, m.Addr)
}

// ParseRTS reads a request-to-send. The size must fit an int.
func ParseRTS(a []uint64) (RTS, error) {
	if len(a) != RTSArgs {
		return RTS{}, fmt.Errorf("%w: request-to-send of %d arguments, want %d", ErrMalformed, len(a), RTSArgs)
	}
	env, err := ParseEnvelope(a)
	if err != nil {
		return RTS{}, err
	}
	m := RTS{Env: env, Size: a[2], SendID: a[3], Addr: a[4]}
	if m.Size > math.MaxInt {
		return RTS{}, fmt.Errorf("%w: request-to-send of %d bytes", ErrMalformed, m.Size)
	}
	return m, nil
}

// CTS is a clear-to-send: which send (the sender's request id), where to
// store which part of it (address, offset in the message, bytes), the
// receiver's request id for the store's handler, and flags (CTSMore,
// CTSPiece, CTSStage and its fields).
type CTS struct {
	SendID, Addr, Off, N, RecvID, Flags uint64
}

// Append appends the clear-to-send's six arguments to b.
func (m *CTS) Append(b []uint64) []uint64 {
	return append(b, m.SendID, m.Addr, m.Off, m.N, m.RecvID, m.Flags)
}

// ParseCTS reads a clear-to-send. The part [Off, Off+N) must not overflow and
// the flags must be known; whether it lies inside the send is the sender's to
// check.
func ParseCTS(a []uint64) (CTS, error) {
	if len(a) != CTSArgs {
		return CTS{}, fmt.Errorf("%w: clear-to-send of %d arguments, want %d", ErrMalformed, len(a), CTSArgs)
	}
	m := CTS{SendID: a[0], Addr: a[1], Off: a[2], N: a[3], RecvID: a[4], Flags: a[5]}
	switch {
	case m.Flags&CTSStage == 0 && m.Flags&^(CTSMore|CTSPiece) != 0, m.Flags&0x8 != 0:
		return CTS{}, fmt.Errorf("%w: clear-to-send with unknown flags %#x", ErrMalformed, m.Flags)
	case m.Off > math.MaxInt || m.N > math.MaxInt-m.Off:
		return CTS{}, fmt.Errorf("%w: clear-to-send for [%d,+%d)", ErrMalformed, m.Off, m.N)
	}
	return m, nil
}

// Piece is a piece notice: the receiver's request id and the offset in the
// message, in packed bytes, of the piece that has landed.
type Piece struct {
	RecvID, Off uint64
}

// Append appends the notice's two arguments to b.
func (m *Piece) Append(b []uint64) []uint64 { return append(b, m.RecvID, m.Off) }

// ParsePiece reads a piece notice.
func ParsePiece(a []uint64) (Piece, error) {
	if len(a) != PieceArgs {
		return Piece{}, fmt.Errorf("%w: piece notice of %d arguments, want %d", ErrMalformed, len(a), PieceArgs)
	}
	return Piece{RecvID: a[0], Off: a[1]}, nil
}

// ParseID reads the request id of a data, fin or pulled notice.
func ParseID(a []uint64) (uint64, error) {
	if len(a) != IDArgs {
		return 0, fmt.Errorf("%w: notice of %d arguments, want %d", ErrMalformed, len(a), IDArgs)
	}
	return a[0], nil
}

// MaxBarrierRounds bounds a dissemination barrier's rounds (log2 of the
// largest communicator, with room to spare).
const MaxBarrierRounds = 40

// Barrier is one message of a dissemination barrier: the communicator's
// context id (even) and the round.
type Barrier struct {
	Context uint32
	Round   uint32
}

// Append appends the barrier message's two arguments to b.
func (m *Barrier) Append(b []uint64) []uint64 {
	return append(b, uint64(m.Context), uint64(m.Round))
}

// ParseBarrier reads a barrier message: an even context id and a round below
// MaxBarrierRounds.
func ParseBarrier(a []uint64) (Barrier, error) {
	if len(a) != BarrierArgs {
		return Barrier{}, fmt.Errorf("%w: barrier message of %d arguments, want %d", ErrMalformed, len(a), BarrierArgs)
	}
	if a[0] > math.MaxUint32 || a[0]&1 != 0 || a[1] >= MaxBarrierRounds {
		return Barrier{}, fmt.Errorf("%w: barrier message for context %d, round %d", ErrMalformed, a[0], a[1])
	}
	return Barrier{Context: uint32(a[0]), Round: uint32(a[1])}, nil
}

// MaxAllreduceSteps bounds the steps of a small allreduce over active
// messages: the fold-in (step 0), a doubling step per bit of the size, the
// fold-out.
const MaxAllreduceSteps = MaxBarrierRounds + 2

// AllreduceAM is one message of a small allreduce over active messages (a
// medium request whose payload is the sender's partial result): the
// communicator's context id (even), the step, and the call's number among
// the communicator's allreduces over active messages.
//
// Arguments: a0 = step<<32 | context, a1 = call.
type AllreduceAM struct {
	Context uint32
	Step    uint32
	Call    uint64
}

// Args returns the message's two arguments.
func (m AllreduceAM) Args() (a0, a1 uint64) {
	return uint64(m.Step)<<32 | uint64(m.Context), m.Call
}

// ParseAllreduceAM reads an allreduce message with a payload of n bytes: an
// even context id, a step below MaxAllreduceSteps and at most max bytes.
func ParseAllreduceAM(a []uint64, n, max int) (AllreduceAM, error) {
	if len(a) != AllreduceAMArgs {
		return AllreduceAM{}, fmt.Errorf("%w: allreduce message of %d arguments, want %d", ErrMalformed, len(a), AllreduceAMArgs)
	}
	m := AllreduceAM{Context: uint32(a[0]), Step: uint32(a[0] >> 32), Call: a[1]}
	if m.Context&1 != 0 || m.Step >= MaxAllreduceSteps || n > max {
		return AllreduceAM{}, fmt.Errorf("%w: allreduce message for context %d, step %d, %d bytes (at most %d)", ErrMalformed, m.Context, m.Step, n, max)
	}
	return m, nil
}

// Throttle is a receiver's word to a sender: stop sending it eagerly (On) or
// resume, for the episode Epoch.
type Throttle struct {
	On    bool
	Epoch uint64
}

// Append appends the throttle message's two arguments to b.
func (m *Throttle) Append(b []uint64) []uint64 {
	var on uint64
	if m.On {
		on = 1
	}
	return append(b, on, m.Epoch)
}

// ParseThrottle reads a throttle message: on is 0 or 1.
func ParseThrottle(a []uint64) (Throttle, error) {
	if len(a) != ThrottleArgs || a[0] > 1 {
		return Throttle{}, fmt.Errorf("%w: throttle message %v", ErrMalformed, a)
	}
	return Throttle{On: a[0] == 1, Epoch: a[1]}, nil
}
