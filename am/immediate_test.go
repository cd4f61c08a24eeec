package am

import (
	"bytes"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/amgo-hpc/amgo/handlers"
	"github.com/amgo-hpc/amgo/internal/wire"
	"github.com/stretchr/testify/require"
)

// Immediate requests, mixed with medium requests, arrive once each and in
// the order they were sent, on every network: as immediate requests where
// the network carries them (ordered and reliable, no reliability layer), as
// medium requests elsewhere. Their handlers cannot reply or retain; they
// take no credit, so nothing is outstanding once they are handled.
func TestImmediateRequestsInOrderWithMediums(t *testing.T) {
	forEachNetwork(t, 2, Config{}, func(t *testing.T, eps []*Endpoint) {
		const n = 600
		var mu sync.Mutex
		var got []uint64
		var immediate atomic.Int64
		for _, ep := range eps {
			_, err := ep.Register(handlers.Entry{Index: 1, Name: "msg", NArgs: 2, Fn: func(tok *handlers.Token, a []uint64, p []byte) {
				require.Len(t, p, int(a[1]))
				require.True(t, bytes.Equal(p, bytes.Repeat([]byte{byte(a[0])}, len(p))), "payload of message %d", a[0])
				if tok.IsImmediate() {
					immediate.Add(1)
					require.ErrorIs(t, tok.ReplyShort(2), handlers.ErrImmediate)
					_, _, err := tok.Retain()
					require.ErrorIs(t, err, handlers.ErrImmediate)
				}
				mu.Lock()
				got = append(got, a[0])
				mu.Unlock()
			}})
			require.NoError(t, err)
			_, err = ep.Register(handlers.Entry{Index: 2, Name: "unused", NArgs: 0, Fn: func(*handlers.Token, []uint64, []byte) {}})
			require.NoError(t, err)
		}
		carries := eps[0].PeerCarriesImmediate(1)
		require.Equal(t, carries, eps[1].PeerCarriesImmediate(0), "both ends agree")
		// The receiver polls on its own goroutine: the sender runs ahead of
		// it until the network's queue is full, then falls back to medium
		// requests, which wait for credit.
		stop := make(chan struct{})
		polled := make(chan struct{})
		go func() {
			defer close(polled)
			for {
				select {
				case <-stop:
					return
				default:
				}
				_, _ = eps[1].Poll()
			}
		}()
		var sentImmediate int
		for i := 0; i < n; i++ {
			size := (i * 37) % (MaxImmediate + 64) // some over MaxImmediate
			msg := bytes.Repeat([]byte{byte(i)}, size)
			if i%5 != 4 {
				ok, err := eps[0].RequestImmediate(1, 1, msg, uint64(i), uint64(size))
				require.NoError(t, err)
				if ok {
					sentImmediate++
					continue
				}
				require.True(t, !carries || size > MaxImmediate || true) // refused: full queue, or too large
			}
			require.NoError(t, eps[0].RequestMedium(1, 1, msg, uint64(i), uint64(size)))
		}
		require.Eventually(t, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(got) == n
		}, 10*time.Second, time.Millisecond)
		close(stop)
		<-polled
		for i, v := range got {
			require.EqualValues(t, i, v, "message order")
		}
		if carries {
			require.Positive(t, sentImmediate)
		} else {
			require.Zero(t, sentImmediate)
		}
		require.EqualValues(t, sentImmediate, immediate.Load())
		s0, s1 := eps[0].Stats(), eps[1].Stats()
		require.EqualValues(t, sentImmediate, s0.ImmediateSent)
		require.EqualValues(t, sentImmediate, s1.ImmediateRecv)
		require.EqualValues(t, n, s0.RequestsSent)
		require.EqualValues(t, n, s1.RequestsRecv)
		pollAll(t, eps, func() bool { return eps[0].Drain(0) == 0 })
	})
}

// Which networks carry immediate requests, and what RequestImmediate
// refuses without sending: too large, Config.NoImmediate, bad input.
func TestImmediateRefusalsAndErrors(t *testing.T) {
	// Ranks 0 and 2 of the two-network jobs share a node, 1 is on the other.
	for network, want := range map[string][2]bool{"fake": {true, true}, "loop": {true, true}, "shm": {true, true},
		"tcp": {}, "lossy": {}, "sim": {}, "udp": {}, "loop+sim": {false, true}, "shm+tcp": {false, true}} {
		eps := openEndpoints(t, network, 3, Config{})
		require.Equal(t, want, [2]bool{eps[0].PeerCarriesImmediate(1), eps[0].PeerCarriesImmediate(2)}, network)
		if want[0] || want[1] {
			require.Positive(t, eps[0].ImmediateQueueBytes(), network)
		} else {
			require.Zero(t, eps[0].ImmediateQueueBytes(), network)
		}
	}
	eps := newFakeEndpoints(t, newFakeNet(2), Config{})
	_, err := eps[0].Register(handlers.Entry{Index: 5, Name: "two", NArgs: 2, Fn: func(*handlers.Token, []uint64, []byte) {}})
	require.NoError(t, err)
	ok, err := eps[0].RequestImmediate(1, 5, make([]byte, MaxImmediate+1), 1, 2)
	require.False(t, ok)
	require.NoError(t, err, "too large: not an error, the caller sends a medium")
	for _, c := range []struct {
		dst  int
		h    handlers.Index
		args []uint64
		want error
	}{
		{2, 5, []uint64{1, 2}, ErrRank},
		{-1, 5, []uint64{1, 2}, ErrRank},
		{1, 5, []uint64{1}, handlers.ErrArgCount},
		{1, 6, nil, handlers.ErrUnknownHandler},
		{1, 250, nil, handlers.ErrIndexReserved},
	} {
		ok, err := eps[0].RequestImmediate(c.dst, c.h, nil, c.args...)
		require.False(t, ok)
		require.ErrorIs(t, err, c.want)
	}
	require.False(t, eps[0].PeerCarriesImmediate(2))

	off := newFakeEndpoints(t, newFakeNet(2), Config{NoImmediate: true})
	_, err = off[0].Register(handlers.Entry{Index: 5, Name: "two", NArgs: 2, Fn: func(*handlers.Token, []uint64, []byte) {}})
	require.NoError(t, err)
	require.False(t, off[0].PeerCarriesImmediate(1))
	ok, err = off[0].RequestImmediate(1, 5, nil, 1, 2)
	require.False(t, ok)
	require.NoError(t, err)
	require.Zero(t, off[0].Stats().RequestsSent)
}

