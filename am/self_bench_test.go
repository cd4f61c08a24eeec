package am

import (
	"sync/atomic"
	"testing"

	"github.com/amgo-hpc/amgo/handlers"
	"github.com/stretchr/testify/require"
)

// BenchmarkSelfRoundTrip measures the CPU cost of one request and its reply
// with no cache line crossing cores: a rank sends to itself and polls. It is
// the endpoint's own overhead per round trip (two sends, two deliveries).
func BenchmarkSelfRoundTrip(b *testing.B) {
	for _, network := range []string{"loop", "shm"} {
		b.Run(network, func(b *testing.B) {
			trs := openJob(b, network, 1)
			ep, err := New(trs[0], Config{})
			require.NoError(b, err)
			var pongs atomic.Int64
			_, _ = ep.Register(handlers.Entry{Index: 1, Name: "ping", NArgs: 1, Fn: func(tok *handlers.Token, a []uint64, p []byte) {
				_ = tok.ReplyShort(2, a[0])
			}})
			_, _ = ep.Register(handlers.Entry{Index: 2, Name: "pong", NArgs: 1, Fn: func(*handlers.Token, []uint64, []byte) { pongs.Add(1) }})
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := ep.RequestShort(0, 1, uint64(i)); err != nil {
					b.Fatal(err)
				}
				for pongs.Load() != int64(i+1) {
					_, _ = ep.Poll()
				}
			}
			b.StopTimer()
			_ = ep.tr.Close()
		})
	}
}
