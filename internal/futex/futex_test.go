//go:build linux

package futex

import (
	"os"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/amgo-hpc/amgo/internal/membarrier"
	"github.com/amgo-hpc/amgo/internal/release"
)

func TestSleepValueChanged(t *testing.T) {
	var w atomic.Uint32
	w.Store(1)
	start := time.Now()
	require.NoError(t, Sleep(&w, 0, time.Second)) // *addr != val: returns at once
	require.Less(t, time.Since(start), 500*time.Millisecond)
}

func TestSleepTimeout(t *testing.T) {
	var w atomic.Uint32
	start := time.Now()
	require.NoError(t, Sleep(&w, 0, 20*time.Millisecond))
	require.GreaterOrEqual(t, time.Since(start), 15*time.Millisecond)
}

func TestDoorbell(t *testing.T) {
	mem := make([]byte, 64)
	d, err := NewDoorbell(mem)
	require.NoError(t, err)
	_, err = NewDoorbell(mem[1:])
	require.ErrorIs(t, err, ErrAlign)
	_, err = NewDoorbell(mem[:4])
	require.ErrorIs(t, err, ErrAlign)

	// Timeout with nothing ready.
	start := time.Now()
	ok, err := d.Wait(func() bool { return false }, 100*time.Microsecond, 30*time.Millisecond)
	require.NoError(t, err)
	require.False(t, ok)
	require.GreaterOrEqual(t, time.Since(start), 25*time.Millisecond)
	require.False(t, d.Sleeping())

	// A sender wakes a sleeping receiver long before the timeout.
	for i := 0; i < 20; i++ {
		var flag atomic.Bool
		go func() {
			time.Sleep(2 * time.Millisecond)
			flag.Store(true)
			d.Ring()
		}()
		start = time.Now()
		// Wait may return early and false on a spurious wake-up (a ring of
		// the previous round): wait again, as callers do.
		for ok = false; !ok && time.Since(start) < 5*time.Second; {
			ok, err = d.Wait(flag.Load, 10*time.Microsecond, 10*time.Second)
			require.NoError(t, err)
		}
		require.True(t, ok)
		require.Less(t, time.Since(start), 5*time.Second)
	}
	d.Ring() // nobody sleeps: no-op
}

// TestDoorbellSignal: a signal delivered to the sleeping thread (the runtime
// sends SIGURG to preempt goroutines) does not end Wait before its timeout.
func TestDoorbellSignal(t *testing.T) {
	d, err := NewDoorbell(make([]byte, 8))
	require.NoError(t, err)
	tid := make(chan int)
	type result struct {
		ok      bool
		err     error
		elapsed time.Duration
	}
	done := make(chan result)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		tid <- unix.Gettid()
		start := time.Now()
		ok, err := d.Wait(func() bool { return false }, 0, 50*time.Millisecond)
		done <- result{ok, err, time.Since(start)}
	}()
	id := <-tid
	for !d.Sleeping() {
		runtime.Gosched()
	}
	for i := 0; i < 5; i++ {
		require.NoError(t, unix.Tgkill(os.Getpid(), id, unix.SIGURG))
		time.Sleep(time.Millisecond)
	}
	r := <-done
	require.NoError(t, r.err)
	require.False(t, r.ok)
	require.GreaterOrEqual(t, r.elapsed, 45*time.Millisecond)
}

// BenchmarkWakeup measures a round trip in which each side sleeps on the futex
// (no spinning): the cost of two futex wake-ups.
func BenchmarkWakeup(b *testing.B) {
	m1, m2 := make([]byte, 8), make([]byte, 8)
	d1, _ := NewDoorbell(m1)
	d2, _ := NewDoorbell(m2)
	var f1, f2 atomic.Bool
	n := b.N
	go func() {
		for i := 0; i < n; i++ {
			for ok, _ := d1.Wait(f1.Load, 0, time.Second); !ok; ok, _ = d1.Wait(f1.Load, 0, time.Second) {
			}
			f1.Store(false)
			f2.Store(true)
			d2.Ring()
		}
	}()
	for i := 0; i < n; i++ {
		f1.Store(true)
		d1.Ring()
		for ok, _ := d2.Wait(f2.Load, 0, time.Second); !ok; ok, _ = d2.Wait(f2.Load, 0, time.Second) {
		}
		f2.Store(false)
	}
}

// TestDoorbellLightSender: a sender that publishes with a release store and
// rings with no fence between (what shm and loop do where membarrier is
// Enabled) never leaves a receiver asleep. Sender and receiver start each
// round together, and the sender publishes after a delay that sweeps the
// receiver's last microseconds before it sleeps; a lost wake-up shows as a
// round that lasts the receiver's whole timeout. The window in which a
// missing barrier loses a wake-up is a store's cache-line transfer, and this
// test rarely lands in it (it passed 40 000 rounds with Heavy removed from
// Wait); the ordering itself is tested by membarrier's store-buffering litmus
// test, which does catch the missing barrier.
func TestDoorbellLightSender(t *testing.T) {
	if runtime.GOMAXPROCS(0) < 2 {
		t.Skip("needs two Ps: sender and receiver must run at once")
	}
	rounds := 4000
	if testing.Short() {
		rounds = 400
	}
	d, err := NewDoorbell(make([]byte, 64))
	require.NoError(t, err)
	var flag uint32
	var turn atomic.Uint64
	ready := func() bool { return atomic.LoadUint32(&flag) != 0 }
	done := make(chan struct{})
	go func() { // the sender
		defer close(done)
		for i := 1; i <= rounds; i++ {
			for turn.Load() != uint64(i) {
			}
			for spin := (i * 7) % 1500; spin > 0; spin-- { // 0 to ~1.5 µs
				_ = ready()
			}
			release.Store32(&flag, 1)
			d.Ring()
		}
	}()
	slow := 0
	for i := 1; i <= rounds; i++ {
		atomic.StoreUint32(&flag, 0)
		turn.Store(uint64(i))
		start := time.Now()
		for ok := false; !ok; {
			ok, err = d.Wait(ready, 0, 300*time.Millisecond)
			require.NoError(t, err)
			if !ok && time.Since(start) >= 300*time.Millisecond {
				break
			}
		}
		if time.Since(start) >= 250*time.Millisecond {
			slow++
		}
	}
	<-done
	require.Zero(t, slow, "rounds in which the receiver slept through the sender's ring (membarrier enabled: %v)", membarrier.Enabled())
}
