//go:build linux

package shm

// Tests and benchmarks with ranks in separate processes: the test binary
// re-executes itself (TestChild) with AMGO_SHM_TEST_ROLE set, and the ranks meet
// through a transporttest.FileBootstrap in a temporary directory.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/amgo-hpc/amgo/am/transport"
	"github.com/amgo-hpc/amgo/am/transport/transporttest"
)

const (
	envRole = "AMGO_SHM_TEST_ROLE"
	envRank = "AMGO_SHM_TEST_RANK"
	envDir  = "AMGO_SHM_TEST_DIR"
	envN    = "AMGO_SHM_TEST_N"
)

// startChild re-executes the test binary as rank of a 2-rank job playing role.
func startChild(t testing.TB, dir, role string, rank, n int) (*exec.Cmd, *bytes.Buffer) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestChild$", "-test.bench=^$", "-test.count=1")
	cmd.Env = append(os.Environ(), envRole+"="+role, envRank+"="+strconv.Itoa(rank), envDir+"="+dir,
		envN+"="+strconv.Itoa(n))
	out := &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start())
	return cmd, out
}

func openRank(dir string, rank int, opts map[string]string) (*Transport, error) {
	o := map[string]string{"dir": dir}
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

// putTarget is rank 1's side of a Put exchange: it publishes a buffer of size
// bytes, then serves until rank 0 says "stop" (verifying the content when rank 0
// says "check").
func putTarget(tr *Transport, size int) error {
	buf := make([]byte, size)
	for i := range buf { // fault the pages in, and make stale content visible
		buf[i] = 0xee
	}
	var pin runtime.Pinner
	pin.Pin(&buf[0])
	defer pin.Unpin()
	msg := binary.LittleEndian.AppendUint64(nil, uint64(uintptr(unsafe.Pointer(&buf[0]))))
	if err := sendRetry(tr, 0, msg, nil); err != nil {
		return err
	}
	rx := &last{}
	for {
		if err := recvOne(tr, rx, true); err != nil {
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
			if err := sendRetry(tr, 0, []byte("ok"), nil); err != nil {
				return err
			}
		}
	}
}

// putSource is rank 0's side: it learns the address, then calls put(addr).
func putSource(tr *Transport, put func(addr uintptr) error) error {
	rx := &last{}
	if err := recvOne(tr, rx, true); err != nil {
		return err
	}
	if len(rx.buf) != 8 {
		return fmt.Errorf("address packet of %d bytes", len(rx.buf))
	}
	return put(uintptr(binary.LittleEndian.Uint64(rx.buf)))
}

func putPattern(size int) []byte {
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i*7 + i>>12)
	}
	return data
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
	if role == "flag" {
		require.NoError(t, flagChild(dir, n))
		return
	}
	tr, err := openRank(dir, rank, nil)
	require.NoError(t, err)
	switch role {
	case "test":
		require.NoError(t, pingPong(tr, 0, n, true), "ping-pong")
		const size = 4 << 20
		if rank == 1 {
			require.NoError(t, putTarget(tr, size))
		} else {
			require.NoError(t, putSource(tr, func(addr uintptr) error {
				if err := tr.Put(1, addr, putPattern(size)); err != nil {
					return err
				}
				if err := sendRetry(tr, 1, []byte("check"), nil); err != nil {
					return err
				}
				rx := &last{}
				if err := recvOne(tr, rx, true); err != nil || string(rx.buf) != "ok" {
					return fmt.Errorf("check: %q, %v", rx.buf, err)
				}
				// An unmapped address is a clear error, not a crash.
				err := tr.Put(1, 8, []byte{1})
				if err == nil || !strings.Contains(err.Error(), "not mapped") {
					return fmt.Errorf("put to address 8: %v", err)
				}
				return sendRetry(tr, 1, []byte("stop"), nil)
			}))
		}
		require.NoError(t, tr.Close())
	case "pingpong", "pingpong-wait":
		require.NoError(t, pingPong(tr, 0, n, role == "pingpong-wait"))
		require.NoError(t, tr.Close())
	case "put":
		require.NoError(t, putTarget(tr, n))
		require.NoError(t, tr.Close())
	case "die":
		// Exit without Close, as a crash would.
		os.Exit(0)
	default:
		t.Fatalf("unknown role %q", role)
	}
}

