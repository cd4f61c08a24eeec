package dgram

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// Each drop is counted under its reason, wrapped or not; anything else is
// a bad proof.
func TestDropsCount(t *testing.T) {
	var d Drops
	for _, err := range []error{ErrShort, fmt.Errorf("%w: 3 bytes", ErrShort), ErrForeign, ErrMisdirected, ErrProof, errors.New("other")} {
		d.Count(err)
	}
	short, foreign, mis, bad := d.Snapshot()
	require.Equal(t, [4]uint64{2, 1, 1, 2}, [4]uint64{short, foreign, mis, bad})
}

// Two networks' magics and keys keep their datagrams apart.
func TestMagicAndKeySeparateNetworks(t *testing.T) {
	a, err := NewProver(DeriveKey([]byte("0123456789abcdef"), "a"), 0x11111111)
	require.NoError(t, err)
	b, err := NewProver(DeriveKey([]byte("0123456789abcdef"), "b"), 0x22222222)
	require.NoError(t, err)
	d := a.Append(nil, 0, 1, 7, []byte("x"))
	var n [NonceLen]byte
	src, pkt, err := a.Decode(d, 1, 2, &n)
	require.NoError(t, err)
	require.Equal(t, 0, src)
	require.Equal(t, "x", string(pkt))
	_, _, err = b.Decode(d, 1, 2, &n)
	require.ErrorIs(t, err, ErrForeign)
	_, err = NewProver([]byte("short"), 1)
	require.Error(t, err)
}
