//go:build !amd64 || race

package release

import "sync/atomic"

// Store64 stores v at addr atomically (see the package documentation).
func Store64(addr *uint64, v uint64) { atomic.StoreUint64(addr, v) }

// Store32 is Store64 for a 32-bit word.
func Store32(addr *uint32, v uint32) { atomic.StoreUint32(addr, v) }

// Kept64 is Store64; an atomic store is never dead.
func Kept64(addr *uint64, v uint64) { atomic.StoreUint64(addr, v) }
