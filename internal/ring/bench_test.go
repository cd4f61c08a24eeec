package ring

import (
	"fmt"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"unsafe"
)

// BenchmarkPingPong bounces an 8-byte record between two goroutines over two
// rings; ns/op is one half round trip (one record one way).
func BenchmarkPingPong(b *testing.B) { pingPong(b, 8, false) }

// pingPong bounces a record of size data bytes between two goroutines over
// two rings and reports ns per half round trip; with read, each side reads
// every byte it receives, as a packet's decoder would.
func pingPong(b *testing.B, size int, read bool) {
	if runtime.GOMAXPROCS(0) < 2 {
		b.Skip("needs GOMAXPROCS >= 2: both sides busy-poll")
	}
	pa, ca, _ := newRing(b, 4096)
	pb, cb, _ := newRing(b, 4096)
	msg := make([]byte, size)
	echo := make([]byte, size)
	sum := func(rec []byte) (s byte) {
		if read {
			for _, x := range rec {
				s += x
			}
		}
		return s
	}
	n := b.N
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < n; i++ {
			for {
				if rec, ok := ca.Peek(); ok {
					echo[0] = sum(rec)
					pb.Push(echo, nil)
					ca.Advance()
					break
				}
			}
		}
	}()
	b.ResetTimer()
	for i := 0; i < n; i++ {
		pa.Push(msg, nil)
		for {
			if rec, ok := cb.Peek(); ok {
				msg[size-1] = sum(rec)
				cb.Advance()
				break
			}
		}
	}
	b.StopTimer()
	<-done
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(2*b.N), "ns/halfrtt")
}

// BenchmarkStream pushes 64-byte records from one goroutine to another.
func BenchmarkStream(b *testing.B) {
	p, c, _ := newRing(b, 64<<10)
	stream(b, p, c, 64, false)
}

// stream pushes b.N records of size bytes through p from this goroutine
// to another that takes them from c, copying each out when copyOut is set.
func stream(b *testing.B, p *Producer, c *Consumer, size int, copyOut bool) {
	if runtime.GOMAXPROCS(0) < 2 {
		b.Skip("needs GOMAXPROCS >= 2")
	}
	msg := make([]byte, size)
	out := make([]byte, size)
	n := b.N
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < n; i++ {
			for {
				if rec, ok := c.Peek(); ok {
					if copyOut {
						copy(out, rec)
					}
					c.Advance()
					break
				}
			}
		}
	}()
	b.SetBytes(int64(size))
	b.ResetTimer()
	for i := 0; i < n; i++ {
		for !p.Push(msg[:16], msg[16:]) {
		}
	}
	<-done
}

// BenchmarkPingPongSizes is BenchmarkPingPong with records of several sizes
// (the data bytes; each side reads every byte of what it receives), to show
// what a record costs per cache line it spans.
func BenchmarkPingPongSizes(b *testing.B) {
	for _, sz := range []int{8, 48, 56, 64, 88, 120} {
		b.Run(strconv.Itoa(sz), func(b *testing.B) { pingPong(b, sz, true) })
	}
}

// BenchmarkStreamLap streams records of several sizes from one goroutine to
// another, the consumer copying each out, through a 256 KiB ring with and
// without a short lap (SetLap) and through a ring of the lap's size: what
// keeping a stream's lines in the first-level caches is worth.
func BenchmarkStreamLap(b *testing.B) {
	for _, tc := range []struct {
		name      string
		ring, lap int
	}{{"ring256k", 256 << 10, 0}, {"ring256k-lap16k", 256 << 10, 16 << 10}, {"ring16k", 16 << 10, 0}} {
		for _, size := range []int{64, 1024} {
			b.Run(fmt.Sprintf("%s/%d", tc.name, size), func(b *testing.B) {
				p, c, _ := newRing(b, tc.ring)
				p.SetLap(tc.lap)
				p.Streaming(true)
				stream(b, p, c, size, true)
			})
		}
	}
}

// BenchmarkChase is the pattern behind the ring's gap (Producer.pushGapped),
// outside the ring: one goroutine copies chunks of size bytes around a
// region, placed back to back or with unused space after each, and another
// copies each out as soon as it is published, as a receiver that keeps up
// with a stream does; at most 64 chunks are outstanding, and the writer
// does about 50 ns of other work after each (work), as a sender does per
// message. ns/op is one chunk. Back to back, the reader's stream
// prefetcher runs ahead into the lines being written next; with a gap it
// reads lines nobody writes. Without the writer's work the reader rarely
// catches up and the gap matters little.
func BenchmarkChase(b *testing.B) {
	for _, tc := range []struct{ size, gap int }{{1024, 0}, {1024, 1024}, {1024, 3072}, {2048, 0}, {2048, 1024}, {2048, 2048}} {
		b.Run(fmt.Sprintf("%d/gap%d", tc.size, tc.gap), func(b *testing.B) { chase(b, tc.size, tc.size+tc.gap) })
	}
}

func chase(b *testing.B, size, stride int) {
	if runtime.GOMAXPROCS(0) < 2 {
		b.Skip("needs GOMAXPROCS >= 2: both sides busy-poll")
	}
	const window = 64
	chunks := (256 << 10) / stride
	region := make([]byte, stride*chunks+lineLen)
	region = region[lineLen-int(uintptr(unsafe.Pointer(&region[0]))&(lineLen-1)):] // line-aligned
	src, dst := make([]byte, size), make([]byte, size)
	var published, consumed atomic.Int64
	n := b.N
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < n; i++ {
			for published.Load() <= int64(i) {
			}
			c := (i % chunks) * stride
			copy(dst, region[c:c+size])
			consumed.Store(int64(i + 1))
		}
	}()
	b.SetBytes(int64(size))
	b.ResetTimer()
	for i := 0; i < n; i++ {
		for int64(i)-consumed.Load() >= window {
		}
		c := (i % chunks) * stride
		copy(region[c:c+size], src)
		published.Store(int64(i + 1))
		spin = work(spin)
	}
	<-done
}

// spin keeps work's result alive.
var spin uint64

// work stands for a sender's own steps between two messages (a request's
// bookkeeping, the matching): about 50 ns of dependent arithmetic.
func work(x uint64) uint64 {
	for range 64 {
		x = x*6364136223846793005 + 1442695040888963407
	}
	return x
}
