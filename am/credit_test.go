package am

import (
	"testing"

	"github.com/amgo-hpc/amgo/am/transport"
	"github.com/amgo-hpc/amgo/flowctl"
	"github.com/amgo-hpc/amgo/handlers"
	"github.com/amgo-hpc/amgo/internal/wire"
	"github.com/stretchr/testify/require"
)

// TestQuarterAckFollowsTheAnswer checks when the credit return of requests
// answered without a reply leaves (docs/am.md "How space comes back"): once
// a quarter of the buffer is pending, before the next packet is delivered or
// at the start of the next poll, never from the delivery that filled the
// quarter, so that a handler's caller answers before the ack goes out.
func TestQuarterAckFollowsTheAnswer(t *testing.T) {
	net := newFakeNet(2)
	eps := newFakeEndpoints(t, net, Config{})
	var got int
	for _, ep := range eps {
		_, err := ep.Register(handlers.Entry{Index: 1, Name: "sink", NArgs: 0,
			Fn: func(*handlers.Token, []uint64, []byte) { got++ }})
		require.NoError(t, err)
	}
	quarter := flowctl.DefaultBufferBytes / 4
	big := make([]byte, quarter) // one request reserves more than a quarter
	acks := func() uint64 { return eps[1].Stats().AcksSent }

	// A ping-pong's message: the delivery that fills the quarter sends nothing.
	require.NoError(t, eps[0].RequestMedium(1, 1, big))
	n, err := eps[1].Poll()
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, 1, got)
	require.Zero(t, acks(), "the ack must not leave from the delivery that filled the quarter")
	// The next poll sends it, before looking for packets, and rank 0 gets its space back.
	n, err = eps[1].Poll()
	require.NoError(t, err)
	require.Zero(t, n)
	require.EqualValues(t, 1, acks())
	_, err = eps[0].Poll()
	require.NoError(t, err)
	require.Equal(t, 0, eps[0].Drain(0), "rank 0's window is empty again")

	// A stream: two requests in one poll; the ack of the first leaves before
	// the second is delivered, the second's waits for the next poll.
	require.NoError(t, eps[0].RequestMedium(1, 1, big))
	require.NoError(t, eps[0].RequestMedium(1, 1, big))
	n, err = eps[1].Poll()
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.EqualValues(t, 2, acks())
	_, err = eps[1].Poll()
	require.NoError(t, err)
	require.EqualValues(t, 3, acks())
	_, err = eps[0].Poll()
	require.NoError(t, err)
	require.Equal(t, 0, eps[0].Drain(0))

	// Below a quarter nothing leaves until the endpoint idles.
	small := make([]byte, 100)
	require.NoError(t, eps[0].RequestMedium(1, 1, small))
	_, err = eps[1].Poll()
	require.NoError(t, err)
	_, err = eps[1].Poll()
	require.NoError(t, err)
	require.EqualValues(t, 3, acks())
	for i := 0; i < idleFlushPolls; i++ {
		_, err = eps[1].Poll()
		require.NoError(t, err)
	}
	require.EqualValues(t, 4, acks())
	require.False(t, eps[1].rx.credit.Pending(), "the sources' list is emptied with their frees")
}

