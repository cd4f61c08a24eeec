// Package handlers is the Active Messages handler table: registration of
// handler functions under small indices, the tokens handlers receive, and the
// dispatch rules of Generic Active Messages, SP AM and GASNet (GASNet-1 spec
// §"Active Message handlers"; GASNet-EX §"AM handler context"):
//
//   - handlers are registered before communication starts, identically on every rank;
//   - a handler runs only inside Poll, on the polling goroutine, and must not block
//     or poll;
//   - a request handler may reply at most once, only to the requester, and only
//     while it runs; a reply handler may not reply.
//
// Every violation is an error, never a panic: registering after the endpoint has
// started (ErrStarted), an unknown handler index arriving on the wire (the packet
// is dropped and counted; ErrUnknownHandler), a second reply (ErrReplied), a reply
// outside a handler or from a reply handler (ErrNotInHandler, ErrReplyFromReply).
//
// The table does not send anything itself: package am implements Replier and
// drives Dispatch from its poll loop.
package handlers

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/amgo-hpc/amgo/internal/wire"
)

// Index names a handler in the table. Valid client indices are 1..MaxClientIndex;
// 0 asks Register to pick the highest free client index (GASNet-EX rule).
type Index uint8

// MaxClientIndex is the largest index clients may register; indices above it are
// reserved for package am's own handlers (barrier and the like).
const MaxClientIndex Index = 239

// AnyArgs as Entry.NArgs accepts any argument count up to wire.MaxArgs.
const AnyArgs = -1

// Func is a handler. tok names the message being handled; args are its 64-bit
// arguments; payload is its data: for a medium request or reply, bytes in the
// receive buffer valid only until the handler returns (Token.Retain keeps them);
// for a store, the destination region in registered memory. args is valid only
// until the handler returns and is read-only: it may lie in the network's
// receive buffer.
type Func func(tok *Token, args []uint64, payload []byte)

// Entry is one registration.
type Entry struct {
	// Index is where the handler goes; 0 picks the highest free client index.
	Index Index
	// Name is for diagnostics.
	Name string
	// Fn runs on arrival.
	Fn Func
	// NArgs is the number of arguments the handler takes (0..16), or AnyArgs.
	// Messages with another count are dropped and counted at the receiver and
	// refused at the sender.
	NArgs int
}

// Errors of registration and dispatch; wrap them with detail.
var (
	ErrStarted        = errors.New("handlers: table is sealed: register handlers before communication starts")
	ErrIndexInUse     = errors.New("handlers: index already registered")
	ErrIndexReserved  = errors.New("handlers: index reserved for the AM layer")
	ErrTableFull      = errors.New("handlers: no free handler index")
	ErrBadEntry       = errors.New("handlers: invalid entry")
	ErrUnknownHandler = errors.New("handlers: no handler registered at index")
	ErrArgCount       = errors.New("handlers: wrong argument count for handler")
	ErrReplied        = errors.New("handlers: handler already replied")
	ErrNotInHandler   = errors.New("handlers: reply outside the handler that received the request")
	ErrReplyFromReply = errors.New("handlers: a reply handler cannot reply")
	ErrRetained       = errors.New("handlers: payload retained: the release answers the request")
	// ErrImmediate: the request being handled is an immediate request
	// (am.Endpoint.RequestImmediate), which reserved no room for a reply
	// and no space to retain its payload in.
	ErrImmediate = errors.New("handlers: an immediate request takes no reply and cannot be retained")
)

// Table maps indices to handlers. Register is safe for concurrent use; Lookup and
// Dispatch are lock-free once the table is sealed.
type Table struct {
	mu      sync.Mutex
	entries [256]Entry
	// nargs[i] has bit k set when the handler at index i takes k
	// arguments (all of 0..16 for AnyArgs; none without a handler): the
	// per-message checks in one load and test.
	nargs   [256]uint32
	sealed  atomic.Bool
	unknown atomic.Uint64
	badArgs atomic.Uint64
}

// Register adds e. It fails once the table is sealed, for a taken or reserved
// index, for a nil function, or for an argument count outside 0..16 (or AnyArgs).
// It returns the index used.
func (t *Table) Register(e Entry) (Index, error) {
	return t.register(e, false)
}

// RegisterReserved adds an entry at a reserved index (above MaxClientIndex); it is
// for package am's own handlers.
func (t *Table) RegisterReserved(e Entry) (Index, error) {
	if e.Index <= MaxClientIndex {
		return 0, fmt.Errorf("%w: %d is a client index", ErrBadEntry, e.Index)
	}
	return t.register(e, true)
}

