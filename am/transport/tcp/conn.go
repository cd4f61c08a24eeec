//go:build linux

package tcp

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"time"

	"golang.org/x/sys/unix"

	"github.com/amgo-hpc/amgo/am/transport"
)

// Handshake messages (see doc.go).
const (
	magic        = "amgoTCP1"
	version      = 1
	challengeLen = 8 + 4 + 4 + 4 + 16      // magic, version, rank, size, nonce
	helloLen     = 8 + 4 + 4 + 4 + 16 + 32 // magic, version, rank, size, nonce, mac
	welcomeLen   = 4 + 32                  // status, mac
	statusOK     = 1
	statusDup    = 2
)

// Connection states.
const (
	stChallenge = iota // dialer: connecting, then waiting for the challenge
	stWelcome          // dialer: hello sent, waiting for the welcome
	stHello            // acceptor: challenge sent, waiting for the hello
	stOpen             // frames flow
)

// conn is one TCP connection. Everything but fd's use by writers (under the
// peer's mu) belongs to the poller.
type conn struct {
	t      *Transport
	fd     int
	rank   int // peer's rank; -1 for an accepted connection before its hello
	dialed bool
	state  int
	since  time.Time
	nonce  [16]byte // ours
	pnonce [16]byte // the peer's
	eof    bool
	bye    bool // the peer said goodbye
	polled bool // in the epoll set (handshakes; open ones beyond directMax)

	rbuf       []byte
	r, scan, w int // delivered up to r; complete packets up to scan; read up to w

	putLeft int    // bytes of the current put still to read
	putDst  []byte // where they go; nil: discard
}

func newConn(t *Transport, fd, rank int, dialed bool) *conn {
	c := &conn{t: t, fd: fd, rank: rank, dialed: dialed, since: time.Now(), rbuf: make([]byte, initialRead)}
	rand.Read(c.nonce[:])
	return c
}

// dial starts a non-blocking connect to dst and hands the connection to the
// connector goroutine, which runs the dialer's side of the handshake. p.mu is
// held.
func (t *Transport) dial(p *peer, dst int) error {
	fd, err := unix.Socket(t.family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return transport.PeerErrorf(dst, "tcp: rank %d: socket to dial rank %d: %v", t.rank, dst, err)
	}
	_ = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
	t.setCongestion(fd, t.addrs[dst])
	if err := unix.Connect(fd, t.addrs[dst]); err != nil && !errors.Is(err, unix.EINPROGRESS) {
		unix.Close(fd)
		p.err = transport.PeerErrorf(dst, "tcp: rank %d: connect to rank %d: %v", t.rank, dst, err)
		t.anyDead.Store(true)
		return p.err
	}
	c := newConn(t, fd, dst, true)
	c.state = stChallenge
	p.dialing = c
	t.dialMu.Lock()
	t.dials = append(t.dials, c)
	if !t.connecting {
		t.connecting = true
		t.connWG.Add(1)
		go t.connector()
	}
	t.dialMu.Unlock()
	return nil
}

// connSpin is how long the connector polls its sockets without progress
// before it sleeps in ppoll.
const connSpin = 200 * time.Microsecond

// connector runs the dialer's side of handshakes until no dial is left (or
// the transport closes), so that a connection opens, and what Send queued on
// it goes out, even when the dialing rank does not poll.
func (t *Transport) connector() {
	defer t.connWG.Done()
	var mine []*conn
	var fds []unix.PollFd
	last := time.Now()
	for {
		t.dialMu.Lock()
		mine = append(mine, t.dials...)
		t.dials = t.dials[:0]
		if len(mine) == 0 || t.closed.Load() {
			for _, c := range mine {
				unix.Close(c.fd)
			}
			t.connecting = false
			t.dialMu.Unlock()
			return
		}
		t.dialMu.Unlock()
		for i := 0; i < len(mine); i++ {
			done, moved := t.dialStep(mine[i])
			if moved {
				last = time.Now()
			}
			if done {
				mine = append(mine[:i], mine[i+1:]...)
				i--
			}
		}
		if len(mine) == 0 {
			continue
		}
		if time.Since(last) < connSpin {
			runtime.Gosched()
			continue
		}
		fds = fds[:0]
		for _, c := range mine {
			fds = append(fds, unix.PollFd{Fd: int32(c.fd), Events: unix.POLLIN})
		}
		ts := unix.NsecToTimespec(int64(time.Millisecond))
		unix.Ppoll(fds, &ts, nil)
	}
}

