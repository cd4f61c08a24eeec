//go:build linux

package tcp

// Tests and benchmarks with ranks in separate processes: the test binary
// re-executes itself (TestChild) with AMGO_TCP_TEST_ROLE set, and the ranks
// meet through a transporttest.FileBootstrap in a temporary directory.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/amgo-hpc/amgo/am/transport"
	"github.com/amgo-hpc/amgo/am/transport/transporttest"
)

const (
	envRole = "AMGO_TCP_TEST_ROLE"
	envRank = "AMGO_TCP_TEST_RANK"
	envDir  = "AMGO_TCP_TEST_DIR"
	envN    = "AMGO_TCP_TEST_N"
)

// startChild re-executes the test binary as rank of a 2-rank job playing role.
func startChild(t testing.TB, dir, role string, rank, n int) (*exec.Cmd, *bytes.Buffer) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestChild$", "-test.bench=^$", "-test.count=1")
	cmd.Env = append(os.Environ(), envRole+"="+role, envRank+"="+strconv.Itoa(rank), envDir+"="+dir,
		envN+"="+strconv.Itoa(n), "GORACE=atexit_sleep_ms=0")
	out := &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start())
	return cmd, out
}

func openRank(dir string, rank int, opts map[string]string) (*Transport, error) {
	o := map[string]string{"iface": "lo"}
	for k, v := range opts {
		o[k] = v
	}
	return open(&transporttest.FileBootstrap{Dir: dir, ID: "proc", R: rank, N: 2, Timeout: 20 * time.Second}, o)
}

// last keeps a copy of the last packet delivered.
type last struct {
	src int
	buf []byte
	n   int
}

func (l *last) Deliver(src int, pkt []byte) {
	l.src = src
	l.buf = append(l.buf[:0], pkt...)
	l.n++
}

// recvOne polls (and, if sleep, waits) until one packet has arrived.
func recvOne(tr *Transport, rx *last, sleep bool) error {
	var deadline time.Time
	for i := 0; ; i++ {
		n, err := tr.Poll(rx, 1)
		if err != nil || n == 1 {
			return err
		}
		if sleep {
			if err := tr.Wait(50 * time.Millisecond); err != nil {
				return err
			}
		}
		if i&1023 == 1023 {
			if deadline.IsZero() {
				deadline = time.Now().Add(20 * time.Second)
			}
			if time.Now().After(deadline) {
				return errors.New("nothing arrived for 20 s")
			}
		}
	}
}

func sendRetry(tr *Transport, dst int, hdr, payload []byte) error {
	for {
		err := tr.Send(dst, hdr, payload)
		if !errors.Is(err, transport.ErrWouldBlock) {
			return err
		}
		if _, err := tr.Poll(&last{}, 0); err != nil {
			return err
		}
		runtime.Gosched()
	}
}

// pingPong runs round trips first..first+n-1 of 8-byte packets; rank 0 starts each.
func pingPong(tr *Transport, first, n int, sleep bool) error {
	rx := &last{}
	msg := make([]byte, 8)
	peer := 1 - tr.Rank()
	for i := first; i < first+n; i++ {
		if tr.Rank() == 0 {
			binary.LittleEndian.PutUint64(msg, uint64(i))
			if err := sendRetry(tr, peer, msg, nil); err != nil {
				return err
			}
		}
		if err := recvOne(tr, rx, sleep); err != nil {
			return fmt.Errorf("round %d: %w", i, err)
		}
		if len(rx.buf) != 8 || binary.LittleEndian.Uint64(rx.buf) != uint64(i) || rx.src != peer {
			return fmt.Errorf("round %d: got %x from %d", i, rx.buf, rx.src)
		}
		if tr.Rank() == 1 {
			if err := sendRetry(tr, peer, rx.buf, nil); err != nil {
				return err
			}
		}
	}
	return nil
}