func (t *Table) register(e Entry, reserved bool) (Index, error) {
	if e.Fn == nil {
		return 0, fmt.Errorf("%w: %q has no function", ErrBadEntry, e.Name)
	}
	if e.NArgs != AnyArgs && (e.NArgs < 0 || e.NArgs > wire.MaxArgs) {
		return 0, fmt.Errorf("%w: %q takes %d arguments (0..%d or AnyArgs)", ErrBadEntry, e.Name, e.NArgs, wire.MaxArgs)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.sealed.Load() {
		return 0, fmt.Errorf("%w (handler %q)", ErrStarted, e.Name)
	}
	if !reserved && e.Index > MaxClientIndex {
		return 0, fmt.Errorf("%w: %d (clients use 1..%d)", ErrIndexReserved, e.Index, MaxClientIndex)
	}
	if e.Index == 0 {
		for i := MaxClientIndex; i >= 1; i-- {
			if t.entries[i].Fn == nil {
				e.Index = i
				break
			}
		}
		if e.Index == 0 {
			return 0, fmt.Errorf("%w for %q", ErrTableFull, e.Name)
		}
	}
	if old := t.entries[e.Index]; old.Fn != nil {
		return 0, fmt.Errorf("%w: %d holds %q, cannot take %q", ErrIndexInUse, e.Index, old.Name, e.Name)
	}
	t.entries[e.Index] = e
	if e.NArgs == AnyArgs {
		t.nargs[e.Index] = 1<<(wire.MaxArgs+1) - 1
	} else {
		t.nargs[e.Index] = 1 << e.NArgs
	}
	return e.Index, nil
}

// Seal forbids further registration. The endpoint seals its table when
// communication starts.
func (t *Table) Seal() {
	t.mu.Lock()
	t.sealed.Store(true)
	t.mu.Unlock()
}

// Sealed reports whether communication has started.
func (t *Table) Sealed() bool { return t.sealed.Load() }

// Lookup returns the entry at idx. ErrUnknownHandler if none is registered there.
func (t *Table) Lookup(idx Index) (*Entry, error) {
	e := &t.entries[idx]
	if e.Fn == nil {
		return nil, fmt.Errorf("%w: %d", ErrUnknownHandler, idx)
	}
	return e, nil
}

// CheckSend validates a message the local rank is about to send against the
// local table: tables are identical on every rank, so a wrong index or argument
// count is caught at the sender with an error instead of a drop at the receiver.
func (t *Table) CheckSend(idx Index, nargs int) error {
	if uint(nargs) <= wire.MaxArgs && t.nargs[idx]>>nargs&1 != 0 {
		return nil // the common case, inlined into the caller
	}
	return t.checkSendSlow(idx, nargs)
}

// checkSendSlow is CheckSend's error path.
func (t *Table) checkSendSlow(idx Index, nargs int) error {
	e, err := t.Lookup(idx)
	if err != nil {
		return err
	}
	if nargs > wire.MaxArgs || (e.NArgs != AnyArgs && e.NArgs != nargs) {
		return fmt.Errorf("%w: %q takes %d, message has %d", ErrArgCount, e.Name, e.NArgs, nargs)
	}
	return nil
}

// Dispatch runs the handler at idx for a message described by tok (which the
// caller has filled with Begin). Unknown indices and wrong argument counts are
// counted and returned as errors; the handler does not run.
//
// The token is active while the handler runs. A handler that panics leaves
// it active until the next Begin; the panic ends the poll that ran it.
func (t *Table) Dispatch(tok *Token, idx Index, args []uint64, payload []byte) error {
	fn := t.Runnable(idx, len(args))
	if fn == nil {
		return t.refuse(tok, &t.entries[idx], idx, len(args))
	}
	tok.Run(fn, args, payload)
	return nil
}

// Runnable returns the handler that Dispatch would run for a message to idx
// with nargs arguments, without running it: nil when Dispatch would refuse
// the message (no handler at idx, or another argument count), and the
// caller then calls Dispatch, which counts and reports why. With Run it is
// Dispatch in two inlined parts, for a dispatcher on a packet's path
// (package am) that would otherwise pay Dispatch's call on every message.
func (t *Table) Runnable(idx Index, nargs int) Func {
	if uint(nargs) > wire.MaxArgs || t.nargs[idx]>>nargs&1 == 0 {
		return nil
	}
	return t.entries[idx].Fn
}

// refuse counts and reports a message Dispatch does not run.
func (t *Table) refuse(tok *Token, e *Entry, idx Index, nargs int) error {
	if e.Fn == nil {
		t.unknown.Add(1)
		return fmt.Errorf("%w: %d (from rank %d)", ErrUnknownHandler, idx, tok.src)
	}
	t.badArgs.Add(1)
	return fmt.Errorf("%w: %q takes %d, message from rank %d has %d", ErrArgCount, e.Name, e.NArgs, tok.src, nargs)
}

// Unknown is the number of messages dropped for an unregistered handler index.
func (t *Table) Unknown() uint64 { return t.unknown.Load() }

// BadArgs is the number of messages dropped for a wrong argument count.
func (t *Table) BadArgs() uint64 { return t.badArgs.Load() }

// Replier sends replies and retains payloads on behalf of tokens; package am
// implements it.
type Replier interface {
	// Reply sends a reply for tok to its source: handler h, tok.ReplyArgs() as
	// arguments, payload (nil for a short reply).
	Reply(tok *Token, h Index, payload []byte, medium bool) error
	// Retain keeps the payload of tok's request beyond the handler and returns it.
	Retain(tok *Token) ([]byte, Retained, error)
}

// Retained names a request payload kept in the receive buffer after its
// handler returned; releasing it (am.Endpoint.Release) answers the request and
// frees the sender's space.
type Retained struct {
	Src int    // rank that sent the request
	Off uint32 // offset of the space in the per-peer receive buffer, bytes
	Len uint32 // bytes reserved there
}

// Token names the message a handler is running for (GASNet gex_Token_t). The
// endpoint reuses one token per poll, so a token must not be kept after the
// handler returns; calls on it then fail with ErrNotInHandler.
type Token struct {
	src       int
	isRequest bool
	immediate bool
	active    bool
	replied   bool
	retained  bool
	r         Replier
	nargs     int
	args      [wire.MaxArgs]uint64

	pb, replyPB       uint64 // piggybacked values: arrived, and for the reply
	hasPB, hasReplyPB bool

	// Reservation of the request being answered, for package am.
	ReqOff, ReqLen uint32
	// MaxReply is the largest reply this request has room for (encoded header,
	// arguments and payload), in bytes.
	MaxReply int
}

// Begin prepares tok for a new message from src; package am calls it before Dispatch.
func (tok *Token) Begin(r Replier, src int, isRequest bool) {
	tok.r = r
	tok.src = src
	tok.isRequest = isRequest
	tok.immediate = false
	tok.replied = false
	tok.retained = false
	tok.active = false
	tok.hasPB, tok.hasReplyPB = false, false
}

// BeginImmediate prepares tok for an immediate request from src: Reply and
// Retain return ErrImmediate. Package am calls it before Dispatch.
func (tok *Token) BeginImmediate(r Replier, src int) {
	tok.Begin(r, src, true)
	tok.immediate = true
	tok.ReqOff, tok.ReqLen, tok.MaxReply = 0, 0, 0
}

// Run runs fn, a handler that Table.Runnable returned, for the message tok
// describes (filled with Begin or BeginImmediate), with tok active while fn
// runs, as Dispatch does.
func (tok *Token) Run(fn Func, args []uint64, payload []byte) {
	tok.active = true
	fn(tok, args, payload)
	tok.active = false
}

// RunFrom runs fn, a handler that Table.Runnable returned, for an immediate
// request from src, on a token that BeginImmediate prepared and that carries
// only immediate requests since: a handler can change nothing else in an
// immediate request's token (it can neither reply nor retain), so only the
// source changes per message. It is BeginImmediate and Run in one inlined
// step, for a dispatcher on a packet's path that keeps a token for immediate
// requests apart.
func (tok *Token) RunFrom(src int, fn Func, args []uint64, payload []byte) {
	tok.src = src
	tok.active = true
	fn(tok, args, payload)
	tok.active = false
}

// IsImmediate reports whether the message is an immediate request: its
// handler can neither reply nor retain it.
func (tok *Token) IsImmediate() bool { return tok.immediate }

// SetPiggyback records the value piggybacked on the message being handled;
// package am calls it after Begin.
func (tok *Token) SetPiggyback(v uint64) { tok.pb, tok.hasPB = v, true }

// Piggyback returns the tool value the sender attached to this message, if any
// (one value per message, carried in its header).
func (tok *Token) Piggyback() (uint64, bool) {
	if !tok.hasPB {
		return 0, false
	}
	return tok.pb, true
}

// ReplyPiggyback returns the value to piggyback on the reply being sent, valid
// during Replier.Reply.
func (tok *Token) ReplyPiggyback() (uint64, bool) { return tok.replyPB, tok.hasReplyPB }

// Piggyback is a tool value that a message may carry in its header: one
// value per message, in the message's own packet, never an extra message
// (docs/tools.md). The zero value carries none.
type Piggyback struct {
	Value uint64
	Set   bool
}

// ReplyShortWith is ReplyShort with a tool value piggybacked on the reply when
// pb is set (the receiver's updated delay of the overhead-compensation
// handshake); with the zero Piggyback it is ReplyShort.
func (tok *Token) ReplyShortWith(h Index, pb Piggyback, args ...uint64) error {
	tok.replyPB, tok.hasReplyPB = pb.Value, pb.Set
	err := tok.reply(h, nil, false, args)
	tok.hasReplyPB = false
	return err
}

// Source is the rank that sent the message.
func (tok *Token) Source() int { return tok.src }

// IsRequest reports whether the message is a request (true) or a reply.
func (tok *Token) IsRequest() bool { return tok.isRequest }

// Replied reports whether the handler has replied.
func (tok *Token) Replied() bool { return tok.replied }

// IsRetained reports whether the handler retained the payload.
func (tok *Token) IsRetained() bool { return tok.retained }

// ReplyArgs returns the arguments of the reply being sent, valid during Replier.Reply.
func (tok *Token) ReplyArgs() []uint64 { return tok.args[:tok.nargs] }

// MaxReplyMedium is the largest payload, in bytes, that a medium reply with
// nargs arguments can carry for this request (gex_Token_MaxReplyMedium).
func (tok *Token) MaxReplyMedium(nargs int) int {
	n := tok.MaxReply - wire.HeaderLen - wire.PiggybackExtLen - 8*nargs // room for a piggybacked value too
	if n < 0 {
		return 0
	}
	return n
}

func (tok *Token) canReply() error {
	switch {
	case !tok.active:
		return ErrNotInHandler
	case !tok.isRequest:
		return ErrReplyFromReply
	case tok.replied:
		return fmt.Errorf("%w (request from rank %d)", ErrReplied, tok.src)
	case tok.retained:
		return ErrRetained
	case tok.immediate:
		return fmt.Errorf("%w (request from rank %d)", ErrImmediate, tok.src)
	}
	return nil
}

// ReplyShort answers the request with a short reply: handler h at the requester
// runs with args (at most 16). Errors: ErrNotInHandler, ErrReplyFromReply,
// ErrReplied, ErrRetained, ErrImmediate, and the sender's errors (unknown
// handler, argument count).
func (tok *Token) ReplyShort(h Index, args ...uint64) error {
	return tok.reply(h, nil, false, args)
}

// ReplyMedium answers the request with a medium reply: payload (at most
// MaxReplyMedium(len(args)) bytes) is delivered to handler h at the requester.
// Errors as ReplyShort, plus a size error when payload does not fit.
func (tok *Token) ReplyMedium(h Index, payload []byte, args ...uint64) error {
	return tok.reply(h, payload, true, args)
}

func (tok *Token) reply(h Index, payload []byte, medium bool, args []uint64) error {
	if err := tok.canReply(); err != nil {
		return err
	}
	if len(args) > wire.MaxArgs {
		return fmt.Errorf("%w: %d arguments (max %d)", ErrArgCount, len(args), wire.MaxArgs)
	}
	tok.nargs = copy(tok.args[:], args)
	if err := tok.r.Reply(tok, h, payload, medium); err != nil {
		return err
	}
	tok.replied = true
	return nil
}

// Retain keeps the request's payload in the receive buffer after the handler
// returns (the buffered protocol's unexpected message that keeps its space until
// its receive comes), and returns
// it together with the handle that releases it. The request is then answered
// by the release, not by a reply. Errors: ErrNotInHandler, ErrReplyFromReply,
// ErrReplied, ErrRetained (twice), ErrImmediate.
func (tok *Token) Retain() ([]byte, Retained, error) {
	if err := tok.canReply(); err != nil {
		return nil, Retained{}, err
	}
	p, r, err := tok.r.Retain(tok)
	if err != nil {
		return nil, Retained{}, err
	}
	tok.retained = true
	return p, r, nil
}
