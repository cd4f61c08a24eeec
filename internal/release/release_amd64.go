//go:build amd64 && !race

package release

// Store64 stores v at addr with release semantics and no fence (see the
// package documentation).
//
//go:noescape
func Store64(addr *uint64, v uint64)

// Store32 is Store64 for a 32-bit word.
//
//go:noescape
func Store32(addr *uint32, v uint32)