// resolverFor serves puts into buf, which it names by its address.
func resolverFor(buf []byte) transport.PutResolver {
	base := uint64(uintptr(unsafe.Pointer(&buf[0])))
	return func(addr uint64, n int) ([]byte, error) {
		if addr < base || addr-base > uint64(len(buf)) || uint64(n) > uint64(len(buf))-(addr-base) {
			return nil, fmt.Errorf("[%#x,+%d) outside the buffer", addr, n)
		}
		off := int(addr - base)
		return buf[off : off+n], nil
	}
}

func putPattern(size int) []byte {
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i*7 + i>>12)
	}
	return data
}

// putTarget is rank 1's side of a Put exchange: it publishes a buffer of size
// bytes, then serves until rank 0 says "stop" (verifying the content when rank
// 0 says "check", answering "sync" with "ok").
func putTarget(tr *Transport, size int, sleep bool) error {
	buf := make([]byte, size)
	for i := range buf { // fault the pages in, and make stale content visible
		buf[i] = 0xee
	}
	tr.SetPutResolver(resolverFor(buf))
	msg := binary.LittleEndian.AppendUint64(nil, uint64(uintptr(unsafe.Pointer(&buf[0]))))
	if err := sendRetry(tr, 0, msg, nil); err != nil {
		return err
	}
	rx := &last{}
	for {
		if err := recvOne(tr, rx, sleep); err != nil {
			return err
		}
		switch string(rx.buf) {
		case "stop":
			runtime.KeepAlive(buf)
			return nil
		case "check":
			for i := range buf {
				if buf[i] != byte(i*7+i>>12) {
					return fmt.Errorf("put: byte %d is %#x, want %#x", i, buf[i], byte(i*7+i>>12))
				}
			}
			fallthrough
		case "sync":
			if err := sendRetry(tr, 0, []byte("ok"), nil); err != nil {
				return err
			}
		}
	}
}

// putSource is rank 0's side: it learns the address, then calls put(addr).
func putSource(tr *Transport, put func(addr uintptr) error) error {
	tr.SetPutResolver(func(uint64, int) ([]byte, error) { return nil, errors.New("no segments") })
	rx := &last{}
	if err := recvOne(tr, rx, true); err != nil {
		return err
	}
	if len(rx.buf) != 8 {
		return fmt.Errorf("address packet of %d bytes", len(rx.buf))
	}
	return put(uintptr(binary.LittleEndian.Uint64(rx.buf)))
}

// roundTrip sends msg to rank 1 and waits for "ok".
func roundTrip(tr *Transport, msg string, sleep bool) error {
	if err := sendRetry(tr, 1, []byte(msg), nil); err != nil {
		return err
	}
	rx := &last{}
	if err := recvOne(tr, rx, sleep); err != nil || string(rx.buf) != "ok" {
		return fmt.Errorf("%s: got %q, %v", msg, rx.buf, err)
	}
	return nil
}

// TestChild is the body of a re-executed rank; it is skipped in a normal run.
func TestChild(t *testing.T) {
	role := os.Getenv(envRole)
	if role == "" {
		t.Skip("only runs as a child process of TestProcesses and the process benchmarks")
	}
	rank, _ := strconv.Atoi(os.Getenv(envRank))
	n, _ := strconv.Atoi(os.Getenv(envN))
	dir := os.Getenv(envDir)
	if role == "raw" {
		require.NoError(t, rawEcho(dir, n))
		return
	}
	tr, err := openRank(dir, rank, nil)
	require.NoError(t, err)
	switch role {
	case "test":
		require.NoError(t, pingPong(tr, 0, n, true), "ping-pong")
		const size = 64 << 20
		if rank == 1 {
			require.NoError(t, putTarget(tr, size, true))
		} else {
			require.NoError(t, putSource(tr, func(addr uintptr) error {
				if err := tr.Put(1, addr, putPattern(size)); err != nil {
					return err
				}
				if err := roundTrip(tr, "check", true); err != nil {
					return err
				}
				return sendRetry(tr, 1, []byte("stop"), nil)
			}))
		}
		require.NoError(t, tr.Close())
	case "pingpong", "pingpong-wait":
		require.NoError(t, pingPong(tr, 0, n, role == "pingpong-wait"))
		require.NoError(t, tr.Close())
	case "put":
		require.NoError(t, putTarget(tr, n, false))
		require.NoError(t, tr.Close())
	case "die":
		// Connect, then wait to be killed, as a crash would end it.
		require.NoError(t, pingPong(tr, 0, 1, true))
		for {
			if _, err := tr.Poll(&last{}, 10); err != nil {
				t.Fatal(err)
			}
			tr.Wait(time.Second)
		}
	default:
		t.Fatalf("unknown role %q", role)
	}
}

