// Package examples_test runs the example programs as a user would: built with
// go build and launched by amrun, as real processes over shared memory and as
// goroutine ranks over loop.
package examples_test

import (
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func build(t *testing.T, dir string, pkgs ...string) {
	t.Helper()
	args := append([]string{"build", "-o", dir + "/"}, pkgs...)
	out, err := exec.Command("go", args...).CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
}

func TestExamplesUnderAmrun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and launches programs")
	}
	dir := t.TempDir()
	build(t, dir, "../cmd/amrun", "./am-pingpong", "./am-ring", "../bench/ampingpong")
	amrun := filepath.Join(dir, "amrun")
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"pingpong-shm", []string{"-n", "2", "--timeout", "60s", filepath.Join(dir, "am-pingpong"), "-i", "2000"}, "ping-pong: OK"},
		{"pingpong-loop", []string{"-n", "2", "--transport", "loop", "--timeout", "60s", filepath.Join(dir, "am-pingpong"), "-i", "2000"}, "ping-pong: OK"},
		{"ring-shm", []string{"-n", "4", "--timeout", "60s", filepath.Join(dir, "am-ring"), "-laps", "200"}, "ring: 4 ranks, 200 laps over shm: sum 1200: OK"},
		{"ring-loop", []string{"-n", "5", "--transport", "loop", "--timeout", "60s", filepath.Join(dir, "am-ring"), "-laps", "200"}, "ring: 5 ranks, 200 laps over loop: sum 2000: OK"},
		{"bench-store-shm", []string{"-n", "2", "--timeout", "60s", filepath.Join(dir, "ampingpong"), "-k", "store", "-m", "4194304", "-i", "20", "-x", "2"}, "4194304"},
		{"bench-medium-loop", []string{"-n", "2", "--transport", "loop", "--timeout", "60s", filepath.Join(dir, "ampingpong"), "-k", "medium", "-i", "200", "-x", "10"}, "# Size"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, err := exec.Command(amrun, c.args...).CombinedOutput()
			require.NoError(t, err, "%s", out)
			require.Contains(t, string(out), c.want)
		})
	}
}

// A program that fails on one rank ends the job with an error naming the rank.
func TestFailingRankEndsJob(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and launches programs")
	}
	dir := t.TempDir()
	build(t, dir, "../cmd/amrun", "./am-pingpong")
	// am-pingpong on one rank returns an error ("needs at least 2 ranks").
	out, err := exec.Command(filepath.Join(dir, "amrun"), "-n", "1", "--timeout", "30s", filepath.Join(dir, "am-pingpong")).CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), "needs at least 2 ranks")
	require.Contains(t, string(out), "rank 0")
}

