// Package membarrier gives the two sides of an asymmetric memory barrier with
// Linux's membarrier(2): a sender that publishes and then checks whether its
// receiver sleeps needs no fence of its own (the light side), because a
// receiver about to sleep runs Heavy, which makes every thread of every
// registered process pass a full barrier, between announcing that it sleeps
// and checking for arrivals once more (the heavy side).
//
// # Why no wake-up is lost
//
// The sender runs: publish (a release store); if waiters != 0 { wake }.
// The receiver runs: waiters++; Heavy(); if ready() { return }; sleep.
// Without a fence the sender's load of waiters may complete before its
// publication leaves its store buffer. If that load saw 0, it executed before
// the receiver's increment was visible, hence before Heavy began; Heavy puts a
// full barrier on the sender's CPU (or the sender was switched out, which is
// one) after that load and so after the publication, which is therefore
// visible when Heavy returns, and the receiver's ready() sees it. This is the
// pattern membarrier(2) was added for (the "asymmetric fence" of liburcu and
// Folly); the heavy side costs an inter-processor interrupt per CPU that runs a
// registered process, microseconds, paid only by a receiver that is about to
// sleep anyway.
//
// Enabled registers the process once (MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED)
// and tries one heavy barrier; a sender may skip its fence only when Enabled
// reports true, and a receiver runs Heavy whenever Enabled reports true.
// Every amgo process on a host runs the same kernel, so all of them agree.
// Where the kernel lacks the command or a seccomp filter refuses it, Enabled
// reports false and senders keep their fence (ring.Producer.Fence).
package membarrier

import (
	"sync"

	"golang.org/x/sys/unix"
)

// Commands of membarrier(2) (include/uapi/linux/membarrier.h).
const (
	cmdQuery                   = 0
	cmdGlobalExpedited         = 1 << 1
	cmdRegisterGlobalExpedited = 1 << 2
)

var (
	once    sync.Once
	enabled bool
)

// Enabled reports whether this process is registered for expedited global
// barriers and one has worked: then senders in it may publish without a fence,
// and its receivers must call Heavy before their last check. The first call
// registers (a system call or three); later calls are one load.
func Enabled() bool {
	once.Do(func() { enabled = setup() })
	return enabled
}

func setup() bool {
	cmds, _, errno := unix.Syscall(unix.SYS_MEMBARRIER, cmdQuery, 0, 0)
	if errno != 0 || cmds&(cmdGlobalExpedited|cmdRegisterGlobalExpedited) != cmdGlobalExpedited|cmdRegisterGlobalExpedited {
		return false
	}
	if _, _, errno := unix.Syscall(unix.SYS_MEMBARRIER, cmdRegisterGlobalExpedited, 0, 0); errno != 0 {
		return false
	}
	return heavy() == nil
}

// Heavy is the heavy side: when it returns, every store that any thread of a
// registered process executed before Heavy began is visible to the caller. It
// does nothing when Enabled is false. Errors: the system call's (ENOSYS,
// EPERM, EINVAL), which only a change of seccomp filter after Enabled could
// cause.
func Heavy() error {
	if !Enabled() {
		return nil
	}
	return heavy()
}

func heavy() error {
	if _, _, errno := unix.Syscall(unix.SYS_MEMBARRIER, cmdGlobalExpedited, 0, 0); errno != 0 {
		return errno
	}
	return nil
}
