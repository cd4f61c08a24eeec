package main

import (
	"fmt"
	"sort"
	"strings"
)

// The report's ratio tables compare amgo with each MPI run by run: in one
// repetition the configurations of a benchmark run one after another
// (repOrder), minutes apart at most, so both usually see the same phase of
// the machine (phase.go), while the medians of the compact tables may
// set amgo's runs in one phase against an MPI's in another. A cell is the
// median over the repetitions of amgo's figure divided by the MPI's in the
// same repetition, first over the repetitions whose two runs both lay in
// the fast phase, then over all.

// refImpls are the implementations amgo is set beside, in column order.
var refImpls = []string{"ompi", "mpich"}

// counterparts returns, for an amgo configuration, the configuration of
// each reference implementation on the same network (nil entries are
// missing): the same name after the implementation, else without the
// thread-level suffix "-mt" (ThreadMultiple against the MPIs' default), else,
// for a configuration "amgo-<network>-pair", the MPI's "-pair" run.
func counterparts(cfg string, have map[string]bool) []string {
	suffix, ok := strings.CutPrefix(cfg, "amgo-")
	if !ok {
		return nil
	}
	cands := []string{suffix, strings.TrimSuffix(suffix, "-mt")}
	if strings.HasSuffix(suffix, "-pair") {
		cands = append(cands, "pair")
	}
	refs := make([]string, len(refImpls))
	found := false
	for i, impl := range refImpls {
		for _, c := range cands {
			if have[impl+"-"+c] {
				refs[i], found = impl+"-"+c, true
				break
			}
		}
	}
	if !found {
		return nil
	}
	return refs
}

// lowerIsBetter reports whether a column is a time (its figures improve
// downwards) rather than a rate or a bandwidth.
func lowerIsBetter(column string) bool { return strings.Contains(column, "(us)") }

// ratioSet is the per-repetition ratios of one cell, over the fast phase
// and over all repetitions.
type ratioSet struct{ fast, all []float64 }

// ratioCell names a cell: an amgo configuration against a reference (a
// configuration name, or "better" for the better of the references in
// that repetition) at one size.
type ratioCell struct {
	amgo, ref string
	size      int
}

// repRatios computes the ratio cells of one benchmark column. A run counts
// as fast when its probes lie within limit (runProbe.fast); limit 0 leaves
// the fast sets empty.
func repRatios(samples []sample, probes []runProbe, limit float64, bench, column string) map[ratioCell]*ratioSet {
	type run struct {
		config string
		rep    int
	}
	fast := map[run]bool{}
	for _, p := range probes {
		if p.Bench == bench && limit > 0 && p.fast(limit) {
			fast[run{p.Config, p.Rep}] = true
		}
	}
	val := map[run]map[int]float64{}
	have := map[string]bool{}
	var configs []string
	for _, s := range samples {
		if s.Bench != bench || s.Column != column {
			continue
		}
		r := run{s.Config, s.Rep}
		if val[r] == nil {
			val[r] = map[int]float64{}
		}
		val[r][s.Size] = s.Value
		if !have[s.Config] {
			have[s.Config] = true
			configs = append(configs, s.Config)
		}
	}
	out := map[ratioCell]*ratioSet{}
	add := func(c ratioCell, v float64, isFast bool) {
		set := out[c]
		if set == nil {
			set = &ratioSet{}
			out[c] = set
		}
		set.all = append(set.all, v)
		if isFast {
			set.fast = append(set.fast, v)
		}
	}
	lower := lowerIsBetter(column)
	for _, a := range configs {
		refs := counterparts(a, have)
		if refs == nil {
			continue
		}
		for r, sizes := range val {
			if r.config != a {
				continue
			}
			for size, av := range sizes {
				best, bestFast, any := 0.0, true, false
				for _, ref := range refs {
					if ref == "" {
						continue
					}
					rv, ok := val[run{ref, r.rep}][size]
					if !ok || rv <= 0 {
						continue
					}
					isFast := fast[r] && fast[run{ref, r.rep}]
					add(ratioCell{a, ref, size}, av/rv, isFast)
					if !any || lower && rv < best || !lower && rv > best {
						best, bestFast = rv, isFast
					}
					any = true
				}
				if any {
					add(ratioCell{a, "better", size}, av/best, bestFast)
				}
			}
		}
	}
	return out
}

// median is the middle of v (the mean of the two middle values of an even
// count); v is sorted in place.
func median(v []float64) float64 {
	sort.Float64s(v)
	if len(v)%2 == 0 {
		return (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return v[len(v)/2]
}

// ratioTable writes one benchmark column's ratio table: a row per size
// (those in pick that have figures), a column per amgo configuration and
// reference (each MPI on the same network, then the better of them); nil
// pick: every size.
func ratioTable(b *strings.Builder, samples []sample, probes []runProbe, limit float64, bench, column string, pick []int) {
	cells := repRatios(samples, probes, limit, bench, column)
	if len(cells) == 0 {
		return
	}
	type pair struct{ amgo, ref string }
	var cols []pair
	seen := map[pair]bool{}
	sizeSet := map[int]bool{}
	for c := range cells {
		p := pair{c.amgo, c.ref}
		if !seen[p] {
			seen[p] = true
			cols = append(cols, p)
		}
		sizeSet[c.size] = true
	}
	refRank := func(ref string) int {
		for i, impl := range refImpls {
			if strings.HasPrefix(ref, impl+"-") {
				return i
			}
		}
		return len(refImpls) // "better" last
	}
	sort.Slice(cols, func(i, j int) bool {
		if cols[i].amgo != cols[j].amgo {
			return cols[i].amgo < cols[j].amgo
		}
		return refRank(cols[i].ref) < refRank(cols[j].ref)
	})
	var sizes []int
	for _, s := range pick {
		if sizeSet[s] {
			sizes = append(sizes, s)
		}
	}
	if pick == nil {
		for s := range sizeSet {
			sizes = append(sizes, s)
		}
		sort.Ints(sizes)
	}
	if len(sizes) == 0 {
		return
	}
	way := "above 1: amgo moves more"
	if lowerIsBetter(column) {
		way = "below 1: amgo is faster"
	}
	fmt.Fprintf(b, "\n### %s: %s (%s)\n\n| size |", bench, column, way)
	for _, c := range cols {
		ref := c.ref
		if ref == "better" {
			ref = "the better MPI"
		}
		fmt.Fprintf(b, " %s / %s |", c.amgo, ref)
	}
	fmt.Fprintf(b, "\n|---|%s\n", strings.Repeat("---:|", len(cols)))
	for _, s := range sizes {
		fmt.Fprintf(b, "| %s |", sizeLabel(s))
		for _, c := range cols {
			set := cells[ratioCell{c.amgo, c.ref, s}]
			switch {
			case set == nil:
				b.WriteString(" |")
			case len(set.fast) > 0:
				fmt.Fprintf(b, " %.2f (%d fast); %.2f (%d) |", median(set.fast), len(set.fast), median(set.all), len(set.all))
			default:
				fmt.Fprintf(b, " no fast; %.2f (%d) |", median(set.all), len(set.all))
			}
		}
		b.WriteString("\n")
	}
}
