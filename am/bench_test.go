package am

import (
	"sync"
	"sync/atomic"
	"testing"

	"github.com/amgo-hpc/amgo/handlers"
	"github.com/stretchr/testify/require"
)

// pingPongPair opens two endpoints over network with a ping handler that
// replies at once and a pong handler that counts.
func pingPongPair(tb testing.TB, network string) (eps []*Endpoint, pongs *atomic.Int64) {
	pongs = new(atomic.Int64)
	for _, tr := range openJob(tb, network, 2) {
		ep, err := New(tr, Config{})
		require.NoError(tb, err)
		_, err = ep.Register(handlers.Entry{Index: 1, Name: "ping", NArgs: 1, Fn: func(tok *handlers.Token, a []uint64, p []byte) {
			_ = tok.ReplyShort(2, a[0])
		}})
		require.NoError(tb, err)
		_, err = ep.Register(handlers.Entry{Index: 2, Name: "pong", NArgs: 1, Fn: func(*handlers.Token, []uint64, []byte) { pongs.Add(1) }})
		require.NoError(tb, err)
		_, err = ep.Register(handlers.Entry{Index: 3, Name: "ping-medium", NArgs: 0, Fn: func(tok *handlers.Token, a []uint64, p []byte) {
			_ = tok.ReplyShort(2, uint64(len(p)))
		}})
		require.NoError(tb, err)
		eps = append(eps, ep)
	}
	return eps, pongs
}

// serve polls ep on its own goroutine until stop is closed.
func serve(ep *Endpoint, stop *atomic.Bool, wg *sync.WaitGroup) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = ep.PollUntil(stop.Load)
	}()
}

func benchPingPong(b *testing.B, network string, size int) {
	eps, pongs := pingPongPair(b, network)
	var stop atomic.Bool
	var wg sync.WaitGroup
	serve(eps[1], &stop, &wg)
	payload := make([]byte, max(size, 0))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var err error
		if size < 0 {
			err = eps[0].RequestShort(1, 1, uint64(i))
		} else {
			err = eps[0].RequestMedium(1, 3, payload)
		}
		if err != nil {
			b.Fatal(err)
		}
		want := int64(i + 1)
		for pongs.Load() != want {
			if _, err := eps[0].Poll(); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.StopTimer()
	stop.Store(true)
	wg.Wait()
	for _, ep := range eps {
		_ = ep.tr.Close()
	}
}

// BenchmarkPingPong reports one round trip (request + reply) per op.
func BenchmarkPingPong(b *testing.B) {
	for _, network := range []string{"loop", "shm"} {
		b.Run(network+"/short", func(b *testing.B) { benchPingPong(b, network, -1) })
		b.Run(network+"/medium-8", func(b *testing.B) { benchPingPong(b, network, 8) })
		b.Run(network+"/medium-4096", func(b *testing.B) { benchPingPong(b, network, 4096) })
	}
}
