package main

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/amgo-hpc/amgo/trace"
)

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
	buildOut  []byte
)

// buildAmtrace compiles the command (once per test binary) into a temporary
// directory removed by TestMain.
func buildAmtrace(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "amtrace-test")
		if buildErr == nil {
			buildOut, buildErr = exec.Command("go", "build", "-o", filepath.Join(binDir, "amtrace"), ".").CombinedOutput()
		}
	})
	require.NoError(t, buildErr, "go build: %s", buildOut)
	return filepath.Join(binDir, "amtrace")
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// runAmtrace runs the binary and returns stdout, stderr and the exit status.
func runAmtrace(t *testing.T, bin string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else {
		require.NoError(t, err)
	}
	return stdout.String(), stderr.String(), code
}

// call records one MPI call: Enter at t0, the events, Leave at t1.
func call(t *testing.T, w *trace.Writer, name string, t0, t1 uint64, events ...trace.Record) {
	t.Helper()
	id, err := w.Region(name)
	require.NoError(t, err)
	require.NoError(t, w.Enter(t0, id))
	for _, e := range events {
		require.NoError(t, w.Write(e))
	}
	require.NoError(t, w.Leave(t1, id))
}

// writeJob writes a 3-rank job: communicator 0 is the world, communicator 4
// holds world ranks 2 and 1 in that order. Rank 1's clock epoch is 1 µs
// after the others'.
func writeJob(t *testing.T, dir string) {
	const epoch = 1_700_000_000_000_000_000
	world := []uint32{0, 1, 2}
	split := []uint32{2, 1}
	open := func(rank uint32) *trace.Writer {
		e := int64(epoch)
		if rank == 1 {
			e += 1000
		}
		comms := map[uint32][]uint32{0: world}
		if rank != 0 {
			comms[4] = split
		}
		w, err := trace.Create(dir, trace.Definitions{Rank: rank, Size: 3, Clock: trace.Clock{Resolution: 1, Epoch: e}, Comms: comms})
		require.NoError(t, err)
		return w
	}
	type R = trace.Record
	w0 := open(0)
	call(t, w0, "MPI_Isend", 100, 120, R{Kind: trace.KindIsend, Time: 110, Peer: 1, Tag: 5, Length: 100, Request: 1})
	call(t, w0, "MPI_Send", 130, 150, R{Kind: trace.KindSend, Time: 140, Peer: 2, Tag: 5, Length: 8})
	call(t, w0, "MPI_Wait", 160, 180, R{Kind: trace.KindIsendComplete, Time: 170, Request: 1})
	call(t, w0, "MPI_Send", 200, 220, R{Kind: trace.KindSend, Time: 210, Peer: 1, Tag: 6, Length: 3}) // never received
	require.NoError(t, w0.Close())

	w1 := open(1)
	call(t, w1, "MPI_Irecv", 100, 110, R{Kind: trace.KindIrecvRequest, Time: 105, Request: 1})
	call(t, w1, "MPI_Irecv", 115, 117, R{Kind: trace.KindIrecvRequest, Time: 116, Request: 2})
	call(t, w1, "MPI_Irecv", 118, 120, R{Kind: trace.KindIrecvRequest, Time: 119, Request: 3})
	call(t, w1, "MPI_Waitsome", 300, 360,
		R{Kind: trace.KindIrecv, Time: 350, Peer: 0, Comm: 4, Tag: 1, Length: 16, Request: 2},
		R{Kind: trace.KindIrecv, Time: 350, Peer: 0, Comm: 0, Tag: 5, Length: 100, Request: 1})
	call(t, w1, "MPI_Cancel", 370, 380, R{Kind: trace.KindRequestCancelled, Time: 375, Request: 3})
	require.NoError(t, w1.Close())

	w2 := open(2)
	call(t, w2, "MPI_Recv", 100, 190, R{Kind: trace.KindRecv, Time: 180, Peer: 0, Tag: 5, Length: 8})
	call(t, w2, "MPI_Send", 200, 220, R{Kind: trace.KindSend, Time: 210, Peer: 1, Comm: 4, Tag: 1, Length: 16})
	require.NoError(t, w2.Close())
}

// fieldsOf splits the output into lines of whitespace-separated fields.
func fieldsOf(out string) [][]string {
	var ls [][]string
	for _, l := range strings.Split(out, "\n") {
		ls = append(ls, strings.Fields(l))
	}
	return ls
}

func requireLine(t *testing.T, out string, want ...string) {
	t.Helper()
	for _, l := range fieldsOf(out) {
		if slices.Equal(l, want) {
			return
		}
	}
	t.Fatalf("no line %q in output:\n%s", strings.Join(want, " "), out)
}

