package am

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/amgo-hpc/amgo/handlers"
	"github.com/stretchr/testify/require"
)

// countFiller writes seq, seq+1, ... into a payload and counts its calls.
type countFiller struct {
	seq   byte
	calls int
}

func (f *countFiller) Fill(p []byte) {
	f.calls++
	for i := range p {
		p[i] = f.seq + byte(i)
	}
}

// RequestMediumFill delivers the payload its filler wrote, of every size up
// to MaxMediumTo, calling the filler once per request, on every network:
// in place where the network takes it (loop, shm, and their peers under
// route), built first elsewhere. A stream larger than the per-peer buffer
// waits for credit on the way and still fills each request once.
func TestRequestMediumFill(t *testing.T) {
	forEachNetwork(t, 2, Config{}, func(t *testing.T, eps []*Endpoint) {
		var got atomic.Int64
		var bad atomic.Value
		for _, ep := range eps {
			_, err := ep.Register(handlers.Entry{Index: 1, Name: "filled", NArgs: 2, Fn: func(tok *handlers.Token, a []uint64, p []byte) {
				if uint64(len(p)) != a[0] {
					bad.Store("length")
				}
				for i, b := range p {
					if b != byte(a[1])+byte(i) {
						bad.Store("content")
						break
					}
				}
				got.Add(1)
			}})
			require.NoError(t, err)
		}
		name := eps[0].nets[1].name
		require.Equal(t, name == "loop" || name == "shm", eps[0].PeerFills(1), "network %s", name)
		sizes := []int{0, 1, 100, 4096, eps[0].MaxMediumTo(1)}
		const stream = 400 // 4 KiB each: many buffers' worth
		total := int64(len(sizes) + stream)
		done := make(chan struct{})
		go func() { // the receiver, polled meanwhile
			defer close(done)
			deadline := time.Now().Add(20 * time.Second)
			for got.Load() < total && time.Now().Before(deadline) {
				_, _ = eps[1].Poll()
			}
		}()
		for i, size := range sizes {
			f := &countFiller{seq: byte(i)}
			require.NoError(t, eps[0].RequestMediumFill(1, 1, size, f, handlers.Piggyback{}, uint64(size), uint64(i)))
			require.Equal(t, 1, f.calls)
		}
		for i := range stream {
			f := &countFiller{seq: byte(i)}
			require.NoError(t, eps[0].RequestMediumFill(1, 1, 4096, f, handlers.Piggyback{}, 4096, uint64(i)))
			require.Equal(t, 1, f.calls, "request %d", i)
		}
		<-done
		require.Equal(t, total, got.Load())
		require.Nil(t, bad.Load())
	})
}

// Arguments RequestMediumFill refuses, each before calling the filler.
func TestRequestMediumFillErrors(t *testing.T) {
	eps := newFakeEndpoints(t, newFakeNet(2), Config{})
	_, err := eps[0].Register(handlers.Entry{Index: 5, Name: "two", NArgs: 2, Fn: func(*handlers.Token, []uint64, []byte) {}})
	require.NoError(t, err)
	f := &countFiller{}
	none := handlers.Piggyback{}
	require.ErrorIs(t, eps[0].RequestMediumFill(2, 5, 8, f, none, 1, 2), ErrRank)
	require.ErrorIs(t, eps[0].RequestMediumFill(1, 5, 8, nil, none, 1, 2), ErrArg)
	require.ErrorIs(t, eps[0].RequestMediumFill(1, 5, -1, f, none, 1, 2), ErrArg)
	require.ErrorIs(t, eps[0].RequestMediumFill(1, 5, eps[0].MaxMediumTo(1)+1, f, none, 1, 2), ErrTooLarge)
	require.ErrorIs(t, eps[0].RequestMediumFill(1, 5, 8, f, none, 1), handlers.ErrArgCount)
	require.ErrorIs(t, eps[0].RequestMediumFill(1, 250, 8, f, none, 1, 2), handlers.ErrIndexReserved)
	require.Zero(t, f.calls)
	require.False(t, eps[0].PeerFills(2))
}
