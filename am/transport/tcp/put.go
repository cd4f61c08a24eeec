//go:build linux

package tcp

import (
	"encoding/binary"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/amgo-hpc/amgo/am/transport"
)

// putSpin is how long Put retries a full socket, reading input in between,
// before it sleeps until the socket drains.
const putSpin = 50 * time.Microsecond

// Put writes a put frame (addr, len(data)) followed by data to rank dst's
// connection, straight from data (no copy into the queue), and returns once
// the kernel has taken every byte: data may then be reused. Packets sent to
// dst before Put arrive before the data; packets sent after it (am's
// store-done) arrive after the data has landed. dst reads the data straight
// into the slice its PutResolver gives for (addr, len(data)); if the resolver
// refuses, dst reads and drops it (counted in Stats.PutsDropped), so the
// sender learns of a bad address only through the protocol above.
//
// Put blocks until the data is written, dialing dst first if needed; while the
// socket is full it reads input (without delivering packets) so that two
// ranks putting to each other cannot deadlock. Puts to one peer are
// serialized; Sends to it meanwhile are queued. A Put to this rank itself
// resolves addr locally and copies. Errors: transport.ErrPutUnsupported when
// no PutResolver was installed here (package am installs one on every rank;
// a bare transport has no way to name memory), transport.ErrPeer (dst out of
// range, unreachable, failed or closed), transport.ErrClosed, and the
// resolver's error for a self-put.
func (t *Transport) Put(dst int, addr uintptr, data []byte) error {
	return t.putSend(dst, addr, data, nil, nil, false)
}

// PutSend is Put followed by the packet (hdr, payload), which leaves with the
// data's last piece in one sendmsg rather than in a call of its own: am's
// store-done after the data of a rendezvous. The packet arrives after the
// data has landed; errors as Put, and as Send for the packet
// (transport.ErrTooLarge). When data is empty it is Send.
func (t *Transport) PutSend(dst int, addr uintptr, data, hdr, payload []byte) error {
	if len(hdr)+len(payload) > MaxPacket {
		return fmt.Errorf("tcp: send %d bytes to rank %d, max %d: %w", len(hdr)+len(payload), dst, MaxPacket, transport.ErrTooLarge)
	}
	if len(data) == 0 || dst == t.rank {
		if err := t.Put(dst, addr, data); err != nil {
			return err
		}
		return t.Send(dst, hdr, payload)
	}
	return t.putSend(dst, addr, data, hdr, payload, true)
}

// putSend writes a put frame and data to dst and, when withPkt, the packet
// (hdr, payload) after them in the same stream.
func (t *Transport) putSend(dst int, addr uintptr, data, hdr, payload []byte, withPkt bool) error {
	if t.closed.Load() {
		return transport.ErrClosed
	}
	if uint(dst) >= uint(t.size) {
		return transport.PeerErrorf(dst, "tcp: put from rank %d to rank %d of %d", t.rank, dst, t.size)
	}
	rp := t.resolver.Load()
	if rp == nil {
		return fmt.Errorf("tcp: put to rank %d: no PutResolver installed: %w", dst, transport.ErrPutUnsupported)
	}
	if len(data) == 0 {
		return nil
	}
	if dst == t.rank {
		region, err := (*rp)(uint64(addr), len(data))
		if err != nil {
			return fmt.Errorf("tcp: put to rank %d itself: %w", dst, err)
		}
		copy(region, data)
		return nil
	}
	p := &t.peers[dst]
	p.putMu.Lock()
	defer p.putMu.Unlock()

	// Wait until the connection is open and what was queued before is written.
	var c *conn
	for c == nil {
		p.mu.Lock()
		if p.err == nil && p.gone {
			p.err = transport.PeerErrorf(dst, "tcp: put to rank %d, which has closed", dst)
		}
		if p.err == nil && p.c == nil && p.dialing == nil {
			t.dial(p, dst)
		}
		if p.err != nil {
			err := p.err
			p.mu.Unlock()
			return err
		}
		fd := -1
		if p.c != nil {
			t.flushLocked(p, dst)
			fd = p.c.fd
			if p.err == nil && p.head == len(p.out) {
				c = p.c
				p.putting = true
			}
		}
		p.mu.Unlock()
		if c == nil {
			t.progress(fd, true)
		}
	}
	defer func() {
		p.mu.Lock()
		p.putting = false
		t.flushLocked(p, dst)
		p.mu.Unlock()
	}()

	var ph [putHdr]byte
	binary.LittleEndian.PutUint32(ph[0:], wordPut)
	binary.LittleEndian.PutUint64(ph[4:], uint64(addr))
	binary.LittleEndian.PutUint64(ph[12:], uint64(len(data)))
	var lw [4]byte // the packet's length word
	binary.LittleEndian.PutUint32(lw[:], uint32(len(hdr)+len(payload)))
	end := putHdr + len(data) // where the packet starts in the stream
	total := end
	if withPkt {
		total += len(lw) + len(hdr) + len(payload)
	}
	var idle time.Time
	for off := 0; off < total; {
		p.mu.Lock()
		if p.c != c || p.err != nil {
			err := p.err
			p.mu.Unlock()
			if err == nil {
				err = transport.PeerErrorf(dst, "tcp: put to rank %d: connection closed", dst)
			}
			return err
		}
		var k int
		var err error
		var bufs [maxIov][]byte
		i, upTo := 0, end // buffers used; where in the stream the data of this call ends
		switch {
		case off < putHdr:
			upTo = putHdr + min(len(data), putChunk)
			bufs[0], bufs[1], i = ph[off:], data[:upTo-putHdr], 2
		case off < end:
			d := off - putHdr
			upTo = putHdr + min(len(data), (d/putChunk+1)*putChunk)
			bufs[0], i = data[d:upTo-putHdr], 1
		}
		if withPkt && upTo == end {
			// The data's last piece (or none left): the packet goes with it.
			at := max(off-end, 0)
			for _, b := range [3][]byte{lw[:], hdr, payload} {
				if at >= len(b) {
					at -= len(b)
					continue
				}
				bufs[i] = b[at:]
				at = 0
				i++
			}
		}
		k, err = sendvec(c.fd, &bufs)
		if err != nil {
			err = t.failLocked(p, dst, err)
			p.mu.Unlock()
			return err
		}
		fd := c.fd
		p.mu.Unlock()
		off += k
		t.st.bytesOut.Add(uint64(k))
		if k > 0 {
			idle = time.Time{}
			continue
		}
		// The socket is full: read input meanwhile, spin a little, then sleep
		// until it drains.
		if idle.IsZero() {
			idle = time.Now()
		}
		t.progress(fd, time.Since(idle) < putSpin)
	}
	t.st.putsOut.Add(1)
	if withPkt {
		t.st.pktsOut.Add(1)
	}
	return nil
}

// progress reads input without delivering it (when no other goroutine
// polls), then, unless spin, sleeps up to a millisecond until fd is writable
// or input arrives.
func (t *Transport) progress(fd int, spin bool) {
	if t.pollMu.TryLock() {
		t.flushAll()
		t.pump()
		t.setAvail()
		t.pollMu.Unlock()
	}
	if spin {
		return
	}
	var buf [8]unix.PollFd
	fds := t.sleepFds(buf[:0])
	if fd >= 0 {
		fds = append(fds, unix.PollFd{Fd: int32(fd), Events: unix.POLLOUT})
	}
	ts := unix.NsecToTimespec(int64(time.Millisecond))
	unix.Ppoll(fds, &ts, nil)
}