// dialStep advances the dialer's handshake on c. done: c has opened (and
// was handed to the poller) or was closed; moved: bytes arrived.
func (t *Transport) dialStep(c *conn) (done, moved bool) {
	p := &t.peers[c.rank]
	p.mu.Lock()
	abandoned := p.dialing != c
	p.mu.Unlock()
	if abandoned { // the peer's own dial won the tie-break
		unix.Close(c.fd)
		return true, false
	}
	w0 := c.w
	switch c.state {
	case stChallenge:
		ok, eof := c.fill(challengeLen)
		if eof {
			return t.dialFailed(c, "connection closed before the challenge"), true
		}
		if !ok {
			return false, c.w > w0
		}
		b := c.rbuf
		if string(b[:8]) != magic || binary.LittleEndian.Uint32(b[8:]) != version ||
			binary.LittleEndian.Uint32(b[12:]) != uint32(c.rank) || binary.LittleEndian.Uint32(b[16:]) != uint32(t.size) {
			return t.dialFailed(c, fmt.Sprintf("the listener is not rank %d of this job", c.rank)), true
		}
		copy(c.pnonce[:], b[20:36])
		c.consume(challengeLen)
		var msg [helloLen]byte
		t.putIntro(msg[:], c.nonce)
		copy(msg[36:], t.mac("amgo-tcp-hello", c.pnonce, c.nonce, t.rank, c.rank, t.size))
		if k, err := unix.Write(c.fd, msg[:]); err != nil || k != len(msg) {
			return t.dialFailed(c, "cannot send the hello"), true
		}
		c.state = stWelcome
		w0 = 0
		fallthrough
	case stWelcome:
		ok, eof := c.fill(welcomeLen)
		if eof {
			return t.dialFailed(c, "connection closed before the welcome"), true
		}
		if !ok {
			return false, true
		}
		status := int(binary.LittleEndian.Uint32(c.rbuf))
		if status != statusOK && status != statusDup ||
			!hmac.Equal(c.rbuf[4:36], t.mac("amgo-tcp-welcome", c.nonce, c.pnonce, c.rank, t.rank, status)) {
			return t.dialFailed(c, fmt.Sprintf("rank %d answered without a valid proof of the job secret", c.rank)), true
		}
		c.consume(welcomeLen)
		p.mu.Lock()
		if status == statusDup || p.dialing != c {
			// The peer keeps the connection it dialed itself (lower rank).
			if p.dialing == c {
				p.dialing = nil
			}
			p.mu.Unlock()
			t.st.duplicates.Add(1)
			unix.Close(c.fd)
			return true, true
		}
		p.dialing = nil
		p.c = c
		c.state = stOpen
		t.flushLocked(p, c.rank)
		p.mu.Unlock()
		t.st.dialed.Add(1)
		// Not in the epoll set yet: the poller's syncPolled decides.
		t.dialMu.Lock()
		t.newOpen = append(t.newOpen, c)
		t.nNew.Add(1)
		t.dialMu.Unlock()
		t.wake()
		return true, true
	}
	return false, false
}

// MaxHandshakes bounds the accepted connections that have not yet proved
// membership of the job. Past it, accepting a connection refuses the oldest
// one in its handshake: a flood of silent connections costs a rank a bounded
// number of descriptors, and a peer's own dial, which proves itself within a
// round trip, is not crowded out unless MaxHandshakes newer connections
// arrive during that round trip.
const MaxHandshakes = 64

// accept takes every pending connection and sends each a challenge. It does
// not wait for the answer: the handshake goes on from later polls (epoll
// reports the hello), so that a connection costs the progress path a few
// non-blocking system calls and nothing more.
func (t *Transport) accept() {
	for {
		fd, sa, err := unix.Accept4(t.lfd, unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
		if err != nil {
			return // EAGAIN, or a transient error; epoll reports the next one
		}
		_ = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
		t.setCongestion(fd, sa)
		c := newConn(t, fd, -1, false)
		c.state = stHello
		var msg [challengeLen]byte
		t.putIntro(msg[:], c.nonce)
		if k, err := unix.Write(fd, msg[:]); err != nil || k != len(msg) {
			unix.Close(fd)
			continue
		}
		if err := unix.EpollCtl(t.epfd, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}); err != nil {
			unix.Close(fd)
			continue
		}
		if len(t.hs) >= MaxHandshakes {
			t.refuse(t.hs[0]) // the oldest: the one least likely to be a peer
		}
		c.polled = true
		t.hs = append(t.hs, c)
		t.byFd[fd] = c
	}
}

