package main

import (
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Every subcommand runs to its end over shared memory between processes
// launched by amrun, with few iterations: a benchmark that hangs (as match
// did once its queued sends outgrew the receiver's unexpected limit and
// went by rendezvous) fails here, within amrun's timeout, rather than in a
// make bench an hour long.
func TestSubcommandsUnderAmrun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and launches programs")
	}
	dir := t.TempDir()
	out, err := exec.Command("go", "build", "-o", dir+"/", "../../cmd/amrun", ".").CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	few := []string{"-i", "4", "-x", "1"}
	runs := []struct {
		ranks int
		args  []string
		row   string // the first column of a row the run must print
	}{
		{2, []string{"latency", "-m", "8:65536"}, "65536"},
		{2, []string{"latency", "-m", "8:16384", "-d", "vector"}, "16384"},
		{2, []string{"bw", "-m", "8:65536", "-W", "8"}, "65536"},
		{2, []string{"bibw", "-m", "8:65536", "-W", "8"}, "65536"},
		{2, []string{"mbw_mr", "-m", "8:8", "-W", "8"}, "8"},
		{2, []string{"latency_mt", "-m", "8:8", "-t", "2"}, "8"},
		// More queued messages than the default unexpected limit holds.
		{2, []string{"match", "-q", "10000"}, "10000"},
		{3, []string{"match", "-q", "100"}, "100"},
		{2, []string{"am", "-k", "short"}, "8"},
		{2, []string{"am", "-k", "medium", "-m", "8:1024"}, "1024"},
		{2, []string{"am", "-k", "store", "-bw", "-m", "8:65536", "-W", "8"}, "65536"},
		{3, []string{"allreduce", "-m", "8:1024"}, "1024"},
		{3, []string{"bcast", "-m", "8:1024"}, "1024"},
		{3, []string{"alltoall", "-m", "8:1024"}, "1024"},
		{3, []string{"barrier"}, "0"},
		{2, []string{"iallreduce", "-m", "8:1024"}, "1024"},
		{2, []string{"ialltoall", "-m", "8:1024"}, "1024"},
		{2, []string{"ibcast", "-m", "8:1024"}, "1024"},
		{2, []string{"ibarrier"}, "0"},
		{2, []string{"put_latency", "-m", "8:1024"}, "1024"},
		{2, []string{"get_bw", "-m", "8:1024", "-s", "fence"}, "1024"},
		{2, []string{"acc_latency", "-m", "8:1024", "-s", "lock"}, "1024"},
		{2, []string{"fop_latency", "-s", "pscw"}, "8"},
		{2, []string{"cas_latency"}, "8"},
	}
	for _, r := range runs {
		t.Run(strings.Join(r.args, "_"), func(t *testing.T) {
			args := append([]string{"-n", strconv.Itoa(r.ranks), "--timeout", "60s", filepath.Join(dir, "osu")}, r.args...)
			out, err := exec.Command(filepath.Join(dir, "amrun"), append(args, few...)...).CombinedOutput()
			require.NoError(t, err, "%s", out)
			var rows []string
			for _, l := range strings.Split(string(out), "\n") {
				if f := strings.Fields(l); len(f) > 1 && !strings.HasPrefix(l, "#") {
					rows = append(rows, f[0])
				}
			}
			require.Contains(t, rows, r.row, "no row for %s in:\n%s", r.row, out)
		})
	}
}
