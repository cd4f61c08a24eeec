package shmem

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

// Two mappings of one file see each other's stores, after the name is gone.
func TestCreateOpenShare(t *testing.T) {
	if _, err := os.Stat(Dir); err != nil {
		t.Skipf("no %s: %v", Dir, err)
	}
	name, a, err := Create("amgo-test-", 8192)
	require.NoError(t, err)
	b, err := Open(name, 8192)
	require.NoError(t, err)
	require.NoError(t, Remove(name))
	_, err = os.Stat(name)
	require.True(t, os.IsNotExist(err))
	a[0], a[8191] = 7, 9
	require.Equal(t, byte(7), b[0])
	require.Equal(t, byte(9), b[8191])
	b[100] = 5
	require.Equal(t, byte(5), a[100])
	require.NoError(t, Unmap(a))
	require.NoError(t, Unmap(b))

	_, err = Open(name, 8192)
	require.Error(t, err, "removed")
	_, _, err = Create("amgo-test-", 0)
	require.Error(t, err)
	name, a, err = Create("amgo-test-", 4096)
	require.NoError(t, err)
	_, err = Open(name, 8192)
	require.Error(t, err, "wrong size")
	require.NoError(t, Remove(name))
	require.NoError(t, Unmap(a))
}
