//go:build linux

package tcp

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/amgo-hpc/amgo/am/transport"
	"github.com/amgo-hpc/amgo/am/transport/transporttest"
)

const testSecret = "00112233445566778899aabbccddeeff"

// pollUntil polls every transport until cond holds (20 s at most).
func pollUntil(t *testing.T, ts []*Transport, rx []*transporttest.Last, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		for i, tr := range ts {
			_, err := tr.Poll(rx[i], 64)
			require.NoError(t, err, "rank %d", i)
		}
		require.True(t, time.Now().Before(deadline), "condition not met after 20 s")
		runtime.Gosched()
	}
}

func closeAll(ts []*Transport) {
	for _, tr := range ts {
		tr.Close()
	}
}

// exchange checks that packets still flow both ways between ranks 0 and 1.
func exchange(t *testing.T, ts []*Transport) {
	t.Helper()
	rx := []*transporttest.Last{{}, {}}
	require.NoError(t, ts[0].Send(1, []byte("ping"), nil))
	pollUntil(t, ts, rx, func() bool { return rx[1].N == 1 })
	require.Equal(t, "ping", string(rx[1].Buf))
	require.NoError(t, ts[1].Send(0, []byte("pong"), nil))
	pollUntil(t, ts, rx, func() bool { return rx[0].N == 1 })
	require.Equal(t, "pong", string(rx[0].Buf))
}

// hello builds a dialer's hello for challenge ch, as rank src of a job of
// size, with secret.
func hello(ch []byte, src, size int, secret []byte) []byte {
	msg := make([]byte, helloLen)
	copy(msg, magic)
	binary.LittleEndian.PutUint32(msg[8:], version)
	binary.LittleEndian.PutUint32(msg[12:], uint32(src))
	binary.LittleEndian.PutUint32(msg[16:], uint32(size))
	nonce := bytes.Repeat([]byte{7}, 16)
	copy(msg[20:], nonce)
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("amgo-tcp-hello"))
	m.Write(ch[20:36])
	m.Write(nonce)
	var b [12]byte
	binary.LittleEndian.PutUint32(b[0:], uint32(src))
	binary.LittleEndian.PutUint32(b[4:], binary.LittleEndian.Uint32(ch[12:]))
	binary.LittleEndian.PutUint32(b[8:], uint32(size))
	m.Write(b[:])
	copy(msg[36:], m.Sum(nil))
	return msg
}

// intruder runs f on a raw connection to addr on its own goroutine.
func intruder(addr string, f func(c net.Conn) error) chan error {
	done := make(chan error, 1)
	go func() {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(20 * time.Second))
		done <- f(c)
	}()
	return done
}

// closedByPeer reads until the other side closes (or resets the connection).
func closedByPeer(c net.Conn) error {
	_, err := io.Copy(io.Discard, c)
	if errors.Is(err, syscall.ECONNRESET) {
		return nil
	}
	return err
}

// Connections from outside the job are refused, closed and counted; the
// job's traffic goes on.
func TestRefuseOutsiders(t *testing.T) {
	ts := openJob(t, 2, map[string]string{"secret": testSecret})
	defer closeAll(ts)
	exchange(t, ts)
	rx := []*transporttest.Last{{}, {}}
	addr := ts[1].Addr()

	// Garbage.
	done := intruder(addr, func(c net.Conn) error {
		if _, err := c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n" + string(bytes.Repeat([]byte{0}, 100)))); err != nil {
			return err
		}
		return closedByPeer(c)
	})
	pollUntil(t, ts, rx, func() bool { return ts[1].Stats().Refused == 1 })
	require.NoError(t, <-done)

	// A well-formed hello with a proof made with the wrong secret, claiming
	// to be rank 0.
	done = intruder(addr, func(c net.Conn) error {
		ch := make([]byte, challengeLen)
		if _, err := io.ReadFull(c, ch); err != nil {
			return err
		}
		if string(ch[:8]) != magic {
			return errors.New("no challenge")
		}
		if _, err := c.Write(hello(ch, 0, 2, []byte("not the job secret"))); err != nil {
			return err
		}
		return closedByPeer(c)
	})
	pollUntil(t, ts, rx, func() bool { return ts[1].Stats().Refused == 2 })
	require.NoError(t, <-done)

	// A hello replayed from another connection (the nonce differs).
	var ch0 []byte
	done = intruder(addr, func(c net.Conn) error {
		ch0 = make([]byte, challengeLen)
		_, err := io.ReadFull(c, ch0)
		return err
	})
	pollUntil(t, ts, rx, func() bool { return len(done) == 1 })
	require.NoError(t, <-done)
	secret, _ := hex.DecodeString(testSecret)
	done = intruder(addr, func(c net.Conn) error {
		ch := make([]byte, challengeLen)
		if _, err := io.ReadFull(c, ch); err != nil {
			return err
		}
		if _, err := c.Write(hello(ch0, 0, 2, secret)); err != nil {
			return err
		}
		return closedByPeer(c)
	})
	pollUntil(t, ts, rx, func() bool { return ts[1].Stats().Refused == 3 })
	require.NoError(t, <-done)

	exchange(t, ts)
	require.Equal(t, uint64(1), ts[1].Stats().Accepted)
	require.Zero(t, ts[1].Stats().Malformed)
}

