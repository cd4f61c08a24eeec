package main

import (
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestProbeHop(t *testing.T) {
	if runtime.NumCPU() < 2 {
		require.Zero(t, probeHop(1000), "one CPU: no probe")
		return
	}
	ns := probeHop(2000)
	require.Greater(t, ns, 0.0)
	require.Less(t, ns, 1e6, "a hop of a millisecond is not a cache line's")
	require.Zero(t, probeHop(0))
}

func TestRepOrder(t *testing.T) {
	jobs := []job{{Bench: "a"}, {Bench: "b"}, {Bench: "c"}}
	names := func(js []job) (s string) {
		for _, j := range js {
			s += j.Bench
		}
		return s
	}
	require.Equal(t, "abc", names(repOrder(jobs, 1)))
	require.Equal(t, "cba", names(repOrder(jobs, 2)))
	require.Equal(t, "abc", names(repOrder(jobs, 3)))
	require.Equal(t, "abc", names(jobs), "the plan itself is left alone")
}

func TestFastSamples(t *testing.T) {
	probes := []runProbe{
		{"bw", "amgo-shm", 1, 70, 80},   // fast
		{"bw", "ompi-shm", 1, 75, 290},  // ends slow
		{"bw", "amgo-shm", 2, 300, 280}, // slow
		{"bw", "ompi-shm", 2, 60, 119},  // fast: 119 <= 2*60
		{"bw", "mpich-shm", 1, 0, 0},    // not probed
	}
	limit := fastLimit(probes)
	require.Equal(t, 120.0, limit)
	var samples []sample
	for _, p := range probes {
		samples = append(samples, sample{Bench: p.Bench, Config: p.Config, Column: "MB/s", Size: 8, Rep: p.Rep, Value: 1})
	}
	fast := fastSamples(samples, probes, limit)
	require.Len(t, fast, 2)
	require.Equal(t, "amgo-shm", fast[0].Config)
	require.Equal(t, 1, fast[0].Rep)
	require.Equal(t, "ompi-shm", fast[1].Config)
	require.Equal(t, 2, fast[1].Rep)

	sum := phaseSummary(probes, limit)
	require.Contains(t, sum, "lowest 60 ns")
	require.Contains(t, sum, "2 of 5 runs")
	require.Zero(t, fastLimit([]runProbe{{"bw", "x", 1, 0, 0}}))
	require.Contains(t, phaseSummary(nil, 0), "No cross-core probes")
}

func TestReportFastPhaseTables(t *testing.T) {
	cfg := func(name string) config { return config{Name: name} }
	jobs := []job{{Bench: "bw", Cfg: cfg("amgo-shm")}, {Bench: "bw", Cfg: cfg("ompi-shm")}}
	samples := []sample{
		{"bw", "amgo-shm", "Bandwidth (MB/s)", 8, 1, 100, 70},
		{"bw", "ompi-shm", "Bandwidth (MB/s)", 8, 1, 90, 300},
		{"bw", "amgo-shm", "Bandwidth (MB/s)", 8, 2, 60, 280},
		{"bw", "ompi-shm", "Bandwidth (MB/s)", 8, 2, 95, 72},
	}
	probes := []runProbe{{"bw", "amgo-shm", 1, 70, 65}, {"bw", "ompi-shm", 1, 300, 290},
		{"bw", "amgo-shm", 2, 280, 260}, {"bw", "ompi-shm", 2, 72, 70}}
	md := report(nil, jobs, samples, probes, nil)
	all, fast, ok := strings.Cut(md, "## Compact tables, runs in the fast phase")
	require.True(t, ok, md)
	require.Contains(t, all, "| 8B | 80.0 (60.0–100) | 92.5 (90.0–95.0) |")
	require.Contains(t, fast, "| 8B | 100 (100–100), n=1 | 95.0 (95.0–95.0), n=1 |")
	require.Contains(t, fast, "2 of 4 runs")
	// amgo against Open MPI in each repetition: 100/90 (amgo fast, Open
	// MPI slow), 60/95 (the other way round): no fast pair.
	require.Contains(t, md, "## amgo against the MPIs, repetition by repetition")
	require.Contains(t, md, "| 8B | no fast; 0.87 (2) | no fast; 0.87 (2) |")
}

// The compact tables name each collective's column as osu prints it, so
// that the 2- and 4-rank collectives appear in them.
func TestCompactCollectiveTables(t *testing.T) {
	cfg := func(name string) config { return config{Name: name} }
	jobs := []job{{Bench: "allreduce", Cfg: cfg("amgo-shm")}, {Bench: "allreduce-4", Cfg: cfg("amgo-shm")},
		{Bench: "ialltoall-4", Cfg: cfg("amgo-shm")}}
	samples := []sample{
		{"allreduce", "amgo-shm", "Avg Latency(us)", 8, 1, 0.2, 0},
		{"allreduce-4", "amgo-shm", "Avg Latency(us)", 8, 1, 4.5, 0},
		{"ialltoall-4", "amgo-shm", "Overall(us)", 8, 1, 19, 0},
		{"ialltoall-4", "amgo-shm", "Pure Comm.(us)", 8, 1, 5.5, 0},
	}
	md := report(nil, jobs, samples, nil, nil)
	compact, _, ok := strings.Cut(md, "## Full tables")
	require.True(t, ok, md)
	require.NotContains(t, md, "## amgo against the MPIs", "no MPI ran: no ratio section")
	for _, want := range []string{"### allreduce: Avg Latency(us)", "### allreduce-4: Avg Latency(us)",
		"### ialltoall-4: Overall(us)", "### ialltoall-4: Pure Comm.(us)", "| 8B | 4.50 (4.50–4.50) |"} {
		require.Contains(t, compact, want)
	}
}

// Four ranks of each implementation, launched as each launches an
// oversubscribed job, without changing the 2-rank configurations.
func TestPlanFour(t *testing.T) {
	amgo := config{Name: "amgo-shm", Impl: "amgo", Launch: []string{"amrun", "-n", "4"}}
	ompi := config{Name: "ompi-shm", Impl: "ompi", Launch: []string{"mpirun", "--oversubscribe", "-np", "2", "--mca", "btl", "self,vader"}}
	mpich := config{Name: "mpich-shm", Impl: "mpich", Launch: []string{"mpiexec.mpich", "-n", "2", "-bind-to", "core"}}
	jobs := planFour(amgo, ompi, mpich, false)
	require.Len(t, jobs, 15)
	require.Equal(t, "2", ompi.Launch[3], "the 2-rank configuration is left alone")
	for _, j := range jobs {
		require.True(t, strings.HasSuffix(j.Bench, "-4"), j.Bench)
		switch j.Cfg.Impl {
		case "ompi":
			require.Equal(t, []string{"mpirun", "--oversubscribe", "-np", "4", "--mca", "btl", "self,vader"}, j.Cfg.Launch)
		case "mpich":
			require.Equal(t, []string{"mpiexec.mpich", "-n", "4"}, j.Cfg.Launch)
			require.Contains(t, strings.Join(j.Args, " "), "-i 200 ")
		case "amgo":
			require.Contains(t, strings.Join(j.Args, " "), "-m 8:8 -i 2000 ")
		}
	}
}
