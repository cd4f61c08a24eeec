//go:build !amd64 || race

package ring

import "sync/atomic"

// storeRelease stores v at addr atomically (see release_amd64.go).
func storeRelease(addr *uint64, v uint64) { atomic.StoreUint64(addr, v) }
