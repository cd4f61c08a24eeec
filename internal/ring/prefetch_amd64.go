package ring

// prefetch2 asks the CPU to bring the cache lines holding a and b into its
// caches (PREFETCHT0 each) and returns without waiting for them: one call
// for both, since a call to assembly costs more than the prefetches.
//
//go:noescape
func prefetch2(a, b uintptr)

// prefetchW asks the CPU to take the n cache lines from the one holding a
// for writing (PREFETCHW each: the line comes in exclusive, any other
// core's copy is invalidated) and returns without waiting for them. A CPU
// without the instruction runs it as a no-op.
//
//go:noescape
func prefetchW(a uintptr, n int)
