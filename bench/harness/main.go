// Command harness runs amgo's OSU-style benchmarks (bench/osu) over amgo's
// transports and the C reference programs (bench/ref) under Open MPI and MPICH,
// over shared memory and TCP, interleaved (A B C C B A A B C ...) for -reps
// repetitions, and writes the medians with min-max as a CSV file and a Markdown
// report into a dated directory under -out (bench/results/<UTC stamp>/, and
// bench/results/latest pointing to it). Around every run it times a cache
// line's hop between two cores (phase.go) and reports the runs made in the
// machine's fast phase apart, since some guests change that cost several
// times over from one minute to the next. bench/run.sh (`make bench`) builds
// everything and calls it; bench/plot draws the figures from the CSV.
//
//	harness [-reps 3] [-quick] [-only regexp] [-bin bin] [-ref dir] [-out bench/results] [-cluster]
//
// With -cluster (root; `make bench-cluster`) it builds an emulated cluster
// of two nodes (internal/cluster: network namespaces on a bridge, each with
// its own host name and /dev/shm) and runs jobs across it instead: amgo
// under amrun --hosts, MPICH under Hydra and Open MPI under mpirun, each
// reaching the nodes through the cluster's ssh stand-in (see planCluster).
//
// Before the session it waits until the 1-minute load average is below
// -maxload; before every run it samples /proc/stat for half a second and waits
// (up to -loadwait) while the machine is busier than -maxbusy: the load average
// cannot serve between runs because the benchmarks' own two busy ranks keep it
// near 2. A configuration whose first run fails (a transport that does not
// exist yet, a missing MPI) is skipped for the rest of the session, with a note
// in the report.
package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/amgo-hpc/amgo/bench/internal/osu"
	"github.com/amgo-hpc/amgo/internal/cluster"
)

// config is one implementation over one network: how to launch a program of
// two ranks.
type config struct {
	Name   string   // e.g. "amgo-shm", "ompi-tcp"
	Impl   string   // "amgo", "ompi", "mpich"
	Launch []string // launcher and its arguments, before the program
	Env    []string // extra environment
	Prog   string   // the benchmark program
	Flags  []string // flags of the program after its subcommand (osu's -thread)
}

// job is one benchmark under one configuration.
type job struct {
	Bench string // row family name, e.g. "latency", "am-short"
	Cfg   config
	Args  []string // the benchmark program's arguments
	// Prep, if set, runs before every run of the job (the cluster's CPU
	// split).
	Prep func() error
}

func (j job) name() string { return j.Bench + "/" + j.Cfg.Name }

func (j job) command() []string {
	c := append(append([]string{}, j.Cfg.Launch...), j.Cfg.Prog)
	if len(j.Args) > 0 && len(j.Cfg.Flags) > 0 {
		c = append(append(c, j.Args[0]), j.Cfg.Flags...)
		return append(c, j.Args[1:]...)
	}
	return append(c, j.Args...)
}

// sample is one figure of one run.
type sample struct {
	Bench, Config, Column string
	Size, Rep             int
	Value                 float64
	Probe                 float64 // the run's worse cross-core probe, ns per hop (runProbe.worst)
}

// repOrder is the order of the jobs in repetition rep: as planned in odd
// repetitions, reversed in even ones, so that no configuration always runs
// just before or after another. The machine's phases (phase.go) last
// minutes; a fixed order would give the configuration run second the
// better chance of a phase that ended during the first.
func repOrder(jobs []job, rep int) []job {
	if rep%2 == 1 {
		return jobs
	}
	r := make([]job, len(jobs))
	for i, j := range jobs {
		r[len(jobs)-1-i] = j
	}
	return r
}