// The MPI examples (mpiam): ping-pong, ring and the heat solver, as processes
// over shm and as goroutine ranks over loop.
func TestMPIExamplesUnderAmrun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and launches programs")
	}
	dir := t.TempDir()
	build(t, dir, "../cmd/amrun", "./pingpong", "./ring", "./heat", "./halo3d")
	amrun := filepath.Join(dir, "amrun")
	pingpong, ring, heat := filepath.Join(dir, "pingpong"), filepath.Join(dir, "ring"), filepath.Join(dir, "heat")
	halo3d := filepath.Join(dir, "halo3d")
	cases := []struct {
		name string
		args []string
		want []string
	}{
		{"pingpong-shm-2", []string{"-n", "2", pingpong, "-i", "200", "-max", "1048576"},
			[]string{"1048576", "pingpong: OK"}},
		{"pingpong-shm-4", []string{"-n", "4", pingpong, "-i", "100", "-max", "262144"},
			[]string{"262144", "pingpong: OK"}},
		{"pingpong-loop-3", []string{"-n", "3", "--transport", "loop", pingpong, "-i", "100", "-max", "262144"},
			[]string{"262144", "pingpong: OK"}},
		{"ring-shm-2", []string{"-n", "2", ring, "-laps", "500"},
			[]string{"2 ranks, 500 laps: token 1500", "every rank has 3", "ring: OK"}},
		{"ring-shm-4", []string{"-n", "4", ring, "-laps", "500"},
			[]string{"4 ranks, 500 laps: token 5000", "every rank has 10", "ring: OK"}},
		{"ring-loop-3", []string{"-n", "3", "--transport", "loop", ring, "-laps", "500"},
			[]string{"3 ranks, 500 laps: token 3000", "every rank has 6", "ring: OK"}},
		{"heat-shm-1", []string{"-n", "1", heat, "-nx", "64", "-ny", "48", "-iters", "400"},
			[]string{"process grid 1 x 1 (1 ranks)", "max |parallel - serial| = 0.000e+00", "heat: check PASSED"}},
		{"heat-shm-2", []string{"-n", "2", heat, "-nx", "64", "-ny", "64", "-iters", "400"},
			[]string{"process grid 2 x 1 (2 ranks)", "heat: check PASSED"}},
		{"heat-shm-3-uneven", []string{"-n", "3", heat, "-nx", "100", "-ny", "61", "-iters", "400", "-k", "7"},
			[]string{"process grid 3 x 1 (3 ranks), blocks of 33..34 x 61 points", "400 iterations (max 400, tol 5.0e-05, residual every 7)", "heat: check PASSED"}},
		{"heat-shm-4", []string{"-n", "4", heat, "-nx", "65", "-ny", "67", "-iters", "400"},
			[]string{"process grid 2 x 2 (4 ranks), blocks of 32..33 x 33..34 points", "heat: check PASSED"}},
		{"heat-loop-3", []string{"-n", "3", "--transport", "loop", heat, "-nx", "40", "-ny", "90", "-iters", "400"},
			[]string{"process grid 1 x 3 (3 ranks)", "heat: check PASSED"}},
		{"heat-loop-6-converges", []string{"-n", "6", "--transport", "loop", heat, "-nx", "30", "-ny", "20", "-tol", "1e-4"},
			[]string{"process grid 3 x 2 (6 ranks)", "converged", "heat: check PASSED"}},
		{"halo3d-shm-1", []string{"-n", "1", halo3d, "-n", "20", "-sweeps", "5"},
			[]string{"20^3 on 1 x 1 x 1 ranks, neighbor exchange", "halo3d: check PASSED"}},
		{"halo3d-shm-2", []string{"-n", "2", halo3d, "-n", "25", "-sweeps", "8"},
			[]string{"25^3 on 2 x 1 x 1 ranks", "halo3d: check PASSED"}},
		{"halo3d-shm-4-isend", []string{"-n", "4", halo3d, "-n", "23", "-sweeps", "8", "-mode", "isend"},
			[]string{"23^3 on 2 x 2 x 1 ranks, isend exchange", "halo3d: check PASSED"}},
		// The columns bench/harness reads (names apart by two spaces or more).
		{"halo3d-shm-2-bench", []string{"-n", "2", halo3d, "-sizes", "12,16", "-sweeps", "3", "-bench"},
			[]string{"# Size     Time per sweep (us)       Exchange (us)  Exchange only (us)\n12 ", "\n16 "}},
		{"halo3d-loop-8", []string{"-n", "8", "--transport", "loop", halo3d, "-n", "19", "-sweeps", "6"},
			[]string{"19^3 on 2 x 2 x 2 ranks", "halo3d: check PASSED"}},
		{"halo3d-loop-6-isend", []string{"-n", "6", "--transport", "loop", halo3d, "-n", "21", "-sweeps", "6", "-mode", "isend"},
			[]string{"21^3 on 3 x 2 x 1 ranks", "halo3d: check PASSED"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			args := append([]string{"--timeout", "60s"}, c.args...)
			out, err := exec.Command(amrun, args...).CombinedOutput()
			require.NoError(t, err, "%s", out)
			for _, w := range c.want {
				require.Contains(t, string(out), w)
			}
		})
	}
}

// A heat run that cannot be decomposed fails the job with a message saying why.
func TestHeatRejectsTooManyRanks(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and launches programs")
	}
	dir := t.TempDir()
	build(t, dir, "../cmd/amrun", "./heat")
	out, err := exec.Command(filepath.Join(dir, "amrun"), "-n", "3", "--timeout", "30s", filepath.Join(dir, "heat"), "-nx", "2", "-ny", "2").CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), "cannot be split over 3 ranks")
}

// The tools end to end: the heat demo traced with amrun --trace, the traces
// turned into messages by amtrace with every message matched, and profiled
// with amrun --profile.
func TestHeatTracedAndProfiled(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and launches programs")
	}
	dir := t.TempDir()
	build(t, dir, "../cmd/amrun", "../cmd/amtrace", "./heat")
	traces := filepath.Join(dir, "traces")
	out, err := exec.Command(filepath.Join(dir, "amrun"), "-n", "4", "--timeout", "60s", "--trace", traces,
		filepath.Join(dir, "heat"), "-iters", "200").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "heat: check PASSED")
	out, err = exec.Command(filepath.Join(dir, "amtrace"), traces).CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "0 unmatched sends, 0 unmatched receives")
	require.NotContains(t, string(out), "warning")
	jsonFile := filepath.Join(dir, "heat.json")
	out, err = exec.Command(filepath.Join(dir, "amtrace"), "-json", jsonFile, traces).CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.FileExists(t, jsonFile)

	out, err = exec.Command(filepath.Join(dir, "amrun"), "-n", "3", "--timeout", "60s", "--profile",
		filepath.Join(dir, "heat"), "-iters", "100").CombinedOutput()
	require.NoError(t, err, "%s", out)
	for _, want := range []string{"heat: check PASSED", "# amgo profile", "compensated ms", "Waitall", "job (3 ranks)"} {
		require.Contains(t, string(out), want)
	}
}
