//go:build linux

package shm

import (
	"fmt"
	"os"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/amgo-hpc/amgo/am/transport"
	"github.com/amgo-hpc/amgo/am/transport/transporttest"
	"github.com/amgo-hpc/amgo/internal/ring"
)

var jobSeq atomic.Int64

// openJob opens n shm transports in this process, each on its own goroutine
// (New fences), with their files in a test directory.
func openJob(t testing.TB, n int, opts map[string]string) []transport.Transport {
	dir := t.TempDir()
	o := map[string]string{"dir": dir}
	for k, v := range opts {
		o[k] = v
	}
	bs := transporttest.NewBootstraps(n, fmt.Sprintf("shmtest-%d", jobSeq.Add(1)))
	ts := make([]transport.Transport, n)
	errs := make(chan error, n)
	for i := range bs {
		go func() {
			tr, err := New(bs[i], o)
			if err == nil {
				ts[i] = tr
			}
			errs <- err
		}()
	}
	for range bs {
		require.NoError(t, <-errs)
	}
	return ts
}

func TestConformance(t *testing.T) {
	transporttest.Run(t, func(t *testing.T, n int) []transport.Transport {
		return openJob(t, n, map[string]string{"ring_bytes": "16k"})
	})
}

func TestFilesAndDirectory(t *testing.T) {
	// Without a job directory, New makes a private one under /dev/shm and the
	// last rank removes it again.
	t.Setenv("AMGO_JOB_DIR", "")
	id := fmt.Sprintf("shmtest-dir-%d-%d", os.Getpid(), jobSeq.Add(1))
	bs := transporttest.NewBootstraps(2, id)
	errs := make(chan error, 2)
	ts := make([]*Transport, 2)
	for i := range bs {
		go func() {
			var err error
			ts[i], err = open(bs[i], nil)
			errs <- err
		}()
	}
	require.NoError(t, <-errs)
	require.NoError(t, <-errs)
	dir := fmt.Sprintf("/dev/shm/amgo-%s-%d", id, os.Getuid())
	_, err := os.Stat(dir)
	require.ErrorIs(t, err, os.ErrNotExist, "job directory left behind")
	require.Equal(t, ring.MaxRecord(DefaultRingBytesFor(len(ts))), ts[0].Caps().MaxPacket)
	for _, tr := range ts {
		require.NoError(t, tr.Close())
	}

	// Files are private to the user.
	path := t.TempDir() + "/f"
	mem, err := createFile(path, 8192)
	require.NoError(t, err)
	st, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	require.NoError(t, unix.Munmap(mem))

	// A peer file with a bad header is refused.
	require.NoError(t, os.WriteFile(path, make([]byte, 8192), 0o600))
	_, err = mapPeer(path, 1, 2)
	require.ErrorContains(t, err, "bad header")
	_, err = mapPeer(path+"-missing", 1, 2)
	require.Error(t, err)

	// A directory that someone else could have prepared is refused.
	pub := fmt.Sprintf("/dev/shm/amgo-%s-%d", "shmtest-open", os.Getuid())
	require.NoError(t, os.MkdirAll(pub, 0o755))
	require.NoError(t, os.Chmod(pub, 0o755))
	defer os.Remove(pub)
	_, _, err = jobDir(transporttest.NewBootstraps(1, "shmtest-open")[0], nil)
	require.ErrorContains(t, err, "not a private directory")
}

func TestOptions(t *testing.T) {
	for _, o := range []map[string]string{{"ring_bytes": "lots"}, {"ring_bytes": "8"}, {"ring_bytes": "2048m"}, {"spin": "forever"}} {
		o["dir"] = t.TempDir()
		_, err := New(transporttest.NewBootstraps(1, "opts")[0], o)
		require.Error(t, err, "%v", o)
	}
	tr, err := transport.Open("shm", transporttest.NewBootstraps(1, "open")[0], map[string]string{"dir": t.TempDir()})
	require.NoError(t, err, "registered as shm")
	require.Equal(t, "shm", tr.Caps().Name)
	require.NoError(t, tr.Close())

	ts := openJob(t, 1, map[string]string{"ring_bytes": "100k", "spin": "1us"}) // rounds up to 128 KiB
	require.Equal(t, ring.MaxRecord(128<<10), ts[0].Caps().MaxPacket)
	require.NoError(t, ts[0].Close())
}

// A peer that corrupts a ring makes Poll fail with ErrPeer, not panic.
func TestCorruptRing(t *testing.T) {
	ts := openJob(t, 2, map[string]string{"ring_bytes": "4k"})
	t0 := ts[0].(*Transport)
	require.NoError(t, t0.Send(1, []byte("hello"), nil))
	// Overwrite the record header in rank 1's file with an absurd length.
	stride := int(u64(t0.peers[1].mem, hdrStride).Load())
	u64(t0.peers[1].mem, ringsOff(2)+0*stride+ring.ControlLen).Store(1<<30 | 1<<28) // valid, 256 MiB
	_, err := ts[1].Poll(&transporttest.Last{}, 10)
	require.ErrorIs(t, err, transport.ErrPeer)
	require.ErrorContains(t, err, "rank 0")
	for _, tr := range ts {
		tr.Close()
	}
}

