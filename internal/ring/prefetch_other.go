//go:build !amd64

package ring

// prefetch2 is a no-op where no prefetch instruction is wired up.
func prefetch2(a, b uintptr) {}

// prefetchW is a no-op where no prefetch instruction is wired up.
func prefetchW(a uintptr, n int) {}
