package trace

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// allKinds is one record of every kind, with extreme field values and
// decreasing time stamps (concurrent goroutines may record out of order).
func allKinds() []Record {
	return []Record{
		{Kind: KindEnter, Time: 1000, Region: 0},
		{Kind: KindSend, Time: 1010, Peer: 3, Comm: 0, Tag: 7, Length: 1 << 20},
		{Kind: KindIsend, Time: 1005, Peer: math.MaxUint32, Comm: math.MaxUint32, Tag: math.MaxUint32, Length: math.MaxUint64, Request: math.MaxUint64},
		{Kind: KindIsendComplete, Time: 2000, Request: 1},
		{Kind: KindRecv, Time: 0, Peer: 1, Comm: 5, Tag: 0, Length: 0},
		{Kind: KindIrecvRequest, Time: math.MaxInt64, Request: 0},
		{Kind: KindIrecv, Time: 3, Peer: 2, Comm: 1, Tag: 99, Length: 12, Request: 17},
		{Kind: KindRequestCancelled, Time: 4, Request: 17},
		{Kind: KindCollectiveBegin, Time: 5},
		{Kind: KindCollectiveEnd, Time: 6, Region: 1, Comm: 1, Peer: NoRoot, Length: 64, Received: 128},
		{Kind: KindCollectiveEnd, Time: 7, Region: 1, Comm: 1, Peer: 0, Length: 0, Received: math.MaxUint64},
		{Kind: KindLeave, Time: 8, Region: math.MaxUint32},
	}
}

func testDefs() Definitions {
	return Definitions{Rank: 1, Size: 4, Clock: Clock{Resolution: 1, Epoch: 1_700_000_000_000_000_000},
		Comms: map[uint32][]uint32{0: {0, 1, 2, 3}}, Regions: map[uint32]string{0: "MPI_Send"}}
}

// encode writes defs and records with a Writer, with two more definitions
// interleaved after the first record.
func encode(t testing.TB, d Definitions, recs []Record) []byte {
	var buf bytes.Buffer
	w, err := NewWriter(&buf, d)
	require.NoError(t, err)
	for i, r := range recs {
		require.NoError(t, w.Write(r))
		if i == 0 {
			require.NoError(t, w.DefineComm(5, []uint32{3, 1}))
			require.NoError(t, w.DefineRegion(1, "Allreduce ✓"))
		}
	}
	require.NoError(t, w.Close())
	return buf.Bytes()
}

func TestFileRoundTripKeepsEveryRecordAndDefinition(t *testing.T) {
	data := encode(t, testDefs(), allKinds())
	f, err := Read(bytes.NewReader(data))
	require.NoError(t, err)
	require.Equal(t, allKinds(), f.Records)
	want := testDefs()
	want.Comms[5] = []uint32{3, 1}
	want.Regions[1] = "Allreduce ✓"
	require.Equal(t, want, f.Defs)
}

func TestEmptyFileRoundTrips(t *testing.T) {
	data := encode(t, Definitions{Size: 1}, nil)
	f, err := Read(bytes.NewReader(data))
	require.NoError(t, err)
	require.Empty(t, f.Records)
	require.Equal(t, uint32(1), f.Defs.Size)
	require.Equal(t, uint64(1), f.Defs.Clock.Resolution, "zero resolution defaults to 1 ns")
	require.NotZero(t, f.Defs.Clock.Epoch, "zero epoch defaults to now")
}