func main() {
	reps := flag.Int("reps", 3, "repetitions of every run")
	quick := flag.Bool("quick", false, "small sizes and few iterations (a smoke test of the harness)")
	only := flag.String("only", "", "run only jobs whose bench/config name matches this regexp")
	bin := flag.String("bin", "bin", "directory of amrun and osu")
	ref := flag.String("ref", "bench/results/ref", "directory of osu_ref_ompi and osu_ref_mpich")
	out := flag.String("out", "bench/results", "directory for the dated results")
	maxLoad := flag.Float64("maxload", 1.0, "wait before the session until the 1-minute load average is below this")
	maxBusy := flag.Float64("maxbusy", 0.3, "wait before each run while other processes keep more than this many CPUs busy")
	loadWait := flag.Duration("loadwait", 2*time.Minute, "longest wait for a quiet machine before running anyway")
	timeout := flag.Duration("timeout", 5*time.Minute, "limit of one run")
	onCluster := flag.Bool("cluster", false, "run 2-node jobs on an emulated cluster (root): amgo, MPICH and Open MPI across nodes")
	flag.Parse()

	var jobs []job
	if *onCluster {
		dir, err := os.MkdirTemp("", "amgo-bench-cluster-")
		if err != nil {
			fatal(err)
		}
		c, err := cluster.Build(2, "node", dir)
		if err != nil {
			fatal(err)
		}
		atExit = func() { c.Close(); os.RemoveAll(dir) }
		if _, err := c.Link(0, 1, pairDev, pairMTU); err != nil {
			atExit()
			fatal(err)
		}
		defer atExit()
		sigs := make(chan os.Signal, 1)
		signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
		go func() { s := <-sigs; atExit(); fmt.Fprintln(os.Stderr, "harness:", s); os.Exit(130) }()
		jobs = planCluster(*bin, *ref, c, *quick)
		afterRun = func() {
			if err := c.Reset(); err != nil {
				fmt.Fprintln(os.Stderr, "harness:", err)
			}
		}
		if *timeout == 5*time.Minute { // the default: a launcher that hangs across nodes should cost less
			*timeout = 2 * time.Minute
		}
	} else {
		jobs = plan(*bin, *ref, *quick)
	}
	if *only != "" {
		re, err := regexp.Compile(*only)
		if err != nil {
			fatal(err)
		}
		var keep []job
		for _, j := range jobs {
			if re.MatchString(j.name()) {
				keep = append(keep, j)
			}
		}
		jobs = keep
	}
	start := time.Now().UTC()
	dir := filepath.Join(*out, start.Format("20060102T150405Z"))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		fatal(err)
	}
	waitLoad(*maxLoad, *loadWait)
	facts := machineFacts(start, *reps)
	var samples []sample
	var notes []string
	skipped := map[string]bool{}
	logf, err := os.Create(filepath.Join(dir, "runs.log"))
	if err != nil {
		fatal(err)
	}
	defer logf.Close()
	var probes []runProbe
	for rep := 1; rep <= *reps; rep++ {
		for _, j := range repOrder(jobs, rep) {
			if skipped[j.Cfg.Name] {
				continue
			}
			if j.Prep != nil {
				if err := j.Prep(); err != nil {
					fatal(fmt.Errorf("%s: %w", j.name(), err))
				}
			}
			busy := waitQuiet(*maxBusy, *loadWait)
			fmt.Fprintf(os.Stderr, "harness: rep %d/%d %-28s (busy %.2f CPUs)\n", rep, *reps, j.name(), busy)
			pr := runProbe{Bench: j.Bench, Config: j.Cfg.Name, Rep: rep, Before: probeHop(probeRounds)}
			stdout, stderr, err := run(j, *timeout)
			afterRun()
			pr.After = probeHop(probeRounds)
			probes = append(probes, pr)
			fmt.Fprintf(logf, "=== rep %d %s busy=%.2f probe=%.0f/%.0fns: %s\n%s%s", rep, j.name(), busy, pr.Before, pr.After, strings.Join(j.command(), " "), stdout, stderr)
			cols, rows, perr := osu.Parse(bytes.NewReader(stdout))
			if err == nil && perr == nil && len(rows) == 0 {
				err = fmt.Errorf("no result rows")
			}
			if err != nil {
				msg := fmt.Sprintf("%s: %v: %s", j.name(), err, lastLine(stderr))
				if rep == 1 && !anyOK(samples, j.Cfg.Name) {
					skipped[j.Cfg.Name] = true
					msg = fmt.Sprintf("skipped %s for this session: %s", j.Cfg.Name, msg)
				}
				notes = append(notes, msg)
				fmt.Fprintln(os.Stderr, "harness:", msg)
				continue
			}
			for _, r := range rows {
				for c, v := range r.Values {
					col := fmt.Sprintf("col%d", c)
					if c < len(cols) {
						col = cols[c]
					}
					samples = append(samples, sample{j.Bench, j.Cfg.Name, col, r.Size, rep, v, pr.worst()})
				}
			}
		}
	}
	if err := writeCSV(filepath.Join(dir, "results.csv"), samples); err != nil {
		fatal(err)
	}
	md := report(facts, jobs, samples, probes, notes)
	if err := os.WriteFile(filepath.Join(dir, "results.md"), []byte(md), 0o644); err != nil {
		fatal(err)
	}
	latest := filepath.Join(*out, "latest")
	_ = os.Remove(latest)
	_ = os.Symlink(filepath.Base(dir), latest)
	fmt.Println(dir)
}

// atExit undoes what must not outlive the harness (the emulated cluster);
// afterRun clears what a run may leave behind (processes in its nodes).
var atExit, afterRun = func() {}, func() {}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "harness:", err)
	atExit()
	os.Exit(1)
}

func anyOK(samples []sample, cfg string) bool {
	for _, s := range samples {
		if s.Config == cfg {
			return true
		}
	}
	return false
}

func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}

