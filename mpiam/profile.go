package mpiam

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"
)

// The built-in "profile" tool: time per MPI routine, raw and compensated for
// the tool's own overhead (TAU overhead compensation: Malony and Shende,
// "Overhead Compensation in Performance Profiling", Euro-Par 2004; Shende et
// al., "Performance Profiling Overhead Compensation for MPI Programs",
// EuroPVM/MPI 2005).
//
// Every rank measures the time its own hooks take (its overhead o) and keeps
// its delay x: how much later its events happen than they would without the
// tool. The delay rides on every message it sends (Piggybacker). A rank that
// waited w in a call that received a message from a sender with delay x1,
// while its own delay was x2, applies the two-case rule:
//
//	x1 >= x2 + w: all the waiting was caused by the sender's overhead:
//	              w' = 0,              x2' = x2 + w
//	x1 <  x2 + w: w' = w + x2 - x1 (clipped at 0), x2' = x1
//
// so that the waiting time it reports is what it would have been without
// instrumentation. For an Irecv the rule is applied at the Wait/Test that
// completes it, with the value that arrived with the message; for a call that
// completes several receives, or a collective, with the largest delay among
// the senders it depends on.

// EnvProfileCost adds an artificial cost (a Go duration, e.g. "2ms") to every
// hook of the profile tool: a known overhead for validating the compensation.
const EnvProfileCost = "AMGO_PROFILE_COST"

// RoutineProfile is one MPI routine's line of a rank's profile.
type RoutineProfile struct {
	Routine string `json:"routine"`
	Calls   int64  `json:"calls"`
	// RawNs is the time measured around the calls, hooks included: what an
	// uncompensated profiler reports, in nanoseconds.
	RawNs int64 `json:"raw_ns"`
	// CompensatedNs is the time the calls would have taken without the tool:
	// the hooks' own time removed, and waiting for messages corrected by the
	// two-case rule, in nanoseconds.
	CompensatedNs int64 `json:"compensated_ns"`
}

// RankProfile is one rank's profile, as written to AMGO_PROFILE/rank-N.json.
type RankProfile struct {
	Rank       int              `json:"rank"`
	Size       int              `json:"size"`
	WallNs     int64            `json:"wall_ns"`     // from the tool's start to the rank's finalize
	OverheadNs int64            `json:"overhead_ns"` // time spent in this rank's hooks (o)
	DelayNs    int64            `json:"delay_ns"`    // final delay x
	Routines   []RoutineProfile `json:"routines"`
}

type profCall struct {
	enter, start time.Time
}

type profRoutine struct {
	calls     int64
	raw, comp time.Duration
}

// profiler is the profile tool of one rank.
type profiler struct {
	rank, size int
	dir        string
	cost       time.Duration
	begin      time.Time

	mu       sync.Mutex
	inflight map[*Event]profCall
	routines [callEnd]profRoutine
	overhead time.Duration
	delay    atomic.Int64 // x, in ns: read by PiggybackValue from handlers
}

func init() {
	_ = RegisterTool("profile", newProfiler)
}

func newProfiler(w *Comm) (Tool, error) {
	p := &profiler{rank: w.Rank(), size: w.Size(), dir: os.Getenv(EnvProfile), begin: time.Now(), inflight: map[*Event]profCall{}}
	if v := os.Getenv(EnvProfileCost); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return nil, fmt.Errorf("%w: %s=%q is not a duration", ErrArg, EnvProfileCost, v)
		}
		p.cost = d
	}
	return p, nil
}

// NewProfiler returns the profile tool for world's rank, writing its profile
// to dir (nothing is written if dir is empty) with an artificial cost per hook
// (0 for none). Attach it with AddTool; AMGO_PROFILE does this for every rank.
func NewProfiler(world *Comm, dir string, cost time.Duration) Tool {
	return &profiler{rank: world.Rank(), size: world.Size(), dir: dir, cost: cost, begin: time.Now(), inflight: map[*Event]profCall{}}
}

// PiggybackValue is the rank's current delay in nanoseconds.
func (p *profiler) PiggybackValue() uint64 { return uint64(max(p.delay.Load(), 0)) }

func (p *profiler) spend(from time.Time) time.Time {
	if p.cost > 0 {
		time.Sleep(p.cost - time.Since(from))
	}
	return time.Now()
}

func (p *profiler) Before(e *Event) {
	enter := time.Now()
	start := p.spend(enter)
	p.mu.Lock()
	p.inflight[e] = profCall{enter: enter, start: start}
	ov := start.Sub(enter)
	p.overhead += ov
	p.mu.Unlock()
	p.delay.Add(int64(ov))
}

