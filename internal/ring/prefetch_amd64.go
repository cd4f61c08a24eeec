package ring

// prefetch2 asks the CPU to bring the cache lines holding a and b into its
// caches (PREFETCHT0 each) and returns without waiting for them: one call
// for both, since a call to assembly costs more than the prefetches.
//
//go:noescape
func prefetch2(a, b uintptr)