// plan lists the jobs of one repetition, in the order they are interleaved.
func plan(bin, ref string, quick bool) []job {
	amrun := filepath.Join(bin, "amrun")
	osuProg := filepath.Join(bin, "osu")
	amgo := func(network string, n int) config {
		return config{Name: "amgo-" + network, Impl: "amgo", Prog: osuProg,
			Launch: []string{amrun, "-n", strconv.Itoa(n), "--transport", network, "--timeout", "4m"}}
	}
	ompi := func(btl, network string) config {
		return config{Name: "ompi-" + network, Impl: "ompi", Prog: filepath.Join(ref, "osu_ref_ompi"),
			Launch: []string{"mpirun.openmpi", "--allow-run-as-root", "--oversubscribe", "-np", "2", "--mca", "btl", btl}}
	}
	mpich := func(network string, env ...string) config {
		return config{Name: "mpich-" + network, Impl: "mpich", Prog: filepath.Join(ref, "osu_ref_mpich"),
			// Bound to a core each, as amrun and mpirun bind theirs
			// (Hydra leaves ranks unbound unless asked).
			Launch: []string{"mpiexec.mpich", "-n", "2", "-bind-to", "core"}, Env: env}
	}
	amgoNets := []string{"loop", "shm", "tcp"}
	// amgo's osu declares ThreadSingle, as the C programs' MPI_Init does;
	// amgo-shm-mt is the same over shm at ThreadMultiple.
	shmMT := amgo("shm", 2)
	shmMT.Name, shmMT.Flags = "amgo-shm-mt", []string{"-thread", "multiple"}
	ompiShm, mpichShm := ompi("self,vader", "shm"), mpich("shm")
	all := []config{amgo("loop", 2), amgo("shm", 2), amgo("tcp", 2),
		ompiShm, ompi("self,tcp", "tcp"),
		mpichShm, mpich("tcp", "MPIR_CVAR_NOLOCAL=1", "UCX_TLS=tcp,self")}
	p2p := append(all[:3:3], shmMT)
	p2p = append(p2p, all[3:]...)
	var sizes []string
	mt := []string{"-m", "0:65536", "-i", "1000", "-x", "10"}
	match := []string{}
	if quick {
		sizes = []string{"-m", "0:65536", "-i", "200", "-x", "10"}
		mt = []string{"-m", "0:1024", "-i", "100", "-x", "5"}
		match = []string{"-q", "1000", "-i", "50"}
	}
	var jobs []job
	collSizes := []string{}
	if quick {
		collSizes = []string{"-m", "1:65536", "-i", "200", "-x", "20"}
	}
	for _, b := range []string{"allreduce", "bcast", "alltoall", "barrier", "iallreduce", "ialltoall", "ibarrier"} {
		for _, c := range all {
			jobs = append(jobs, job{Bench: b, Cfg: c, Args: append([]string{b}, collSizes...)})
		}
	}
	for _, b := range []string{"latency", "bw", "bibw"} {
		for _, c := range p2p {
			jobs = append(jobs, job{Bench: b, Cfg: c, Args: append([]string{b}, sizes...)})
		}
	}
	jobs = append(jobs, job{Bench: "mbw_mr", Cfg: shmMT, Args: append([]string{"mbw_mr"}, sizes...)})
	for _, c := range []config{ompiShm, mpichShm} {
		jobs = append(jobs, job{Bench: "mbw_mr", Cfg: c, Args: append([]string{"mbw_mr"}, sizes...)})
	}
	for _, net := range amgoNets {
		c := amgo(net, 2)
		jobs = append(jobs,
			job{Bench: "mbw_mr", Cfg: c, Args: append([]string{"mbw_mr"}, sizes...)},
			job{Bench: "latency_mt", Cfg: c, Args: append([]string{"latency_mt", "-t", "2"}, mt...)},
			job{Bench: "match", Cfg: c, Args: append([]string{"match"}, match...)},
		)
		for _, k := range []string{"short", "medium", "store"} {
			jobs = append(jobs, job{Bench: "am-" + k, Cfg: c, Args: append([]string{"am", "-k", k}, sizes...)})
		}
		for _, k := range []string{"medium", "store"} {
			jobs = append(jobs, job{Bench: "am-" + k + "-bw", Cfg: c, Args: append([]string{"am", "-bw", "-k", k}, sizes...)})
		}
	}
	// Latency of a strided message (every other float64) beside the
	// contiguous one, over shared memory.
	for _, c := range all {
		if strings.HasSuffix(c.Name, "-shm") {
			jobs = append(jobs, job{Bench: "latency-vector", Cfg: c, Args: append([]string{"latency", "-d", "vector"}, sizes...)})
		}
	}
	// The 3-D halo exchange (examples/halo3d against bench/ref/halo3d.c),
	// 2 ranks: the grid edge is the row's size.
	haloSizes, sweeps := "32,64,128", "50"
	if quick {
		haloSizes, sweeps = "16,32", "10"
	}
	for _, c := range all {
		h := c
		args := []string{"-sizes", haloSizes, "-sweeps", sweeps, "-bench"}
		switch c.Impl {
		case "amgo":
			h.Prog = filepath.Join(bin, "halo3d")
		default:
			h.Prog = filepath.Join(ref, "halo3d_"+c.Impl)
			args = []string{"-s", haloSizes, "-i", sweeps}
		}
		jobs = append(jobs, job{Bench: "halo3d", Cfg: h, Args: args})
	}
	// One-sided communication (OSU's one-sided tests, bench/osu/rma.go and
	// bench/ref/osu_ref.c), windows from WinAllocate, flush synchronization
	// (and lock, fence, pscw for Put's latency). Open MPI picks its osc
	// component by the node, not the btl: osc sm (loads and stores in a
	// shared mapping) over shm, the others forced over tcp.
	rmaSizes := []string{"-m", "1:1048576"}
	if quick {
		rmaSizes = []string{"-m", "8:65536", "-i", "100", "-x", "10"}
	}
	for _, c := range all {
		rc := c
		if c.Impl == "ompi" {
			osc := "sm"
			if strings.HasSuffix(c.Name, "-tcp") {
				osc = "^sm"
			}
			rc.Launch = append(append([]string(nil), c.Launch...), "--mca", "osc", osc)
		}
		for _, b := range []string{"put_latency", "get_latency", "put_bw", "get_bw", "acc_latency", "fop_latency", "cas_latency"} {
			args := append([]string{b}, rmaSizes...)
			if b == "fop_latency" || b == "cas_latency" {
				args = []string{b}
			}
			jobs = append(jobs, job{Bench: b, Cfg: rc, Args: args})
		}
		for _, sync := range []string{"lock", "fence", "pscw"} {
			jobs = append(jobs, job{Bench: "put_latency-" + sync, Cfg: rc, Args: append([]string{"put_latency", "-s", sync}, rmaSizes...)})
		}
	}
	// Two pairs only where it does not oversubscribe busy-polling processes.
	jobs = append(jobs, job{Bench: "mbw_mr-2pairs", Cfg: amgo("loop", 4), Args: append([]string{"mbw_mr"}, sizes...)})
	return append(jobs, planFour(amgo("shm", 4), ompiShm, mpichShm, quick)...)
}

