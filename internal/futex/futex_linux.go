//go:build linux

package futex

import (
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/amgo-hpc/amgo/internal/membarrier"
)

// Operations of futex(2). Deliberately without FUTEX_PRIVATE_FLAG: the word may
// be in a MAP_SHARED mapping, and private futexes are keyed by address space.
const (
	opWait = 0 // FUTEX_WAIT
	opWake = 1 // FUTEX_WAKE
)

// Sleep blocks the calling thread while *addr == val, for at most d (d <= 0:
// no limit). It returns nil when woken, when *addr != val on entry, when a
// signal interrupts it, and when d passes: the caller re-checks its condition
// in every case. Other errors wrap the errno.
func Sleep(addr *atomic.Uint32, val uint32, d time.Duration) error {
	var ts *unix.Timespec
	var tsv unix.Timespec
	if d > 0 {
		tsv = unix.NsecToTimespec(d.Nanoseconds())
		ts = &tsv
	}
	_, _, e := unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), opWait, uintptr(val),
		uintptr(unsafe.Pointer(ts)), 0, 0)
	switch e {
	case 0, unix.EAGAIN, unix.EINTR, unix.ETIMEDOUT:
		return nil
	}
	return fmt.Errorf("futex: wait on %p: %w", addr, e)
}

// Wake wakes up to n threads sleeping on addr and returns how many it woke.
// Errors wrap the errno.
func Wake(addr *atomic.Uint32, n int) (int, error) {
	if n > math.MaxInt32 {
		n = math.MaxInt32
	}
	r, _, e := unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), opWake, uintptr(n), 0, 0, 0)
	if e != 0 {
		return 0, fmt.Errorf("futex: wake on %p: %w", addr, e)
	}
	return int(r), nil
}

// DoorbellLen is the number of bytes a Doorbell occupies in its memory.
const DoorbellLen = 8

// ErrAlign: the memory given to NewDoorbell is too short or not 4-byte aligned.
var ErrAlign = errors.New("futex: doorbell memory too short or misaligned")

// Doorbell is a wake-up signal from senders to one receiver over a futex word
// in (possibly shared) memory. The zero value is not usable; see NewDoorbell.
// A Doorbell is a small value that may be copied.
type Doorbell struct {
	seq     *atomic.Uint32 // bumped by a sender that finds sleepers; futex word
	waiters *atomic.Uint32 // receivers announced asleep
}

// NewDoorbell returns the doorbell in mem[0:DoorbellLen], which must be 4-byte
// aligned. Zeroed memory is a valid doorbell with nobody asleep; every process
// that maps the memory calls NewDoorbell on it. Errors: ErrAlign.
func NewDoorbell(mem []byte) (Doorbell, error) {
	if len(mem) < DoorbellLen || uintptr(unsafe.Pointer(&mem[0]))&3 != 0 {
		return Doorbell{}, ErrAlign
	}
	return Doorbell{
		seq:     (*atomic.Uint32)(unsafe.Pointer(&mem[0])),
		waiters: (*atomic.Uint32)(unsafe.Pointer(&mem[4])),
	}, nil
}

// Ring wakes the receiver if it sleeps. Call it after publishing what the
// receiver should see: after a full barrier, or with none where
// membarrier.Enabled (Wait then runs the heavy side; see the package
// documentation). It costs one atomic load when nobody sleeps; otherwise
// it wakes every sleeper. A failing wake is ignored: the receiver's timeout
// covers it. Its common case inlines into the sender's path.
func (d Doorbell) Ring() {
	if d.waiters.Load() != 0 {
		wakeAll(d.seq)
	}
}

// wakeAll is Ring with a sleeper: the sequence word seq bumped, every
// sleeper woken. (Never inlined: in Ring it would take Ring over the
// inlining budget.)
//
//go:noinline
func wakeAll(seq *atomic.Uint32) {
	seq.Add(1)
	_, _ = Wake(seq, math.MaxInt32)
}

// Sleeping reports whether a receiver has announced that it sleeps.
func (d Doorbell) Sleeping() bool { return d.waiters.Load() != 0 }

// Wait returns true as soon as ready() does; ready must not block and must not
// change what it reports on its own (it checks for arrivals). Wait first spins
// calling ready for about spin, then announces itself asleep, calls ready once
// more and sleeps until a sender rings, for at most timeout in total (measured
// from the call). A signal does not end the sleep early; only a ring (any ring,
// including one meant for an earlier wait) or the timeout does. It returns
// ready()'s last answer: false after the timeout or a ring that found nothing
// ready. Errors come from the futex system call.
func (d Doorbell) Wait(ready func() bool, spin, timeout time.Duration) (bool, error) {
	start := time.Now()
	if spin > timeout {
		spin = timeout
	}
	for i := 0; ; i++ {
		if ready() {
			return true, nil
		}
		if i&63 == 63 && time.Since(start) >= spin {
			break
		}
	}
	left := timeout - time.Since(start)
	if left <= 0 {
		return ready(), nil
	}
	s := d.seq.Load()
	d.waiters.Add(1)
	if membarrier.Heavy() != nil {
		// A sender that skipped its fence may not be visible yet: do not
		// sleep. An early return, which callers allow (as loop's bell does);
		// the network is fine, so it is no error of Wait's.
		d.waiters.Add(^uint32(0))
		return ready(), nil
	}
	if ready() {
		d.waiters.Add(^uint32(0))
		return true, nil
	}
	// Sleep again after a wake-up that no ring caused (a signal, such as the
	// runtime's preemption SIGURG, interrupts futex_wait with EINTR): only a
	// ring or the timeout ends the sleep.
	var err error
	for {
		if err = Sleep(d.seq, s, left); err != nil || d.seq.Load() != s {
			break
		}
		if left = timeout - time.Since(start); left <= 0 {
			break
		}
	}
	d.waiters.Add(^uint32(0))
	return ready(), err
}
