package ring

// prefetch asks the CPU to bring the cache line holding addr into its caches
// (PREFETCHT0) and returns without waiting for it.
//
//go:noescape
func prefetch(addr uintptr)