// planFour lists the collectives of four ranks on one node (the "-4"
// benches): on a machine of fewer than four CPUs they are oversubscribed
// for every implementation alike, each launched as it launches an
// oversubscribed job. amrun leaves such ranks unbound and they yield while
// they wait (docs/launch.md); Open MPI's mpirun --oversubscribe binds none
// and yields; MPICH's ranks spin (MPIR_CVAR_POLLS_BEFORE_YIELD changes
// nothing here), taking milliseconds per operation, so they run a tenth of
// the iterations, unbound. amgo and ompi are the 2-rank configurations of
// the same names with -n 4.
func planFour(amgo, ompi, mpich config, quick bool) []job {
	ompi.Launch = slices.Clone(ompi.Launch)
	ompi.Launch[slices.Index(ompi.Launch, "-np")+1] = "4"
	mpich.Launch = []string{"mpiexec.mpich", "-n", "4"}
	iters, mpichIters := []string{"-i", "2000", "-x", "200"}, []string{"-i", "200", "-x", "20"}
	if quick {
		iters, mpichIters = []string{"-i", "200", "-x", "20"}, []string{"-i", "20", "-x", "2"}
	}
	var jobs []job
	for _, b := range []string{"allreduce", "bcast", "barrier", "iallreduce", "ialltoall"} {
		args := []string{b, "-m", "8:8"}
		for _, c := range []config{amgo, ompi, mpich} {
			it := iters
			if c.Impl == "mpich" {
				it = mpichIters
			}
			jobs = append(jobs, job{Bench: b + "-4", Cfg: c, Args: append(slices.Clone(args), it...)})
		}
	}
	return jobs
}

// The point-to-point link between the emulated cluster's two nodes, beside
// their bridge: a veth pair, with the jumbo frames of a cluster's Ethernet.
const (
	pairDev = "p2p0"
	pairMTU = 9000
)

