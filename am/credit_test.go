package am

import (
	"testing"

	"github.com/amgo-hpc/amgo/flowctl"
	"github.com/amgo-hpc/amgo/handlers"
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
	require.Len(t, eps[1].rx.dirty, 0, "the sources' list is emptied with their frees")
}
