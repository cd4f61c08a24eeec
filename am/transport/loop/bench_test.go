package loop

import (
	"errors"
	"testing"
	"time"

	"github.com/amgo-hpc/amgo/am/transport"
)

type count struct{ n int }

func (c *count) Deliver(src int, pkt []byte) { c.n++ }

// pingPong bounces an 8-byte packet between rank 0 (this goroutine) and rank 1.
// With wait, each side calls Wait(d) whenever Poll finds nothing.
func pingPong(b *testing.B, opts map[string]string, wait bool) {
	ts, err := NewJob(2, opts)
	if err != nil {
		b.Fatal(err)
	}
	msg := make([]byte, 8)
	recv := func(tr transport.Transport, c *count) {
		for {
			if n, _ := tr.Poll(c, 1); n == 1 {
				return
			}
			if wait {
				tr.Wait(time.Second)
			}
		}
	}
	send := func(tr transport.Transport, dst int) {
		for errors.Is(tr.Send(dst, msg, nil), transport.ErrWouldBlock) {
		}
	}
	n := b.N
	done := make(chan struct{})
	go func() {
		defer close(done)
		c := &count{}
		for i := 0; i < n; i++ {
			recv(ts[1], c)
			send(ts[1], 0)
		}
	}()
	c := &count{}
	b.ResetTimer()
	for i := 0; i < n; i++ {
		send(ts[0], 1)
		recv(ts[0], c)
	}
	b.StopTimer()
	<-done
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(2*b.N), "ns/halfrtt")
}

// BenchmarkPingPong: both ranks busy-poll.
func BenchmarkPingPong(b *testing.B) { pingPong(b, nil, false) }

// BenchmarkWakeup: both ranks park at once (spin 0): the cost of waking a
// parked goroutine through the channel bell, to compare with
// internal/futex.BenchmarkWakeup (a futex sleep of the thread).
func BenchmarkWakeup(b *testing.B) { pingPong(b, map[string]string{"spin": "0s"}, true) }