// putIntro writes magic, version, this rank, the job size and nonce into b.
func (t *Transport) putIntro(b []byte, nonce [16]byte) {
	copy(b, magic)
	binary.LittleEndian.PutUint32(b[8:], version)
	binary.LittleEndian.PutUint32(b[12:], uint32(t.rank))
	binary.LittleEndian.PutUint32(b[16:], uint32(t.size))
	copy(b[20:], nonce[:])
}

// mac is HMAC-SHA256 with the job secret over label and the handshake's
// fields, so that a proof for one direction, pair or nonce proves nothing else.
func (t *Transport) mac(label string, nonce1, nonce2 [16]byte, r1, r2, x int) []byte {
	m := hmac.New(sha256.New, t.secret)
	m.Write([]byte(label))
	m.Write(nonce1[:])
	m.Write(nonce2[:])
	var b [12]byte
	binary.LittleEndian.PutUint32(b[0:], uint32(r1))
	binary.LittleEndian.PutUint32(b[4:], uint32(r2))
	binary.LittleEndian.PutUint32(b[8:], uint32(x))
	m.Write(b[:])
	return m.Sum(nil)
}

// fill reads into rbuf until it holds n bytes. ok: it does; eof: the peer
// closed or failed.
func (c *conn) fill(n int) (ok, eof bool) {
	for c.w < n {
		k, err := unix.Read(c.fd, c.rbuf[c.w:n])
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			return false, false
		}
		if err != nil || k == 0 {
			return false, true
		}
		c.w += k
	}
	return true, false
}

// consume drops the first n bytes of rbuf (a handshake message).
func (c *conn) consume(n int) {
	c.w = copy(c.rbuf, c.rbuf[n:c.w])
}

// handshake advances the acceptor's side of the handshake on c.
func (c *conn) handshake() {
	t := c.t
	switch c.state {
	case stHello:
		ok, eof := c.fill(helloLen)
		if !ok && c.w >= 8 && string(c.rbuf[:8]) != magic || eof && c.w > 0 {
			t.refuse(c)
			return
		}
		if eof {
			t.dropConn(c) // connected and left without a word: not counted
			return
		}
		if !ok {
			return
		}
		b := c.rbuf
		src := int(binary.LittleEndian.Uint32(b[12:]))
		if string(b[:8]) != magic || binary.LittleEndian.Uint32(b[8:]) != version ||
			binary.LittleEndian.Uint32(b[16:]) != uint32(t.size) || src < 0 || src >= t.size || src == t.rank {
			t.refuse(c)
			return
		}
		copy(c.pnonce[:], b[20:36])
		if !hmac.Equal(b[36:68], t.mac("amgo-tcp-hello", c.nonce, c.pnonce, src, t.rank, t.size)) {
			t.refuse(c)
			return
		}
		c.consume(helloLen)
		c.rank = src
		p := &t.peers[src]
		p.mu.Lock()
		status := statusOK
		if p.c != nil || p.dialing != nil && t.rank < src {
			status = statusDup // keep the connection the lower rank dialed
		}
		if status == statusOK && p.dialing != nil {
			p.dialing = nil // src < us: its dial wins; the connector closes ours
			t.st.duplicates.Add(1)
		}
		p.mu.Unlock()
		var msg [welcomeLen]byte
		binary.LittleEndian.PutUint32(msg[:], uint32(status))
		copy(msg[4:], t.mac("amgo-tcp-welcome", c.pnonce, c.nonce, t.rank, src, status))
		if k, err := unix.Write(c.fd, msg[:]); err != nil || k != len(msg) {
			t.dropConn(c)
			return
		}
		if status == statusDup {
			t.st.duplicates.Add(1)
			unix.Shutdown(c.fd, unix.SHUT_WR)
			t.dropConn(c)
			return
		}
		t.st.accepted.Add(1)
		t.opened(c)
	}
}