// A full network queue refuses an immediate request without waiting; the
// requests it took arrive once the receiver polls.
func TestImmediateRequestWhenTheQueueIsFull(t *testing.T) {
	net := newFakeNet(2)
	net.limit = 3
	eps := newFakeEndpoints(t, net, Config{})
	var ran atomic.Int32
	for _, ep := range eps {
		_, _ = ep.Register(handlers.Entry{Index: 1, Name: "h", NArgs: 0, Fn: func(*handlers.Token, []uint64, []byte) { ran.Add(1) }})
	}
	for i := 0; i < 3; i++ {
		ok, err := eps[0].RequestImmediate(1, 1, []byte("x"))
		require.NoError(t, err)
		require.True(t, ok)
	}
	ok, err := eps[0].RequestImmediate(1, 1, []byte("x"))
	require.NoError(t, err)
	require.False(t, ok, "queue full")
	pollAll(t, eps, func() bool { return ran.Load() == 3 })
	ok, err = eps[0].RequestImmediate(1, 1, nil)
	require.NoError(t, err)
	require.True(t, ok)
	pollAll(t, eps, func() bool { return ran.Load() == 4 })
}

// Malformed immediate requests are dropped and counted, never run: a
// packet cut inside its arguments, too many arguments, an unknown handler,
// a wrong argument count, and an immediate request over a network that
// does not carry them.
func TestMalformedImmediateRequestsAreDropped(t *testing.T) {
	imm := func(handler uint8, args []uint64, payload []byte) []byte {
		b := make([]byte, wire.ImmediateHeaderLen+8*len(args))
		n := wire.EncodeImmediate(b, handler, args)
		return append(b[:n], payload...)
	}
	good := imm(1, []uint64{7}, []byte("abc"))
	cut := good[:wire.ImmediateHeaderLen+7]
	many := append([]byte(nil), good...)
	many[3] = wire.MaxArgs + 1
	reasons, ran, _ := injectDrops(t, 1, cut, many, imm(99, []uint64{7}, nil), imm(1, nil, nil), good[:3])
	require.Len(t, reasons, 5)
	require.ErrorIs(t, reasons[0], wire.ErrShort)
	require.ErrorIs(t, reasons[1], wire.ErrArgs)
	require.ErrorIs(t, reasons[2], handlers.ErrUnknownHandler)
	require.ErrorIs(t, reasons[3], handlers.ErrArgCount)
	require.ErrorIs(t, reasons[4], wire.ErrShort)
	require.Zero(t, ran)

	// Over a network without them (the reliability layer's), an immediate
	// request is not this endpoint's: dropped.
	noImm := newFakeEndpoints(t, newFakeNet(2), Config{NoImmediate: true})
	var dropped []error
	noImm[1].cfg.OnDrop = func(err error) { dropped = append(dropped, err) }
	var ranNo atomic.Int32
	_, _ = noImm[1].Register(handlers.Entry{Index: 1, Name: "h", NArgs: 1, Fn: func(*handlers.Token, []uint64, []byte) { ranNo.Add(1) }})
	noImm[0].tr.(*fakeTr).net.inject(0, 1, good)
	_, err := noImm[1].Poll()
	require.NoError(t, err)
	require.Len(t, dropped, 1)
	require.Zero(t, ranNo.Load())
}

// A rank that only sends immediate requests never waits for credit, so it
// polls once every immediatePollEvery of them: what its receiver sends it
// (here a request answering the first message) reaches it while it sends.
func TestImmediateSenderPollsWhileItOnlySends(t *testing.T) {
	eps := newFakeEndpoints(t, newFakeNet(2), Config{})
	var stopped atomic.Int64 // sends made when rank 0 ran "stop", plus one
	var sent int64
	for _, ep := range eps {
		_, err := ep.Register(handlers.Entry{Index: 1, Name: "data", NArgs: 0, Fn: func(tok *handlers.Token, _ []uint64, _ []byte) {
			if tok.Source() == 0 && stopped.Load() == 0 {
				require.NoError(t, eps[1].RequestShort(0, 2))
			}
		}})
		require.NoError(t, err)
		_, err = ep.Register(handlers.Entry{Index: 2, Name: "stop", NArgs: 0, Fn: func(*handlers.Token, []uint64, []byte) {
			stopped.CompareAndSwap(0, sent+1)
		}})
		require.NoError(t, err)
	}
	for sent = 0; sent < 4*immediatePollEvery; sent++ {
		ok, err := eps[0].RequestImmediate(1, 1, []byte("x"))
		require.NoError(t, err)
		require.True(t, ok)
		_, err = eps[1].Poll() // rank 1 keeps up; rank 0 never polls itself
		require.NoError(t, err)
	}
	require.Positive(t, stopped.Load(), "the sender never polled")
	require.LessOrEqual(t, stopped.Load(), int64(immediatePollEvery+1))
}
