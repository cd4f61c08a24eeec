//go:build linux

package udp

// Tests and benchmarks with ranks in separate processes, through the
// reliability layer as package am uses udp: the test binary re-executes
// itself (TestChild) with AMGO_UDP_TEST_ROLE set, and the ranks meet through
// a transporttest.FileBootstrap in a temporary directory.

import (
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/amgo-hpc/amgo/am/internal/reliable"
	"github.com/amgo-hpc/amgo/am/transport"
	"github.com/amgo-hpc/amgo/am/transport/transporttest"
	"github.com/amgo-hpc/amgo/internal/wire"
)

// openRank opens rank's udp transport on loopback and wraps it in the
// reliability layer with its default configuration, as am.New does.
func openRank(dir string, rank int, rcfg reliable.Config) (transport.Transport, *Transport, error) {
	raw, err := open(transporttest.ProcBootstrap(dir, rank),
		map[string]string{"iface": "lo"})
	if err != nil {
		return nil, nil, err
	}
	w, err := reliable.Wrap(raw, rcfg, nil)
	if err != nil {
		raw.Close()
		return nil, nil, err
	}
	return w, raw, nil
}

// packet encodes a medium request carrying payload and index i.
func packet(src int, i uint64, payload []byte) (hdr []byte) {
	h := wire.Header{Kind: wire.KindRequestMedium, NArgs: 1, Src: uint32(src), Len: uint32(len(payload))}
	hdr = make([]byte, h.EncodedLen())
	wire.Encode(hdr, &h, []uint64{i})
	return hdr
}

// last keeps the last packet delivered, decoded.
type last struct {
	src     int
	i       uint64
	payload []byte
	n       int
	bytes   int
	check   func(i uint64, payload []byte) error
	err     error
}

func (l *last) Deliver(src int, pkt []byte) {
	var h wire.Header
	var args [wire.MaxArgs]uint64
	payload, err := wire.Decode(pkt, &h, &args)
	if err != nil {
		l.err = err
		return
	}
	l.src, l.i = src, args[0]
	l.payload = append(l.payload[:0], payload...)
	l.n++
	l.bytes += len(payload)
	if l.check != nil && l.err == nil {
		l.err = l.check(args[0], payload)
	}
}

// recvOne polls (and, if sleep, waits) until one more packet has arrived.
func recvOne(tr transport.Transport, rx *last, sleep bool) error {
	want := rx.n + 1
	return transporttest.PollFor(tr, rx, sleep, func() (bool, error) { return rx.n >= want, rx.err })
}

// pingPong runs round trips first..first+n-1 of 8-byte payloads; rank 0
// starts each.
func pingPong(tr transport.Transport, first, n int, sleep bool) error {
	rx := &last{}
	msg := make([]byte, 8)
	peer := 1 - tr.Rank()
	for i := first; i < first+n; i++ {
		if tr.Rank() == 0 {
			if err := transporttest.SendRetry(tr, peer, packet(0, uint64(i), msg), msg, rx); err != nil {
				return err
			}
		}
		if err := recvOne(tr, rx, sleep); err != nil {
			return fmt.Errorf("round %d: %w", i, err)
		}
		if rx.i != uint64(i) || rx.src != peer || len(rx.payload) != 8 {
			return fmt.Errorf("round %d: got packet %d from %d", i, rx.i, rx.src)
		}
		if tr.Rank() == 1 {
			if err := transporttest.SendRetry(tr, peer, packet(1, uint64(i), msg), msg, rx); err != nil {
				return err
			}
		}
	}
	return nil
}

// chunk is the payload of one bulk packet: the largest multiple of 1 KiB that
// fits a udp packet with its header.
const chunk = (MaxPacket - wire.MaxHeaderLen) &^ 1023

func fill(b []byte, i uint64) {
	for j := range b {
		b[j] = byte(uint64(j)*7 + i*13)
	}
}

func checkFill(i uint64, b []byte) error {
	for j := range b {
		if b[j] != byte(uint64(j)*7+i*13) {
			return fmt.Errorf("packet %d: byte %d is %#x, want %#x", i, j, b[j], byte(uint64(j)*7+i*13))
		}
	}
	return nil
}

// stream sends total bytes to rank 1 in packets of chunk payload bytes numbered from first, then
// waits for rank 1's "ok" (index ^0) that it has received them all.
func stream(tr transport.Transport, total int, first uint64, check bool, chunk int) (uint64, error) {
	rx := &last{}
	buf := make([]byte, chunk)
	i := first
	for sent := 0; sent < total; i++ {
		k := min(chunk, total-sent)
		if check {
			fill(buf[:k], i)
		}
		if err := transporttest.SendRetry(tr, 1, packet(0, i, buf[:k]), buf[:k], rx); err != nil {
			return i, err
		}
		sent += k
	}
	if err := transporttest.SendRetry(tr, 1, packet(0, 1<<63, nil), nil, rx); err != nil {
		return i, err
	}
	if err := recvOne(tr, rx, false); err != nil {
		return i, err
	}
	if rx.i != 1<<63 {
		return i, fmt.Errorf("expected the sink's ok, got packet %d", rx.i)
	}
	return i, nil
}