func TestHeaderAndRecordBytesAreAsDocumented(t *testing.T) {
	var buf bytes.Buffer
	w, err := NewWriter(&buf, Definitions{Rank: 2, Size: 3, Clock: Clock{Resolution: 1, Epoch: 0x0102030405060708}})
	require.NoError(t, err)
	require.NoError(t, w.DefineRegion(4, "Ab"))
	require.NoError(t, w.Send(300, 1, 0, 5, 200))
	require.NoError(t, w.IsendComplete(299, 9))
	require.NoError(t, w.CollectiveEnd(299, 4, 0, NoRoot, 1, 2))
	require.NoError(t, w.Close())
	want := []byte{
		'A', 'M', 'T', 'R', 1, 0, 0, 0, // magic, version 1, flags 0
		2, 0, 0, 0, 3, 0, 0, 0, // rank 2, size 3
		1, 0, 0, 0, 0, 0, 0, 0, // resolution 1 ns
		8, 7, 6, 5, 4, 3, 2, 1, // epoch
		0x40, 4, 2, 'A', 'b', // DefRegion 4 "Ab"
		1, 0xd8, 0x04, 1, 0, 5, 0xc8, 0x01, // Send: dt=+300 (zigzag 600), peer 1, comm 0, tag 5, len 200
		3, 1, 9, // IsendComplete: dt=-1 (zigzag 1), req 9
		11, 0, 4, 0, 0, 1, 2, // CollectiveEnd: dt 0, op 4, comm 0, root NoRoot (0), sent 1, received 2
		0xff, 3, // End, 3 event records
	}
	require.Equal(t, want, buf.Bytes())
}

func TestWriterAllocatesNothingPerRecord(t *testing.T) {
	w, err := NewWriter(io.Discard, Definitions{Size: 2})
	require.NoError(t, err)
	id, err := w.Region("MPI_Isend")
	require.NoError(t, err)
	var tm uint64
	allocs := testing.AllocsPerRun(1000, func() {
		tm += 10
		_ = w.Enter(tm, id)
		_ = w.Isend(tm+1, 1, 0, 3, 4096, tm)
		_ = w.Send(tm+2, 1, 0, 3, 4096)
		_ = w.IsendComplete(tm+3, tm)
		_ = w.Write(Record{Kind: KindIrecv, Time: tm + 4, Peer: 1, Length: 8, Request: 3})
		_, _ = w.Region("MPI_Isend")
		_ = w.Leave(tm+5, id)
	})
	require.Zero(t, allocs)
}

func TestWriterIsSafeForConcurrentGoroutines(t *testing.T) {
	var buf bytes.Buffer
	w, err := NewWriter(&buf, Definitions{Size: 2})
	require.NoError(t, err)
	const G, N = 8, 500
	var wg sync.WaitGroup
	for g := range G {
		wg.Go(func() {
			id, err := w.Region("worker " + strconv.Itoa(g))
			require.NoError(t, err)
			for i := range N {
				require.NoError(t, w.Send(w.Now(), 1, 0, uint32(g), uint64(i)))
				require.NoError(t, w.Enter(w.Now(), id))
			}
		})
	}
	wg.Wait()
	require.NoError(t, w.Close())
	f, err := Read(&buf)
	require.NoError(t, err)
	require.Len(t, f.Records, 2*G*N)
	require.Len(t, f.Defs.Regions, G)
	next := make([]uint64, G) // each goroutine's sends stay in its order
	for _, r := range f.Records {
		if r.Kind == KindSend {
			require.Equal(t, next[r.Tag], r.Length)
			next[r.Tag]++
		}
	}
}

func TestWriterRejectsInvalidInput(t *testing.T) {
	_, err := NewWriter(io.Discard, Definitions{Rank: 2, Size: 2})
	require.ErrorIs(t, err, ErrInvalid)
	w, err := NewWriter(io.Discard, Definitions{Size: 3})
	require.NoError(t, err)
	require.ErrorIs(t, w.Write(Record{Kind: 0}), ErrInvalid)
	require.ErrorIs(t, w.Write(Record{Kind: 12}), ErrInvalid)
	require.ErrorIs(t, w.Send(math.MaxInt64+1, 0, 0, 0, 0), ErrInvalid)
	require.ErrorIs(t, w.DefineComm(1, nil), ErrInvalid)
	require.ErrorIs(t, w.DefineComm(1, []uint32{0, 3}), ErrInvalid)
	require.ErrorIs(t, w.DefineComm(1, []uint32{1, 1}), ErrInvalid)
	require.NoError(t, w.DefineComm(1, []uint32{2, 0}))
	require.NoError(t, w.DefineComm(1, []uint32{2, 0}), "same definition again is fine")
	require.ErrorIs(t, w.DefineComm(1, []uint32{0, 2}), ErrInvalid)
	require.NoError(t, w.DefineRegion(0, "a"))
	require.ErrorIs(t, w.DefineRegion(0, "b"), ErrInvalid)
	require.ErrorIs(t, w.DefineRegion(1, string([]byte{0xff})), ErrInvalid)
	id, err := w.Region("c")
	require.NoError(t, err)
	require.Equal(t, uint32(1), id)
	id, err = w.Region("a")
	require.NoError(t, err)
	require.Equal(t, uint32(0), id)
	require.NoError(t, w.Close())
	require.ErrorIs(t, w.Close(), ErrClosed)
	require.ErrorIs(t, w.Send(1, 0, 0, 0, 0), ErrClosed)
	require.ErrorIs(t, w.Flush(), ErrClosed)
}

