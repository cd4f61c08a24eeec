//go:build amd64 && !race

package ring

// storeRelease stores v at addr with release semantics and no fence: a plain
// MOV, which x86-64's total store order never lets pass an earlier store, so a
// reader that loads v (atomically) also sees every store before it. Go's
// atomic Store is an XCHG, a full barrier that must own the line it writes
// before it completes: publishing a record with it waited for the transfer of
// the consumer's line after the record's other lines had drained, one after
// the other (see Producer.Fence for the one place that needs a full barrier).
// The race detector cannot see this synchronization, so race builds use the
// atomic store (release_other.go).
//
//go:noescape
func storeRelease(addr *uint64, v uint64)