// Two processes: ping-pong with Wait, then a 64 MiB Put checked byte by byte.
func TestProcesses(t *testing.T) {
	dir := t.TempDir()
	c0, out0 := startChild(t, dir, "test", 0, 2000)
	c1, out1 := startChild(t, dir, "test", 1, 2000)
	err0, err1 := c0.Wait(), c1.Wait()
	require.NoError(t, err0, "rank 0:\n%s", out0)
	require.NoError(t, err1, "rank 1:\n%s", out1)
}

// A peer that is killed surfaces as ErrPeer naming it, from Poll and Send,
// within 5 s.
func TestDeadPeer(t *testing.T) {
	dir := t.TempDir()
	c1, out1 := startChild(t, dir, "die", 1, 0)
	defer c1.Process.Kill()
	tr, err := openRank(dir, 0, nil)
	require.NoError(t, err)
	defer tr.Close()
	require.NoError(t, pingPong(tr, 0, 1, true), "%s", out1)
	require.NoError(t, c1.Process.Kill())
	start := time.Now()
	for {
		_, err := tr.Poll(&last{}, 10)
		if err != nil {
			require.ErrorIs(t, err, transport.ErrPeer)
			require.Contains(t, err.Error(), "rank 1")
			break
		}
		require.NoError(t, tr.Wait(20*time.Millisecond))
		require.Less(t, time.Since(start), 5*time.Second, "dead peer not noticed")
	}
	t.Logf("noticed after %v", time.Since(start))
	c1.Wait()
	require.ErrorIs(t, tr.Send(1, []byte("hello"), nil), transport.ErrPeer)
	tr.SetPutResolver(resolverFor(make([]byte, 1)))
	require.ErrorIs(t, tr.Put(1, 0, []byte("x")), transport.ErrPeer)
}

// BenchmarkPingPong: 8-byte packets between this process (rank 0) and a
// child process (rank 1) over loopback, both busy-polling; ns/op is one round
// trip, and ns/halfrtt half of it.
func BenchmarkPingPong(b *testing.B) { benchPingPong(b, "pingpong") }

// BenchmarkPingPongWait is BenchmarkPingPong with Wait between polls (spin,
// then epoll), the way a blocking call waits.
func BenchmarkPingPongWait(b *testing.B) { benchPingPong(b, "pingpong-wait") }

func benchPingPong(b *testing.B, role string) {
	dir := b.TempDir()
	n := b.N + 1000
	cmd, out := startChild(b, dir, role, 1, n)
	tr, err := openRank(dir, 0, nil)
	require.NoError(b, err)
	require.NoError(b, pingPong(tr, 0, 1000, role == "pingpong-wait")) // warm up
	b.ResetTimer()
	err = pingPong(tr, 1000, b.N, role == "pingpong-wait")
	b.StopTimer()
	require.NoError(b, err)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(2*b.N), "ns/halfrtt")
	require.NoError(b, cmd.Wait(), "%s", out)
	tr.Close()
}

