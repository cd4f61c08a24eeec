package locks

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestMutexModes(t *testing.T) {
	for _, seq := range []*Seq{nil, {}, NewSeq()} {
		var m Mutex
		m.SetSeq(seq)
		require.Equal(t, seq != nil && seq.on, m.Sequential())
		m.Lock()
		require.False(t, m.TryLock(), "a taken mutex")
		m.Unlock()
		require.True(t, m.TryLock())
		m.Unlock()
		require.False(t, seq.Collided())
	}
}

// The zero Seq (not made by NewSeq) leaves a real mutex: exclusion holds
// between goroutines.
func TestZeroSeqIsAMutex(t *testing.T) {
	var m Mutex
	m.SetSeq(&Seq{})
	n := 0
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 1000; i++ {
				m.Lock()
				n++
				m.Unlock()
			}
		}()
	}
	wg.Wait()
	require.Equal(t, 4000, n)
}

// A Lock that finds the flag taken records the collision and waits for the
// holder to let go.
func TestCollisionIsRecorded(t *testing.T) {
	if raceEnabled {
		t.Skip("the plain flag's accesses from two goroutines are the race the detector reports")
	}
	s := NewSeq()
	var m Mutex
	m.SetSeq(s)
	m.Lock()
	locked := make(chan struct{})
	go func() {
		m.Lock() // collides, waits
		close(locked)
		m.Unlock()
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !s.Collided() && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond) // the goroutine has not reached its Lock yet
	}
	require.True(t, s.Collided())
	select {
	case <-locked:
		t.Fatal("the colliding Lock went on while the flag was held")
	default:
	}
	m.Unlock()
	<-locked
}

// TestContendedLockSleepsAndWakes holds a lock past a waiter's yielding
// tries, so that the waiter sleeps between tries, and checks that it gets
// the lock only once the holder lets go.
func TestContendedLockSleepsAndWakes(t *testing.T) {
	var m Mutex
	m.Lock()
	var got atomic.Bool
	done := make(chan struct{})
	go func() {
		m.Lock()
		got.Store(true)
		m.Unlock()
		close(done)
	}()
	time.Sleep(50 * time.Millisecond) // far past spinYields yields
	require.False(t, got.Load(), "the waiter took a held lock")
	require.False(t, m.TryLock())
	m.Unlock()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter did not take the released lock")
	}
	require.True(t, m.TryLock())
	m.Unlock()
}

// TestTryLockLoopDoesNotStarveLock runs a poller that takes the lock again
// with TryLock as soon as it lets go and holds it almost all the time;
// a Lock beside it must still get in, and the poller go on after.
func TestTryLockLoopDoesNotStarveLock(t *testing.T) {
	var m Mutex
	var stop atomic.Bool
	var polls atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for !stop.Load() {
			if m.TryLock() {
				polls.Add(1)
				for end := time.Now().Add(20 * time.Microsecond); time.Now().Before(end); {
				}
				m.Unlock()
			}
		}
	}()
	for polls.Load() < 10 {
		time.Sleep(time.Millisecond)
	}
	got := make(chan struct{})
	var inside bool
	go func() {
		m.Lock()
		inside = true // written under the lock, read after got closes
		m.Unlock()
		close(got)
	}()
	select {
	case <-got:
	case <-time.After(20 * time.Second):
		t.Fatal("Lock starved by a TryLock loop")
	}
	require.True(t, inside)
	n := polls.Load()
	for polls.Load() == n {
		time.Sleep(time.Millisecond) // the poller takes the lock again
	}
	stop.Store(true)
	<-done
}
