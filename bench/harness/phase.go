package main

import (
	"fmt"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/amgo-hpc/amgo/internal/ring"
)

// probeRounds is how many round trips one probe makes: about 30 ms on a
// guest whose cores pass a line in 75 ns.
const probeRounds = 200000

// fastFactor bounds a run "in the fast phase": both of its probes at most
// this many times the session's low probe (fastLimit).
const fastFactor = 2.0

// probeHop measures what moving a cache line from one core to another
// costs now, in nanoseconds per one-way hop: rounds of an 8-byte record
// through internal/ring, from this goroutine to another and back (the
// ring's own ping-pong benchmark). Some guests change this cost by a factor
// of three to four from one minute to the next (a host that moves the
// vCPUs), and every small-message figure follows it, so the harness
// probes before and after each run and reports the runs that fell wholly
// in the machine's fast phase apart (report). It returns 0 on a machine of
// one CPU, where two busy goroutines would share it, or if the rings
// cannot be made.
func probeHop(rounds int) float64 {
	if runtime.NumCPU() < 2 || rounds <= 0 {
		return 0
	}
	if runtime.GOMAXPROCS(0) < 2 {
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2))
	}
	ab, errA := ring.Alloc(4096)
	ba, errB := ring.Alloc(4096)
	if errA != nil || errB != nil {
		return 0
	}
	pa, _ := ring.NewProducer(ab)
	ca, _ := ring.NewConsumer(ab)
	pb, _ := ring.NewProducer(ba)
	cb, _ := ring.NewConsumer(ba)
	msg := make([]byte, 8)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < rounds; i++ {
			for {
				if rec, ok := ca.Peek(); ok {
					for !pb.Push(rec, nil) {
					}
					ca.Advance()
					break
				}
			}
		}
	}()
	start := time.Now()
	for i := 0; i < rounds; i++ {
		for !pa.Push(msg, nil) {
		}
		for {
			if _, ok := cb.Peek(); ok {
				cb.Advance()
				break
			}
		}
	}
	el := time.Since(start)
	<-done
	return float64(el.Nanoseconds()) / float64(2*rounds)
}

// runProbe is the probes around one run.
type runProbe struct {
	Bench, Config string
	Rep           int
	Before, After float64 // ns per hop (probeHop); 0: not probed
}

// worst is the larger of the two probes.
func (p runProbe) worst() float64 { return max(p.Before, p.After) }

// fast reports whether the run was probed on both sides and lay wholly
// within limit.
func (p runProbe) fast(limit float64) bool {
	return p.Before > 0 && p.After > 0 && p.worst() <= limit
}

// probeValues is every probe of the runs probed on both sides, sorted.
func probeValues(probes []runProbe) []float64 {
	var all []float64
	for _, p := range probes {
		if p.Before > 0 && p.After > 0 {
			all = append(all, p.Before, p.After)
		}
	}
	sort.Float64s(all)
	return all
}

// fastLimit is the probe in ns at or under which a run counts as in the
// fast phase: fastFactor times the session's low probe, the tenth
// percentile of all its probes (not the lowest, which one lucky probe
// would set); 0 when nothing was probed.
func fastLimit(probes []runProbe) float64 {
	all := probeValues(probes)
	if len(all) == 0 {
		return 0
	}
	return fastFactor * all[len(all)/10]
}

// fastSamples keeps the samples of runs whose probes before and after both
// lie within limit.
func fastSamples(samples []sample, probes []runProbe, limit float64) []sample {
	type run struct {
		bench, config string
		rep           int
	}
	fast := map[run]bool{}
	for _, p := range probes {
		if p.fast(limit) {
			fast[run{p.Bench, p.Config, p.Rep}] = true
		}
	}
	var out []sample
	for _, s := range samples {
		if fast[run{s.Bench, s.Config, s.Rep}] {
			out = append(out, s)
		}
	}
	return out
}

// phaseSummary describes the session's probes in a sentence or two for the
// report: their spread and how many runs fell wholly in the fast phase.
func phaseSummary(probes []runProbe, limit float64) string {
	all := probeValues(probes)
	if len(all) == 0 {
		return "No cross-core probes (one CPU)."
	}
	fast := 0
	for _, p := range probes {
		if p.fast(limit) {
			fast++
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Cross-core probe (a cache line's one-way hop between two goroutines, before and after every run): "+
		"lowest %.0f ns, median %.0f, highest %.0f. ", all[0], all[len(all)/2], all[len(all)-1])
	fmt.Fprintf(&b, "%d of %d runs lay wholly in the fast phase (both probes at most %.0f ns, %.0fx the tenth percentile).",
		fast, len(probes), limit, fastFactor)
	return b.String()
}
