package mpiam

import (
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/amgo-hpc/amgo/am"
	"github.com/amgo-hpc/amgo/trace"
	"github.com/stretchr/testify/require"
)

// In an in-process job, Abort's code reaches the caller: the result is the
// abort alone (the other ranks' "endpoint closed" is its consequence).
func TestAbortInProcessCarriesItsCode(t *testing.T) {
	err := RunLocal(3, Config{}, func(w *Comm) error {
		if w.Rank() == 2 {
			return w.Abort(7)
		}
		return w.Barrier()
	})
	var ae *am.AbortError
	require.ErrorAs(t, err, &ae)
	require.ErrorIs(t, err, am.ErrAborted)
	require.Equal(t, 7, ae.Code)
	require.Equal(t, 2, ae.Rank)
	require.NotContains(t, err.Error(), "closed", "only the abort is reported")
}

// Under amrun, over every kind of network: the job ends with the code given to
// Abort, the first line of its output names the abort, and every rank's
// trace is readable (the aborting rank's closed by Abort, the others' by the
// launcher's SIGTERM, or by their own return in an in-process job).
func TestAbortUnderAmrunExitsWithCodeAndLeavesTraces(t *testing.T) {
	dir := buildWithAmrun(t, "./internal/abortcheck")
	for _, nw := range []string{"loop", "shm", "tcp"} {
		t.Run(nw, func(t *testing.T) {
			tr := t.TempDir()
			cmd := exec.Command(filepath.Join(dir, "amrun"), "-n", "3", "--transport", nw, "--timeout", "60s",
				"--trace", tr, filepath.Join(dir, "abortcheck"))
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			require.True(t, errors.As(err, &ee), "%v: %s", err, out)
			require.Equal(t, 7, ee.ExitCode(), "%s", out)
			first, _, _ := strings.Cut(string(out), "\n")
			require.Contains(t, first, "abort", "%s", out)
			require.NotContains(t, string(out), "endpoint closed", "%s", out)

			job, err := trace.ReadDir(tr)
			require.NoError(t, err, "%s", out)
			require.Len(t, job.Ranks, 3)
			require.Nil(t, job.Ranks[2].Truncated, "the aborting rank closes its trace")
			for r, f := range job.Ranks {
				require.NotEmpty(t, f.Records, "rank %d", r)
			}
			m, _ := job.Messages()
			require.GreaterOrEqual(t, len(m.Messages), 3, "the ring's messages are in the traces")
		})
	}
}

// An erroneous program that hangs: amrun --timeout has every rank print what
// it waits for before the job is ended (exit status 124).
func TestHungJobPrintsPendingOperations(t *testing.T) {
	dir := buildWithAmrun(t, "./internal/abortcheck")
	for _, nw := range []string{"loop", "shm", "tcp"} {
		t.Run(nw, func(t *testing.T) {
			cmd := exec.Command(filepath.Join(dir, "amrun"), "-n", "3", "--transport", nw, "--timeout", "1s",
				filepath.Join(dir, "abortcheck"), "hang")
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			require.True(t, errors.As(err, &ee), "%v: %s", err, out)
			require.Equal(t, 124, ee.ExitCode(), "%s", out)
			s := string(out)
			require.Contains(t, s, "amgo: rank 0:   receive from rank 1, tag 5, communicator 0, 8 bytes", s)
			require.Contains(t, s, "amgo: rank 1:   Bcast on communicator 0, root 0, 800 bytes", s)
			require.Contains(t, s, "amgo: rank 2:   Barrier on communicator 0", s)
			require.Contains(t, s, "timed out after 1s", s)
		})
	}
	// At a single-threaded level the blocking collective under way is
	// recorded without a lock, and still listed.
	cmd := exec.Command(filepath.Join(dir, "amrun"), "-n", "3", "--transport", "shm", "--timeout", "1s",
		filepath.Join(dir, "abortcheck"), "hang", "single")
	out, _ := cmd.CombinedOutput()
	s := string(out)
	require.Contains(t, s, "amgo: rank 1:   Bcast on communicator 0, root 0, 800 bytes", s)
	require.Contains(t, s, "amgo: rank 2:   Barrier on communicator 0", s)
	require.Contains(t, s, "without locks: receives not listed", s)
}
