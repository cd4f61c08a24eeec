package job_test

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/amgo-hpc/amgo/am"
	"github.com/amgo-hpc/amgo/am/job"
)

// job.Run with AMGO_TRANSPORT=sim runs AMGO_LOOP_SIZE goroutine ranks over a
// sim network whose faults come from the AMGO_SIM_* variables, under the
// reliability layer.
func TestRunOverSim(t *testing.T) {
	t.Setenv(job.EnvTransport, "sim")
	t.Setenv(job.EnvLoopSize, "3")
	t.Setenv("AMGO_SIM_LOSS", "10%")
	t.Setenv("AMGO_SIM_REORDER", "0.3")
	t.Setenv("AMGO_SIM_DUP", "0.01")
	var ranks atomic.Int32
	err := job.Run(am.Config{}, func(ep *am.Endpoint) error {
		ranks.Add(1)
		if n := ep.Transport().Caps().Name; ep.Size() != 3 || n != "sim+reliable" {
			return fmt.Errorf("rank %d: job of %d over %q", ep.Rank(), ep.Size(), n)
		}
		for range 20 {
			if err := ep.Barrier(); err != nil {
				return err
			}
		}
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, int32(3), ranks.Load())

	t.Setenv("AMGO_SIM_LOSS", "lots")
	require.Error(t, job.Run(am.Config{}, func(*am.Endpoint) error { return nil }))
}
