//go:build linux

package tcp

import (
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// rawMax is the largest transfer, in bytes, for which a system call on a
// non-blocking socket skips the Go runtime's system-call bookkeeping
// (entersyscall/exitsyscall). Such a call never sleeps, so the bookkeeping
// buys nothing: on the critical path of a small message it adds to every read
// and sendmsg, and on a transfer that copies for longer than sysmon's 20 us
// tick it is worse: sysmon takes the P away, wakes another thread to run it,
// and that thread preempts the copying one (context switches on every large
// message). Put writes and put-data reads are cut to putChunk bytes so that
// every call stays under rawMax; a garbage collection's stop waits for one
// such copy at most.
const rawMax = putChunk + putHdr

// putChunk is the most put data one sendmsg or read moves, in bytes, so that
// every call stays under rawMax. Under reno (see LocalCongestion) the size of
// the writes barely matters from 512 KiB up, and smaller writes cost
// bandwidth. MPICH's UCX writes 512 KiB per call too.
const putChunk = 512 << 10

// readFd is read(2) on a non-blocking descriptor. It returns the bytes read
// and the errno (nil on success; EAGAIN when nothing is there).
func readFd(fd int, b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	var n uintptr
	var e syscall.Errno
	if len(b) <= rawMax {
		n, _, e = unix.RawSyscall(unix.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
	} else {
		n, _, e = unix.Syscall(unix.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
	}
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// epollReady is epoll_wait(2) with a zero timeout: it never sleeps, so it
// skips the runtime's bookkeeping too.
func epollReady(epfd int, evs []unix.EpollEvent) (int, error) {
	n, _, e := unix.RawSyscall6(unix.SYS_EPOLL_WAIT, uintptr(epfd), uintptr(unsafe.Pointer(&evs[0])), uintptr(len(evs)), 0, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}
