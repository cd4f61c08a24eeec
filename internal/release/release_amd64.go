//go:build amd64 && !race

package release

// Store64 stores v at addr with release semantics and no fence: a plain MOV,
// inlined at the call site (see the package documentation for what the
// compiler may and may not do with it).
func Store64(addr *uint64, v uint64) { *addr = v }

// Store32 is Store64 for a 32-bit word.
func Store32(addr *uint32, v uint32) { *addr = v }

// Kept64 is Store64 made by a call the compiler cannot see into, so that no
// later store to the same word can make it dead (see the package
// documentation).
//
//go:noescape
func Kept64(addr *uint64, v uint64)
