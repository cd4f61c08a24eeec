package transporttest

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

	"github.com/amgo-hpc/amgo/am/transport"
)

// Tests with ranks in separate processes. A network's test binary re-executes
// itself as the other rank (StartChild): the child runs the network's
// TestChild, which reads its part from the environment (ChildRole) and plays
// it; the two ranks meet through a FileBootstrap in a directory they share.
// The helpers below are the parts every network's process tests share.

// Environment of a re-executed rank.
const (
	envRole = "AMGO_PROCTEST_ROLE"
	envRank = "AMGO_PROCTEST_RANK"
	envDir  = "AMGO_PROCTEST_DIR"
	envN    = "AMGO_PROCTEST_N"
)

// StartChild re-executes the test binary (its TestChild) as rank of a job
// whose ranks meet in dir, playing role with parameter n. Its output is
// collected in the returned buffer.
func StartChild(t testing.TB, dir, role string, rank, n int) (*exec.Cmd, *bytes.Buffer) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestChild$", "-test.bench=^$", "-test.count=1")
	cmd.Env = append(os.Environ(), envRole+"="+role, envRank+"="+strconv.Itoa(rank), envDir+"="+dir,
		envN+"="+strconv.Itoa(n), "GORACE=atexit_sleep_ms=0")
	out := &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start())
	return cmd, out
}

// ChildRole returns the part StartChild gave this process; role is "" in a
// test binary that was not started by StartChild (TestChild then skips).
func ChildRole() (role string, rank, n int, dir string) {
	rank, _ = strconv.Atoi(os.Getenv(envRank))
	n, _ = strconv.Atoi(os.Getenv(envN))
	return os.Getenv(envRole), rank, n, os.Getenv(envDir)
}

// ProcBootstrap is the bootstrap of rank of a two-rank job meeting in dir.
func ProcBootstrap(dir string, rank int) *FileBootstrap {
	return &FileBootstrap{Dir: dir, ID: "proc", R: rank, N: 2, Timeout: 20 * time.Second}
}

// Last keeps a copy of the last packet delivered.
type Last struct {
	Src int
	Buf []byte
	N   int // packets delivered
}

// Deliver implements transport.Receiver.
func (l *Last) Deliver(src int, pkt []byte) {
	l.Src = src
	l.Buf = append(l.Buf[:0], pkt...)
	l.N++
}

// RecvOne polls tr (and, if sleep, waits between polls) until one packet has
// arrived in rx; it gives up after 20 s without one.
func RecvOne(tr transport.Transport, rx *Last, sleep bool) error {
	want := rx.N + 1
	return PollFor(tr, rx, sleep, func() (bool, error) { return rx.N >= want, nil })
}