// A member that breaks the framing is cut off and reported as failed; the
// transport does not panic.
func TestMalformedFrame(t *testing.T) {
	secret, _ := hex.DecodeString(testSecret)
	for _, word := range []uint32{MaxPacket + 1, 0x9000_0000} {
		ts := openJob(t, 2, map[string]string{"secret": testSecret})
		done := intruder(ts[1].Addr(), func(c net.Conn) error {
			ch := make([]byte, challengeLen)
			if _, err := io.ReadFull(c, ch); err != nil {
				return err
			}
			if _, err := c.Write(hello(ch, 0, 2, secret)); err != nil {
				return err
			}
			w := make([]byte, welcomeLen)
			if _, err := io.ReadFull(c, w); err != nil {
				return err
			}
			if binary.LittleEndian.Uint32(w) != statusOK {
				return errors.New("not welcome")
			}
			// One good packet, then a bad length word.
			frame := binary.LittleEndian.AppendUint32(nil, 3)
			frame = append(frame, "abc"...)
			frame = binary.LittleEndian.AppendUint32(frame, word)
			frame = append(frame, make([]byte, 64)...)
			if _, err := c.Write(frame); err != nil {
				return err
			}
			return closedByPeer(c)
		})
		rx := &transporttest.Last{}
		deadline := time.Now().Add(20 * time.Second)
		var err error
		for err == nil {
			_, err = ts[1].Poll(rx, 10)
			require.True(t, time.Now().Before(deadline))
		}
		require.ErrorIs(t, err, transport.ErrPeer)
		require.Contains(t, err.Error(), "rank 0")
		require.Equal(t, "abc", string(rx.Buf), "the packet before the bad frame is delivered")
		require.Equal(t, uint64(1), ts[1].Stats().Malformed)
		require.NoError(t, <-done)
		closeAll(ts)
	}
}

// When both ranks dial each other at once, the connection dialed by the
// lower rank is kept, the other one is closed cleanly, and nothing is lost.
func TestSimultaneousDial(t *testing.T) {
	for run := 0; run < 10; run++ {
		ts := openJob(t, 2, nil)
		const k = 50
		for i := 0; i < k; i++ {
			var b [4]byte
			binary.LittleEndian.PutUint32(b[:], uint32(i))
			require.NoError(t, ts[0].Send(1, b[:], nil))
			require.NoError(t, ts[1].Send(0, b[:], nil))
		}
		got := [2][]uint32{}
		rx := []transport.Receiver{recvFunc(func(src int, pkt []byte) { got[0] = append(got[0], binary.LittleEndian.Uint32(pkt)) }),
			recvFunc(func(src int, pkt []byte) { got[1] = append(got[1], binary.LittleEndian.Uint32(pkt)) })}
		deadline := time.Now().Add(20 * time.Second)
		for len(got[0]) < k || len(got[1]) < k {
			for i, tr := range ts {
				_, err := tr.Poll(rx[i], 64)
				require.NoError(t, err)
			}
			require.True(t, time.Now().Before(deadline), "got %d and %d packets", len(got[0]), len(got[1]))
		}
		for r := range got {
			for i, v := range got[r] {
				require.Equal(t, uint32(i), v, "rank %d packet %d", r, i)
			}
		}
		// Let the loser's close arrive (poll until each rank holds one open
		// connection and none in its handshake, or 10 s pass), then check:
		// one connection each, the one rank 0 dialed.
		settled := func() bool {
			for _, tr := range ts {
				tr.pollMu.Lock()
				ok := len(tr.open) == 1 && len(tr.hs) == 0
				tr.pollMu.Unlock()
				if !ok {
					return false
				}
			}
			return true
		}
		for deadline := time.Now().Add(10 * time.Second); !settled() && time.Now().Before(deadline); {
			for j, tr := range ts {
				_, err := tr.Poll(rx[j], 64)
				require.NoError(t, err)
			}
		}
		s0, s1 := ts[0].Stats(), ts[1].Stats()
		require.Equal(t, uint64(1), s0.Dialed, "%+v", s0)
		require.Equal(t, uint64(0), s0.Accepted, "%+v", s0)
		require.Equal(t, uint64(1), s1.Accepted, "%+v", s1)
		require.Equal(t, uint64(0), s1.Dialed, "%+v", s1)
		require.NotZero(t, s0.Duplicates+s1.Duplicates)
		require.Zero(t, s0.Refused+s1.Refused)
		for _, tr := range ts {
			tr.pollMu.Lock()
			require.Len(t, tr.open, 1)
			require.Empty(t, tr.hs)
			tr.pollMu.Unlock()
		}
		closeAll(ts)
	}
}

