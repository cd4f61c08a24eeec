//go:build !(386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64 || wasm)

package wire

// nativeLittleEndian is false: arguments are always decoded by copy.
const nativeLittleEndian = false
