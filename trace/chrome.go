package trace

import (
	"bufio"
	"cmp"
	"encoding/json"
	"io"
	"slices"
	"strconv"
)

// chromeEvent is one event of the Chrome Trace Event format.
type chromeEvent struct {
	Name string         `json:"name"`
	Cat  string         `json:"cat,omitempty"`
	Ph   string         `json:"ph"`
	Ts   float64        `json:"ts"`
	Dur  *float64       `json:"dur,omitempty"`
	Pid  int            `json:"pid"`
	Tid  int            `json:"tid"`
	ID   *int           `json:"id,omitempty"`
	Bp   string         `json:"bp,omitempty"`
	Args map[string]any `json:"args,omitempty"`
}

// Pid returns the Chrome trace process id of world rank r: r+1, because
// Perfetto treats pid 0 specially.
func Pid(rank int) int { return rank + 1 }

// us converts nanoseconds to the format's microseconds.
func us(ns uint64) float64 { return float64(ns) / 1e3 }

// slice is a complete ("X") event being built.
type slice struct {
	name, cat  string
	begin, end uint64
	region     uint32
	args       map[string]any
}

// rankSlices turns a rank's Enter/Leave and CollectiveBegin/End records into
// slices, with time stamps moved by off. A Leave closes the most recent open
// Enter of the same region (so slightly interleaved calls of several
// goroutines still pair up); a Leave without an Enter is ignored; calls still
// open at the end are closed at the rank's last time stamp.
func rankSlices(f *File, off uint64) []slice {
	var (
		out      []slice
		open     []slice // Enter stack
		collOpen []uint64
		last     uint64
	)
	for _, r := range f.Records {
		last = max(last, r.Time)
		switch r.Kind {
		case KindEnter:
			open = append(open, slice{name: f.Defs.RegionName(r.Region), cat: "mpi", begin: r.Time, region: r.Region})
		case KindLeave:
			for i := len(open) - 1; i >= 0; i-- {
				if open[i].region == r.Region {
					s := open[i]
					s.end = max(r.Time, s.begin)
					out = append(out, s)
					open = slices.Delete(open, i, i+1)
					break
				}
			}
		case KindCollectiveBegin:
			collOpen = append(collOpen, r.Time)
		case KindCollectiveEnd:
			begin := r.Time
			if n := len(collOpen); n > 0 {
				begin = collOpen[n-1]
				collOpen = collOpen[:n-1]
			}
			args := map[string]any{"comm": r.Comm, "bytes_sent": r.Length, "bytes_received": r.Received}
			if r.Peer != NoRoot {
				args["root"] = r.Peer
			}
			out = append(out, slice{name: f.Defs.RegionName(r.Region), cat: "collective",
				begin: begin, end: max(r.Time, begin), args: args})
		}
	}
	for _, s := range open {
		s.end = max(last, s.begin)
		out = append(out, s)
	}
	for i := range out {
		out[i].begin += off
		out[i].end += off
	}
	slices.SortStableFunc(out, func(a, b slice) int {
		// outer slices first when two begin together
		return cmp.Or(cmp.Compare(a.begin, b.begin), cmp.Compare(b.end, a.end))
	})
	return out
}

// WriteChromeJSON writes the trace as Chrome Trace Event JSON
// ({"traceEvents": [...], "displayTimeUnit": "ns"}), which ui.perfetto.dev
// and chrome://tracing open: one process per rank (pid Pid(rank), named
// "rank N"), a complete ("X") slice for every MPI call (Enter/Leave) and every
// collective (CollectiveBegin/End, with its communicator, root and byte
// counts as args), and for every matched message of m a flow arrow: a "s"
// event at the send's time on the sender, inside the sending call's slice,
// and a "f" event with "bp":"e" at the receive's time on the receiver, inside
// the receiving call's slice, both with id = Message.ID. Time stamps are in
// microseconds on the trace's common time line. m may be nil (no arrows); it
// must come from t.Messages (or Match on the same time line). The only
// errors are w's.
func WriteChromeJSON(w io.Writer, t *Trace, m *Matching) error {
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	if _, err := io.WriteString(bw, "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n"); err != nil {
		return err
	}
	first := true
	emit := func(e *chromeEvent) error {
		if !first {
			if _, err := io.WriteString(bw, ","); err != nil {
				return err
			}
		}
		first = false
		return enc.Encode(e) // adds a newline
	}
	for r, f := range t.Ranks {
		pid := Pid(r)
		meta := []chromeEvent{
			{Name: "process_name", Ph: "M", Pid: pid, Tid: pid, Args: map[string]any{"name": "rank " + strconv.Itoa(r)}},
			{Name: "process_sort_index", Ph: "M", Pid: pid, Tid: pid, Args: map[string]any{"sort_index": r}},
			{Name: "thread_name", Ph: "M", Pid: pid, Tid: pid, Args: map[string]any{"name": "MPI"}},
		}
		for i := range meta {
			if err := emit(&meta[i]); err != nil {
				return err
			}
		}
		for _, s := range rankSlices(f, t.Offset(r)) {
			dur := us(s.end - s.begin)
			e := chromeEvent{Name: s.name, Cat: s.cat, Ph: "X", Ts: us(s.begin), Dur: &dur, Pid: pid, Tid: pid, Args: s.args}
			if err := emit(&e); err != nil {
				return err
			}
		}
	}
	if m != nil {
		for i := range m.Messages {
			msg := &m.Messages[i]
			id := msg.ID
			args := map[string]any{"src": msg.Src, "dst": msg.Dst, "comm": msg.Comm, "tag": msg.Tag,
				"bytes": msg.SendLength, "latency_ns": int64(msg.Latency())}
			s := chromeEvent{Name: "message", Cat: "mpi.message", Ph: "s", Ts: us(msg.SendTime),
				Pid: Pid(int(msg.Src)), Tid: Pid(int(msg.Src)), ID: &id, Args: args}
			f := chromeEvent{Name: "message", Cat: "mpi.message", Ph: "f", Bp: "e", Ts: us(msg.RecvTime),
				Pid: Pid(int(msg.Dst)), Tid: Pid(int(msg.Dst)), ID: &id, Args: args}
			if err := emit(&s); err != nil {
				return err
			}
			if err := emit(&f); err != nil {
				return err
			}
		}
	}
	if _, err := io.WriteString(bw, "]}\n"); err != nil {
		return err
	}
	return bw.Flush()
}