func TestAmtraceListsMessagesStatisticsAndUnmatchedAndWritesPerfettoJSON(t *testing.T) {
	bin := buildAmtrace(t)
	dir := t.TempDir()
	writeJob(t, dir)

	out, errOut, code := runAmtrace(t, bin, dir)
	require.Equal(t, 0, code, errOut)
	require.Empty(t, errOut)
	requireLine(t, out, "3", "ranks,", "34", "records,", "3", "messages,", "1", "unmatched", "sends,", "0", "unmatched", "receives")
	// messages in send order, ranks translated through communicator 4,
	// rank 1's times moved by its later epoch
	requireLine(t, out, "time", "src", "->", "dst", "comm", "tag", "bytes", "latency")
	requireLine(t, out, "0.110", "0", "->", "1", "0", "5", "100", "1.240")
	requireLine(t, out, "0.140", "0", "->", "2", "0", "5", "8", "0.040")
	requireLine(t, out, "0.210", "2", "->", "1", "4", "1", "16", "1.140")
	require.Less(t, strings.Index(out, "0.110"), strings.Index(out, "0.140"))
	require.Less(t, strings.Index(out, "0.140"), strings.Index(out, "0.210"))
	// per-pair statistics
	requireLine(t, out, "0", "->", "1", "1", "100", "1.240", "1.240", "1.240")
	requireLine(t, out, "0", "->", "2", "1", "8", "0.040", "0.040", "0.040")
	requireLine(t, out, "2", "->", "1", "1", "16", "1.140", "1.140", "1.140")
	// the send nobody received
	requireLine(t, out, "unmatched", "sends", "(1):")
	requireLine(t, out, "0.210", "0", "->", "1", "0", "6", "3", "10")
	requireLine(t, out, "unmatched", "receives", "(0):")

	jsonPath := filepath.Join(t.TempDir(), "out.json")
	out, errOut, code = runAmtrace(t, bin, "-json", jsonPath, dir)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "ui.perfetto.dev")
	data, err := os.ReadFile(jsonPath)
	require.NoError(t, err)
	var jt struct {
		TraceEvents []struct {
			Name string         `json:"name"`
			Ph   string         `json:"ph"`
			Ts   float64        `json:"ts"`
			Dur  float64        `json:"dur"`
			Pid  int            `json:"pid"`
			ID   *int           `json:"id"`
			Bp   string         `json:"bp"`
			Args map[string]any `json:"args"`
		} `json:"traceEvents"`
	}
	require.NoError(t, json.Unmarshal(data, &jt))
	procs := map[int]string{}
	phases := map[string]int{}
	starts, finishes := map[int]float64{}, map[int]float64{}
	for _, e := range jt.TraceEvents {
		phases[e.Ph]++
		switch e.Ph {
		case "M":
			if e.Name == "process_name" {
				procs[e.Pid] = e.Args["name"].(string)
			}
		case "s":
			starts[*e.ID] = e.Ts
		case "f":
			require.Equal(t, "e", e.Bp)
			finishes[*e.ID] = e.Ts
		}
	}
	require.Equal(t, map[int]string{1: "rank 0", 2: "rank 1", 3: "rank 2"}, procs)
	require.Equal(t, 11, phases["X"], "one slice per MPI call")
	require.Equal(t, map[int]float64{0: 0.11, 1: 0.14, 2: 0.21}, starts)
	require.Equal(t, map[int]float64{0: 1.35, 1: 0.18, 2: 1.35}, finishes)
}

func TestAmtraceReportsRecordProblemsAsWarnings(t *testing.T) {
	bin := buildAmtrace(t)
	dir := t.TempDir()
	w, err := trace.Create(dir, trace.Definitions{Size: 1, Comms: map[uint32][]uint32{0: {0}}})
	require.NoError(t, err)
	require.NoError(t, w.IsendComplete(5, 42))
	require.NoError(t, w.Close())
	out, errOut, code := runAmtrace(t, bin, dir)
	require.Equal(t, 0, code)
	require.Contains(t, errOut, "warning")
	require.Contains(t, errOut, "rank 0: record 0 IsendComplete@5{req 42}: trace: completion of a request id that is not pending")
	require.Contains(t, out, "0 messages")
}

func TestAmtraceFailsClearlyOnMalformedFiles(t *testing.T) {
	bin := buildAmtrace(t)
	dir := t.TempDir()
	writeJob(t, dir)
	// Rank 1's file cut in the middle (a rank killed before it closed its
	// trace) is read up to its last whole record, with a warning.
	p := filepath.Join(dir, "rank-1.amtr")
	data, err := os.ReadFile(p)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(p, data[:len(data)-5], 0o644))
	out, errOut, code := runAmtrace(t, bin, dir)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, errOut, "amtrace: warning: rank-1.amtr is cut short")
	require.Contains(t, out, "3 ranks")

	// A header cut short is an error naming the file.
	require.NoError(t, os.WriteFile(p, data[:10], 0o644))
	_, errOut, code = runAmtrace(t, bin, dir)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "rank-1.amtr: trace: malformed trace file at byte")

	require.NoError(t, os.WriteFile(p, []byte("not a trace at all, clearly, but long enough"), 0o644))
	_, errOut, code = runAmtrace(t, bin, dir)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, `magic "not " is not "AMTR"`)

	_, errOut, code = runAmtrace(t, bin, t.TempDir())
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "no rank-<r>.amtr files")

	_, errOut, code = runAmtrace(t, bin)
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "usage: amtrace [-json out.json] DIR")

	// Asking for help is not a usage error.
	_, errOut, code = runAmtrace(t, bin, "-h")
	require.Equal(t, 0, code)
	require.Contains(t, errOut, "usage: amtrace [-json out.json] DIR")
}
