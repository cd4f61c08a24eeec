package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCounterparts(t *testing.T) {
	have := map[string]bool{"ompi-shm": true, "mpich-shm": true, "ompi-tcp": true, "ompi-pair": true, "mpich-pair": true}
	require.Equal(t, []string{"ompi-shm", "mpich-shm"}, counterparts("amgo-shm", have))
	require.Equal(t, []string{"ompi-shm", "mpich-shm"}, counterparts("amgo-shm-mt", have), "ThreadMultiple against the MPIs' default")
	require.Equal(t, []string{"ompi-tcp", ""}, counterparts("amgo-tcp", have), "only Open MPI over tcp")
	require.Equal(t, []string{"ompi-pair", "mpich-pair"}, counterparts("amgo-xdp-pair", have))
	require.Nil(t, counterparts("amgo-loop", have), "nothing to compare with")
	require.Nil(t, counterparts("ompi-shm", have), "not amgo")
}

// Ratios pair the runs of one repetition: amgo's rate over each MPI's and
// over the better of them, over the repetitions whose both runs were
// fast and over all; a time's better MPI is the lower.
func TestRepRatios(t *testing.T) {
	const bw, lat = "Bandwidth (MB/s)", "Latency (us)"
	samples := []sample{
		{"bw", "amgo-shm", bw, 8, 1, 100, 0}, {"bw", "ompi-shm", bw, 8, 1, 80, 0}, {"bw", "mpich-shm", bw, 8, 1, 125, 0},
		{"bw", "amgo-shm", bw, 8, 2, 50, 0}, {"bw", "ompi-shm", bw, 8, 2, 100, 0}, {"bw", "mpich-shm", bw, 8, 2, 40, 0},
		{"latency", "amgo-shm", lat, 8, 1, 0.2, 0}, {"latency", "ompi-shm", lat, 8, 1, 0.1, 0}, {"latency", "mpich-shm", lat, 8, 1, 0.4, 0},
	}
	probes := []runProbe{
		{"bw", "amgo-shm", 1, 70, 70}, {"bw", "ompi-shm", 1, 70, 70}, {"bw", "mpich-shm", 1, 300, 300},
		{"bw", "amgo-shm", 2, 300, 300}, {"bw", "ompi-shm", 2, 70, 70}, {"bw", "mpich-shm", 2, 70, 70},
	}
	cells := repRatios(samples, probes, 140, "bw", bw)
	require.Equal(t, []float64{1.25}, cells[ratioCell{"amgo-shm", "ompi-shm", 8}].fast)
	require.ElementsMatch(t, []float64{1.25, 0.5}, cells[ratioCell{"amgo-shm", "ompi-shm", 8}].all)
	require.Empty(t, cells[ratioCell{"amgo-shm", "mpich-shm", 8}].fast)
	require.ElementsMatch(t, []float64{0.8, 1.25}, cells[ratioCell{"amgo-shm", "mpich-shm", 8}].all)
	better := cells[ratioCell{"amgo-shm", "better", 8}]
	require.ElementsMatch(t, []float64{0.8, 0.5}, better.all, "rep 1 against MPICH's 125, rep 2 against Open MPI's 100")
	require.Empty(t, better.fast, "MPICH's run of rep 1 was slow, amgo's of rep 2")

	lc := repRatios(samples, nil, 0, "latency", lat)
	require.Equal(t, []float64{2}, lc[ratioCell{"amgo-shm", "better", 8}].all, "the lower time is the better")
	require.Empty(t, lc[ratioCell{"amgo-shm", "better", 8}].fast, "no probes: nothing counts as fast")

	var b strings.Builder
	ratioTable(&b, samples, probes, 140, "bw", bw, []int{8, 1024})
	md := b.String()
	require.Contains(t, md, "### bw: Bandwidth (MB/s) (above 1: amgo moves more)")
	require.Contains(t, md, "| size | amgo-shm / ompi-shm | amgo-shm / mpich-shm | amgo-shm / the better MPI |")
	require.Contains(t, md, "| 8B | 1.25 (1 fast); 0.88 (2) | no fast; 1.02 (2) | no fast; 0.65 (2) |")
	require.NotContains(t, md, "1KiB", "sizes without figures are left out")
}