// opened moves c from the handshake to the open connections, makes it its
// peer's connection and flushes what Sends queued meanwhile.
func (t *Transport) opened(c *conn) {
	t.removeHs(c)
	c.state = stOpen
	t.open = append(t.open, c)
	t.dirty = true
	p := &t.peers[c.rank]
	p.mu.Lock()
	if p.dialing == c {
		p.dialing = nil
	}
	p.c = c
	t.flushLocked(p, c.rank)
	p.mu.Unlock()
	c.scanFrames()
	c.read()
}

// refuse closes an incoming connection without a valid proof and counts it.
func (t *Transport) refuse(c *conn) {
	t.st.refused.Add(1)
	t.dropConn(c)
}

// dialFailed gives up on our dial c to its peer and closes it; it returns
// true for dialStep.
func (t *Transport) dialFailed(c *conn, why string) bool {
	p := &t.peers[c.rank]
	p.mu.Lock()
	if p.dialing == c {
		p.dialing = nil
		if p.c == nil && p.err == nil {
			p.err = transport.PeerErrorf(c.rank, "tcp: rank %d: dial rank %d: %s", t.rank, c.rank, why)
			p.out, p.head = p.out[:0], 0
			p.pending.Store(false)
			t.anyDead.Store(true)
		}
	}
	p.mu.Unlock()
	unix.Close(c.fd)
	c.fd = -1
	return true
}

// dropConn closes a connection that is not open.
func (t *Transport) dropConn(c *conn) {
	t.removeHs(c)
	t.closeFd(c)
}

func (t *Transport) removeHs(c *conn) {
	for i, h := range t.hs {
		if h == c {
			t.hs = append(t.hs[:i], t.hs[i+1:]...)
			return
		}
	}
}

func (t *Transport) closeFd(c *conn) {
	if c.fd < 0 {
		return
	}
	delete(t.byFd, c.fd)
	if c.polled {
		unix.EpollCtl(t.epfd, unix.EPOLL_CTL_DEL, c.fd, nil)
		c.polled = false
	}
	unix.Close(c.fd)
	c.fd = -1
	t.dirty = true // drop it from the direct set
}

// expireHandshakes refuses connections that have not proved
// membership within HandshakeTimeout.
func (t *Transport) expireHandshakes() {
	now := time.Now()
	for i := 0; i < len(t.hs); i++ {
		if c := t.hs[i]; now.Sub(c.since) > HandshakeTimeout {
			t.refuse(c)
			i--
		}
	}
}

// lost handles the end of an open connection: clean after a goodbye, a
// failure otherwise. The packets already read stay for delivery.
func (c *conn) lost(cause error) {
	t := c.t
	p := &t.peers[c.rank]
	p.mu.Lock()
	if p.c == c {
		if c.bye {
			p.gone = true
		}
		t.failLocked(p, c.rank, cause)
		p.c = nil
	}
	p.mu.Unlock()
	c.putLeft, c.putDst = 0, nil
	t.closeFd(c)
}

// malformed closes a connection whose peer broke the framing.
func (c *conn) malformed(why string) {
	c.t.st.malformed.Add(1)
	c.bye = false
	c.w = c.scan
	c.lost(errors.New(why))
}

// read reads what the socket holds: put data straight into its destination,
// everything else into rbuf, where scanFrames marks complete packets.
func (c *conn) read() {
	t := c.t
	for c.fd >= 0 {
		if c.putLeft > 0 {
			var dst []byte
			if c.putDst != nil {
				dst = c.putDst[len(c.putDst)-c.putLeft:]
				dst = dst[:min(len(dst), putChunk)] // under rawMax
			} else {
				if t.drop == nil {
					t.drop = make([]byte, 256<<10)
				}
				dst = t.drop[:min(c.putLeft, len(t.drop))]
			}
			k, err := readFd(c.fd, dst)
			if !c.check(k, err) {
				return
			}
			t.st.bytesIn.Add(uint64(k))
			if c.putLeft -= k; c.putLeft == 0 {
				c.putDst = nil
			}
			continue
		}
		if c.w == len(c.rbuf) && !c.makeRoom() {
			return
		}
		want := len(c.rbuf) - c.w
		k, err := readFd(c.fd, c.rbuf[c.w:])
		if !c.check(k, err) {
			return
		}
		t.st.bytesIn.Add(uint64(k))
		c.w += k
		c.scanFrames()
		if c.putLeft == 0 && k < want {
			return // drained: save the EAGAIN round trip
		}
	}
}

