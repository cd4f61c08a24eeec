package mpiam

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// Every collective with known answers on 4 processes over shared memory
// through amrun, on the world and on a split communicator while
// point-to-point traffic flows on the parent (cmd collcheck).
func TestCollectivesUnderAmrun(t *testing.T) {
	dir := buildWithAmrun(t, "./internal/collcheck")
	for _, n := range []int{3, 4} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			out, err := exec.Command(filepath.Join(dir, "amrun"), "-n", fmt.Sprint(n), "--transport", "shm",
				"--timeout", "60s", filepath.Join(dir, "collcheck")).CombinedOutput()
			require.NoError(t, err, "%s", out)
			require.Contains(t, string(out), fmt.Sprintf("collcheck: %d ranks: OK", n))
		})
	}
}
