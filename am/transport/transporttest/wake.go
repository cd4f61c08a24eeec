package transporttest

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/amgo-hpc/amgo/am/transport"
)

// WakeRace checks that no wake-up is lost where a receiver goes to sleep just
// as a sender publishes: rank 1 of ts (opened with a spin of zero, so that
// every Wait announces itself asleep at once) waits with a timeout of 10 s
// while rank 0 sends one packet after a delay drawn from seed (0 to ~20 µs,
// and one round in eight at once), for rounds rounds. A round that takes
// more than a second slept through its packet. shm and loop senders skip
// their fence where the receiver's sleep path runs membarrier.Heavy: this
// checks the wake-up path end to end, while the ordering that makes it safe is
// tested by internal/membarrier's litmus test (the window in which a missing
// barrier loses a wake-up is a cache-line transfer, which these rounds rarely
// hit). Transports without Caps().Wakeup are skipped.
func WakeRace(t *testing.T, ts []transport.Transport, rounds int, seed uint64) {
	if !ts[1].Caps().Wakeup {
		t.Skip("the transport has no wake-up")
	}
	rng := rand.New(rand.NewPCG(seed, 1))
	j := newDriver(t, ts)
	hdr, payload := build(0, 1, 0, 0, 8)
	var slowest time.Duration
	for i := range rounds {
		delay := time.Duration(rng.IntN(20_000))
		if rng.IntN(8) == 0 {
			delay = 0
		}
		sent := make(chan error, 1)
		go func() {
			for start := time.Now(); time.Since(start) < delay; {
			}
			sent <- ts[0].Send(1, hdr, payload)
		}()
		start := time.Now()
		j.waitArrival(1, 10*time.Second, 20*time.Second)
		took := time.Since(start)
		require.NoError(t, <-sent)
		require.Less(t, took, time.Second, "round %d (seed %d, delay %v): Wait slept through the packet", i, seed, delay)
		slowest = max(slowest, took)
		j.rx[1].take()
	}
	t.Logf("%d rounds, slowest %v", rounds, slowest)
}

// Sleep checks a transport.Sleeper (rank 1 of ts; the test is skipped for a
// transport that is not one): Sleep with nothing to deliver lasts about its
// timeout, a packet from rank 0 ends it, and so does Wake from another
// goroutine when the transport is a transport.Waker.
func Sleep(t *testing.T, ts []transport.Transport) {
	sl, ok := ts[1].(transport.Sleeper)
	if !ok {
		t.Skip("not a transport.Sleeper")
	}
	start := time.Now()
	require.NoError(t, sl.Sleep(30*time.Millisecond))
	require.GreaterOrEqual(t, time.Since(start), 15*time.Millisecond, "Sleep with nothing to deliver")

	asleep := func(wake func()) time.Duration {
		done := make(chan time.Duration, 1)
		go func() {
			start := time.Now()
			_ = sl.Sleep(5 * time.Second)
			done <- time.Since(start)
		}()
		time.Sleep(20 * time.Millisecond) // let it fall asleep
		wake()
		select {
		case d := <-done:
			return d
		case <-time.After(10 * time.Second):
			t.Fatal("Sleep did not end")
			return 0
		}
	}
	hdr, payload := build(0, 1, 0, 0, 8)
	require.Less(t, asleep(func() { require.NoError(t, SendRetry(ts[0], 1, hdr, payload, nil)) }), 4*time.Second, "a packet ends Sleep")
	var got Last
	require.NoError(t, RecvOne(ts[1], &got, false))
	if w, ok := ts[1].(transport.Waker); ok {
		require.Less(t, asleep(w.Wake), 4*time.Second, "Wake ends Sleep")
	}
}

// Wake checks a transport.Waker (rank 0 of ts; the test is skipped for a
// transport that is not one): Wake from another goroutine ends a Wait in
// progress; a Wake before a Wait makes that Wait return at once; and a Wake
// counts once (a Wait after it sleeps again: one of three, since a Wait may
// return spuriously). ts should be opened with a
// spin of zero so that each Wait sleeps at once.
func Wake(t *testing.T, ts []transport.Transport) {
	w, ok := ts[0].(transport.Waker)
	if !ok {
		t.Skip("not a transport.Waker")
	}
	done := make(chan time.Duration, 1)
	go func() {
		start := time.Now()
		_ = ts[0].Wait(5 * time.Second)
		done <- time.Since(start)
	}()
	time.Sleep(20 * time.Millisecond) // let it fall asleep
	w.Wake()
	select {
	case d := <-done:
		require.Less(t, d, 4*time.Second, "Wake ends a Wait in progress")
	case <-time.After(10 * time.Second):
		t.Fatal("Wake did not end the Wait")
	}
	w.Wake()
	start := time.Now()
	require.NoError(t, ts[0].Wait(5*time.Second))
	require.Less(t, time.Since(start), 4*time.Second, "a Wake before the Wait")
	// A Wake counts once: Waits sleep again after it. A Wait may still end
	// early now and then (a spurious return costs the caller one more look,
	// and one Wake can race a Wait's clearing of it), but a wake that stuck
	// would end every Wait at once: of three, one must sleep.
	var slept []time.Duration
	for range 3 {
		start = time.Now()
		require.NoError(t, ts[0].Wait(50*time.Millisecond))
		d := time.Since(start)
		if d >= 40*time.Millisecond {
			return
		}
		slept = append(slept, d)
	}
	t.Fatalf("a Wake counts once: three Waits of 50ms after it lasted %v", slept)
}