// BenchmarkPut: Put into a busy-polling child's buffer; MB/s is the bandwidth
// up to the data having landed (a final round trip is included).
func BenchmarkPut(b *testing.B) {
	for _, size := range []int{64 << 10, 1 << 20, 4 << 20} {
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			dir := b.TempDir()
			cmd, out := startChild(b, dir, "put", 1, size)
			tr, err := openRank(dir, 0, nil)
			require.NoError(b, err)
			data := putPattern(size)
			b.SetBytes(int64(size))
			err = putSource(tr, func(addr uintptr) error {
				for i := 0; i < 3; i++ { // warm up
					if err := tr.Put(1, addr, data); err != nil {
						return err
					}
				}
				if err := roundTrip(tr, "sync", false); err != nil {
					return err
				}
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if err := tr.Put(1, addr, data); err != nil {
						return err
					}
				}
				if err := roundTrip(tr, "sync", false); err != nil {
					return err
				}
				b.StopTimer()
				return sendRetry(tr, 1, []byte("stop"), nil)
			})
			if err != nil {
				cmd.Wait()
			}
			require.NoError(b, err, "child:\n%s", out)
			require.NoError(b, cmd.Wait(), "%s", out)
			tr.Close()
		})
	}
}

// BenchmarkRawPingPong is the floor under BenchmarkPingPong: the same 8-byte
// ping-pong over one loopback TCP connection between two processes, with
// bare non-blocking read and write system calls in a busy loop and no
// transport. ns/halfrtt is comparable.
func BenchmarkRawPingPong(b *testing.B) {
	dir := b.TempDir()
	cmd, out := startChild(b, dir, "raw", 1, b.N+1000)
	fd, err := rawConn(dir, 0)
	require.NoError(b, err)
	defer unix.Close(fd)
	buf := make([]byte, 8)
	b.ResetTimer()
	for i := 0; i < b.N+1000; i++ {
		if i == 1000 {
			b.ResetTimer()
		}
		if _, err := unix.Write(fd, buf); err != nil {
			b.Fatal(err)
		}
		for got := 0; got < 8; {
			k, err := unix.Read(fd, buf[got:])
			if k > 0 {
				got += k
			} else if !errors.Is(err, unix.EAGAIN) {
				b.Fatal(err)
			}
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(2*b.N), "ns/halfrtt")
	require.NoError(b, cmd.Wait(), "%s", out)
}

// rawConn connects rank 0 and rank 1 with one non-blocking TCP socket: rank 1
// listens and publishes its port in dir.
func rawConn(dir string, rank int) (int, error) {
	bs := &transporttest.FileBootstrap{Dir: dir, ID: "raw", R: rank, N: 2, Timeout: 20 * time.Second}
	if rank == 1 {
		lfd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0)
		if err != nil {
			return -1, err
		}
		defer unix.Close(lfd)
		if err := unix.Bind(lfd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
			return -1, err
		}
		unix.Listen(lfd, 1)
		sa, _ := unix.Getsockname(lfd)
		bs.Put("port", strconv.Itoa(sa.(*unix.SockaddrInet4).Port))
		bs.Fence()
		fd, _, err := unix.Accept4(lfd, unix.SOCK_NONBLOCK)
		if err == nil {
			unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
		}
		return fd, err
	}
	bs.Fence()
	v, err := bs.Get("port")
	if err != nil {
		return -1, err
	}
	port, _ := strconv.Atoi(v)
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0)
	if err != nil {
		return -1, err
	}
	if err := unix.Connect(fd, &unix.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		return -1, err
	}
	unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
	return fd, unix.SetNonblock(fd, true)
}

// rawEcho is rank 1 of BenchmarkRawPingPong.
func rawEcho(dir string, n int) error {
	fd, err := rawConn(dir, 1)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	buf := make([]byte, 8)
	for i := 0; i < n; i++ {
		for got := 0; got < 8; {
			k, err := unix.Read(fd, buf[got:])
			if k > 0 {
				got += k
			} else if !errors.Is(err, unix.EAGAIN) {
				return err
			}
		}
		if _, err := unix.Write(fd, buf); err != nil {
			return err
		}
	}
	return nil
}
