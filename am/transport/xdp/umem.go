//go:build linux

package xdp

import (
	"errors"
	"fmt"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The UMEM of an interface's ranks. Every AF_XDP socket bound to one
// interface queue must share one UMEM (the kernel keeps one buffer pool per
// queue), so the ranks of a job on one interface share it: the first of them
// (the interface's leader) makes it in a memfd, with the fill and
// completion rings, and hands the others its socket, the memfd, the
// XSKMAP and the program's BPF link over a Unix socket (SCM_RIGHTS); each
// of the others binds its own socket with XDP_SHARED_UMEM and has its own
// rx and tx rings. The memfd holds, after the frames the UMEM registers, a
// control page in every process's mapping:
//
//	offset  size       field
//	0       4          fill ring lock (0 free, 1 taken)
//	64      4          completion ring lock
//	128     4 × tx     one word per send slot: its frame's descriptors in flight
//
// Receive frames are one pool: the kernel takes them from the shared fill
// ring, and whichever rank consumed one returns it there, under the fill
// lock. Send slots (one chunk, or sgChunks adjacent ones for frames
// larger than a chunk) are each rank's own, TxFrames/span/k of them for k
// ranks on the interface: the owner sets a slot's word to the number of
// descriptors of the frame it sends from it, and whichever rank reaps the
// shared completion ring, under its lock, counts each completion off the
// word of the slot it belongs to; a slot is free at zero.
const (
	ctrlFill = 0
	ctrlComp = 64
	ctrlBusy = 128
)

// umemLayout is the shape of an interface's UMEM for k ranks.
type umemLayout struct {
	k     int // ranks on the interface
	txPer int // send slots per rank
	span  int // chunks per send slot: 1, or sgChunks for frames over several chunks
}

// newLayout is the layout for k ranks, with send slots of sgChunks chunks
// when sg (frames larger than a chunk).
func newLayout(k int, sg bool) umemLayout {
	span := 1
	if sg {
		span = sgChunks
	}
	return umemLayout{k: k, txPer: max(TxFrames/span/k, 16), span: span}
}

// frames is the number of chunks the UMEM registers.
func (l umemLayout) frames() int { return RxFrames + l.k*l.txPer*l.span }

// umemBytes is the registered UMEM's size in bytes.
func (l umemLayout) umemBytes() int { return l.frames() * FrameSize }

// memBytes is the memfd's size: the UMEM and the control page(s).
func (l umemLayout) memBytes() int {
	ctrl := ctrlBusy + 4*l.k*l.txPer
	return l.umemBytes() + (ctrl+FrameSize-1)/FrameSize*FrameSize
}

// word returns the control word at offset off of the control page.
func (t *Transport) word(off int) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&t.mem[t.layout.umemBytes()+off]))
}

// busy returns the in-flight word of send slot i (0..k*txPer-1).
func (t *Transport) busy(i int) *atomic.Uint32 { return t.word(ctrlBusy + 4*i) }

// spinLock takes a lock word shared between processes: the holders keep it
// for a few ring entries, so a waiter spins, then yields its thread.
func spinLock(w *atomic.Uint32) {
	for i := 0; !w.CompareAndSwap(0, 1); i++ {
		if i >= 64 {
			runtime.Gosched()
			if i >= 1024 {
				_ = unix.Nanosleep(&unix.Timespec{Nsec: 1000}, nil)
			}
		}
	}
}

func spinUnlock(w *atomic.Uint32) { w.Store(0) }

// shareName is the abstract Unix socket on which an interface's leader
// hands its UMEM to the job's other ranks there (abstract names belong to
// the network namespace, which ranks on one interface share).
func shareName(jobID, ifname string, queue int) string {
	r := strings.NewReplacer("/", "_", "\x00", "_")
	return "@amgo-xdp/" + r.Replace(jobID) + "/" + ifname + "/" + strconv.Itoa(queue)
}

// makeUMEM creates the memfd and maps it (the leader).
func (t *Transport) makeUMEM() error {
	var err error
	if t.memfd, err = unix.MemfdCreate("amgo-xdp-umem", unix.MFD_CLOEXEC); err != nil {
		return fmt.Errorf("memfd_create: %w", err)
	}
	if err := unix.Ftruncate(t.memfd, int64(t.layout.memBytes())); err != nil {
		return fmt.Errorf("size the UMEM's memfd: %w", err)
	}
	return t.mapUMEM()
}

// mapUMEM maps the memfd (every rank on the interface).
func (t *Transport) mapUMEM() error {
	var err error
	t.mem, err = unix.Mmap(t.memfd, 0, t.layout.memBytes(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return fmt.Errorf("map the UMEM (%d bytes): %w", t.layout.memBytes(), err)
	}
	t.umem = t.mem[:t.layout.umemBytes()]
	return nil
}

// share serves the interface's other ranks: each connection gets the
// leader's socket, the memfd, the XSKMAP and the BPF link, until the
// listener closes.
func (t *Transport) share(l *net.UnixListener) {
	lfd := -1
	if l, ok := t.att.lnk.(interface{ FD() int }); ok {
		lfd = l.FD()
	}
	rights := unix.UnixRights(t.fd, t.memfd, t.att.xsks.FD(), lfd)
	for {
		c, err := l.AcceptUnix()
		if err != nil {
			return
		}
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		msg := fmt.Sprintf("%s %d %d", t.att.mode, t.layout.span, t.layout.txPer)
		_, _, _ = c.WriteMsgUnix([]byte(msg), rights, nil)
		c.Close()
	}
}

// fetchShared asks the interface's leader for its socket, memfd, XSKMAP and
// link, and returns them with the leader's attach mode and UMEM layout
// ("mode span txPer").
func fetchShared(name string) (fds []int, mode string, err error) {
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: name, Net: "unix"})
	if err != nil {
		return nil, "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	buf, oob := make([]byte, 64), make([]byte, unix.CmsgSpace(4*4))
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, "", err
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		return nil, "", fmt.Errorf("no descriptors in the leader's answer (%v)", err)
	}
	if fds, err = unix.ParseUnixRights(&msgs[0]); err != nil {
		return nil, "", err
	}
	if len(fds) != 4 {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, "", errors.New("the leader's answer carries a wrong number of descriptors")
	}
	return fds, string(buf[:n]), nil
}