type recvFunc func(src int, pkt []byte)

func (f recvFunc) Deliver(src int, pkt []byte) { f(src, pkt) }

// A peer's Close is not a failure: Poll stays quiet, Send says the peer closed.
func TestPeerCloses(t *testing.T) {
	ts := openJob(t, 2, nil)
	defer closeAll(ts)
	exchange(t, ts)
	closed := make(chan error)
	go func() { closed <- ts[1].Close() }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := ts[0].Poll(&transporttest.Last{}, 10)
		require.NoError(t, err)
		if err := ts[0].Send(1, []byte("x"), nil); err != nil {
			require.ErrorIs(t, err, transport.ErrPeer)
			require.Contains(t, err.Error(), "closed")
			break
		}
		require.True(t, time.Now().Before(deadline))
	}
	require.NoError(t, <-closed)
	for i := 0; i < 10; i++ {
		_, err := ts[0].Poll(&transporttest.Last{}, 10)
		require.NoError(t, err)
	}
}

// base is the fake address at which rank 1's test buffer is registered.
const base = 0x7000_0000

func fakeResolver(buf []byte) transport.PutResolver {
	return func(addr uint64, n int) ([]byte, error) {
		if addr < base || addr-base > uint64(len(buf)) || uint64(n) > uint64(len(buf))-(addr-base) {
			return nil, errors.New("outside the segment")
		}
		return buf[addr-base : addr-base+uint64(n)], nil
	}
}

// Put streams into the buffer the receiver's resolver names; a refused
// range is dropped and counted; without a resolver Put is unsupported.
func TestPut(t *testing.T) {
	ts := openJob(t, 2, nil)
	defer closeAll(ts)
	require.ErrorIs(t, ts[0].Put(1, base, []byte{1}), transport.ErrPutUnsupported)
	bufs := [][]byte{make([]byte, 4<<20), make([]byte, 4<<20)}
	for i, tr := range ts {
		tr.SetPutResolver(fakeResolver(bufs[i]))
	}
	rx := []*transporttest.Last{{}, {}}
	for i, c := range []struct{ off, n int }{{0, 1}, {3, 1000}, {4096, 64 << 10}, {100, 3 << 20}, {0, 4 << 20}} {
		data := transporttest.PutPattern(c.n)
		for j := range data {
			data[j] += byte(i)
		}
		before := bytes.Clone(bufs[1])
		errc := make(chan error, 1)
		go func() {
			if err := ts[0].Put(1, base+uintptr(c.off), data); err != nil {
				errc <- err
				return
			}
			errc <- ts[0].Send(1, []byte("done"), nil) // ordered after the data
		}()
		n := rx[1].N
		pollUntil(t, ts[1:], rx[1:], func() bool { return rx[1].N > n })
		require.NoError(t, <-errc)
		require.Equal(t, "done", string(rx[1].Buf))
		require.Equal(t, data, bufs[1][c.off:c.off+c.n], "put %+v", c)
		require.Equal(t, before[:c.off], bufs[1][:c.off])
		require.Equal(t, before[c.off+c.n:], bufs[1][c.off+c.n:])
	}
	require.Equal(t, uint64(5), ts[1].Stats().PutsReceived)

	// Outside the segment: dropped, counted, and the stream goes on.
	before := bytes.Clone(bufs[1])
	errc := make(chan error, 1)
	go func() {
		if err := ts[0].Put(1, base+4<<20-10, make([]byte, 100<<10)); err != nil {
			errc <- err
			return
		}
		errc <- ts[0].Send(1, []byte("after"), nil)
	}()
	pollUntil(t, ts[1:], rx[1:], func() bool { return string(rx[1].Buf) == "after" })
	require.NoError(t, <-errc)
	require.Equal(t, before, bufs[1])
	require.Equal(t, uint64(1), ts[1].Stats().PutsDropped)

	// To itself: a local copy through the resolver.
	require.NoError(t, ts[1].Put(1, base+8, []byte("self")))
	require.Equal(t, "self", string(bufs[1][8:12]))
	require.Error(t, ts[1].Put(1, base+4<<20, []byte("x")))
}

