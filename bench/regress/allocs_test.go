package regress

import (
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/amgo-hpc/amgo/am"
	"github.com/amgo-hpc/amgo/am/job"
	"github.com/amgo-hpc/amgo/handlers"
	"github.com/amgo-hpc/amgo/mpiam"
)

const (
	warmRoundTrips = 2000 // buffers, pools and matching structures reach their steady size
	measuredRuns   = 1000
	tagPing        = 1
	tagStop        = 2
)

// TestMPIEagerRoundTripAllocatesNothing: an 8-byte eager Send/Recv round trip
// between two in-process ranks (loop network) allocates nothing in steady state,
// counted over both ranks (testing.AllocsPerRun counts every goroutine's mallocs).
func TestMPIEagerRoundTripAllocatesNothing(t *testing.T) {
	var allocs float64
	err := mpiam.RunLocal(2, mpiam.Config{}, func(world *mpiam.Comm) error {
		sbuf, rbuf := make([]byte, 8), make([]byte, 8)
		if world.Rank() == 1 { // echo until told to stop
			for {
				st, err := mpiam.Recv(world, rbuf, 0, mpiam.AnyTag)
				if err != nil || st.Tag == tagStop {
					return err
				}
				if err := mpiam.Send(world, sbuf, 0, tagPing); err != nil {
					return err
				}
			}
		}
		var failed error
		roundTrip := func() {
			if err := mpiam.Send(world, sbuf, 1, tagPing); err != nil {
				failed = err
				return
			}
			if _, err := mpiam.Recv(world, rbuf, 1, tagPing); err != nil {
				failed = err
			}
		}
		for i := 0; i < warmRoundTrips; i++ {
			roundTrip()
		}
		allocs = testing.AllocsPerRun(measuredRuns, roundTrip)
		if failed != nil {
			return failed
		}
		return mpiam.Send(world, sbuf, 1, tagStop)
	})
	require.NoError(t, err)
	require.Zero(t, allocs, "allocations per 8-byte eager MPI round trip")
}

// TestAMShortRoundTripAllocatesNothing: an AM short request whose handler
// replies short, between two in-process ranks, allocates nothing in steady
// state.
func TestAMShortRoundTripAllocatesNothing(t *testing.T) {
	const hPing, hPong handlers.Index = 1, 2
	var allocs float64
	var done atomic.Bool
	err := job.RunLocal(2, am.Config{}, func(ep *am.Endpoint) error {
		var pongs atomic.Int64
		for _, e := range []handlers.Entry{
			{Index: hPing, Name: "ping", NArgs: 1, Fn: func(tok *handlers.Token, _ []uint64, _ []byte) { _ = tok.ReplyShort(hPong) }},
			{Index: hPong, Name: "pong", NArgs: 0, Fn: func(*handlers.Token, []uint64, []byte) { pongs.Add(1) }},
		} {
			if _, err := ep.Register(e); err != nil {
				return err
			}
		}
		if err := ep.Barrier(); err != nil {
			return err
		}
		if ep.Rank() == 1 { // answer inside the polling until rank 0 is done
			return ep.PollUntil(done.Load)
		}
		var want int64
		var failed error
		roundTrip := func() {
			want++
			if err := ep.RequestShort(1, hPing, 42); err != nil {
				failed = err
				return
			}
			if err := ep.PollUntil(func() bool { return pongs.Load() >= want }); err != nil {
				failed = err
			}
		}
		for i := 0; i < warmRoundTrips; i++ {
			roundTrip()
		}
		allocs = testing.AllocsPerRun(measuredRuns, roundTrip)
		done.Store(true)
		return failed
	})
	require.NoError(t, err)
	require.Zero(t, allocs, "allocations per AM short round trip")
}
