//go:build linux

package wakefd

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// readable reports whether the eventfd would end a sleep now.
func readable(t *testing.T, w *Fd) bool {
	fds := []unix.PollFd{{Fd: int32(w.FD()), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, 0)
	require.NoError(t, err)
	return n == 1
}

// A Wake is seen (flag and eventfd), counts once after Drain, and a Wake
// after the drain is seen again.
func TestWakeDrain(t *testing.T) {
	w, err := Open()
	require.NoError(t, err)
	defer w.Close()
	require.False(t, w.Woken())
	require.False(t, readable(t, w))
	w.Wake()
	require.True(t, w.Woken())
	require.True(t, readable(t, w))
	w.Drain(true)
	require.False(t, w.Woken())
	require.False(t, readable(t, w))
	w.Drain(false) // nothing to drain: no block, no change
	go func() { time.Sleep(time.Millisecond); w.Wake() }()
	fds := []unix.PollFd{{Fd: int32(w.FD()), Events: unix.POLLIN}}
	_, err = unix.Poll(fds, 5000)
	require.NoError(t, err)
	require.True(t, w.Woken())
	var nilFd *Fd
	nilFd.Close()
}
