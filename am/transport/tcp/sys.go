//go:build linux

package tcp

import (
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// rawMax is the largest transfer, in bytes, for which a system call on a
// non-blocking socket skips the Go runtime's system-call bookkeeping
// (entersyscall/exitsyscall: handing the P to sysmon and taking it back).
// Such a call never sleeps, so the bookkeeping buys nothing, and on the
// critical path of a small message it costs a read and a sendmsg each about
// 0.1-0.2 us on a 2-vCPU KVM guest. Larger transfers (put data, big packets)
// copy for long enough that they go through the runtime, so that a garbage
// collection need not wait for them.
const rawMax = 128 << 10

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
