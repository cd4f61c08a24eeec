package handlers

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

// recorder is a Replier that records what tokens ask for.
type recorder struct {
	replies []Index
	args    [][]uint64
	fail    error
}

func (r *recorder) Reply(tok *Token, h Index, payload []byte, medium bool) error {
	if r.fail != nil {
		return r.fail
	}
	r.replies = append(r.replies, h)
	r.args = append(r.args, append([]uint64(nil), tok.ReplyArgs()...))
	return nil
}

func (r *recorder) Retain(tok *Token) ([]byte, Retained, error) {
	return []byte("kept"), Retained{Src: tok.Source(), Off: tok.ReqOff, Len: tok.ReqLen}, nil
}

func nop(*Token, []uint64, []byte) {}

func TestRegisterRules(t *testing.T) {
	var tb Table
	idx, err := tb.Register(Entry{Index: 5, Name: "a", Fn: nop, NArgs: 2})
	require.NoError(t, err)
	require.Equal(t, Index(5), idx)
	_, err = tb.Register(Entry{Index: 5, Name: "b", Fn: nop})
	require.ErrorIs(t, err, ErrIndexInUse)
	_, err = tb.Register(Entry{Index: 240, Name: "c", Fn: nop})
	require.ErrorIs(t, err, ErrIndexReserved)
	_, err = tb.Register(Entry{Index: 6, Name: "d"})
	require.ErrorIs(t, err, ErrBadEntry)
	_, err = tb.Register(Entry{Index: 6, Name: "e", Fn: nop, NArgs: 17})
	require.ErrorIs(t, err, ErrBadEntry)
	// Index 0 takes the highest free client index (GASNet-EX rule).
	idx, err = tb.Register(Entry{Name: "auto", Fn: nop, NArgs: AnyArgs})
	require.NoError(t, err)
	require.Equal(t, MaxClientIndex, idx)
	_, err = tb.RegisterReserved(Entry{Index: 250, Name: "internal", Fn: nop})
	require.NoError(t, err)
	_, err = tb.RegisterReserved(Entry{Index: 10, Name: "not reserved", Fn: nop})
	require.ErrorIs(t, err, ErrBadEntry)
	tb.Seal()
	require.True(t, tb.Sealed())
	_, err = tb.Register(Entry{Index: 7, Name: "late", Fn: nop})
	require.ErrorIs(t, err, ErrStarted)
}

func TestTableFull(t *testing.T) {
	var tb Table
	for i := 1; i <= int(MaxClientIndex); i++ {
		_, err := tb.Register(Entry{Name: "x", Fn: nop})
		require.NoError(t, err)
	}
	_, err := tb.Register(Entry{Name: "one too many", Fn: nop})
	require.ErrorIs(t, err, ErrTableFull)
}

func TestDispatchCountsUnknownAndBadArgs(t *testing.T) {
	var tb Table
	ran := 0
	_, _ = tb.Register(Entry{Index: 1, Name: "two", Fn: func(*Token, []uint64, []byte) { ran++ }, NArgs: 2})
	var tok Token
	tok.Begin(&recorder{}, 3, true)
	require.ErrorIs(t, tb.Dispatch(&tok, 9, nil, nil), ErrUnknownHandler)
	require.ErrorIs(t, tb.Dispatch(&tok, 1, []uint64{1}, nil), ErrArgCount)
	require.NoError(t, tb.Dispatch(&tok, 1, []uint64{1, 2}, nil))
	require.Equal(t, 1, ran)
	require.EqualValues(t, 1, tb.Unknown())
	require.EqualValues(t, 1, tb.BadArgs())
	require.ErrorIs(t, tb.CheckSend(1, 3), ErrArgCount)
	require.ErrorIs(t, tb.CheckSend(2, 0), ErrUnknownHandler)
	require.NoError(t, tb.CheckSend(1, 2))
}

// TestRunnableIsDispatchInTwoParts checks that Runnable refuses what
// Dispatch refuses, and that Run keeps the token active only while the
// handler runs, as Dispatch does.
func TestRunnableIsDispatchInTwoParts(t *testing.T) {
	var tb Table
	var activeInside []bool
	var tok Token
	_, _ = tb.Register(Entry{Index: 1, Name: "two", NArgs: 2, Fn: func(tk *Token, _ []uint64, _ []byte) {
		activeInside = append(activeInside, tk.active)
	}})
	_, _ = tb.Register(Entry{Index: 2, Name: "any", NArgs: AnyArgs, Fn: func(*Token, []uint64, []byte) {}})
	require.Nil(t, tb.Runnable(9, 0), "no handler")
	require.Nil(t, tb.Runnable(1, 1), "wrong argument count")
	require.NotNil(t, tb.Runnable(2, 5))
	fn := tb.Runnable(1, 2)
	require.NotNil(t, fn)
	tok.Begin(&recorder{}, 3, true)
	tok.Run(fn, []uint64{1, 2}, nil)
	require.Equal(t, []bool{true}, activeInside)
	require.False(t, tok.active, "inactive once the handler returned")
	require.Zero(t, tb.Unknown()+tb.BadArgs(), "Runnable counts nothing: Dispatch does, when called for a refused message")
}