func TestProcesses(t *testing.T) {
	dir := t.TempDir()
	c0, out0 := startChild(t, dir, "test", 0, 2000)
	c1, out1 := startChild(t, dir, "test", 1, 2000)
	err0, err1 := c0.Wait(), c1.Wait()
	require.NoError(t, err0, "rank 0:\n%s", out0)
	require.NoError(t, err1, "rank 1:\n%s", out1)
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range entries {
		require.False(t, strings.HasPrefix(e.Name(), "shm."), "left behind: %s", e.Name())
	}
}

// A peer that exits without Close surfaces as ErrPeer, from Poll and Send.
func TestDeadPeer(t *testing.T) {
	dir := t.TempDir()
	c1, out1 := startChild(t, dir, "die", 1, 0)
	tr, err := openRank(dir, 0, map[string]string{"ring_bytes": "4k"})
	require.NoError(t, err)
	defer tr.Close()
	require.NoError(t, c1.Wait(), "%s", out1)
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := tr.Poll(&last{}, 10)
		if err != nil {
			require.ErrorIs(t, err, transport.ErrPeer)
			require.Contains(t, err.Error(), "rank 1")
			break
		}
		require.NoError(t, tr.Wait(20*time.Millisecond))
		require.True(t, time.Now().Before(deadline), "dead peer not noticed")
	}
	for i := 0; ; i++ {
		err := tr.Send(1, []byte("hello"), nil)
		if errors.Is(err, transport.ErrPeer) {
			break
		}
		require.True(t, err == nil || errors.Is(err, transport.ErrWouldBlock), "%v", err)
		require.Less(t, i, 1000)
	}
}

// BenchmarkPingPongProc: 8-byte packets between this process (rank 0) and a
// child process (rank 1), both busy-polling; ns/op is one round trip, and
// ns/halfrtt half of it.
func BenchmarkPingPongProc(b *testing.B) { benchPingPong(b, "pingpong") }

// BenchmarkPingPongProcWait is BenchmarkPingPongProc with Wait between polls
// (spin, then futex), the way a blocking call waits.
func BenchmarkPingPongProcWait(b *testing.B) { benchPingPong(b, "pingpong-wait") }

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

// BenchmarkPutProc: single-copy Put (process_vm_writev) into a child process's
// buffer; MB/s is the bandwidth.
func BenchmarkPutProc(b *testing.B) {
	for _, size := range []int{4 << 10, 16 << 10, 64 << 10, 1 << 20, 4 << 20} {
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			dir := b.TempDir()
			cmd, out := startChild(b, dir, "put", 1, size)
			tr, err := openRank(dir, 0, nil)
			require.NoError(b, err)
			data := putPattern(size)
			b.SetBytes(int64(size))
			require.NoError(b, putSource(tr, func(addr uintptr) error {
				for i := 0; i < 3; i++ { // warm up
					if err := tr.Put(1, addr, data); err != nil {
						return err
					}
				}
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if err := tr.Put(1, addr, data); err != nil {
						return err
					}
				}
				b.StopTimer()
				return sendRetry(tr, 1, []byte("stop"), nil)
			}))
			require.NoError(b, cmd.Wait(), "%s", out)
			tr.Close()
		})
	}
}

// BenchmarkFlagPingPongProc is the floor under BenchmarkPingPongProc: two
// processes bounce a counter through two words of a shared mapping, with no
// ring and no transport. ns/halfrtt is comparable.
func BenchmarkFlagPingPongProc(b *testing.B) {
	dir := b.TempDir()
	mem, err := createFile(dir+"/flags", 4096)
	require.NoError(b, err)
	defer unix.Munmap(mem)
	cmd, out := startChild(b, dir, "flag", 1, b.N+1000)
	ping, pong := u64(mem, 0), u64(mem, 128)
	b.ResetTimer()
	for i := uint64(1); i <= uint64(b.N+1000); i++ {
		if i == 1001 {
			b.ResetTimer()
		}
		ping.Store(i)
		for pong.Load() != i {
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(2*b.N), "ns/halfrtt")
	require.NoError(b, cmd.Wait(), "%s", out)
}

func flagChild(dir string, n int) error {
	fd, err := unix.Open(dir+"/flags", unix.O_RDWR, 0)
	if err != nil {
		return err
	}
	mem, err := unix.Mmap(fd, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	unix.Close(fd)
	if err != nil {
		return err
	}
	ping, pong := u64(mem, 0), u64(mem, 128)
	for i := uint64(1); i <= uint64(n); i++ {
		for ping.Load() != i {
		}
		pong.Store(i)
	}
	return unix.Munmap(mem)
}
