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