func TestReplyAtMostOnceAndOnlyInsideTheHandler(t *testing.T) {
	var tb Table
	rec := &recorder{}
	var kept *Token
	var errs []error
	_, _ = tb.Register(Entry{Index: 1, Name: "req", NArgs: AnyArgs, Fn: func(tok *Token, a []uint64, _ []byte) {
		errs = append(errs, tok.ReplyShort(2, 7, 8), tok.ReplyShort(2))
		kept = tok
	}})
	var tok Token
	tok.Begin(rec, 4, true)
	require.NoError(t, tb.Dispatch(&tok, 1, nil, nil))
	require.NoError(t, errs[0])
	require.ErrorIs(t, errs[1], ErrReplied)
	require.Equal(t, []Index{2}, rec.replies)
	require.Equal(t, []uint64{7, 8}, rec.args[0])
	require.True(t, tok.Replied())
	require.ErrorIs(t, kept.ReplyShort(2), ErrNotInHandler)
}

func TestReplyHandlerCannotReplyOrRetain(t *testing.T) {
	var tb Table
	var errs []error
	_, _ = tb.Register(Entry{Index: 1, Name: "rep", NArgs: AnyArgs, Fn: func(tok *Token, _ []uint64, _ []byte) {
		_, _, rerr := tok.Retain()
		errs = append(errs, tok.ReplyShort(1), rerr)
	}})
	var tok Token
	tok.Begin(&recorder{}, 0, false)
	require.NoError(t, tb.Dispatch(&tok, 1, nil, nil))
	require.ErrorIs(t, errs[0], ErrReplyFromReply)
	require.ErrorIs(t, errs[1], ErrReplyFromReply)
}

func TestRetainAnswersTheRequest(t *testing.T) {
	var tb Table
	var errs []error
	var got Retained
	_, _ = tb.Register(Entry{Index: 1, Name: "keep", NArgs: AnyArgs, Fn: func(tok *Token, _ []uint64, _ []byte) {
		_, r, err := tok.Retain()
		got = r
		_, _, err2 := tok.Retain()
		errs = append(errs, err, err2, tok.ReplyShort(1))
	}})
	var tok Token
	tok.Begin(&recorder{}, 2, true)
	tok.ReqOff, tok.ReqLen = 128, 256
	require.NoError(t, tb.Dispatch(&tok, 1, nil, nil))
	require.NoError(t, errs[0])
	require.ErrorIs(t, errs[1], ErrRetained)
	require.ErrorIs(t, errs[2], ErrRetained)
	require.Equal(t, Retained{Src: 2, Off: 128, Len: 256}, got)
	require.True(t, tok.IsRetained())
}

func TestFailedReplyCanBeRetried(t *testing.T) {
	var tb Table
	rec := &recorder{fail: errors.New("network down")}
	var errs []error
	_, _ = tb.Register(Entry{Index: 1, Name: "req", NArgs: AnyArgs, Fn: func(tok *Token, _ []uint64, _ []byte) {
		errs = append(errs, tok.ReplyShort(1))
		rec.fail = nil
		errs = append(errs, tok.ReplyShort(1))
	}})
	var tok Token
	tok.Begin(rec, 0, true)
	require.NoError(t, tb.Dispatch(&tok, 1, nil, nil))
	require.Error(t, errs[0])
	require.NoError(t, errs[1], "a reply that failed to send does not count as the reply")
}

func TestMaxReplyMedium(t *testing.T) {
	var tok Token
	tok.MaxReply = 184
	require.Equal(t, 184-24-8, tok.MaxReplyMedium(0)) // core header and a piggyback extension
	require.Equal(t, 184-24-8-128, tok.MaxReplyMedium(16))
	require.Equal(t, 0, tok.MaxReplyMedium(19))
	tok.MaxReply = 10
	require.Equal(t, 0, tok.MaxReplyMedium(0))
}

// A token kept for immediate requests serves message after message with
// only its source changed: each handler sees its own source, can neither
// reply nor retain, and the token is inactive between messages.
func TestRunFromServesImmediateRequestsOnOneToken(t *testing.T) {
	var tb Table
	rec := &recorder{}
	var srcs []int
	var errs []error
	_, _ = tb.Register(Entry{Index: 1, Name: "imm", NArgs: 1, Fn: func(tok *Token, a []uint64, _ []byte) {
		srcs = append(srcs, tok.Source())
		_, _, rerr := tok.Retain()
		errs = append(errs, tok.ReplyShort(2), rerr, tok.ReplyShortWith(2, Piggyback{Value: 5, Set: true}))
		require.True(t, tok.IsImmediate())
		require.True(t, tok.active)
	}})
	var tok Token
	tok.BeginImmediate(rec, 0)
	fn := tb.Runnable(1, 1)
	for _, src := range []int{3, 0, 7} {
		tok.RunFrom(src, fn, []uint64{9}, nil)
		require.False(t, tok.active, "inactive once the handler returned")
		_, has := tok.ReplyPiggyback()
		require.False(t, has, "a refused reply leaves no tool value behind")
	}
	require.Equal(t, []int{3, 0, 7}, srcs)
	for _, err := range errs {
		require.ErrorIs(t, err, ErrImmediate)
	}
	require.Empty(t, rec.replies)
}
