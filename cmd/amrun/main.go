// Command amrun launches an amgo job: N processes of one program that find each
// other over PMI-1, served by amrun on an inherited socket per rank.
//
//	amrun -n N [--transport loop|shm|tcp] [--iface NAME] [--tag-output] [--timeout D] [--jobdir DIR] prog args...
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
	"syscall"

	"github.com/amgo-hpc/amgo/internal/launch"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run parses args, runs the job and returns amrun's exit status: 0 when every
// rank exited 0, 2 for bad usage, otherwise the failing rank's status (or 124
// for a timeout, 128+n for a signal).
func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("amrun", flag.ContinueOnError)
	fs.SetOutput(stderr)
	n := fs.Int("n", 1, "number of ranks")
	transport := fs.String("transport", "shm", "network the ranks use (AMGO_TRANSPORT): shm, tcp, or loop for N goroutine ranks in one process")
	iface := fs.String("iface", "", "network interface (name or IP address) that tcp listens on (AMGO_IFACE); default: the host name's address")
	tag := fs.Bool("tag-output", false, "prefix each output line with [rank]")
	timeout := fs.Duration("timeout", 0, "end the job when it runs longer than this (e.g. 30s); 0 means no limit")
	jobdir := fs.String("jobdir", "", "parent directory for the per-job directory (default /dev/shm, else the temp dir)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: amrun -n N [--transport loop|shm|tcp] [--iface NAME] [--tag-output] [--timeout D] [--jobdir DIR] prog args...")
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
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)

	err := launch.Run(context.Background(), launch.Spec{
		N: *n, Prog: fs.Arg(0), Args: fs.Args()[1:],
		Transport: *transport, Iface: *iface, TagOutput: *tag, Timeout: *timeout, JobDirParent: *jobdir,
		Stdout: stdout, Stderr: stderr, Signals: sigs,
	})
	if err != nil {
		fmt.Fprintf(stderr, "amrun: %v\n", err)
	}
	return launch.ExitCode(err)
}
