package memcopy

// prefetchLines issues PREFETCHT0 for n lines from the one holding a.
//
//go:noescape
func prefetchLines(a uintptr, n int)