// TestRequestCarriesOwedCredit checks that a request carries the credit its
// sender owes the destination (wire: FlagFree and the free extension on a
// request), so that a ping-pong of requests answered without replies sends
// no ack: of a quarter or more on every request, of less only on requests of
// at least flowctl.CarryMin bytes; and that credit a refused request took
// goes back in an ack queued behind it.
func TestRequestCarriesOwedCredit(t *testing.T) {
	net := newFakeNet(2)
	eps := newFakeEndpoints(t, net, Config{})
	var got [2]int
	var maxReply []int
	for i, ep := range eps {
		_, err := ep.Register(handlers.Entry{Index: 1, Name: "sink", NArgs: 0,
			Fn: func(*handlers.Token, []uint64, []byte) { got[i]++ }})
		require.NoError(t, err)
		_, err = ep.Register(handlers.Entry{Index: 2, Name: "room", NArgs: 0,
			Fn: func(tok *handlers.Token, _ []uint64, _ []byte) { maxReply = append(maxReply, tok.MaxReply); got[i]++ }})
		require.NoError(t, err)
	}
	inUse := func(from, to int) int { return eps[from].peers[to].cr.InUse() }
	acks := func(i int) uint64 { return eps[i].Stats().AcksSent }
	poll := func(i, want int) {
		t.Helper()
		n, err := eps[i].Poll()
		require.NoError(t, err)
		require.Equal(t, want, n)
	}
	idle := func() { // both ranks idle long enough to flush what they owe
		for i := 0; i <= idleFlushPolls+1; i++ {
			for _, ep := range eps {
				_, err := ep.Poll()
				require.NoError(t, err)
			}
		}
	}
	quarter := flowctl.DefaultBufferBytes / 4
	big := make([]byte, quarter)

	// A ping-pong of big messages: each message carries the space of the one
	// before it back.
	for round := 0; round < 4; round++ {
		require.NoError(t, eps[0].RequestMedium(1, 1, big))
		poll(1, 1)
		require.Zero(t, inUse(1, 0), "round %d: the ping returned the last answer's space", round)
		require.NoError(t, eps[1].RequestMedium(0, 1, big))
		poll(1, 0) // no ack to send: the answer took the credit
		poll(0, 1)
		require.Zero(t, inUse(0, 1), "round %d: the answer returned the ping's space", round)
	}
	// A short request carries a quarter or more, and its handler has the
	// same room to reply as one without (MaxReply).
	require.NotZero(t, eps[0].rx.credit.Owed(1).Len())
	require.NoError(t, eps[0].RequestShort(1, 2))
	poll(1, 1)
	require.Zero(t, inUse(1, 0))
	require.Zero(t, eps[0].rx.credit.Owed(1).Len())
	require.NoError(t, eps[0].RequestShort(1, 2)) // nothing owed: no free extension
	poll(1, 1)
	require.Equal(t, []int{256 - 24 - wire.FreeExtLen, 256 - 24 - wire.FreeExtLen}, maxReply)
	require.Zero(t, acks(0)+acks(1), "no ack in a ping-pong whose messages carry the credit")
	require.Equal(t, [2]int{4, 6}, got)
	idle() // rank 1 owes the short request's space
	require.Zero(t, inUse(0, 1))

	// Below a quarter, a small request does not carry it (8 bytes would cost
	// an 8-byte message a second cache line); an idle flush returns it.
	require.NoError(t, eps[0].RequestMedium(1, 1, []byte{2}))
	poll(1, 1)
	owed := inUse(0, 1)
	require.NotZero(t, owed)
	require.NoError(t, eps[1].RequestMedium(0, 1, []byte{3}))
	poll(0, 1)
	require.Equal(t, owed, inUse(0, 1), "a small request below a quarter carries no credit")
	// A request of flowctl.CarryMin bytes or more carries it.
	require.NoError(t, eps[1].RequestMedium(0, 1, make([]byte, flowctl.CarryMin)))
	poll(0, 1)
	require.Zero(t, inUse(0, 1))
	idle()
	require.Zero(t, inUse(1, 0))
	require.Equal(t, 0, eps[0].Drain(0))
	require.Equal(t, 0, eps[1].Drain(0))

	// A request the network refuses after taking the credit: the credit goes
	// back in an ack queued behind the refused packets, once the network
	// takes them again.
	require.NoError(t, eps[0].RequestMedium(1, 1, big))
	poll(1, 1)
	net.mu.Lock()
	net.limit = 1
	net.mu.Unlock()
	require.NoError(t, eps[1].RequestShort(0, 1)) // carries the credit; fills the 1->0 queue (limit 1)
	require.Zero(t, eps[1].rx.credit.Owed(0).Len(), "the request took the credit")
	require.NoError(t, eps[0].RequestMedium(1, 1, big))
	poll(1, 1) // rank 1 owes rank 0 again
	// The next request takes the credit and the network refuses it.
	p := &eps[1].peers[0]
	p.mu.Lock()
	hdr := wire.Header{Kind: wire.KindRequestShort, Handler: 1, Src: 1}
	credit, err := eps[1].sendLocked(0, p, &hdr, nil, nil, nil)
	p.mu.Unlock()
	require.True(t, credit)
	require.ErrorIs(t, err, transport.ErrWouldBlock)
	require.Zero(t, eps[1].rx.credit.Owed(0).Len(), "the refused request had taken the credit")
	p.mu.Lock()
	require.Len(t, p.backlog, 1, "and queued it as an ack")
	p.mu.Unlock()
	net.mu.Lock()
	net.limit = 0
	net.mu.Unlock()
	poll(0, 1) // the short request that filled the queue, which returned the first big request's space
	poll(1, 0) // flushes the backlog: the ack
	poll(0, 1)
	require.Zero(t, inUse(0, 1), "the ack returned the second's")
	idle()
	require.Equal(t, 0, eps[0].Drain(0))
	require.Equal(t, 0, eps[1].Drain(0))
	require.Zero(t, eps[0].Stats().Drops+eps[1].Stats().Drops)
}

// TestSmallAnswerCarriesCreditBack checks that a request carries the credit
// its sender owes the destination once that is flowctl.CarryAny bytes or
// more, however small its payload (a large message answered with 8 bytes:
// its sender has the space back with the answer, not when the answering
// rank next idles), and that an immediate request, which has no room for
// it, goes as a medium request then; below it, nothing is carried and the
// immediate request goes.
func TestSmallAnswerCarriesCreditBack(t *testing.T) {
	net := newFakeNet(2)
	eps := newFakeEndpoints(t, net, Config{})
	var got [2]int
	for i, ep := range eps {
		_, err := ep.Register(handlers.Entry{Index: 1, Name: "sink", NArgs: 0,
			Fn: func(*handlers.Token, []uint64, []byte) { got[i]++ }})
		require.NoError(t, err)
	}
	require.True(t, eps[1].PeerCarriesImmediate(0))
	poll := func(i, want int) {
		t.Helper()
		n, err := eps[i].Poll()
		require.NoError(t, err)
		require.Equal(t, want, n)
	}
	answer := []byte("answer!!")
	for _, c := range []struct {
		size  int
		carry bool
	}{{12000, true}, {flowctl.CarryAny, true}, {flowctl.CarryMin / 2, false}} {
		require.NoError(t, eps[0].RequestMedium(1, 1, make([]byte, c.size)))
		poll(1, 1)
		ok, err := eps[1].RequestImmediate(0, 1, answer)
		require.NoError(t, err)
		require.Equal(t, !c.carry, ok, "%d bytes owed: immediate only when there is nothing to carry", c.size)
		if !ok {
			require.NoError(t, eps[1].RequestMedium(0, 1, answer))
		}
		poll(0, 1)
		if c.carry {
			require.Zero(t, eps[0].InFlight(1), "%d bytes: the space is back with the answer", c.size)
			continue
		}
		require.NotZero(t, eps[0].InFlight(1), "%d bytes: kept until the idle flush", c.size)
		for range idleFlushPolls + 1 {
			_, err := eps[1].Poll()
			require.NoError(t, err)
		}
		poll(0, 1)
		require.Zero(t, eps[0].InFlight(1))
	}
	require.Equal(t, [2]int{3, 3}, got)
	require.EqualValues(t, 1, eps[1].Stats().AcksSent, "one ack: the idle flush's")
}