// received returns the largest piggybacked delay among the messages the call
// received, if any.
func received(e *Event) (time.Duration, bool) {
	var best uint64
	found := false
	consider := func(st Status) {
		if st.HasPiggyback && (!found || st.Piggyback > best) {
			best, found = st.Piggyback, true
		}
	}
	consider(e.Status)
	for _, st := range e.Statuses {
		consider(st)
	}
	return time.Duration(best), found
}

func (p *profiler) After(e *Event) {
	end := time.Now()
	p.mu.Lock()
	c, ok := p.inflight[e]
	delete(p.inflight, e)
	p.mu.Unlock()
	if !ok {
		return
	}
	w := end.Sub(c.start) // the time in the MPI call proper
	comp := w
	if x1, ok := received(e); ok && e.Call != CallIsend && e.Call != CallIbsend && e.Call != CallIssend && e.Call != CallIrsend {
		x2 := time.Duration(p.delay.Load())
		if x1 >= x2+w {
			comp = 0
			p.delay.Store(int64(x2 + w))
		} else {
			comp = max(w+x2-x1, 0)
			p.delay.Store(int64(x1))
		}
	}
	leave := p.spend(time.Now())
	ov := leave.Sub(end)
	p.mu.Lock()
	p.overhead += ov
	r := &p.routines[e.Call]
	r.calls++
	r.raw += leave.Sub(c.enter)
	r.comp += comp
	p.mu.Unlock()
	p.delay.Add(int64(ov))
}

// Profile returns the rank's profile so far.
func (p *profiler) Profile() RankProfile {
	p.mu.Lock()
	defer p.mu.Unlock()
	rp := RankProfile{Rank: p.rank, Size: p.size, WallNs: int64(time.Since(p.begin)), OverheadNs: int64(p.overhead), DelayNs: p.delay.Load()}
	for c := Call(1); c < callEnd; c++ {
		if r := p.routines[c]; r.calls > 0 {
			rp.Routines = append(rp.Routines, RoutineProfile{Routine: c.String(), Calls: r.calls, RawNs: int64(r.raw), CompensatedNs: int64(r.comp)})
		}
	}
	return rp
}

// Close writes the profile to the directory, if one was given.
func (p *profiler) Close() error {
	if p.dir == "" {
		return nil
	}
	b, err := json.MarshalIndent(p.Profile(), "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(p.dir, 0o755); err != nil {
		return fmt.Errorf("profile: %w", err)
	}
	return os.WriteFile(filepath.Join(p.dir, fmt.Sprintf("rank-%d.json", p.rank)), b, 0o644)
}

// ReadProfiles reads the rank profiles a job wrote to dir, ordered by rank.
// Errors: a file that is not a profile.
func ReadProfiles(dir string) ([]RankProfile, error) {
	files, err := filepath.Glob(filepath.Join(dir, "rank-*.json"))
	if err != nil {
		return nil, err
	}
	var out []RankProfile
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		var rp RankProfile
		if err := json.Unmarshal(b, &rp); err != nil {
			return nil, fmt.Errorf("profile %s: %w", f, err)
		}
		out = append(out, rp)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Rank < out[j].Rank })
	return out, nil
}

// WriteProfileReport prints the profiles per rank and for the whole job: calls,
// raw and compensated time per routine, in milliseconds.
func WriteProfileReport(w io.Writer, profiles []RankProfile) error {
	job := map[string]*RoutineProfile{}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	line := func(cells ...string) { fmt.Fprintln(tw, strings.Join(cells, "\t")+"\t") }
	ms := func(ns int64) string { return fmt.Sprintf("%.3f", float64(ns)/1e6) }
	for _, rp := range profiles {
		fmt.Fprintf(tw, "rank %d: wall %s ms, tool overhead %s ms, final delay %s ms\n", rp.Rank, ms(rp.WallNs), ms(rp.OverheadNs), ms(rp.DelayNs))
		line("routine", "calls", "raw ms", "compensated ms")
		for _, r := range rp.Routines {
			line(r.Routine, fmt.Sprint(r.Calls), ms(r.RawNs), ms(r.CompensatedNs))
			j := job[r.Routine]
			if j == nil {
				j = &RoutineProfile{Routine: r.Routine}
				job[r.Routine] = j
			}
			j.Calls += r.Calls
			j.RawNs += r.RawNs
			j.CompensatedNs += r.CompensatedNs
		}
		line()
	}
	names := make([]string, 0, len(job))
	for n := range job {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintf(tw, "job (%d ranks):\n", len(profiles))
	line("routine", "calls", "raw ms", "compensated ms")
	for _, n := range names {
		j := job[n]
		line(n, fmt.Sprint(j.Calls), ms(j.RawNs), ms(j.CompensatedNs))
	}
	return tw.Flush()
}