type failWriter struct{ n int }

func (f *failWriter) Write(p []byte) (int, error) {
	if f.n -= len(p); f.n < 0 {
		return 0, errors.New("disk full")
	}
	return len(p), nil
}

func TestWriterErrorsAreSticky(t *testing.T) {
	w, err := NewWriter(&failWriter{n: 10}, Definitions{Size: 1})
	require.NoError(t, err)
	require.EqualError(t, w.Flush(), "disk full")
	require.EqualError(t, w.Send(1, 0, 0, 0, 0), "disk full")
	require.EqualError(t, w.Close(), "disk full")
}

// Every prefix of a file is either refused (a cut header) or read up to its
// last whole record, with Truncated saying so: a rank killed mid-run leaves
// such a file, and its records are wanted most then.
func TestEveryTruncationIsReadToItsLastWholeRecord(t *testing.T) {
	recs := allKinds()
	data := encode(t, testDefs(), recs)
	whole, err := Read(bytes.NewReader(data))
	require.NoError(t, err)
	prev := 0
	for n := 0; n < len(data)-1; n++ { // the last byte completes the end record
		f, err := Read(bytes.NewReader(data[:n]))
		if n < HeaderSize {
			require.ErrorIs(t, err, ErrFormat, "prefix of %d bytes", n)
			require.NotErrorIs(t, err, ErrTruncated)
			continue
		}
		require.NoError(t, err, "prefix of %d bytes", n)
		require.ErrorIs(t, f.Truncated, ErrTruncated, "prefix of %d bytes", n)
		require.ErrorIs(t, f.Truncated, ErrFormat)
		require.GreaterOrEqual(t, len(f.Records), prev, "records only grow with the prefix")
		require.True(t, slices.Equal(whole.Records[:len(f.Records)], f.Records), "prefix of %d bytes", n)
		prev = len(f.Records)
	}
	require.Equal(t, len(recs), prev, "the prefix without the end record has every record")
}