// check classifies a read's result: true means bytes arrived.
func (c *conn) check(k int, err error) bool {
	if err == nil && k > 0 {
		return true
	}
	if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
		return false
	}
	c.eof = true
	if err == nil {
		err = errors.New("end of stream")
	}
	c.lost(err)
	return false
}

// makeRoom makes room in a full rbuf: moves the unread part to the front or
// grows the buffer (to hold one whole packet, or up to readLimit of
// undelivered packets). false: no room until packets are delivered.
func (c *conn) makeRoom() bool {
	if c.r > 0 {
		n := copy(c.rbuf, c.rbuf[c.r:c.w])
		c.scan -= c.r
		c.w, c.r = n, 0
		if c.w < len(c.rbuf) {
			return true
		}
	}
	need := 2 * len(c.rbuf)
	if c.w-c.scan >= 4 {
		if l := int(binary.LittleEndian.Uint32(c.rbuf[c.scan:])); l <= MaxPacket && c.scan+4+l > len(c.rbuf) {
			need = max(need, c.scan+4+l)
		} else if need > readLimit {
			return false
		}
	} else if need > readLimit {
		return false
	}
	nb := make([]byte, need)
	copy(nb, c.rbuf[:c.w])
	c.rbuf = nb
	return true
}

// scanFrames advances scan over complete packets in rbuf, takes put frames
// out of the stream (their data goes to the destination), and notes a
// goodbye. An invalid frame closes the connection.
func (c *conn) scanFrames() {
	t := c.t
	for c.putLeft == 0 && c.w-c.scan >= 4 {
		word := binary.LittleEndian.Uint32(c.rbuf[c.scan:])
		switch {
		case word <= MaxPacket:
			if c.w-c.scan < 4+int(word) {
				return
			}
			c.scan += 4 + int(word)
		case word == wordPut:
			if c.w-c.scan < putHdr {
				return
			}
			addr := binary.LittleEndian.Uint64(c.rbuf[c.scan+4:])
			n64 := binary.LittleEndian.Uint64(c.rbuf[c.scan+12:])
			if n64 > 1<<40 {
				c.malformed(fmt.Sprintf("put of %d bytes", n64))
				return
			}
			n := int(n64)
			c.putDst = nil
			if rp := t.resolver.Load(); rp != nil {
				if dst, err := (*rp)(addr, n); err == nil && len(dst) == n {
					c.putDst = dst
				}
			}
			t.st.putsIn.Add(1)
			if c.putDst == nil {
				t.st.putsDropped.Add(1)
			}
			body := min(c.w-c.scan-putHdr, n)
			if c.putDst != nil {
				copy(c.putDst, c.rbuf[c.scan+putHdr:c.scan+putHdr+body])
			}
			c.w = c.scan + copy(c.rbuf[c.scan:], c.rbuf[c.scan+putHdr+body:c.w])
			c.putLeft = n - body
			if c.putLeft == 0 {
				c.putDst = nil
			}
		case word == wordBye:
			c.bye = true
			c.w = c.scan // nothing may follow a goodbye
			p := &t.peers[c.rank]
			p.mu.Lock()
			p.gone = true
			p.mu.Unlock()
			return
		default:
			c.malformed(fmt.Sprintf("frame word %#x", word))
			return
		}
	}
}

// deliver hands up to max complete packets to r.
func (c *conn) deliver(r transport.Receiver, max int) int {
	n := 0
	for n < max && c.r < c.scan {
		l := int(binary.LittleEndian.Uint32(c.rbuf[c.r:]))
		pkt := c.rbuf[c.r+4 : c.r+4+l]
		c.r += 4 + l
		c.t.st.pktsIn.Add(1)
		r.Deliver(c.rank, pkt)
		n++
	}
	if c.r == c.w && c.putLeft == 0 {
		c.r, c.scan, c.w = 0, 0, 0
	}
	return n
}

// discard reads and drops input during Close, noting the peer's end.
func (c *conn) discard() {
	var b [4096]byte
	for {
		k, err := unix.Read(c.fd, b[:])
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			return
		}
		if err != nil || k == 0 {
			c.eof = true
			return
		}
	}
}