// planCluster lists the jobs of one repetition on the emulated cluster c
// (two nodes, node1 and node2), in the order they are interleaved:
//
//   - latency between two ranks of one node inside a 2-node job (ranks 2 and
//     3, on the other node, wait in a barrier), against a 4-rank job on one
//     node (shared memory only; ranks 2 and 3 idle there too, on the same
//     CPUs) and a job of the two ranks alone;
//   - latency, bandwidth and 8-byte message rate between ranks on
//     different nodes: amgo's routed job (shm to itself, AMGO_NET=tcp
//     across), amgo with --transport tcp, udp and xdp, MPICH and Open MPI
//     (over tcp), one rank per node;
//   - latency, bandwidth and 8-byte message rate over the veth pair that
//     joins the two nodes directly (pairDev), one rank per node: amgo with
//     --transport xdp, udp and tcp, MPICH and Open MPI over tcp;
//   - Allreduce and Bcast with 4 ranks, 2 per node: amgo's two-level
//     algorithms and its flat ones (AMGO_COLL_NODE_AWARE=0), MPICH, Open
//     MPI. Four busy ranks on a 2-core machine are oversubscribed for
//     every implementation alike.
func planCluster(bin, ref string, c *cluster.Cluster, quick bool) []job {
	amrun := filepath.Join(bin, "amrun")
	osuProg := filepath.Join(bin, "osu")
	amgo := func(name, hosts string, n int, extra ...string) config {
		l := []string{amrun, "--hosts", hosts, "--launcher-exec", c.StandIn, "--launch-iface", c.Bridge,
			"--timeout", "4m", "-n", strconv.Itoa(n)}
		return config{Name: name, Impl: "amgo", Prog: osuProg, Launch: append(l, extra...)}
	}
	mpich := func(name string, n, ppn int) config {
		return config{Name: name, Impl: "mpich", Prog: filepath.Join(ref, "osu_ref_mpich"),
			Launch: []string{"mpiexec.hydra", "-f", c.Hostfile, "-launcher", "ssh", "-launcher-exec", c.StandIn,
				"-iface", c.Bridge, "-n", strconv.Itoa(n), "-ppn", strconv.Itoa(ppn)}}
	}
	ompi := func(name, hosts string, n int, extra ...string) config {
		l := []string{"mpirun.openmpi", "--allow-run-as-root", "--oversubscribe", "--host", hosts, "-np", strconv.Itoa(n),
			"--mca", "plm_rsh_agent", c.StandIn, "--mca", "btl", "self,vader,tcp",
			"--mca", "btl_tcp_if_include", c.Subnet(), "--mca", "oob_tcp_if_include", c.Subnet()}
		return config{Name: name, Impl: "ompi", Prog: filepath.Join(ref, "osu_ref_ompi"), Launch: append(l, extra...)}
	}
	// The sizes the targets name, and few iterations for the collectives:
	// four ranks on two cores take milliseconds per operation.
	p2p := []string{"-m", "1:1048576"}
	allreduce := []string{"-m", "8:65536", "-i", "200", "-x", "20"}
	bcast := []string{"-m", "8:1048576", "-i", "100", "-x", "10"}
	if quick {
		p2p = []string{"-m", "1:65536", "-i", "200", "-x", "10"}
		allreduce = []string{"-m", "8:65536", "-i", "50", "-x", "5"}
		bcast = []string{"-m", "8:65536", "-i", "50", "-x", "5"}
	}
	// Nodes share the host's CPUs, except for the pairs across nodes: a
	// launcher binds each node's first rank to the first CPU it may use, so
	// on shared CPUs both ranks of a pair would share one core; each node
	// then has a core of its own, as real nodes do.
	cpus := func(c1, c2 string) func() error {
		return func() error {
			if err := c.SetCPUs(0, c1); err != nil {
				return err
			}
			return c.SetCPUs(1, c2)
		}
	}
	shared, split := cpus("", ""), cpus("0", "1")
	if numCPU() < 2 {
		split = shared
	}
	var jobs []job
	prep := shared
	add := func(bench string, args []string, cfgs ...config) {
		for _, cfg := range cfgs {
			jobs = append(jobs, job{Bench: bench, Cfg: cfg, Args: args, Prep: prep})
		}
	}
	// The nodes share the CPUs, so the idle ranks of the other node share
	// them with the pair: the reference with the same idle ranks is a job
	// of 4 ranks on one node (shared memory only); the pair alone is shown
	// too.
	add("latency-same-node", append([]string{"latency"}, p2p...),
		amgo("amgo-2x2", "node1:2,node2:2", 4), amgo("amgo-shm-only-4", "node1:4", 4), amgo("amgo-shm-only-2", "node1", 2))
	across := []config{amgo("amgo-1x1", "node1:1,node2:1", 2), amgo("amgo-tcp-only", "node1:1,node2:1", 2, "--transport", "tcp"),
		amgo("amgo-udp-only", "node1:1,node2:1", 2, "--transport", "udp"),
		amgo("amgo-xdp-only", "node1:1,node2:1", 2, "--transport", "xdp"),
		mpich("mpich-1x1", 2, 1),
		// Bound by mpirun (its default for two processes), both ranks of
		// the pair went to the host's first core whatever CPU their node
		// has (--report-bindings), and the busy-polling pair hung after
		// connecting; each node has one CPU here, so unbound is bound to it.
		ompi("ompi-1x1", "node1,node2", 2, "--bind-to", "none")}
	prep = split
	add("latency-other-node", append([]string{"latency"}, p2p...), across...)
	add("bw-other-node", append([]string{"bw"}, p2p...), across...)
	add("mbw_mr-other-node", append([]string{"mbw_mr"}, p2p...), across...)
	// One-sided communication between the nodes: OSU's seven tests with
	// flush, and the put latency under the other synchronization modes
	// and over a window from WinCreate.
	rmaOther := []string{"-m", "8:1048576", "-i", "1000", "-x", "50"}
	if quick {
		rmaOther = []string{"-m", "8:65536", "-i", "100", "-x", "10"}
	}
	for _, b := range []string{"put_latency", "get_latency", "put_bw", "get_bw", "acc_latency", "fop_latency", "cas_latency"} {
		args := append([]string{b}, rmaOther...)
		if b == "fop_latency" || b == "cas_latency" {
			args = []string{b, "-i", rmaOther[3], "-x", rmaOther[5]}
		}
		add(b+"-other-node", args, across...)
	}
	for _, mode := range [][]string{{"-s", "lock"}, {"-s", "fence"}, {"-s", "pscw"}, {"-w", "create"}} {
		args := append(append([]string{"put_latency"}, rmaOther...), mode...)
		add("put_latency"+mode[0]+"-"+mode[1]+"-other-node", args, across...)
	}
	// Over the veth pair: every implementation told to use it.
	env := func(cfg config, kv ...string) config { cfg.Env = append(cfg.Env, kv...); return cfg }
	pairOMPI := ompi("ompi-pair", "node1,node2", 2, "--bind-to", "none")
	for i, a := range pairOMPI.Launch {
		if a == "btl_tcp_if_include" {
			pairOMPI.Launch[i+1] = pairDev
		}
	}
	pairMPICH := mpich("mpich-pair", 2, 1)
	pairMPICH.Launch = append(pairMPICH.Launch, "-genv", "UCX_NET_DEVICES", pairDev)
	onPair := []config{
		env(amgo("amgo-xdp-pair", "node1:1,node2:1", 2, "--transport", "xdp"), "AMGO_IFACE="+pairDev),
		env(amgo("amgo-udp-pair", "node1:1,node2:1", 2, "--transport", "udp"), "AMGO_IFACE="+pairDev),
		env(amgo("amgo-tcp-pair", "node1:1,node2:1", 2, "--transport", "tcp"), "AMGO_IFACE="+pairDev),
		pairMPICH, pairOMPI,
	}
	add("latency-pair", append([]string{"latency"}, p2p...), onPair...)
	add("bw-pair", append([]string{"bw"}, p2p...), onPair...)
	add("mbw_mr-pair", append([]string{"mbw_mr"}, p2p...), onPair...)
	prep = shared
	four := []config{amgo("amgo-2x2-two-level", "node1:2,node2:2", 4),
		func() config {
			f := amgo("amgo-2x2-flat", "node1:2,node2:2", 4)
			f.Env = []string{"AMGO_COLL_NODE_AWARE=0"}
			return f
		}(),
		mpich("mpich-2x2", 4, 2), ompi("ompi-2x2", "node1:2,node2:2", 4)}
	add("allreduce-2x2", append([]string{"allreduce"}, allreduce...), four...)
	add("bcast-2x2", append([]string{"bcast"}, bcast...), four...)
	return jobs
}

