//go:build linux

package shm

// Tests and benchmarks with ranks in separate processes: the test binary
// re-executes itself (TestChild) with AMGO_SHM_TEST_ROLE set, and the ranks meet
// through a transporttest.FileBootstrap in a temporary directory.

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/amgo-hpc/amgo/am/transport"
	"github.com/amgo-hpc/amgo/am/transport/transporttest"
)

// openAny is openRank with default options, as the shared harness opens ranks.
func openAny(dir string, rank int) (transport.Transport, error) { return openRank(dir, rank, nil) }

func openRank(dir string, rank int, opts map[string]string) (*Transport, error) {
	o := map[string]string{"dir": dir}
	for k, v := range opts {
		o[k] = v
	}
	return open(transporttest.ProcBootstrap(dir, rank), o)
}

// putTarget is rank 1's side of a Put exchange (transporttest.PutTarget) into
// a pinned buffer of size bytes, whose address is what rank 0 puts to.
func putTarget(tr *Transport, size int) error {
	buf := transporttest.PutBuffer(size)
	var pin runtime.Pinner
	pin.Pin(&buf[0])
	defer pin.Unpin()
	return transporttest.PutTarget(tr, buf, true)
}

// TestChild is the body of a re-executed rank; it is skipped in a normal run.
func TestChild(t *testing.T) {
	role, rank, n, dir := transporttest.ChildRole()
	if role == "" {
		t.Skip("only runs as a child process of TestProcesses and the process benchmarks")
	}
	if role == "flag" {
		require.NoError(t, flagChild(dir, n))
		return
	}
	tr, err := openRank(dir, rank, nil)
	require.NoError(t, err)
	switch role {
	case "test":
		require.NoError(t, transporttest.PingPong(tr, 0, n, true), "ping-pong")
		const size = 4 << 20
		if rank == 1 {
			require.NoError(t, putTarget(tr, size))
		} else {
			require.NoError(t, transporttest.PutSource(tr, func(addr uintptr) error {
				if err := tr.Put(1, addr, transporttest.PutPattern(size)); err != nil {
					return err
				}
				if err := transporttest.SendRetry(tr, 1, []byte("check"), nil, nil); err != nil {
					return err
				}
				rx := &transporttest.Last{}
				if err := transporttest.RecvOne(tr, rx, true); err != nil || string(rx.Buf) != "ok" {
					return fmt.Errorf("check: %q, %v", rx.Buf, err)
				}
				// An unmapped address is a clear error, not a crash.
				err := tr.Put(1, 8, []byte{1})
				if err == nil || !strings.Contains(err.Error(), "not mapped") {
					return fmt.Errorf("put to address 8: %v", err)
				}
				return transporttest.SendRetry(tr, 1, []byte("stop"), nil, nil)
			}))
		}
		require.NoError(t, tr.Close())
	case "pingpong", "pingpong-wait":
		require.NoError(t, transporttest.PingPong(tr, 0, n, role == "pingpong-wait"))
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
	c0, out0 := transporttest.StartChild(t, dir, "test", 0, 2000)
	c1, out1 := transporttest.StartChild(t, dir, "test", 1, 2000)
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
	c1, out1 := transporttest.StartChild(t, dir, "die", 1, 0)
	tr, err := openRank(dir, 0, map[string]string{"ring_bytes": "4k"})
	require.NoError(t, err)
	defer tr.Close()
	require.NoError(t, c1.Wait(), "%s", out1)
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := tr.Poll(&transporttest.Last{}, 10)
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
func BenchmarkPingPongProc(b *testing.B) { transporttest.BenchPingPong(b, "pingpong", openAny) }

// BenchmarkPingPongProcWait is BenchmarkPingPongProc with Wait between polls
// (spin, then futex), the way a blocking call waits.
func BenchmarkPingPongProcWait(b *testing.B) {
	transporttest.BenchPingPong(b, "pingpong-wait", openAny)
}

// BenchmarkPutProc: single-copy Put (process_vm_writev) into a child process's
// buffer; MB/s is the bandwidth.
func BenchmarkPutProc(b *testing.B) {
	for _, size := range []int{4 << 10, 16 << 10, 64 << 10, 1 << 20, 4 << 20} {
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			dir := b.TempDir()
			cmd, out := transporttest.StartChild(b, dir, "put", 1, size)
			tr, err := openRank(dir, 0, nil)
			require.NoError(b, err)
			data := transporttest.PutPattern(size)
			b.SetBytes(int64(size))
			require.NoError(b, transporttest.PutSource(tr, func(addr uintptr) error {
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
				return transporttest.SendRetry(tr, 1, []byte("stop"), nil, nil)
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
	cmd, out := transporttest.StartChild(b, dir, "flag", 1, b.N+1000)
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
