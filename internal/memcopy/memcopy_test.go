package memcopy

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// Copy copies what the built-in copy would, at every size around the piece
// boundaries, and reports the same count.
func TestCopyMatchesBuiltin(t *testing.T) {
	for _, n := range []int{0, 1, Piece - 1, Piece, Min - 1, Min, Min + 1, 5*Piece + 7, Max, Max + 1} {
		for _, dn := range []int{n, n + 3, max(n-5, 0)} {
			src := make([]byte, n)
			for i := range src {
				src[i] = byte(i*7 + i>>12)
			}
			want := bytes.Repeat([]byte{0xee}, dn)
			got := bytes.Repeat([]byte{0xee}, dn)
			wn := copy(want, src)
			require.Equal(t, wn, Copy(got, src), "src %d dst %d", n, dn)
			require.True(t, bytes.Equal(want, got), "src %d dst %d", n, dn)
		}
	}
}

// BenchmarkCopy compares the built-in copy with Copy on buffers the caches
// may hold (the same pair each iteration), by size: on amd64 the built-in
// copy stores around the caches from 1 MiB.
func BenchmarkCopy(b *testing.B) {
	for _, n := range []int{512 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20} {
		src, dst := make([]byte, n), make([]byte, n)
		b.Run(fmt.Sprintf("builtin/%dKiB", n>>10), func(b *testing.B) {
			b.SetBytes(int64(n))
			for b.Loop() {
				copy(dst, src)
			}
		})
		b.Run(fmt.Sprintf("pieces/%dKiB", n>>10), func(b *testing.B) {
			b.SetBytes(int64(n))
			for b.Loop() {
				Copy(dst, src)
			}
		})
	}
}

// Overlapping slices are copied as the built-in copy copies them, both ways.
func TestCopyOverlapping(t *testing.T) {
	n := Min + 3*Piece/2
	for _, shift := range []int{1, 4096, Piece + 8} {
		want := make([]byte, n+shift)
		for i := range want {
			want[i] = byte(i*13 + i>>10)
		}
		got := append([]byte(nil), want...)
		wantBack := append([]byte(nil), want...)
		gotBack := append([]byte(nil), want...)
		copy(want[shift:], want[:n])
		require.Equal(t, n, Copy(got[shift:], got[:n]))
		require.True(t, bytes.Equal(want, got), "forward by %d", shift)
		copy(wantBack[:n], wantBack[shift:])
		require.Equal(t, n, Copy(gotBack[:n], gotBack[shift:]))
		require.True(t, bytes.Equal(wantBack, gotBack), "backward by %d", shift)
	}
}
