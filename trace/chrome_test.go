package trace

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

type jsonEvent struct {
	Name string         `json:"name"`
	Cat  string         `json:"cat"`
	Ph   string         `json:"ph"`
	Ts   float64        `json:"ts"`
	Dur  *float64       `json:"dur"`
	Pid  int            `json:"pid"`
	Tid  int            `json:"tid"`
	ID   *int           `json:"id"`
	Bp   string         `json:"bp"`
	Args map[string]any `json:"args"`
}

type jsonTrace struct {
	TraceEvents     []jsonEvent `json:"traceEvents"`
	DisplayTimeUnit string      `json:"displayTimeUnit"`
}

// pingPongTrace is two ranks: rank 0 Isends inside MPI_Isend and waits
// inside MPI_Wait; rank 1 receives inside MPI_Recv and then runs a
// collective. Rank 1's epoch is 1 µs later than rank 0's.
func pingPongTrace(t *testing.T) *Trace {
	regions := map[uint32]string{0: "MPI_Isend", 1: "MPI_Wait", 2: "MPI_Recv", 3: "MPI_Allreduce", 4: "Allreduce"}
	comms := map[uint32][]uint32{0: {0, 1}}
	f0 := &File{Defs: Definitions{Rank: 0, Size: 2, Clock: Clock{1, 5000}, Comms: comms, Regions: regions}, Records: []Record{
		{Kind: KindEnter, Time: 1000, Region: 0},
		isend(1100, 1, 7, 64, 1),
		{Kind: KindLeave, Time: 1200, Region: 0},
		{Kind: KindEnter, Time: 1300, Region: 1},
		isendComplete(1400, 1),
		{Kind: KindLeave, Time: 1500, Region: 1},
		{Kind: KindEnter, Time: 1600, Region: 3}, // never left: closed at the end
	}}
	f1 := &File{Defs: Definitions{Rank: 1, Size: 2, Clock: Clock{1, 6000}, Comms: comms, Regions: regions}, Records: []Record{
		{Kind: KindEnter, Time: 0, Region: 2},
		recv(2500, 0, 7, 64),
		{Kind: KindLeave, Time: 2600, Region: 2},
		{Kind: KindEnter, Time: 3000, Region: 3},
		{Kind: KindCollectiveBegin, Time: 3100},
		{Kind: KindCollectiveEnd, Time: 3900, Region: 4, Comm: 0, Peer: NoRoot, Length: 8, Received: 8},
		{Kind: KindLeave, Time: 4000, Region: 3},
		{Kind: KindLeave, Time: 4100, Region: 1}, // without Enter: ignored
	}}
	tr, err := NewTrace([]*File{f1, f0})
	require.NoError(t, err)
	return tr
}

func TestChromeJSONHasRanksSlicesAndFlowArrowsInsideTheCalls(t *testing.T) {
	tr := pingPongTrace(t)
	m, err := tr.Messages()
	require.NoError(t, err)
	require.Len(t, m.Messages, 1)
	var buf bytes.Buffer
	require.NoError(t, WriteChromeJSON(&buf, tr, m))
	var jt jsonTrace
	require.NoError(t, json.Unmarshal(buf.Bytes(), &jt), buf.String())
	require.Equal(t, "ns", jt.DisplayTimeUnit)

	names := map[int]string{}
	var slices, flows []jsonEvent
	for _, e := range jt.TraceEvents {
		switch e.Ph {
		case "M":
			if e.Name == "process_name" {
				names[e.Pid] = e.Args["name"].(string)
			}
		case "X":
			require.NotNil(t, e.Dur)
			slices = append(slices, e)
		case "s", "f":
			flows = append(flows, e)
		default:
			t.Fatalf("unexpected phase %q", e.Ph)
		}
	}
	require.Equal(t, map[int]string{1: "rank 0", 2: "rank 1"}, names)

	type sl struct {
		Name, Cat string
		Pid       int
		Ts, Dur   float64
	}
	var got []sl
	for _, e := range slices {
		got = append(got, sl{e.Name, e.Cat, e.Pid, e.Ts, *e.Dur})
	}
	require.Equal(t, []sl{
		{"MPI_Isend", "mpi", 1, 1.0, 0.2},
		{"MPI_Wait", "mpi", 1, 1.3, 0.2},
		{"MPI_Allreduce", "mpi", 1, 1.6, 0}, // open at the end of rank 0
		{"MPI_Recv", "mpi", 2, 1.0, 2.6},    // rank 1 is 1 µs later
		{"MPI_Allreduce", "mpi", 2, 4.0, 1.0},
		{"Allreduce", "collective", 2, 4.1, 0.8},
	}, got)
	require.Equal(t, map[string]any{"comm": 0.0, "bytes_sent": 8.0, "bytes_received": 8.0}, slices[5].Args)

	require.Len(t, flows, 2)
	s, f := flows[0], flows[1]
	require.Equal(t, "s", s.Ph)
	require.Equal(t, "f", f.Ph)
	require.Equal(t, "e", f.Bp)
	require.Empty(t, s.Bp)
	require.Equal(t, *s.ID, *f.ID)
	require.Equal(t, s.Name, f.Name)
	require.Equal(t, s.Cat, f.Cat)
	require.Equal(t, 1, s.Pid)
	require.Equal(t, 2, f.Pid)
	require.InDelta(t, 1.1, s.Ts, 1e-9)
	require.InDelta(t, 3.5, f.Ts, 1e-9)
	require.Equal(t, 2400.0, s.Args["latency_ns"])
	inside := func(e jsonEvent, name string) {
		for _, x := range slices {
			if x.Pid == e.Pid && x.Tid == e.Tid && x.Name == name && x.Ts <= e.Ts && e.Ts <= x.Ts+*x.Dur {
				return
			}
		}
		t.Fatalf("%s event at %v is not inside a %s slice of pid %d", e.Ph, e.Ts, name, e.Pid)
	}
	inside(s, "MPI_Isend")
	inside(f, "MPI_Recv")
}

func TestChromeJSONWithoutMatchingHasNoArrows(t *testing.T) {
	var buf bytes.Buffer
	require.NoError(t, WriteChromeJSON(&buf, pingPongTrace(t), nil))
	var jt jsonTrace
	require.NoError(t, json.Unmarshal(buf.Bytes(), &jt))
	for _, e := range jt.TraceEvents {
		require.NotContains(t, []string{"s", "f"}, e.Ph)
	}
}