// sink is rank 1 of stream: it answers every end marker with "ok" until a
// packet with index ^0-1 says stop. With check, it verifies every packet's
// bytes and that packets arrive in order.
func sink(tr transport.Transport, check bool) error {
	rx := &last{}
	var next uint64
	if check {
		rx.check = func(i uint64, p []byte) error {
			if i == 1<<63 || i == 1<<63+1 {
				return nil
			}
			if i != next {
				return fmt.Errorf("packet %d arrived when %d was due", i, next)
			}
			next++
			return checkFill(i, p)
		}
	}
	for {
		if err := recvOne(tr, rx, false); err != nil {
			return err
		}
		switch rx.i {
		case 1 << 63:
			if err := transporttest.SendRetry(tr, 0, packet(1, 1<<63, nil), nil, rx); err != nil {
				return err
			}
		case 1<<63 + 1:
			return nil
		}
	}
}

func stopSink(tr transport.Transport) error {
	return transporttest.SendRetry(tr, 1, packet(0, 1<<63+1, nil), nil, &last{})
}

// linger keeps polling for a while so that the peer's last packets are
// acknowledged before this rank closes.
func linger(tr transport.Transport, d time.Duration) {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		tr.Poll(&last{}, 64)
		tr.Wait(time.Millisecond)
	}
}

// TestChild is the body of a re-executed rank; it is skipped in a normal run.
func TestChild(t *testing.T) {
	role, rank, n, dir := transporttest.ChildRole()
	if role == "" {
		t.Skip("only runs as a child process of TestProcesses and the process benchmarks")
	}
	rcfg := reliable.Config{}
	if role == "raw" {
		rcfg.ProgressInterval = -1
	}
	tr, raw, err := openRank(dir, rank, rcfg)
	require.NoError(t, err)
	switch role {
	case "raw":
		require.NoError(t, pingPong(raw, 0, n, false))
		raw.Close()
		return
	case "test":
		require.NoError(t, pingPong(tr, 0, n, true), "ping-pong")
		require.NoError(t, sink(tr, true))
	case "pingpong", "pingpong-wait":
		require.NoError(t, pingPong(tr, 0, n, role == "pingpong-wait"))
	case "sink":
		require.NoError(t, sink(tr, false))
	case "die":
		require.NoError(t, pingPong(tr, 0, 1, true))
		for {
			tr.Poll(&last{}, 10)
			tr.Wait(time.Second)
		}
	default:
		t.Fatalf("unknown role %q", role)
	}
	linger(tr, 100*time.Millisecond)
	t.Logf("rank %d: %+v", rank, raw.Stats())
	require.NoError(t, tr.Close())
}

// Two processes through the reliability layer: ping-pong with Wait, then
// 64 MiB in 64 KiB datagrams, checked in order and byte by byte. Loopback
// loses datagrams when a socket buffer overflows; the layer recovers them.
func TestProcesses(t *testing.T) {
	dir := t.TempDir()
	c1, out1 := transporttest.StartChild(t, dir, "test", 1, 2000)
	tr, raw, err := openRank(dir, 0, reliable.Config{})
	require.NoError(t, err)
	defer tr.Close()
	require.NoError(t, pingPong(tr, 0, 2000, true), "%s", out1)
	_, err = stream(tr, 64<<20, 0, true, chunk)
	require.NoError(t, err, "%s", out1)
	require.NoError(t, stopSink(tr))
	linger(tr, 100*time.Millisecond)
	require.NoError(t, c1.Wait(), "rank 1:\n%s", out1)
	t.Logf("rank 0: %+v; reliability layer: %+v", raw.Stats(), tr.(interface{ Stats() reliable.Stats }).Stats())
}

// A peer that is killed surfaces as ErrPeer naming it, through the
// reliability layer's DeadAfter.
func TestDeadPeer(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: waits for DeadAfter")
	}
	dir := t.TempDir()
	c1, out1 := transporttest.StartChild(t, dir, "die", 1, 0)
	defer c1.Process.Kill()
	cfg := reliable.Config{DeadAfter: 500 * time.Millisecond}
	tr, _, err := openRank(dir, 0, cfg)
	require.NoError(t, err)
	defer tr.Close()
	require.NoError(t, pingPong(tr, 0, 1, true), "%s", out1)
	require.NoError(t, c1.Process.Kill())
	c1.Wait()
	start := time.Now()
	msg := []byte("are you there")
	var perr error
	for perr == nil {
		if err := tr.Send(1, packet(0, 7, msg), msg); err != nil && !errors.Is(err, transport.ErrWouldBlock) {
			perr = err
			break
		}
		_, perr = tr.Poll(&last{}, 10)
		require.NoError(t, tr.Wait(20*time.Millisecond))
		require.Less(t, time.Since(start), 5*time.Second, "dead peer not noticed")
	}
	t.Logf("noticed after %v: %v", time.Since(start), perr)
	require.ErrorIs(t, perr, transport.ErrPeer)
	require.Contains(t, perr.Error(), "rank 1")
}

