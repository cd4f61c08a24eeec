package mpiam

import (
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/amgo-hpc/amgo/am"
	"github.com/amgo-hpc/amgo/am/transport/loop"
	"github.com/stretchr/testify/require"
)

// detectWithin is the promise: a rank that dies is reported to the others
// within 5 s on every transport.
const detectWithin = 5 * time.Second

// requireProcFailed checks that err reports the failure of world rank want.
func requireProcFailed(t testing.TB, err error, want int) {
	t.Helper()
	require.Error(t, err)
	require.ErrorIs(t, err, ErrProcFailed, "%v", err)
	require.Equal(t, ClassProcFail, ErrorClass(err), "%v", err)
	var pf *ProcFailedError
	require.True(t, errors.As(err, &pf), "%v", err)
	require.Equal(t, want, pf.WorldRank, "%v", err)
	require.Contains(t, err.Error(), fmt.Sprintf("rank %d", want))
	require.NotContains(t, err.Error(), "%!", "a format verb without its argument")
}

// runDeadJob runs ranks as goroutines over loop; rank victim runs die (which
// returns when it has done its part) and then has its transport closed, as a
// crashed process's would be. The survivors run body with the time of death.
// Every rank's endpoint is closed afterwards.
func runDeadJob(t *testing.T, n, victim int, die func(w *Comm) error, body func(w *Comm, died func() time.Time) error) {
	t.Helper()
	trs, err := loop.NewJob(n, nil)
	require.NoError(t, err)
	procs := make([]*proc, n)
	for i, tr := range trs {
		ep, err := am.New(tr, am.Config{})
		require.NoError(t, err)
		procs[i], err = newProc(ep)
		require.NoError(t, err)
	}
	var mu sync.Mutex
	var diedAt time.Time
	died := func() time.Time { mu.Lock(); defer mu.Unlock(); return diedAt }
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range procs {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			ended := false
			defer func() {
				if !ended { // a failed assertion ended the goroutine (Goexit):
					_ = trs[i].Close() // its peers see it die instead of waiting for ever
				}
			}()
			w := procs[i].world
			if i == victim {
				errs[i] = die(w)
				mu.Lock()
				diedAt = time.Now()
				mu.Unlock()
				_ = trs[i].Close()
				ended = true
				return
			}
			errs[i] = body(w, died)
			ended = true
		}(i)
	}
	wg.Wait()
	for _, tr := range trs {
		_ = tr.Close()
	}
	for i, p := range procs {
		p.unpinAfterAbort()
		require.NoError(t, errs[i], "rank %d", i)
	}
}

// since checks that the failure was reported within detectWithin of the death.
func since(t testing.TB, died func() time.Time, what string) {
	t.Helper()
	d := time.Since(died())
	require.Less(t, d, detectWithin, what)
	t.Logf("%s: reported %v after the death", what, d.Round(time.Millisecond))
}

// Pending operations that involve a rank that dies complete with
// ErrProcFailed naming it (ULFM's MPI_ERR_PROC_FAILED): a blocking receive
// from it, a nonblocking one waited on, an AnySource receive, a synchronous
// send waiting for its handshake, a Barrier and an Allreduce; new operations to and from
// it fail at once; the live ranks keep talking.
func TestDeadRankLoop(t *testing.T) {
	const n, victim = 4, 3
	block := make([]byte, 64<<10) // rendezvous size
	runDeadJob(t, n, victim,
		func(w *Comm) error {
			// Take part in one exchange, then die while the others wait.
			var x [1]int64
			if err := Allreduce(w, []int64{1}, x[:], Sum[int64]()); err != nil {
				return err
			}
			time.Sleep(30 * time.Millisecond)
			return nil
		},
		func(w *Comm, died func() time.Time) error {
			var x [1]int64
			if err := Allreduce(w, []int64{1}, x[:], Sum[int64]()); err != nil {
				return err
			}
			if x[0] != n {
				return fmt.Errorf("allreduce %d", x[0])
			}
			buf := make([]byte, 8)
			switch w.Rank() {
			case 0: // blocking receive from the victim; then AnySource
				_, err := Recv(w, buf, victim, 1)
				requireProcFailed(t, err, victim)
				since(t, died, "Recv")
				_, err = Recv(w, buf, AnySource, 1)
				requireProcFailed(t, err, victim)
			case 1: // nonblocking receive waited on, and a rendezvous Ssend
				r, err := Irecv(w, buf, victim, 1)
				require.NoError(t, err)
				s, err := Issend(w, block, victim, 2)
				require.NoError(t, err)
				_, err = r.Wait()
				requireProcFailed(t, err, victim)
				since(t, died, "Irecv+Wait")
				_, err = s.Wait()
				requireProcFailed(t, err, victim)
			case 2: // collectives the victim never joins
				requireProcFailed(t, w.Barrier(), victim)
				since(t, died, "Barrier")
				err := Allreduce(w, []int64{1}, x[:], Sum[int64]())
				requireProcFailed(t, err, victim)
				since(t, died, "Allreduce")
				// Nonblocking ones on the schedule engine fail alike,
				// through the shared area's event (all four ranks share a
				// node: the first Allreduce made it) or a barrier's wait.
				require.Equal(t, shmReady, w.shmState.Load())
				req, err := Iallreduce(w, []int64{1}, x[:], Sum[int64]())
				require.NoError(t, err)
				_, err = req.Wait()
				requireProcFailed(t, err, victim)
				req, err = w.Ibarrier()
				require.NoError(t, err)
				_, err = req.Wait()
				requireProcFailed(t, err, victim)
			}
			// New operations with the dead rank fail at once.
			start := time.Now()
			requireProcFailed(t, Send(w, buf, victim, 3), victim)
			_, err := Recv(w, buf, victim, 3)
			requireProcFailed(t, err, victim)
			_, err = Irecv(w, buf, victim, 3)
			requireProcFailed(t, err, victim)
			// At once: no wait for a timeout (generous bound for a loaded CI machine).
			require.Less(t, time.Since(start), time.Second)
			// Live ranks go on: a ring among the survivors.
			live := n - 1
			to, from := (w.Rank()+1)%live, (w.Rank()+live-1)%live
			out := []int64{int64(w.Rank())}
			in := make([]int64, 1)
			if _, err := Sendrecv(w, out, to, 9, in, from, 9); err != nil {
				return err
			}
			if in[0] != int64(from) {
				return fmt.Errorf("ring got %d from %d", in[0], from)
			}
			big := patterned(256<<10, w.Rank())
			got := make([]byte, len(big))
			if _, err := Sendrecv(w, big, to, 10, got, from, 10); err != nil {
				return err
			}
			return checkPattern(got, from)
		})
}

