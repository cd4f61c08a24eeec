//go:build linux

package tcp

// Tests and benchmarks with ranks in separate processes: the test binary
// re-executes itself (TestChild) with AMGO_TCP_TEST_ROLE set, and the ranks
// meet through a transporttest.FileBootstrap in a temporary directory.

import (
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/amgo-hpc/amgo/am/transport"
	"github.com/amgo-hpc/amgo/am/transport/transporttest"
)

// openAny is openRank with default options, as the shared harness opens ranks.
func openAny(dir string, rank int) (transport.Transport, error) { return openRank(dir, rank, nil) }

func openRank(dir string, rank int, opts map[string]string) (*Transport, error) {
	o := map[string]string{"iface": "lo"}
	for k, v := range opts {
		o[k] = v
	}
	return open(transporttest.ProcBootstrap(dir, rank), o)
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

// putTarget is rank 1's side of a Put exchange (transporttest.PutTarget) into
// a buffer of size bytes, which the put resolver serves by its address.
func putTarget(tr *Transport, size int, sleep bool) error {
	buf := transporttest.PutBuffer(size)
	tr.SetPutResolver(resolverFor(buf))
	return transporttest.PutTarget(tr, buf, sleep)
}

// putSource is rank 0's side (transporttest.PutSource); rank 0 serves no
// puts itself.
func putSource(tr *Transport, put func(addr uintptr) error) error {
	tr.SetPutResolver(func(uint64, int) ([]byte, error) { return nil, errors.New("no segments") })
	return transporttest.PutSource(tr, put)
}

// roundTrip sends msg to rank 1 and waits for "ok".
func roundTrip(tr *Transport, msg string, sleep bool) error {
	if err := transporttest.SendRetry(tr, 1, []byte(msg), nil, nil); err != nil {
		return err
	}
	rx := &transporttest.Last{}
	if err := transporttest.RecvOne(tr, rx, sleep); err != nil || string(rx.Buf) != "ok" {
		return fmt.Errorf("%s: got %q, %v", msg, rx.Buf, err)
	}
	return nil
}

// TestChild is the body of a re-executed rank; it is skipped in a normal run.
func TestChild(t *testing.T) {
	role, rank, n, dir := transporttest.ChildRole()
	if role == "" {
		t.Skip("only runs as a child process of TestProcesses and the process benchmarks")
	}
	if role == "raw" {
		require.NoError(t, rawEcho(dir, n))
		return
	}
	tr, err := openRank(dir, rank, nil)
	require.NoError(t, err)
	switch role {
	case "test":
		require.NoError(t, transporttest.PingPong(tr, 0, n, true), "ping-pong")
		const size = 64 << 20
		if rank == 1 {
			require.NoError(t, putTarget(tr, size, true))
		} else {
			require.NoError(t, putSource(tr, func(addr uintptr) error {
				if err := tr.Put(1, addr, transporttest.PutPattern(size)); err != nil {
					return err
				}
				if err := roundTrip(tr, "check", true); err != nil {
					return err
				}
				return transporttest.SendRetry(tr, 1, []byte("stop"), nil, nil)
			}))
		}
		require.NoError(t, tr.Close())
	case "pingpong", "pingpong-wait":
		require.NoError(t, transporttest.PingPong(tr, 0, n, role == "pingpong-wait"))
		require.NoError(t, tr.Close())
	case "put":
		require.NoError(t, putTarget(tr, n, false))
		require.NoError(t, tr.Close())
	case "die":
		// Connect, then wait to be killed, as a crash would end it.
		require.NoError(t, transporttest.PingPong(tr, 0, 1, true))
		for {
			if _, err := tr.Poll(&transporttest.Last{}, 10); err != nil {
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
	c0, out0 := transporttest.StartChild(t, dir, "test", 0, 2000)
	c1, out1 := transporttest.StartChild(t, dir, "test", 1, 2000)
	err0, err1 := c0.Wait(), c1.Wait()
	require.NoError(t, err0, "rank 0:\n%s", out0)
	require.NoError(t, err1, "rank 1:\n%s", out1)
}

// A peer that is killed surfaces as ErrPeer naming it, from Poll and Send,
// within 5 s.
func TestDeadPeer(t *testing.T) {
	dir := t.TempDir()
	c1, out1 := transporttest.StartChild(t, dir, "die", 1, 0)
	defer c1.Process.Kill()
	tr, err := openRank(dir, 0, nil)
	require.NoError(t, err)
	defer tr.Close()
	require.NoError(t, transporttest.PingPong(tr, 0, 1, true), "%s", out1)
	require.NoError(t, c1.Process.Kill())
	start := time.Now()
	for {
		_, err := tr.Poll(&transporttest.Last{}, 10)
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
func BenchmarkPingPong(b *testing.B) { transporttest.BenchPingPong(b, "pingpong", openAny) }

// BenchmarkPingPongWait is BenchmarkPingPong with Wait between polls (spin,
// then epoll), the way a blocking call waits.
func BenchmarkPingPongWait(b *testing.B) { transporttest.BenchPingPong(b, "pingpong-wait", openAny) }

// BenchmarkPut: Put into a busy-polling child's buffer; MB/s is the bandwidth
// up to the data having landed (a final round trip is included).
func BenchmarkPut(b *testing.B) {
	for _, size := range []int{64 << 10, 1 << 20, 4 << 20} {
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			dir := b.TempDir()
			cmd, out := transporttest.StartChild(b, dir, "put", 1, size)
			tr, err := openRank(dir, 0, nil)
			require.NoError(b, err)
			data := transporttest.PutPattern(size)
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
				return transporttest.SendRetry(tr, 1, []byte("stop"), nil, nil)
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
	cmd, out := transporttest.StartChild(b, dir, "raw", 1, b.N+1000)
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