// A ring exists only once its producer has sent on it: in a job of 8 ranks
// where only rank 0 sends, to ranks 1 and 3, rank 1's file holds one
// formatted ring and Poll visits one; every other ring region is still zero
// (its pages never touched). Sending to oneself works the same way.
func TestRingsOnFirstContact(t *testing.T) {
	ts := openJob(t, 8, map[string]string{"ring_bytes": "4k"})
	defer func() {
		for _, tr := range ts {
			tr.Close()
		}
	}()
	t0 := ts[0].(*Transport)
	require.NoError(t, t0.Send(1, []byte("to one"), nil))
	require.NoError(t, t0.Send(3, []byte("to three"), nil))
	require.NoError(t, t0.Send(0, []byte("to self"), nil))
	for _, c := range []struct {
		rank int
		want string
	}{{1, "to one"}, {3, "to three"}, {0, "to self"}} {
		var last transporttest.Last
		n, err := ts[c.rank].Poll(&last, 10)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.Equal(t, c.want, string(last.Buf))
		require.Equal(t, int32(1), ts[c.rank].(*Transport).nAct.Load(), "rank %d polls one ring", c.rank)
	}
	t1 := ts[1].(*Transport)
	for src := 1; src < 8; src++ {
		off := ringsOff(8) + src*t1.stride
		for i := off; i < off+t1.stride; i += 8 {
			require.Zero(t, u64(t1.own, i).Load(), "rank 1's ring from rank %d was touched at byte %d", src, i-off)
		}
	}
	n, err := ts[2].Poll(&transporttest.Last{}, 10)
	require.NoError(t, err)
	require.Zero(t, n)
}

// A corrupt announcement (a slot naming a rank out of range, or one
// already announced) makes Poll fail with ErrPeer, not panic.
func TestCorruptAnnouncement(t *testing.T) {
	for _, bad := range []uint32{100, 1} {
		ts := openJob(t, 2, map[string]string{"ring_bytes": "4k"})
		t1 := ts[1].(*Transport)
		require.NoError(t, ts[0].Send(1, []byte("x"), nil))
		_, err := ts[1].Poll(&transporttest.Last{}, 10)
		require.NoError(t, err)
		slot := t1.ann.Add(1) - 1
		u32(t1.own, annSlots+4*int(slot)).Store(bad)
		_, err = ts[1].Poll(&transporttest.Last{}, 10)
		require.ErrorIs(t, err, transport.ErrPeer, "slot value %d", bad)
		for _, tr := range ts {
			tr.Close()
		}
	}
}

// No wake-up is lost with senders that skip their fence (internal/membarrier).
func TestWakeRace(t *testing.T) {
	rounds := 3000
	if testing.Short() {
		rounds = 300
	}
	transporttest.WakeRace(t, openJob(t, 2, map[string]string{"spin": "0s"}), rounds, 1)
}

// Sleep is Wait without the spin (transport.Sleeper).
func TestSleep(t *testing.T) {
	ts := openJob(t, 2, nil)
	defer ts[0].Close()
	defer ts[1].Close()
	transporttest.Sleep(t, ts)
}

// Wake ends a Wait in progress, and makes the next Wait return at once when
// no Wait is in progress (transport.Waker).
func TestWake(t *testing.T) {
	ts := openJob(t, 2, map[string]string{"spin": "0s"})
	defer ts[0].Close()
	defer ts[1].Close()
	transporttest.Wake(t, ts)
}

// The short lap pauses for a peer that streams records back (streamsBack):
// not for a one-way stream whose receiver answers once a window, for
// windows both ways (a Waitall taking a window's records, then a window of
// Sends taking none) throughout, and for a ping-pong.
func TestStreamsBack(t *testing.T) {
	run := func(rounds int, take func(send int) uint64) (pausedSends, sends int) {
		var avg uint64
		for s := 0; s < rounds*64; s++ {
			var back bool
			avg, back = streamsBack(avg, take(s))
			if s >= 64*8 { // past the start
				sends++
				if back {
					pausedSends++
				}
			}
		}
		return pausedSends, sends
	}
	oneWay := func(s int) uint64 { // an acknowledgement per window of 64
		if s%64 == 0 {
			return 1
		}
		return 0
	}
	bothWays := func(s int) uint64 {
		if s%64 == 0 {
			return 64
		}
		return 0
	}
	pingPong := func(int) uint64 { return 1 }
	paused, _ := run(100, oneWay)
	require.Zero(t, paused, "one way")
	paused, sends := run(100, bothWays)
	require.Equal(t, sends, paused, "both ways")
	paused, sends = run(100, pingPong)
	require.Equal(t, sends, paused, "ping-pong")
}