func TestMalformedFilesAreFormatErrors(t *testing.T) {
	good := encode(t, Definitions{Size: 2}, nil)
	hdr := good[:HeaderSize]
	with := func(body ...byte) []byte { return append(bytes.Clone(hdr), body...) }
	patch := func(off int, b ...byte) []byte { d := bytes.Clone(good); copy(d[off:], b); return d }
	cases := map[string]struct {
		data []byte
		msg  string
	}{
		"bad magic":        {patch(0, 'X'), "not an amgo trace file"},
		"bad version":      {patch(4, 2), "version 2"},
		"flags":            {patch(6, 1), "reserved flags"},
		"rank >= size":     {patch(8, 2), "rank 2 of a job of size 2"},
		"size 0":           {patch(12, 0), "size 0"},
		"resolution 0":     {patch(16, 0), "clock resolution 0"},
		"short header":     {good[:10], "shorter than"},
		"no end":           {with(), "without the end record"},
		"unknown tag":      {with(0x20), "unknown record tag 0x20"},
		"kind 0":           {with(0x00), "unknown record tag"},
		"overlong varint":  {with(1, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01), "time field"},
		"negative time":    {with(3, 1, 0, 0xff, 0), "outside [0, MaxInt64]"},
		"peer > 32 bits":   {with(1, 0, 0x80, 0x80, 0x80, 0x80, 0x10, 0, 0, 0, 0xff, 0), "Send record: peer rank 4294967296 does not fit 32 bits"},
		"count mismatch":   {with(0xff, 1), "end record counts 1 event records, the file has 0"},
		"data after end":   {with(0xff, 0, 0), "data after the end record"},
		"name too long":    {with(0x40, 0, 0x81, 0x20), "name of 4097 bytes"},
		"name not utf8":    {with(0x40, 0, 1, 0xff, 0xff, 0), "not UTF-8"},
		"region conflict":  {with(0x40, 0, 1, 'a', 0x40, 0, 1, 'b', 0xff, 0), `region 0 defined as "a" and as "b"`},
		"comm empty":       {with(0x41, 0, 0, 0xff, 0), "0 members"},
		"comm too big":     {with(0x41, 0, 3, 0, 1, 0, 0xff, 0), "3 members in a job of 2"},
		"comm huge count":  {with(0x41, 0, 0xff, 0xff, 0xff, 0xff, 0x0f), "members in a job of 2"},
		"comm rank range":  {with(0x41, 0, 1, 2, 0xff, 0), "world rank 2 out of range"},
		"comm dup member":  {with(0x41, 0, 2, 1, 1, 0xff, 0), "world rank 1 twice"},
		"comm conflict":    {with(0x41, 0, 1, 0, 0x41, 0, 1, 1, 0xff, 0), "communicator 0 defined as [0] and as [1]"},
		"time overflow":    {with(8, 0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0, 8, 2, 0, 0xff, 2), "outside [0, MaxInt64]"},
		"truncated record": {with(2, 0, 1, 0, 0), "Isend record truncated in the length field"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			f, err := Read(bytes.NewReader(c.data))
			if name == "no end" || name == "truncated record" {
				// A file cut short is read up to its last whole record.
				require.NoError(t, err)
				require.Empty(t, f.Records)
				err = f.Truncated
				require.ErrorIs(t, err, ErrTruncated)
			}
			require.ErrorIs(t, err, ErrFormat)
			var fe *FormatError
			require.ErrorAs(t, err, &fe)
			require.Contains(t, err.Error(), c.msg)
		})
	}
}

func TestReaderErrorIsStickyAndIteratorStopsAtIt(t *testing.T) {
	data := encode(t, testDefs(), allKinds())
	data = data[:len(data)-3]
	r, err := NewReader(bytes.NewReader(data))
	require.NoError(t, err)
	var n int
	var last error
	for _, err := range r.All() {
		n++
		last = err
	}
	require.ErrorIs(t, last, ErrFormat)
	_, err = r.Next()
	require.Equal(t, last, err)
	require.Less(t, n, len(allKinds())+1)
}

func TestReadDirAssemblesRanksAndChecksThem(t *testing.T) {
	dir := t.TempDir()
	for r := range uint32(3) {
		w, err := Create(dir, Definitions{Rank: r, Size: 3, Clock: Clock{Resolution: 1, Epoch: 1000 + int64(r)*10},
			Comms: map[uint32][]uint32{0: {0, 1, 2}}})
		require.NoError(t, err)
		require.NoError(t, w.Send(5, (r+1)%3, 0, 0, 1))
		require.NoError(t, w.Close())
	}
	tr, err := ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, tr.Ranks, 3)
	require.Equal(t, int64(1000), tr.Origin)
	require.Equal(t, uint64(20), tr.Offset(2))
	m, err := tr.Messages()
	require.NoError(t, err)
	require.Empty(t, m.Messages)
	require.Len(t, m.UnmatchedSends, 3)
	require.Equal(t, uint64(15), m.UnmatchedSends[1].Time, "time moved by the rank's offset")

	// A file named after another rank.
	require.NoError(t, os.Rename(filepath.Join(dir, "rank-2.amtr"), filepath.Join(dir, "rank-7.amtr")))
	_, err = ReadDir(dir)
	require.ErrorContains(t, err, "header says rank 2")
	// A missing rank.
	require.NoError(t, os.Remove(filepath.Join(dir, "rank-7.amtr")))
	_, err = ReadDir(dir)
	require.ErrorContains(t, err, "no file for rank 2 of 3")
	require.ErrorIs(t, err, ErrFormat)
	// No files.
	_, err = ReadDir(t.TempDir())
	require.ErrorContains(t, err, "no rank-<r>.amtr files")
}

