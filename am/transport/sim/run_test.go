package sim_test

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/amgo-hpc/amgo/am"
)

// am.Run with AMGO_TRANSPORT=sim runs AMGO_LOOP_SIZE goroutine ranks over a
// sim network whose faults come from the AMGO_SIM_* variables, under the
// reliability layer.
func TestAMRunOverSim(t *testing.T) {
	t.Setenv(am.EnvTransport, "sim")
	t.Setenv(am.EnvLoopSize, "3")
	t.Setenv("AMGO_SIM_LOSS", "10%")
	t.Setenv("AMGO_SIM_REORDER", "0.3")
	t.Setenv("AMGO_SIM_DUP", "0.01")
	var ranks atomic.Int32
	err := am.Run(am.Config{}, func(ep *am.Endpoint) error {
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
	require.Error(t, am.Run(am.Config{}, func(*am.Endpoint) error { return nil }))
}