func run(j job, limit time.Duration) (stdout, stderr []byte, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	argv := j.command()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), j.Cfg.Env...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	if ctx.Err() != nil {
		err = fmt.Errorf("timed out after %v", limit)
	}
	return o.Bytes(), e.Bytes(), err
}

func load1() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	v, _ := strconv.ParseFloat(strings.Fields(string(b))[0], 64)
	return v
}

// waitLoad waits until the 1-minute load average is below max, or for wait.
func waitLoad(max float64, wait time.Duration) {
	deadline := time.Now().Add(wait)
	for l := load1(); l > max && time.Now().Before(deadline); l = load1() {
		fmt.Fprintf(os.Stderr, "harness: 1-minute load %.2f > %.2f: waiting\n", l, max)
		time.Sleep(10 * time.Second)
	}
}

// cpuTimes returns the busy and total jiffies of all CPUs.
func cpuTimes() (busy, total float64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	f := strings.Fields(strings.SplitN(string(b), "\n", 2)[0])
	for i, s := range f[1:] {
		v, _ := strconv.ParseFloat(s, 64)
		total += v
		if i != 3 && i != 4 { // idle, iowait
			busy += v
		}
	}
	return busy, total
}

// busyCPUs is the number of CPUs kept busy over the next half second.
func busyCPUs() float64 {
	b0, t0 := cpuTimes()
	time.Sleep(500 * time.Millisecond)
	b1, t1 := cpuTimes()
	if t1 <= t0 {
		return 0
	}
	return (b1 - b0) / (t1 - t0) * float64(numCPU())
}

func numCPU() int {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 1
	}
	return strings.Count(string(b), "\ncpu")
}

// waitQuiet waits while more than max CPUs are busy, for at most wait; it
// returns the last measurement.
func waitQuiet(max float64, wait time.Duration) float64 {
	deadline := time.Now().Add(wait)
	b := busyCPUs()
	for b > max && time.Now().Before(deadline) {
		fmt.Fprintf(os.Stderr, "harness: %.2f CPUs busy before the run: waiting\n", b)
		time.Sleep(5 * time.Second)
		b = busyCPUs()
	}
	return b
}

