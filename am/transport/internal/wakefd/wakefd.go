//go:build linux

// Package wakefd is the wake-up of a network that sleeps in ppoll(2) on its
// socket (udp, xdp): an eventfd that Wake writes and the sleep watches
// beside the socket, and a flag, so that a Wake before a Wait makes that
// Wait return at once and a Wake counts once (transport.Waker).
package wakefd

import (
	"fmt"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Fd is one network's wake-up. Make it with Open.
type Fd struct {
	fd    int
	woken atomic.Bool
}

// Open makes the eventfd. Errors: eventfd(2)'s.
func Open() (*Fd, error) {
	fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	return &Fd{fd: fd}, nil
}

// FD is the eventfd, to watch for POLLIN beside the socket.
func (w *Fd) FD() int { return w.fd }

// Wake makes a sleep in progress end, or else the next one end at once.
func (w *Fd) Wake() {
	w.woken.Store(true)
	var one = [8]byte{1}
	unix.Write(w.fd, one[:])
}

// Woken reports whether a Wake is pending.
func (w *Fd) Woken() bool { return w.woken.Load() }

// Drain consumes the wake that ended a sleep (fired: the eventfd was
// readable, or the flag was seen set) and clears the flag, so that a Wake
// counts once. A Wake after the flag is cleared leaves the eventfd
// readable: the next sleep ends at once.
func (w *Fd) Drain(fired bool) {
	if fired || w.woken.Load() {
		w.woken.Store(false)
		var b [8]byte
		unix.Read(w.fd, b[:])
	}
}

// Close closes the eventfd; on a nil Fd it does nothing.
func (w *Fd) Close() {
	if w != nil {
		unix.Close(w.fd)
	}
}