// PutSend sends its packet with the data's last piece: the packet arrives
// once the data has landed, for data of one piece and of several (putChunk),
// to a peer and to this rank itself.
func TestPutSend(t *testing.T) {
	ts := openJob(t, 2, nil)
	defer closeAll(ts)
	bufs := [][]byte{make([]byte, 4<<20), make([]byte, 4<<20)}
	for i, tr := range ts {
		tr.SetPutResolver(fakeResolver(bufs[i]))
	}
	rx := []*transporttest.Last{{}, {}}
	cases := []struct{ off, n int }{{0, 1}, {3, 1000}, {4096, 64 << 10}, {0, putChunk}, {8, putChunk + 1}, {100, 3 << 20}}
	for i, c := range cases {
		data := transporttest.PutPattern(c.n)
		for j := range data {
			data[j] += byte(i)
		}
		before := bytes.Clone(bufs[1])
		pkts := ts[0].Stats().PacketsSent
		errc := make(chan error, 1)
		go func() { errc <- ts[0].PutSend(1, base+uintptr(c.off), data, []byte("done"), []byte{byte(i)}) }()
		n := rx[1].N
		pollUntil(t, ts[1:], rx[1:], func() bool { return rx[1].N > n })
		require.NoError(t, <-errc)
		require.Equal(t, "done"+string([]byte{byte(i)}), string(rx[1].Buf))
		require.Equal(t, data, bufs[1][c.off:c.off+c.n], "put %+v", c)
		require.Equal(t, before[:c.off], bufs[1][:c.off])
		require.Equal(t, before[c.off+c.n:], bufs[1][c.off+c.n:])
		require.Equal(t, pkts+1, ts[0].Stats().PacketsSent)
	}
	require.Equal(t, uint64(len(cases)), ts[1].Stats().PutsReceived)

	// To itself: a local copy, then the packet.
	require.NoError(t, ts[1].PutSend(1, base+8, []byte("self"), []byte("mine"), nil))
	require.Equal(t, "self", string(bufs[1][8:12]))
	pollUntil(t, ts[1:], rx[1:], func() bool { return string(rx[1].Buf) == "mine" })
	require.ErrorIs(t, ts[0].PutSend(1, base, []byte("x"), make([]byte, MaxPacket+1), nil), transport.ErrTooLarge)
}

// Two ranks putting large buffers to each other at once, with nobody
// polling, do not deadlock: a blocked Put reads its input (the first Put
// to finish then needs its rank to poll for the other to finish).
func TestPutBothWays(t *testing.T) {
	ts := openJob(t, 2, nil)
	defer closeAll(ts)
	const size = 16 << 20
	bufs := [][]byte{make([]byte, size), make([]byte, size)}
	for i, tr := range ts {
		tr.SetPutResolver(fakeResolver(bufs[i]))
	}
	exchange(t, ts)
	errs := make(chan error, 2)
	for r := range ts {
		go func() {
			data := bytes.Repeat([]byte{byte(r + 1)}, size)
			if err := ts[r].Send(1-r, []byte("before"), nil); err != nil {
				errs <- err
				return
			}
			errs <- ts[r].Put(1-r, base, data)
		}()
	}
	// Once one Put is done, its rank must poll for the other to finish.
	rx := []*transporttest.Last{{}, {}}
	var done []error
	for len(done) < 2 {
		select {
		case err := <-errs:
			done = append(done, err)
		default:
			if len(done) == 1 {
				pollUntil(t, ts, rx, func() bool { return len(errs) > 0 })
			}
		}
	}
	require.NoError(t, done[0])
	require.NoError(t, done[1])
	for i := range ts {
		require.NoError(t, ts[i].Send(1-i, []byte("end"), nil))
	}
	pollUntil(t, ts, rx, func() bool { return string(rx[0].Buf) == "end" && string(rx[1].Buf) == "end" })
	require.Equal(t, bytes.Repeat([]byte{2}, size), bufs[0])
	require.Equal(t, bytes.Repeat([]byte{1}, size), bufs[1])
}

func TestBadSecret(t *testing.T) {
	var err error
	// A secret that is not hex of 16 bytes or more is an error.
	for _, s := range []string{"zz", "0011"} {
		_, err = New(transporttest.NewBootstraps(1, "bad-secret")[0], map[string]string{"secret": s, "iface": "lo"})
		require.Error(t, err)
	}
}