func TestNewTraceRejectsInconsistentRanks(t *testing.T) {
	f := func(rank, size uint32, comms map[uint32][]uint32) *File {
		return &File{Defs: Definitions{Rank: rank, Size: size, Clock: Clock{Resolution: 1}, Comms: comms}}
	}
	_, err := NewTrace(nil)
	require.ErrorIs(t, err, ErrFormat)
	_, err = NewTrace([]*File{f(0, 2, nil), f(1, 3, nil)})
	require.ErrorContains(t, err, "says the job has 3 ranks")
	_, err = NewTrace([]*File{f(0, 2, nil), f(0, 2, nil)})
	require.ErrorContains(t, err, "two files for rank 0")
	_, err = NewTrace([]*File{f(0, 1, nil), f(0, 1, nil)})
	require.ErrorContains(t, err, "2 rank files for a job of 1 ranks")
	_, err = NewTrace([]*File{f(0, 2, map[uint32][]uint32{1: {0, 1}}), f(1, 2, map[uint32][]uint32{1: {1, 0}})})
	require.ErrorContains(t, err, "communicator 1 is")
}

// FuzzReader feeds arbitrary bytes to the decoder: it must never panic, and
// whatever it accepts must encode again to a file that decodes to the same
// records and definitions. The committed seed corpus is in
// testdata/fuzz/FuzzReader (regenerate with TRACE_WRITE_FUZZ_SEEDS=1 go test
// -run TestWriteFuzzSeeds).
func FuzzReader(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := Read(bytes.NewReader(data))
		if err != nil {
			if !errors.Is(err, ErrFormat) {
				t.Fatalf("error not wrapping ErrFormat: %v", err)
			}
			return
		}
		var buf bytes.Buffer
		w, err := NewWriter(&buf, got.Defs)
		require.NoError(t, err)
		for _, r := range got.Records {
			require.NoError(t, w.Write(r))
		}
		require.NoError(t, w.Close())
		again, err := Read(&buf)
		require.NoError(t, err)
		require.Nil(t, again.Truncated)
		got.Truncated = nil // a cut file's records are written whole again
		if got.Defs.Clock.Epoch == 0 {
			// NewWriter sets a zero epoch to the time of writing (its
			// documented default), so only the rest must come back.
			require.NotZero(t, again.Defs.Clock.Epoch)
			again.Defs.Clock.Epoch = 0
		}
		require.Equal(t, got, again)
		// and the algorithm must not panic on whatever was accepted
		_, _, _ = Messages(got.Records)
	})
}

func fuzzSeeds(t testing.TB) [][]byte {
	var rs []Record
	for _, c := range []struct {
		recs []Record
	}{{allKinds()}} {
		rs = append(rs, c.recs...)
	}
	full := encode(t, testDefs(), rs)
	empty := encode(t, Definitions{Size: 1}, nil)
	mixed := encode(t, Definitions{Rank: 0, Size: 4, Comms: map[uint32][]uint32{0: {0, 1}}}, []Record{
		irecvRequest(5, 7), recv(25, 1, 0, 16), irecv(40, 1, 0, 8, 7),
		isend(50, 1, 9, 4, 8), send(55, 1, 9, 4), isendComplete(70, 8), cancelled(80, 3),
	})
	return [][]byte{full, empty, mixed, full[:len(full)/2], append(bytes.Clone(empty), 0)}
}

func TestWriteFuzzSeeds(t *testing.T) {
	if os.Getenv("TRACE_WRITE_FUZZ_SEEDS") == "" {
		t.Skip("set TRACE_WRITE_FUZZ_SEEDS=1 to rewrite testdata/fuzz/FuzzReader")
	}
	dir := filepath.Join("testdata", "fuzz", "FuzzReader")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	for i, s := range fuzzSeeds(t) {
		content := "go test fuzz v1\n[]byte(" + strconv.Quote(string(s)) + ")\n"
		require.NoError(t, os.WriteFile(filepath.Join(dir, "seed-"+strconv.Itoa(i)), []byte(content), 0o644))
	}
}

var _ = binary.MaxVarintLen64