// PollFor polls tr into rx one packet at a time (and, if sleep, waits
// between polls) until done says so or fails; it gives up after 20 s.
func PollFor(tr transport.Transport, rx transport.Receiver, sleep bool, done func() (bool, error)) error {
	var deadline time.Time
	for i := 0; ; i++ {
		if _, err := tr.Poll(rx, 1); err != nil {
			return err
		}
		if ok, err := done(); ok || err != nil {
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

// SendRetry sends until the network takes the packet: on ErrWouldBlock it
// polls into rx, if not nil (a network under the reliability layer frees its
// window only when acknowledgements are taken in), yields, and tries again.
func SendRetry(tr transport.Transport, dst int, hdr, payload []byte, rx transport.Receiver) error {
	for {
		err := tr.Send(dst, hdr, payload)
		if !errors.Is(err, transport.ErrWouldBlock) {
			return err
		}
		if rx != nil {
			if _, err := tr.Poll(rx, 64); err != nil {
				return err
			}
		}
		runtime.Gosched()
	}
}

// PingPong runs round trips first..first+n-1 of 8-byte packets between ranks
// 0 and 1 of tr's job; rank 0 starts each, and checks what comes back.
func PingPong(tr transport.Transport, first, n int, sleep bool) error {
	rx := &Last{}
	msg := make([]byte, 8)
	peer := 1 - tr.Rank()
	for i := first; i < first+n; i++ {
		if tr.Rank() == 0 {
			binary.LittleEndian.PutUint64(msg, uint64(i))
			if err := SendRetry(tr, peer, msg, nil, nil); err != nil {
				return err
			}
		}
		if err := RecvOne(tr, rx, sleep); err != nil {
			return fmt.Errorf("round %d: %w", i, err)
		}
		if len(rx.Buf) != 8 || binary.LittleEndian.Uint64(rx.Buf) != uint64(i) || rx.Src != peer {
			return fmt.Errorf("round %d: got %x from %d", i, rx.Buf, rx.Src)
		}
		if tr.Rank() == 1 {
			if err := SendRetry(tr, peer, rx.Buf, nil, nil); err != nil {
				return err
			}
		}
	}
	return nil
}

// BenchPingPong measures PingPong between this process (rank 0, opened by
// open) and a child playing role ("pingpong", or "pingpong-wait" to Wait
// between polls): ns/op is one round trip, ns/halfrtt half of it.
func BenchPingPong(b *testing.B, role string, open func(dir string, rank int) (transport.Transport, error)) {
	wait := role == "pingpong-wait"
	dir := b.TempDir()
	cmd, out := StartChild(b, dir, role, 1, b.N+1000)
	tr, err := open(dir, 0)
	require.NoError(b, err)
	require.NoError(b, PingPong(tr, 0, 1000, wait)) // warm up
	b.ResetTimer()
	err = PingPong(tr, 1000, b.N, wait)
	b.StopTimer()
	require.NoError(b, err)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(2*b.N), "ns/halfrtt")
	require.NoError(b, cmd.Wait(), "%s", out)
	tr.Close()
}

// PutPattern returns size bytes of the pattern put tests write and check.
func PutPattern(size int) []byte {
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i*7 + i>>12)
	}
	return data
}

// CheckPutPattern reports the first byte of buf that is not PutPattern's.
func CheckPutPattern(buf []byte) error {
	for i := range buf {
		if buf[i] != byte(i*7+i>>12) {
			return fmt.Errorf("put: byte %d is %#x, want %#x", i, buf[i], byte(i*7+i>>12))
		}
	}
	return nil
}

// PutBuffer returns a put destination of size bytes, every byte 0xee (its
// pages faulted in, and stale content visible to CheckPutPattern).
func PutBuffer(size int) []byte {
	buf := make([]byte, size)
	for i := range buf {
		buf[i] = 0xee
	}
	return buf
}

// PutTarget is rank 1's side of a Put exchange: it sends rank 0 buf's
// address (the caller has made buf reachable for puts) and serves until rank
// 0 says "stop", checking buf against PutPattern and answering "ok" when it
// says "check", answering "ok" when it says "sync".
func PutTarget(tr transport.Transport, buf []byte, sleep bool) error {
	msg := binary.LittleEndian.AppendUint64(nil, uint64(uintptr(unsafe.Pointer(&buf[0]))))
	if err := SendRetry(tr, 0, msg, nil, nil); err != nil {
		return err
	}
	rx := &Last{}
	for {
		if err := RecvOne(tr, rx, sleep); err != nil {
			return err
		}
		switch string(rx.Buf) {
		case "stop":
			runtime.KeepAlive(buf)
			return nil
		case "check":
			if err := CheckPutPattern(buf); err != nil {
				return err
			}
			fallthrough
		case "sync":
			if err := SendRetry(tr, 0, []byte("ok"), nil, nil); err != nil {
				return err
			}
		}
	}
}

// PutSource is rank 0's side: it learns the address PutTarget sent, then
// calls put(addr).
func PutSource(tr transport.Transport, put func(addr uintptr) error) error {
	rx := &Last{}
	if err := RecvOne(tr, rx, true); err != nil {
		return err
	}
	if len(rx.Buf) != 8 {
		return fmt.Errorf("address packet of %d bytes", len(rx.Buf))
	}
	return put(uintptr(binary.LittleEndian.Uint64(rx.Buf)))
}
