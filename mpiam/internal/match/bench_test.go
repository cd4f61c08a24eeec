package match

import (
	"fmt"
	"testing"
)

// The cost of matching must not grow with the length of the queues: each
// benchmark runs against 10, 10^3 and 10^4 queued items, and ns/op should stay
// flat across them.

var queueSizes = []int{10, 1_000, 10_000}

const benchSources = 64

// fillUnexpected queues n unexpected messages from 64 sources with distinct
// tags: message i comes from source i%64 with tag i.
func fillUnexpected(b *testing.B, e *Engine[int, int], seq *sendSeq, n int) {
	for i := range n {
		src := int32(i % benchSources)
		if _, err := e.Arrive(Envelope{Source: src, Tag: int32(i), Seq: seq.Next(0, src)}, i, nil); err != nil {
			b.Fatal(err)
		}
	}
	if got := e.Stats().Unexpected; got != n {
		b.Fatalf("queued %d, want %d", got, n)
	}
}

// BenchmarkExactMatch10kUnexpected posts an exact receive for one of n queued
// unexpected messages, which it takes, and re-adds that message (a new arrival
// with the next sequence number), so the queue stays at n.
func BenchmarkExactMatch10kUnexpected(b *testing.B) {
	for _, n := range queueSizes {
		b.Run(fmt.Sprintf("queued=%d", n), func(b *testing.B) {
			e := New[int, int]()
			var seq sendSeq
			fillUnexpected(b, e, &seq, n)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				k := (i * 7919) % n // spread over the queue, not just its head
				src, tag := int32(k%benchSources), int32(k)
				m, _, _, ok := e.Post(Spec{Source: src, Tag: tag}, i)
				if !ok || m != k {
					b.Fatalf("post (%d,%d): got %d ok %v", src, tag, m, ok)
				}
				e.Arrive(Envelope{Source: src, Tag: tag, Seq: seq.Next(0, src)}, k, nil)
			}
		})
	}
}

// BenchmarkWildcardPost posts a receive with wildcards against n queued
// unexpected messages; it takes the earliest match, which is then re-added.
func BenchmarkWildcardPost(b *testing.B) {
	kinds := []struct {
		name string
		spec func(i, n int) Spec
	}{
		{"AnySource,AnyTag", func(i, n int) Spec { return Spec{Source: AnySource, Tag: AnyTag} }},
		{"AnySource,tag", func(i, n int) Spec { return Spec{Source: AnySource, Tag: int32((i * 7919) % n)} }},
		{"source,AnyTag", func(i, n int) Spec { return Spec{Source: int32(i % min(n, benchSources)), Tag: AnyTag} }},
	}
	for _, kind := range kinds {
		for _, n := range queueSizes {
			b.Run(fmt.Sprintf("%s/queued=%d", kind.name, n), func(b *testing.B) {
				e := New[int, int]()
				var seq sendSeq
				fillUnexpected(b, e, &seq, n)
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					m, env, _, ok := e.Post(kind.spec(i, n), i)
					if !ok {
						b.Fatalf("no match for %+v", kind.spec(i, n))
					}
					env.Seq = seq.Next(0, env.Source)
					e.Arrive(env, m, nil)
				}
			})
		}
	}
}

// BenchmarkArrivalAgainstPosted delivers a message that matches one of n
// posted receives (exact, or AnySource with a tag), then posts the receive
// again, so n stay posted.
func BenchmarkArrivalAgainstPosted(b *testing.B) {
	for _, wild := range []bool{false, true} {
		for _, n := range queueSizes {
			name := "exact"
			if wild {
				name = "AnySource"
			}
			b.Run(fmt.Sprintf("%s/posted=%d", name, n), func(b *testing.B) {
				e := New[int, int]()
				var seq sendSeq
				specOf := func(k int) Spec {
					s := Spec{Source: int32(k % benchSources), Tag: int32(k)}
					if wild {
						s.Source = AnySource
					}
					return s
				}
				for k := range n {
					e.Post(specOf(k), k)
				}
				out := make([]Match[int, int], 0, 1)
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					k := (i * 7919) % n
					src := int32(k % benchSources)
					out, _ = e.Arrive(Envelope{Source: src, Tag: int32(k), Seq: seq.Next(0, src)}, i, out[:0])
					if len(out) != 1 || out[0].Recv != k {
						b.Fatalf("arrival %d matched %v", k, out)
					}
					e.Post(specOf(k), k)
				}
			})
		}
	}
}

// BenchmarkOutOfSequencePair delivers pairs of messages from one source in
// reverse order, so that every other arrival is held and then drained, against
// posted AnyTag receives.
func BenchmarkOutOfSequencePair(b *testing.B) {
	e := New[int, int]()
	var seq sendSeq
	out := make([]Match[int, int], 0, 2)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		e.Post(Spec{Source: 1, Tag: AnyTag}, 0)
		e.Post(Spec{Source: 1, Tag: AnyTag}, 1)
		s0, s1 := seq.Next(0, 1), seq.Next(0, 1)
		out, _ = e.Arrive(Envelope{Source: 1, Tag: 3, Seq: s1}, 1, out[:0])
		out, _ = e.Arrive(Envelope{Source: 1, Tag: 3, Seq: s0}, 0, out[:0])
		if len(out) != 2 {
			b.Fatal("pair not drained")
		}
	}
}