// The multi-process form: a rank calls os.Exit(3) mid-exchange under amrun,
// over shm and over tcp, while the others are blocked in Recv, Wait and
// Allreduce (cmd deadcheck). Each survivor reports ErrProcFailed naming the
// rank; amrun exits with the rank's status and names it.
func TestDeadRankUnderAmrun(t *testing.T) {
	dir := buildWithAmrun(t, "./internal/deadcheck")
	reExit := regexp.MustCompile(`deadcheck: rank (\d+) exits at (\d+)`)
	reSaw := regexp.MustCompile(`deadcheck: rank (\d+) (\w+): ErrProcFailed rank (\d+) at (\d+): (.*)`)
	for _, nw := range []string{"shm", "tcp"} {
		for _, mode := range []string{"recv", "allreduce", "barrier"} {
			t.Run(nw+"/"+mode, func(t *testing.T) {
				const n = 4
				cmd := exec.Command(filepath.Join(dir, "amrun"), "-n", strconv.Itoa(n), "--transport", nw,
					"--timeout", "60s", filepath.Join(dir, "deadcheck"), mode)
				out, err := cmd.CombinedOutput()
				var ee *exec.ExitError
				require.True(t, errors.As(err, &ee), "amrun must fail: %v\n%s", err, out)
				require.Equal(t, 3, ee.ExitCode(), "%s", out)
				require.Contains(t, string(out), fmt.Sprintf("amrun: rank %d exited with status 3", n-1), "%s", out)
				m := reExit.FindSubmatch(out)
				require.NotNil(t, m, "%s", out)
				exitAt, _ := strconv.ParseInt(string(m[2]), 10, 64)
				saw := reSaw.FindAllSubmatch(out, -1)
				require.Len(t, saw, n-1, "every survivor reports the failure:\n%s", out)
				for _, s := range saw {
					require.Equal(t, strconv.Itoa(n-1), string(s[3]), "%s", s[0])
					at, _ := strconv.ParseInt(string(s[4]), 10, 64)
					d := time.Duration(at - exitAt)
					require.Less(t, d, detectWithin, "%s", s[0])
					t.Logf("%s %s: rank %s (%s) saw the death after %v", nw, mode, s[1], s[2], d.Round(time.Millisecond))
				}
			})
		}
	}
}

// A rank that dies while the others wait on nonblocking collectives through
// the communicator's shared area fails them with ErrProcFailed: one started
// directly (no collective on the schedule engine under way) and one on the
// engine (queued behind an Igather waiting for the dead rank).
func TestDeadRankDuringAreaCollectives(t *testing.T) {
	const n, victim = 3, 2
	runDeadJob(t, n, victim,
		func(w *Comm) error {
			if err := w.Barrier(); err != nil { // makes the area
				return err
			}
			time.Sleep(30 * time.Millisecond)
			return nil
		},
		func(w *Comm, died func() time.Time) error {
			if err := w.Barrier(); err != nil {
				return err
			}
			require.Equal(t, shmReady, w.shmState.Load())
			var x [1]int64
			switch w.Rank() {
			case 0: // direct: started before the death is known
				req, err := Iallreduce(w, []int64{1}, x[:], Sum[int64]())
				require.NoError(t, err)
				require.Equal(t, w.nbcHead, len(w.nbcq), "the Iallreduce went directly")
				_, err = req.Wait()
				requireProcFailed(t, err, victim)
				since(t, died, "direct Iallreduce")
			case 1: // on the engine, behind an Igather that waits for the victim
				g := make([]int64, n)
				rg, err := Igather(w, []int64{1}, g, 1)
				require.NoError(t, err)
				req, err := Iallreduce(w, []int64{1}, x[:], Sum[int64]())
				require.NoError(t, err)
				require.NotEqual(t, w.nbcHead, len(w.nbcq))
				_, err = req.Wait()
				requireProcFailed(t, err, victim)
				since(t, died, "Iallreduce on the engine")
				_, err = rg.Wait()
				requireProcFailed(t, err, victim)
			}
			return nil
		})
}