func writeCSV(path string, samples []sample) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := csv.NewWriter(f)
	_ = w.Write([]string{"bench", "config", "column", "size", "rep", "value", "probe_ns"})
	for _, s := range samples {
		_ = w.Write([]string{s.Bench, s.Config, s.Column, strconv.Itoa(s.Size), strconv.Itoa(s.Rep),
			strconv.FormatFloat(s.Value, 'g', 6, 64), strconv.FormatFloat(s.Probe, 'f', 0, 64)})
	}
	w.Flush()
	if err := w.Error(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// machineFacts are the header lines of the report.
func machineFacts(start time.Time, reps int) []string {
	sh := func(name string, args ...string) string {
		out, err := exec.Command(name, args...).CombinedOutput()
		if err != nil {
			return "n/a"
		}
		return strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0])
	}
	cpu := "n/a"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "model name") {
				cpu = strings.TrimSpace(strings.SplitN(l, ":", 2)[1])
				break
			}
		}
	}
	mem := "n/a"
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		f := strings.Fields(string(b))
		if len(f) > 1 {
			kb, _ := strconv.ParseFloat(f[1], 64)
			mem = fmt.Sprintf("%.0f GiB", kb/(1<<20))
		}
	}
	return []string{
		"date: " + start.Format(time.RFC3339),
		"kernel: " + sh("uname", "-r"),
		fmt.Sprintf("cpu: %s x %d", cpu, numCPU()),
		"memory: " + mem,
		"go: " + sh("go", "version"),
		"gcc: " + sh("gcc", "--version"),
		"openmpi: " + sh("dpkg-query", "-W", "-f", "${Version}", "openmpi-bin") + " (" + sh("mpirun.openmpi", "--version") + ")",
		"mpich: " + sh("dpkg-query", "-W", "-f", "${Version}", "mpich") + " (" + strings.Join(strings.Fields(sh("sh", "-c", "mpichversion | grep Device")), " ") + ")",
		"amgo: " + sh("git", "log", "-1", "--format=%h %s"),
		fmt.Sprintf("load before the session: %.2f (1-minute average)", load1()),
		fmt.Sprintf("repetitions: %d, interleaved, every other one in reverse order; cells: median (min–max)", reps),
	}
}

// key identifies one figure across repetitions.
type key struct {
	Bench, Config, Column string
	Size                  int
}

// stats are the median, minimum and maximum of a figure over repetitions.
type stats struct {
	Med, Min, Max float64
	N             int // repetitions
}

func summarize(samples []sample) map[key]stats {
	vals := map[key][]float64{}
	for _, s := range samples {
		k := key{s.Bench, s.Config, s.Column, s.Size}
		vals[k] = append(vals[k], s.Value)
	}
	out := map[key]stats{}
	for k, v := range vals {
		med := median(v) // sorts v
		out[k] = stats{med, v[0], v[len(v)-1], len(v)}
	}
	return out
}

