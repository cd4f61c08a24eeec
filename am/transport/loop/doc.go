// Package loop is amgo's in-process transport: the ranks of a job are
// goroutines of one process. Each directed pair of ranks (a rank to itself
// included) that communicates has a ring of package internal/ring on the
// heap, made by the first Send on it, so that a job's memory grows with the
// pairs that talk rather than with the square of its size; Send copies a
// packet into it once, Poll hands it to the receiver in place, visiting only
// the rings that exist. Put is a plain
// copy, since every rank shares the address space. It is ordered and reliable.
//
// NewJob opens all n ranks at once. The factory registered as "loop" serves only
// jobs of size 1 (a program started without a launcher), because ranks in
// other processes cannot share heap rings.
//
// Waiting: Wait spins on the rings (yielding the processor, since ranks are
// goroutines that may outnumber the cores), then parks on a channel that
// senders signal only when the receiver has announced that it sleeps. Parking a
// goroutine costs less than a futex sleep of its thread and leaves the thread to
// other goroutines: a ping-pong in which both sides park (BenchmarkWakeup) is
// several times faster than two threads sleeping on a futex
// (internal/futex.BenchmarkWakeup).
//
// Options (opts of NewJob and of the factory):
//
//	ring_bytes  data bytes of each directed ring (default 65536, rounded up to a
//	            power of two; suffixes k and m allowed). MaxPacket is about half.
//	spin        how long Wait polls before parking, a Go duration (default 5us).
package loop
