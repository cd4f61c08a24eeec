// Command amrun launches an amgo job: N processes of one program that find each
// other over PMI-1, served by amrun on an inherited socket per rank, or, with
// --hosts or --hostfile, over TCP to the ranks that a proxy per host (amrun
// itself, started through ssh or --launcher-exec) starts there.
//
//	amrun -n N [--hosts a,b:2 | --hostfile FILE] [--map-by slot|node] [--launcher-exec CMD] [--launch-iface NAME] [--transport shm|tcp|udp|xdp|loop|sim] [--iface NAME] [--bind-to core|none] [--tag-output] [--timeout D] [--timer-slack D] [--jobdir DIR] [--trace DIR] [--profile] prog args...
//
// See docs/launch.md and package internal/launch.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/amgo-hpc/amgo/am/transport"
	"github.com/amgo-hpc/amgo/internal/launch"
	"github.com/amgo-hpc/amgo/mpiam"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == launch.ProxyFlag {
		os.Exit(launch.RunProxy(os.Args[2:], os.Stdin, os.Stderr))
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run parses args, runs the job and returns amrun's exit status: 0 when every
// rank exited 0, 2 for bad usage, otherwise the failing rank's status (or 124
// for a timeout, 128+n for a signal).
func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("amrun", flag.ContinueOnError)
	fs.SetOutput(stderr)
	n := fs.Int("n", 1, "number of ranks")
	network := fs.String("transport", "", "one network for every pair of ranks (AMGO_TRANSPORT): shm, tcp, udp, xdp (AF_XDP, root, one rank per interface); loop or sim (faults injected) for N goroutine ranks in one process; default: shm between the ranks of a node, AMGO_NET (tcp) between nodes")
	bind := fs.String("bind-to", "", "bind each rank to a CPU of its own: core, or none; default: core when every rank gets a CPU (as Open MPI's mpirun binds 2 or fewer processes), else none")
	iface := fs.String("iface", "", "network interface (name or IP address) that tcp listens on (AMGO_IFACE); default: the host name's address")
	tag := fs.Bool("tag-output", false, "prefix each output line with [rank]")
	timeout := fs.Duration("timeout", 0, "end the job when it runs longer than this (e.g. 30s), after each rank has printed its pending operations (SIGUSR1, as `kill -USR1` of amrun does while the job goes on); 0 means no limit")
	jobdir := fs.String("jobdir", "", "parent directory for the per-job directory (default /dev/shm, else the temp dir)")
	traceDir := fs.String("trace", "", "every rank writes a trace of its MPI events to `DIR` (AMGO_TRACE); read it with amtrace DIR")
	slack := fs.Duration("timer-slack", launch.DefaultTimerSlack, "timer slack the ranks start with (how late the kernel may end their timed sleeps): it keeps the Go runtime's monitor thread from waking every 20 us on a busy-polling rank's CPU; 0 leaves amrun's own")
	hostList := fs.String("hosts", "", "run the ranks on these hosts, comma-separated, each `name` or name:slots (ranks it takes); amrun must be at the same path on each")
	hostfile := fs.String("hostfile", "", "read the hosts from `FILE`: one per line, name, name:slots or name slots=N")
	mapBy := fs.String("map-by", "slot", "placement on the hosts: slot (blocks: fill a host, then the next) or node (round-robin)")
	launcher := fs.String("launcher-exec", "ssh", "command that runs a command on a host, called as `CMD host command` like ssh")
	launchIface := fs.String("launch-iface", "", "interface or IP address at which the hosts reach amrun (PMI and control); default: the address of amrun's host name")
	profile := fs.Bool("profile", false, "profile every rank's MPI calls (AMGO_PROFILE) and print time per routine, raw and compensated for the tool's overhead, per rank and for the job")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: amrun -n N [--hosts a,b:2 | --hostfile FILE] [--map-by slot|node] [--launcher-exec CMD] [--launch-iface NAME] [--transport shm|tcp|udp|xdp|loop|sim] [--iface NAME] [--bind-to core|none] [--tag-output] [--timeout D] [--timer-slack D] [--jobdir DIR] [--trace DIR] [--profile] prog args...")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() == 0 {
		fmt.Fprintln(stderr, "amrun: no program given")
		fs.Usage()
		return 2
	}
	// Checked here, once, rather than by every rank at start-up.
	if known := transport.Names(); *network != "" && !slices.Contains(known, *network) {
		fmt.Fprintf(stderr, "amrun: unknown network %q for --transport (have %s)\n", *network, strings.Join(known, ", "))
		return 2
	}
	var hosts []launch.Host
	var err error
	switch {
	case *hostList != "" && *hostfile != "":
		fmt.Fprintln(stderr, "amrun: give --hosts or --hostfile, not both")
		return 2
	case *hostList != "":
		hosts, err = launch.ParseHosts(*hostList)
	case *hostfile != "":
		hosts, err = launch.ReadHostfilePath(*hostfile)
	}
	if err != nil {
		fmt.Fprintf(stderr, "amrun: %v\n", err)
		return 2
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, mpiam.DiagSignal)
	defer signal.Stop(sigs)

	var env []string // nil: the ranks inherit amrun's environment
	if *traceDir != "" || *profile {
		env = os.Environ()
	}
	if *traceDir != "" {
		abs, err := filepath.Abs(*traceDir)
		if err != nil {
			fmt.Fprintf(stderr, "amrun: --trace %s: %v\n", *traceDir, err)
			return 2
		}
		env = append(env, mpiam.EnvTrace+"="+abs)
	}
	var profDir string
	if *profile {
		d, err := os.MkdirTemp("", "amgo-profile-")
		if err != nil {
			fmt.Fprintf(stderr, "amrun: --profile: %v\n", err)
			return 2
		}
		defer os.RemoveAll(d)
		profDir = d
		env = append(env, mpiam.EnvProfile+"="+d)
	}
	err = launch.Run(context.Background(), launch.Spec{
		N: *n, Prog: fs.Arg(0), Args: fs.Args()[1:],
		Transport: *network, Iface: *iface, Bind: *bind, TagOutput: *tag, Timeout: *timeout, JobDirParent: *jobdir,
		Stdout: stdout, Stderr: stderr, Signals: sigs, Env: env, TimerSlack: rankSlack(*slack),
		DumpSignal: mpiam.DiagSignal,
		Hosts:      hosts, MapBy: *mapBy, LauncherExec: *launcher, LaunchIface: *launchIface,
	})
	if err != nil {
		fmt.Fprintf(stderr, "amrun: %v\n", err)
	}
	if profDir != "" {
		profs, perr := mpiam.ReadProfiles(profDir)
		switch {
		case perr != nil:
			fmt.Fprintf(stderr, "amrun: --profile: %v\n", perr)
		case len(profs) == 0:
			fmt.Fprintln(stderr, "amrun: --profile: no rank wrote a profile (not an mpiam program?)")
		default:
			fmt.Fprintln(stdout, "# amgo profile: time per MPI routine, raw and compensated for the profiler's overhead")
			_ = mpiam.WriteProfileReport(stdout, profs)
		}
	}
	return launch.ExitCode(err)
}

// rankSlack maps --timer-slack to launch.Spec.TimerSlack: 0 (or less) leaves
// amrun's own slack to the ranks.
func rankSlack(d time.Duration) time.Duration {
	if d <= 0 {
		return -1
	}
	return d
}