// num formats a figure with about three significant digits.
func num(v float64) string {
	switch {
	case v >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case v >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	default:
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
}

func (s stats) String() string {
	return fmt.Sprintf("%s (%s–%s)", num(s.Med), num(s.Min), num(s.Max))
}

func sizeLabel(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}

// table writes one Markdown table: rows are sizes (all, or those in pick),
// columns the configurations that have figures for (bench, column).
// withN adds each cell's number of repetitions.
func table(b *strings.Builder, sum map[key]stats, bench, column string, configs []string, pick []int, withN bool) {
	var cfgs []string
	sizeSet := map[int]bool{}
	for _, c := range configs {
		has := false
		for k := range sum {
			if k.Bench == bench && k.Column == column && k.Config == c {
				has = true
				sizeSet[k.Size] = true
			}
		}
		if has {
			cfgs = append(cfgs, c)
		}
	}
	if len(cfgs) == 0 {
		return
	}
	var sizes []int
	for s := range sizeSet {
		sizes = append(sizes, s)
	}
	sort.Ints(sizes)
	if pick != nil {
		var p []int
		for _, s := range pick {
			if sizeSet[s] {
				p = append(p, s)
			}
		}
		sizes = p
	}
	first := "size"
	if bench == "match" {
		first = "queued"
	}
	fmt.Fprintf(b, "\n### %s: %s\n\n| %s | %s |\n|---|%s\n", bench, column, first, strings.Join(cfgs, " | "), strings.Repeat("---:|", len(cfgs)))
	for _, s := range sizes {
		label := strconv.Itoa(s)
		if pick != nil {
			label = sizeLabel(s)
		}
		fmt.Fprintf(b, "| %s |", label)
		for _, c := range cfgs {
			if st, ok := sum[key{bench, c, column, s}]; ok && withN {
				fmt.Fprintf(b, " %s, n=%d |", st, st.N)
			} else if ok {
				fmt.Fprintf(b, " %s |", st)
			} else {
				b.WriteString(" |")
			}
		}
		b.WriteString("\n")
	}
}

func report(facts []string, jobs []job, samples []sample, probes []runProbe, notes []string) string {
	sum := summarize(samples)
	var configs, benches []string
	seenC, seenB := map[string]bool{}, map[string]bool{}
	for _, j := range jobs {
		if !seenC[j.Cfg.Name] {
			seenC[j.Cfg.Name] = true
			configs = append(configs, j.Cfg.Name)
		}
		if !seenB[j.Bench] {
			seenB[j.Bench] = true
			benches = append(benches, j.Bench)
		}
	}
	columns := func(bench string) []string {
		set := map[string]bool{}
		var cols []string
		for _, s := range samples {
			if s.Bench == bench && !set[s.Column] {
				set[s.Column] = true
				cols = append(cols, s.Column)
			}
		}
		// A ping-pong's bandwidth column is implied by its latency: leave it out.
		if len(cols) == 2 && cols[0] == "Latency (us)" {
			cols = cols[:1]
		}
		return cols
	}
	var b strings.Builder
	b.WriteString("# amgo benchmark results\n\n")
	for _, f := range facts {
		fmt.Fprintf(&b, "    %s\n", f)
	}
	b.WriteString("\nLatency in µs (one way, half the round trip), bandwidth in MB/s (10^6 bytes per second).\n")
	if len(notes) > 0 {
		b.WriteString("\nNotes:\n\n")
		for _, n := range notes {
			fmt.Fprintf(&b, "- %s\n", strings.ReplaceAll(n, "|", "\\|"))
		}
	}
	b.WriteString("\n## Compact tables\n")
	compact(&b, sum, configs, false)
	limit := fastLimit(probes)
	if limit > 0 {
		fmt.Fprintf(&b, "\n## Compact tables, runs in the fast phase\n\n%s Cells: median (min–max) of those runs, n of them; "+
			"compare configurations here when the phases differ between their runs.\n", phaseSummary(probes, limit))
		compact(&b, summarize(fastSamples(samples, probes, limit)), configs, true)
	}
	var ratios strings.Builder
	for _, t := range compactTables {
		if !strings.Contains(t.column, "(%)") {
			ratioTable(&ratios, samples, probes, limit, t.bench, t.column, t.sizes)
		}
	}
	if ratios.Len() > 0 {
		b.WriteString("\n## amgo against the MPIs, repetition by repetition\n\n" +
			"In one repetition a benchmark's configurations run one after another, so amgo's run and an MPI's " +
			"usually see the same phase of the machine. Cells: the median over the repetitions of amgo's figure " +
			"divided by the MPI's on the same network in the same repetition (\"the better MPI\": the better of " +
			"the two in that repetition, what the performance targets name), first over the repetitions whose " +
			"two runs both lay in the fast phase, with their count, then over all of them.\n")
		b.WriteString(ratios.String())
	}
	b.WriteString("\n## Full tables\n")
	for _, bench := range benches {
		for _, col := range columns(bench) {
			table(&b, sum, bench, col, configs, nil, false)
		}
	}
	return b.String()
}

// compactSpec names a compact table: a benchmark's column at the sizes
// the performance targets name (nil: every size).
type compactSpec struct {
	bench, column string
	sizes         []int
}

// compactTables are the compact tables, in the report's order.
var compactTables = []compactSpec{
	{"latency", "Latency (us)", []int{8, 1024, 16384, 65536, 1 << 20, 4 << 20}},
	{"bw", "Bandwidth (MB/s)", []int{8, 1024, 16384, 1 << 20, 4 << 20}},
	{"bibw", "Bandwidth (MB/s)", []int{8, 1024, 16384, 1 << 20, 4 << 20}},
	{"allreduce", "Avg Latency(us)", []int{4, 8, 1024, 65536, 1 << 20}},
	{"bcast", "Avg Latency(us)", []int{1, 8, 1024, 65536, 1 << 20}},
	{"alltoall", "Avg Latency(us)", []int{1, 1024, 65536}},
	{"barrier", "Avg Latency(us)", []int{0}},
	{"latency-vector", "Latency (us)", []int{8, 1024, 8192, 65536, 1 << 20}},
	{"halo3d", "Time per sweep (us)", nil},
	{"halo3d", "Exchange (us)", nil},
	{"halo3d", "Exchange only (us)", nil},
	{"iallreduce", "Pure Comm.(us)", []int{8, 1024, 65536}},
	{"iallreduce", "Overlap(%)", []int{8, 1024, 65536}},
	{"ialltoall", "Pure Comm.(us)", []int{8, 1024, 65536}},
	{"ialltoall", "Overlap(%)", []int{8, 1024, 65536}},
	{"ibarrier", "Pure Comm.(us)", []int{0}},
	{"allreduce-4", "Avg Latency(us)", []int{8}},
	{"bcast-4", "Avg Latency(us)", []int{8}},
	{"barrier-4", "Avg Latency(us)", []int{0}},
	{"iallreduce-4", "Pure Comm.(us)", []int{8}},
	{"iallreduce-4", "Overall(us)", []int{8}},
	{"ialltoall-4", "Pure Comm.(us)", []int{8}},
	{"ialltoall-4", "Overall(us)", []int{8}},
	{"put_latency", "Latency (us)", []int{8, 1024, 65536, 1 << 20}},
	{"get_latency", "Latency (us)", []int{8, 1024, 65536, 1 << 20}},
	{"put_bw", "Bandwidth (MB/s)", []int{8, 1024, 65536, 1 << 20}},
	{"fop_latency", "Latency (us)", []int{8}},
	{"latency-pair", "Latency (us)", []int{8, 1024, 4096, 65536, 1 << 20}},
	{"bw-pair", "Bandwidth (MB/s)", []int{8, 1024, 65536, 1 << 20}},
	{"mbw_mr-pair", "Messages/s", []int{8, 1024}},
}

// compact writes the compact tables.
func compact(b *strings.Builder, sum map[key]stats, configs []string, withN bool) {
	for _, t := range compactTables {
		table(b, sum, t.bench, t.column, configs, t.sizes, withN)
	}
}
