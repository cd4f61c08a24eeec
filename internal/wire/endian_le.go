//go:build 386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64 || wasm

package wire

// nativeLittleEndian: this machine stores words little-endian, as the wire
// does, so aligned arguments can be read in place (DecodeImmediate).
const nativeLittleEndian = true
