package mpiam

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// Ranks as real processes launched by amrun over shared memory: ring shifts
// up to 4 MiB (single-copy puts between processes), non-overtaking with
// AnySource from several senders, Ssend and Probe (cmd p2pcheck).
func TestProcessesUnderAmrun(t *testing.T) {
	dir := buildWithAmrun(t, "./internal/p2pcheck")
	for _, n := range []int{2, 4} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			out, err := exec.Command(filepath.Join(dir, "amrun"), "-n", fmt.Sprint(n), "--transport", "shm",
				"--timeout", "60s", filepath.Join(dir, "p2pcheck")).CombinedOutput()
			require.NoError(t, err, "%s", out)
			require.Contains(t, string(out), fmt.Sprintf("p2pcheck: %d ranks: OK", n))
		})
	}
}

// buildWithAmrun builds amrun and the test program pkg (a package path
// relative to mpiam) into a temporary directory and returns it; it skips the
// test under -short.
func buildWithAmrun(t *testing.T, pkg string) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and launches programs")
	}
	dir := t.TempDir()
	out, err := exec.Command("go", "build", "-o", dir+"/", "../cmd/amrun", pkg).CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	return dir
}