// BenchmarkPingPong: 8-byte payloads (64-byte packets) between this process
// (rank 0) and a child process (rank 1) over loopback, through the
// reliability layer, both busy-polling; ns/halfrtt is half a round trip.
func BenchmarkPingPong(b *testing.B) { benchPingPong(b, "pingpong") }

// BenchmarkPingPongWait is BenchmarkPingPong with Wait between polls (spin,
// then ppoll), the way a blocking call waits.
func BenchmarkPingPongWait(b *testing.B) { benchPingPong(b, "pingpong-wait") }

func benchPingPong(b *testing.B, role string) {
	dir := b.TempDir()
	n := b.N + 1000
	cmd, out := transporttest.StartChild(b, dir, role, 1, n)
	tr, _, err := openRank(dir, 0, reliable.Config{})
	require.NoError(b, err)
	require.NoError(b, pingPong(tr, 0, 1000, role == "pingpong-wait")) // warm up
	b.ResetTimer()
	err = pingPong(tr, 1000, b.N, role == "pingpong-wait")
	b.StopTimer()
	require.NoError(b, err)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(2*b.N), "ns/halfrtt")
	linger(tr, 50*time.Millisecond)
	require.NoError(b, cmd.Wait(), "%s", out)
	tr.Close()
}

// BenchmarkBandwidth: 1 MiB transfers from this process to a busy-polling
// child through the reliability layer, in packets of 64 KiB (the largest)
// and of 16 KiB (package am's default per-peer buffer bounds its packets to
// about that); MB/s counts the payload up to the child's acknowledgement of
// the last byte (one final round trip per run, not per transfer), retx/MiB
// the retransmissions (datagrams the receiving socket's buffer dropped).
func BenchmarkBandwidth(b *testing.B) {
	for _, size := range []int{chunk, 16 << 10} {
		b.Run(fmt.Sprintf("packet=%dKiB", (size+1023)>>10), func(b *testing.B) {
			dir := b.TempDir()
			cmd, out := transporttest.StartChild(b, dir, "sink", 1, 0)
			tr, _, err := openRank(dir, 0, reliable.Config{})
			require.NoError(b, err)
			i, err := stream(tr, 4<<20, 0, false, size) // warm up
			require.NoError(b, err, "%s", out)
			before := tr.(interface{ Stats() reliable.Stats }).Stats()
			b.SetBytes(1 << 20)
			b.ResetTimer()
			_, err = stream(tr, b.N<<20, i, false, size)
			b.StopTimer()
			require.NoError(b, err, "%s", out)
			after := tr.(interface{ Stats() reliable.Stats }).Stats()
			b.ReportMetric(float64(after.Retransmits-before.Retransmits)/float64(b.N), "retx/MiB")
			require.NoError(b, stopSink(tr))
			linger(tr, 50*time.Millisecond)
			require.NoError(b, cmd.Wait(), "%s", out)
			tr.Close()
		})
	}
}

// BenchmarkRawPingPong is the floor under BenchmarkPingPong: the same
// 8-byte ping-pong between two udp transports without the reliability layer
// (no datagram was lost on loopback in these runs; a loss would stall it).
func BenchmarkRawPingPong(b *testing.B) {
	dir := b.TempDir()
	cmd, out := transporttest.StartChild(b, dir, "raw", 1, b.N+1000)
	_, raw, err := openRank(dir, 0, reliable.Config{ProgressInterval: -1})
	require.NoError(b, err)
	require.NoError(b, pingPong(raw, 0, 1000, false))
	b.ResetTimer()
	err = pingPong(raw, 1000, b.N, false)
	b.StopTimer()
	require.NoError(b, err)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(2*b.N), "ns/halfrtt")
	require.NoError(b, cmd.Wait(), "%s", out)
	raw.Close()
}

// BenchmarkProof: the cost of proving (or checking) one datagram of n
// bytes of packet.
func BenchmarkProof(b *testing.B) {
	for _, n := range []int{64, 1024, 65000} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			pr := mustProver(b, DeriveKey([]byte("bench-secret-0123")))
			d := make([]byte, FrameHeader+n, Overhead+n)
			pr.PutFrame(d, 0, 1, 1)
			var nonce [NonceLen]byte
			b.SetBytes(int64(n))
			for i := 0; i < b.N; i++ {
				pr.Seal(d, &nonce)
			}
		})
	}
}