// congestionOf is the congestion control of rank from's connection to rank to.
func congestionOf(t *testing.T, ts []*Transport, from, to int) string {
	t.Helper()
	p := &ts[from].peers[to]
	p.mu.Lock()
	defer p.mu.Unlock()
	require.NotNil(t, p.c, "rank %d has no connection to rank %d", from, to)
	cc, err := unix.GetsockoptString(p.c.fd, unix.IPPROTO_TCP, unix.TCP_CONGESTION)
	require.NoError(t, err)
	return strings.TrimRight(cc, "\x00")
}

func TestCongestionControl(t *testing.T) {
	sys, err := os.ReadFile("/proc/sys/net/ipv4/tcp_congestion_control")
	require.NoError(t, err)
	system := strings.TrimSpace(string(sys))

	for _, tc := range []struct{ opt, want string }{
		{"", LocalCongestion}, // same host: both ends get reno
		{"system", system},
		{"reno", "reno"},
	} {
		t.Run("opt="+tc.opt, func(t *testing.T) {
			ts := openJob(t, 2, map[string]string{"congestion": tc.opt})
			defer closeAll(ts)
			exchange(t, ts)
			require.Equal(t, tc.want, congestionOf(t, ts, 0, 1), "dialer's end")
			require.Equal(t, tc.want, congestionOf(t, ts, 1, 0), "acceptor's end")
		})
	}

	t.Run("unknown name", func(t *testing.T) {
		bs := transporttest.NewBootstraps(1, fmt.Sprintf("tcptest-%d", jobSeq.Add(1)))
		_, err := open(bs[0], map[string]string{"iface": "127.0.0.1", "congestion": "no-such-algorithm"})
		require.ErrorContains(t, err, `congestion control "no-such-algorithm"`)
	})

	t.Run("same host", func(t *testing.T) {
		tr := &Transport{ip: netip.MustParseAddr("10.1.2.3")}
		require.True(t, tr.sameHost(&unix.SockaddrInet4{Addr: [4]byte{10, 1, 2, 3}}))
		require.True(t, tr.sameHost(&unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}))
		require.True(t, tr.sameHost(&unix.SockaddrInet6{Addr: netip.IPv6Loopback().As16()}))
		require.True(t, tr.sameHost(&unix.SockaddrInet6{Addr: netip.MustParseAddr("::ffff:10.1.2.3").As16()}))
		require.False(t, tr.sameHost(&unix.SockaddrInet4{Addr: [4]byte{10, 1, 2, 4}}))
		require.False(t, tr.sameHost(&unix.SockaddrUnix{Name: "x"}))
	})
}

// Silent connections from outside the job (a port scanner, a stuck client)
// arriving at a steady rate cost a rank neither its progress nor unbounded
// descriptors: accepting does not wait for their handshake, at most
// MaxHandshakes of them are held (the oldest is refused to make room), and
// the job's ping-pong goes on. The times with and without the churn are
// logged for comparison (benchmarks, not this test, judge speed).
func TestSilentConnectionChurn(t *testing.T) {
	ts := openJob(t, 2, map[string]string{"secret": testSecret})
	defer closeAll(ts)
	exchange(t, ts)
	rx := []*transporttest.Last{{}, {}}
	const rounds = 20000
	maxHs := 0
	pingPong := func() time.Duration {
		start := time.Now()
		for i := 0; i < rounds; i++ {
			for k, dst := range []int{1, 0} {
				want := rx[dst].N + 1
				require.NoError(t, ts[1-dst].Send(dst, []byte("ping"), nil), "round %d/%d", i, k)
				pollUntil(t, ts, rx, func() bool { return rx[dst].N == want })
				maxHs = max(maxHs, len(ts[1].hs))
			}
		}
		return time.Since(start)
	}
	quiet := pingPong()

	stop := make(chan struct{})
	dialed := make(chan int)
	go func() {
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
			dialed <- len(conns)
		}()
		tick := time.NewTicker(time.Second / 800)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			c, err := net.Dial("tcp", ts[1].Addr())
			if err != nil {
				continue
			}
			conns = append(conns, c) // silent, and kept open
		}
	}()
	time.Sleep(100 * time.Millisecond) // the churn is under way
	churned := pingPong()
	close(stop)
	n := <-dialed
	t.Logf("%d ping-pongs: %v quiet, %v with %d silent connections dialed at 800/s", rounds, quiet, churned, n)
	require.LessOrEqual(t, maxHs, MaxHandshakes)
	if n > MaxHandshakes {
		pollUntil(t, ts, rx, func() bool { return ts[1].Stats().Refused >= uint64(n-MaxHandshakes) })
	}
	exchange(t, ts)
}
