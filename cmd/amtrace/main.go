// Command amtrace reads the per-rank trace files of an amgo job and shows its
// MPI messages.
//
// Usage:
//
//	amtrace DIR
//	amtrace -json out.json DIR
//
// DIR holds one file rank-<r>.amtr per rank (written by package trace). The
// first form prints every matched message ordered by send time (time, source
// and destination world ranks, communicator, tag, bytes, latency), the
// statistics of every (source, destination) pair, the unmatched sends and
// receives, and, on standard error, the problems found in the records. The
// second form writes a Chrome trace / Perfetto JSON file instead, with one
// process per rank, a slice per MPI call and an arrow from each send to its
// receive; open it in https://ui.perfetto.dev.
//
// Times are in microseconds since the earliest rank's clock epoch. A file cut
// short (a rank killed before it closed its trace) is read up to its last whole
// record, with a warning. Any other malformed or missing file is an error: amtrace says which file and which
// byte, and exits with status 1 (2 for a usage error).
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/amgo-hpc/amgo/trace"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("amtrace", flag.ContinueOnError)
	fs.SetOutput(stderr)
	jsonOut := fs.String("json", "", "write Chrome trace / Perfetto JSON to this `file` (open it in https://ui.perfetto.dev)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: amtrace [-json out.json] DIR\n\n"+
			"Reads DIR/rank-<r>.amtr of every rank; prints the matched messages, per-pair\n"+
			"statistics and unmatched messages, or writes Perfetto JSON with -json.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return 2
	}
	dir := fs.Arg(0)
	tr, err := trace.ReadDir(dir)
	if err != nil {
		fmt.Fprintf(stderr, "amtrace: %v\n", err)
		return 1
	}
	for r, f := range tr.Ranks {
		if f.Truncated != nil {
			fmt.Fprintf(stderr, "amtrace: warning: %s is cut short (the rank did not close its trace); its records up to the cut are used: %v\n",
				trace.FileName(uint32(r)), f.Truncated)
		}
	}
	m, problems := tr.Messages()
	if problems != nil {
		fmt.Fprintf(stderr, "amtrace: warning: problems in the records (the results below ignore them):\n%v\n", problems)
	}
	if *jsonOut != "" {
		if err := writeJSON(*jsonOut, tr, m); err != nil {
			fmt.Fprintf(stderr, "amtrace: %v\n", err)
			return 1
		}
		fmt.Fprintf(stdout, "%d ranks, %d messages, %d unmatched sends, %d unmatched receives\n",
			len(tr.Ranks), len(m.Messages), len(m.UnmatchedSends), len(m.UnmatchedReceives))
		fmt.Fprintf(stdout, "wrote %s: open it in https://ui.perfetto.dev (Open trace file)\n", *jsonOut)
		return 0
	}
	if err := report(stdout, tr, m); err != nil {
		fmt.Fprintf(stderr, "amtrace: %v\n", err)
		return 1
	}
	return 0
}

func writeJSON(path string, tr *trace.Trace, m *trace.Matching) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := trace.WriteChromeJSON(f, tr, m); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// us formats nanoseconds as microseconds with three decimals.
// us formats a time of ns nanoseconds in microseconds with three decimals.
func us(ns uint64) string { return fmt.Sprintf("%d.%03d", ns/1000, ns%1000) }

// usDur formats a duration in microseconds, as us does; a negative one (clocks
// of two ranks that disagree) keeps its sign.
func usDur(d time.Duration) string {
	if d < 0 {
		return "-" + us(uint64(-d))
	}
	return us(uint64(d))
}

func report(out io.Writer, tr *trace.Trace, m *trace.Matching) error {
	records := 0
	for _, f := range tr.Ranks {
		records += len(f.Records)
	}
	fmt.Fprintf(out, "%d ranks, %d records, %d messages, %d unmatched sends, %d unmatched receives\n",
		len(tr.Ranks), records, len(m.Messages), len(m.UnmatchedSends), len(m.UnmatchedReceives))

	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(out, "\nmessages (by send time; times in µs):\n")
	fmt.Fprintf(tw, "time\tsrc\t->\tdst\tcomm\ttag\tbytes\tlatency\t\n")
	for _, x := range m.Messages {
		fmt.Fprintf(tw, "%s\t%d\t->\t%d\t%d\t%d\t%d\t%v\t\n", us(x.SendTime), x.Src, x.Dst, x.Comm, x.Tag, x.SendLength, usDur(x.Latency()))
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	fmt.Fprintf(out, "\nper-pair statistics (latencies in µs):\n")
	fmt.Fprintf(tw, "src\t->\tdst\tcount\tbytes\tmean\tmin\tmax\t\n")
	for _, p := range m.Pairs {
		fmt.Fprintf(tw, "%d\t->\t%d\t%d\t%d\t%s\t%s\t%s\t\n", p.Src, p.Dst, p.Count, p.Bytes, usDur(p.Mean), usDur(p.Min), usDur(p.Max))
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	peer := func(p int) string {
		if p < 0 {
			return "?"
		}
		return fmt.Sprint(p)
	}
	fmt.Fprintf(out, "\nunmatched sends (%d):\n", len(m.UnmatchedSends))
	if len(m.UnmatchedSends) > 0 {
		fmt.Fprintf(tw, "time\tsrc\t->\tdst\tcomm\ttag\tbytes\trecord\t\n")
		for _, u := range m.UnmatchedSends {
			fmt.Fprintf(tw, "%s\t%d\t->\t%s\t%d\t%d\t%d\t%d\t\n", us(u.Time), u.Src, peer(u.Dst), u.Comm, u.Tag, u.Length, u.Index)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(out, "\nunmatched receives (%d):\n", len(m.UnmatchedReceives))
	if len(m.UnmatchedReceives) > 0 {
		fmt.Fprintf(tw, "time\tsrc\t->\tdst\tcomm\ttag\tbytes\trecord\t\n")
		for _, u := range m.UnmatchedReceives {
			fmt.Fprintf(tw, "%s\t%s\t->\t%d\t%d\t%d\t%d\t%d\t\n", us(u.Time), peer(u.Src), u.Dst, u.Comm, u.Tag, u.Length, u.Index)
		}
	}
	return tw.Flush()
}
