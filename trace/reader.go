package trace

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"iter"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// ErrFormat is wrapped by every error about malformed trace input (a bad
// header, an unknown record tag, a truncated or overlong varint, a field out
// of range, a missing end record, conflicting definitions).
var ErrFormat = errors.New("trace: malformed trace file")

// ErrTruncated is wrapped by the FormatError of a file that ends before its
// end record: a rank that was killed before it closed its trace. Everything
// before Offset is whole; Read keeps it (File.Truncated).
var ErrTruncated = errors.New("trace: truncated trace file")

// FormatError describes malformed input at a byte offset of a file.
type FormatError struct {
	Offset    int64  // byte offset in the file where the bad item starts
	Msg       string // what is wrong
	Truncated bool   // the file ends there, before its end record
}

// Error implements error.
func (e *FormatError) Error() string {
	return fmt.Sprintf("trace: malformed trace file at byte %d: %s", e.Offset, e.Msg)
}

// Is makes errors.Is(err, ErrFormat) true, and errors.Is(err, ErrTruncated)
// for a file cut short.
func (e *FormatError) Is(target error) bool {
	return target == ErrFormat || (e.Truncated && target == ErrTruncated)
}

// Reader decodes one rank's trace file. Malformed input of any kind is
// reported as an error wrapping ErrFormat; the Reader never panics.
type Reader struct {
	br     *bufio.Reader
	off    int64 // bytes consumed
	start  int64 // offset of the item being decoded
	defs   Definitions
	prev   uint64
	n      uint64 // event records read
	done   bool
	err    error
	nameBf []byte
	item   string // what is being decoded, for error messages
}

// NewReader reads and checks the header of a trace file from r.
func NewReader(r io.Reader) (*Reader, error) {
	tr := &Reader{br: bufio.NewReaderSize(r, 64<<10)}
	var h [HeaderSize]byte
	n, err := io.ReadFull(tr.br, h[:])
	tr.off = int64(n)
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, &FormatError{Offset: int64(n), Msg: fmt.Sprintf("file of %d bytes is shorter than the %d-byte header", n, HeaderSize)}
		}
		return nil, err
	}
	if string(h[0:4]) != Magic {
		return nil, &FormatError{Offset: 0, Msg: fmt.Sprintf("magic %q is not %q (not an amgo trace file)", h[0:4], Magic)}
	}
	if v := binary.LittleEndian.Uint16(h[4:6]); v != Version {
		return nil, &FormatError{Offset: 4, Msg: fmt.Sprintf("version %d, this reader knows version %d", v, Version)}
	}
	if f := binary.LittleEndian.Uint16(h[6:8]); f != 0 {
		return nil, &FormatError{Offset: 6, Msg: fmt.Sprintf("reserved flags %#x are not zero", f)}
	}
	d := &tr.defs
	d.Rank = binary.LittleEndian.Uint32(h[8:12])
	d.Size = binary.LittleEndian.Uint32(h[12:16])
	d.Clock.Resolution = binary.LittleEndian.Uint64(h[16:24])
	d.Clock.Epoch = int64(binary.LittleEndian.Uint64(h[24:32]))
	if d.Size == 0 || d.Rank >= d.Size {
		return nil, &FormatError{Offset: 8, Msg: fmt.Sprintf("rank %d of a job of size %d", d.Rank, d.Size)}
	}
	if d.Clock.Resolution == 0 {
		return nil, &FormatError{Offset: 16, Msg: "clock resolution 0"}
	}
	d.Comms = map[uint32][]uint32{}
	d.Regions = map[uint32]string{}
	return tr, nil
}

// Definitions returns the header's fields and the definitions read so far;
// they are complete once Next has returned io.EOF. The caller must not modify
// them.
func (r *Reader) Definitions() *Definitions { return &r.defs }

// ReadByte implements io.ByteReader for the varint decoder, counting bytes.
func (r *Reader) ReadByte() (byte, error) {
	c, err := r.br.ReadByte()
	if err == nil {
		r.off++
	}
	return c, err
}

func (r *Reader) fail(msg string, args ...any) error {
	r.err = &FormatError{Offset: r.start, Msg: fmt.Sprintf(msg, args...)}
	return r.err
}

// cut is fail for input that ends in the middle of an item or before the end
// record.
func (r *Reader) cut(msg string, args ...any) error {
	r.err = &FormatError{Offset: r.start, Msg: fmt.Sprintf(msg, args...), Truncated: true}
	return r.err
}

// uvarint reads one field of the current item.
func (r *Reader) uvarint(what string) (uint64, error) {
	v, err := binary.ReadUvarint(r)
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return 0, r.cut("%s truncated in the %s field", r.item, what)
		}
		return 0, r.fail("%s %s field: %v", r.item, what, err)
	}
	return v, nil
}

func (r *Reader) u32(what string) (uint32, error) {
	v, err := r.uvarint(what)
	if err != nil {
		return 0, err
	}
	if v > math.MaxUint32 {
		return 0, r.fail("%s: %s %d does not fit 32 bits", r.item, what, v)
	}
	return uint32(v), nil
}

// Next returns the next event record. Definition records met on the way are
// added to Definitions. At the end of a well-formed file Next returns io.EOF;
// malformed input gives an error wrapping ErrFormat, and every later call
// returns the same error.
func (r *Reader) Next() (Record, error) {
	if r.err != nil {
		return Record{}, r.err
	}
	if r.done {
		return Record{}, io.EOF
	}
	for {
		r.start = r.off
		tag, err := r.ReadByte()
		if err != nil {
			if err == io.EOF {
				return Record{}, r.cut("file ends without the end record (truncated, or the Writer was not closed)")
			}
			r.err = err
			return Record{}, err
		}
		switch {
		case tag == tagDefRegion:
			r.item = "region definition"
			if err := r.readDefRegion(); err != nil {
				return Record{}, err
			}
		case tag == tagDefComm:
			r.item = "communicator definition"
			if err := r.readDefComm(); err != nil {
				return Record{}, err
			}
		case tag == tagEnd:
			r.item = "end record"
			return Record{}, r.readEnd()
		case Kind(tag).Valid():
			return r.readEvent(Kind(tag))
		default:
			return Record{}, r.fail("unknown record tag %#02x", tag)
		}
	}
}

func (r *Reader) readEvent(k Kind) (Record, error) {
	rec := Record{Kind: k}
	r.item = kindNames[k] + " record"
	zz, err := binary.ReadVarint(r)
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return Record{}, r.cut("%v record truncated in the time field", k)
		}
		return Record{}, r.fail("%v record time field: %v", k, err)
	}
	prev := int64(r.prev)
	if (zz > 0 && prev > math.MaxInt64-zz) || prev+zz < 0 {
		return Record{}, r.fail("%v record time %d%+d is outside [0, MaxInt64]", k, prev, zz)
	}
	rec.Time = uint64(prev + zz)
	switch k {
	case KindSend, KindRecv, KindIsend, KindIrecv:
		if rec.Peer, err = r.u32("peer rank"); err != nil {
			return Record{}, err
		}
		if rec.Comm, err = r.u32("communicator"); err != nil {
			return Record{}, err
		}
		if rec.Tag, err = r.u32("tag"); err != nil {
			return Record{}, err
		}
		if rec.Length, err = r.uvarint("length"); err != nil {
			return Record{}, err
		}
		if k == KindIsend || k == KindIrecv {
			if rec.Request, err = r.uvarint("request"); err != nil {
				return Record{}, err
			}
		}
	case KindIsendComplete, KindIrecvRequest, KindRequestCancelled:
		if rec.Request, err = r.uvarint("request"); err != nil {
			return Record{}, err
		}
	case KindEnter, KindLeave:
		if rec.Region, err = r.u32("region"); err != nil {
			return Record{}, err
		}
	case KindCollectiveBegin:
	case KindCollectiveEnd:
		if rec.Region, err = r.u32("operation"); err != nil {
			return Record{}, err
		}
		if rec.Comm, err = r.u32("communicator"); err != nil {
			return Record{}, err
		}
		root, err := r.u32("root")
		if err != nil {
			return Record{}, err
		}
		rec.Peer = root - 1 // 0 encodes NoRoot
		if rec.Length, err = r.uvarint("bytes sent"); err != nil {
			return Record{}, err
		}
		if rec.Received, err = r.uvarint("bytes received"); err != nil {
			return Record{}, err
		}
	}
	r.prev = rec.Time
	r.n++
	return rec, nil
}

func (r *Reader) readDefRegion() error {
	id, err := r.u32("region id")
	if err != nil {
		return err
	}
	n, err := r.uvarint("name length")
	if err != nil {
		return err
	}
	if n > MaxNameLen {
		return r.fail("region %d: name of %d bytes (at most %d)", id, n, MaxNameLen)
	}
	if cap(r.nameBf) < int(n) {
		r.nameBf = make([]byte, n)
	}
	b := r.nameBf[:n]
	got, err := io.ReadFull(r.br, b)
	r.off += int64(got)
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return r.cut("region %d: name truncated", id)
		}
		r.err = err
		return err
	}
	if !utf8.Valid(b) {
		return r.fail("region %d: name is not UTF-8", id)
	}
	if old, ok := r.defs.Regions[id]; ok {
		if old != string(b) {
			return r.fail("region %d defined as %q and as %q", id, old, b)
		}
		return nil
	}
	r.defs.Regions[id] = string(b)
	return nil
}

func (r *Reader) readDefComm() error {
	id, err := r.u32("communicator id")
	if err != nil {
		return err
	}
	n, err := r.uvarint("communicator size")
	if err != nil {
		return err
	}
	if n == 0 || n > uint64(r.defs.Size) {
		return r.fail("communicator %d: %d members in a job of %d ranks", id, n, r.defs.Size)
	}
	var group []uint32 // grows with the input actually present, never by n
	for i := uint64(0); i < n; i++ {
		w, err := r.u32("member rank")
		if err != nil {
			return err
		}
		group = append(group, w)
	}
	if err := checkGroup(group, r.defs.Size); err != nil {
		return r.fail("communicator %d: %v", id, err)
	}
	if old, ok := r.defs.Comms[id]; ok {
		if !slices.Equal(old, group) {
			return r.fail("communicator %d defined as %v and as %v", id, old, group)
		}
		return nil
	}
	r.defs.Comms[id] = group
	return nil
}

func (r *Reader) readEnd() error {
	n, err := r.uvarint("record count")
	if err != nil {
		return err
	}
	if n != r.n {
		return r.fail("end record counts %d event records, the file has %d", n, r.n)
	}
	if _, err := r.ReadByte(); err != io.EOF {
		if err != nil {
			r.err = err
			return err
		}
		r.start = r.off - 1
		return r.fail("data after the end record")
	}
	r.done = true
	return io.EOF
}

// All returns an iterator over the remaining records. It stops after the
// last record; a malformed file yields one final (Record{}, err) pair with
// err wrapping ErrFormat.
func (r *Reader) All() iter.Seq2[Record, error] {
	return func(yield func(Record, error) bool) {
		for {
			rec, err := r.Next()
			if err == io.EOF {
				return
			}
			if !yield(rec, err) || err != nil {
				return
			}
		}
	}
}

// File is the whole content of one rank's trace file.
type File struct {
	// Defs are the header's fields and all the file's definitions.
	Defs Definitions
	// Records are the event records in file order, time stamps as written
	// (ns since Defs.Clock.Epoch).
	Records []Record
	// Truncated is nil for a whole file. For a file that ends before its end
	// record (the rank was killed before it closed its trace), it is the
	// error saying where (wrapping ErrTruncated), and Records holds every
	// whole record before that point.
	Truncated error
}

// Read decodes a whole trace file from r. A file cut short after its header
// is read up to its last whole record (File.Truncated says where); any other
// malformed input is an error wrapping ErrFormat.
func Read(r io.Reader) (*File, error) {
	tr, err := NewReader(r)
	if err != nil {
		return nil, err
	}
	f := &File{}
	for rec, err := range tr.All() {
		if errors.Is(err, ErrTruncated) {
			f.Truncated = err
			break
		}
		if err != nil {
			return nil, err
		}
		f.Records = append(f.Records, rec)
	}
	f.Defs = tr.defs
	return f, nil
}

// ReadFile decodes the trace file at path. Errors name the path.
func ReadFile(path string) (*File, error) {
	fd, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fd.Close()
	f, err := Read(fd)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return f, nil
}

// Trace is a whole job's trace: one File per world rank.
type Trace struct {
	// Ranks[r] is world rank r's file.
	Ranks []*File
	// Origin is the smallest clock epoch of the ranks (Unix ns): the common
	// time line of Offset, Messages and WriteChromeJSON starts there.
	Origin int64
}

// Offset returns what to add to rank's time stamps to put them on the common
// time line: its epoch minus Origin, in nanoseconds.
func (t *Trace) Offset(rank int) uint64 {
	return uint64(t.Ranks[rank].Defs.Clock.Epoch - t.Origin)
}

// NewTrace assembles the files of one job: exactly one file for each world
// rank 0..Size-1, all of one Size, with consistent communicator definitions
// (two ranks' groups for one communicator id are equal or disjoint: one id
// may name several communicators of disjoint groups). The order of files does
// not matter. Inconsistencies are errors wrapping ErrFormat.
func NewTrace(files []*File) (*Trace, error) {
	if len(files) == 0 {
		return nil, fmt.Errorf("%w: no rank files", ErrFormat)
	}
	size := files[0].Defs.Size
	t := &Trace{Ranks: make([]*File, size), Origin: math.MaxInt64}
	if uint64(len(files)) > uint64(size) {
		return nil, fmt.Errorf("%w: %d rank files for a job of %d ranks", ErrFormat, len(files), size)
	}
	for _, f := range files {
		d := &f.Defs
		if d.Size != size {
			return nil, fmt.Errorf("%w: rank %d says the job has %d ranks, rank %d says %d", ErrFormat, d.Rank, d.Size, files[0].Defs.Rank, size)
		}
		if t.Ranks[d.Rank] != nil {
			return nil, fmt.Errorf("%w: two files for rank %d", ErrFormat, d.Rank)
		}
		t.Ranks[d.Rank] = f
		t.Origin = min(t.Origin, d.Clock.Epoch)
	}
	for r, f := range t.Ranks {
		if f == nil {
			return nil, fmt.Errorf("%w: no file for rank %d of %d", ErrFormat, r, size)
		}
	}
	// For each communicator id, the groups defined by the ranks must be
	// equal or disjoint: owner[id][w] is the group world rank w is in.
	owner := map[uint32]map[uint32][]uint32{}
	for _, f := range t.Ranks {
		for _, id := range sortedKeys(f.Defs.Comms) {
			g := f.Defs.Comms[id]
			if owner[id] == nil {
				owner[id] = map[uint32][]uint32{}
			}
			for _, w := range g {
				if old, ok := owner[id][w]; ok && !slices.Equal(old, g) {
					return nil, fmt.Errorf("%w: communicator %d is %v on one rank and %v on rank %d (groups of one id must be equal or disjoint)", ErrFormat, id, old, g, f.Defs.Rank)
				}
				owner[id][w] = g
			}
		}
	}
	for _, f := range t.Ranks {
		if f.Defs.Clock.Epoch-t.Origin < 0 {
			return nil, fmt.Errorf("%w: clock epochs of the ranks too far apart", ErrFormat)
		}
	}
	return t, nil
}

// ReadDir reads every rank file (rank-<r>.amtr) of a trace directory and
// assembles them with NewTrace. A file whose name does not match the rank in
// its header is an error.
func ReadDir(dir string) (*Trace, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "rank-*.amtr"))
	if err != nil {
		return nil, err
	}
	if len(paths) == 0 {
		return nil, fmt.Errorf("%s: no rank-<r>.amtr files", dir)
	}
	files := make([]*File, 0, len(paths))
	for _, p := range paths {
		f, err := ReadFile(p)
		if err != nil {
			return nil, err
		}
		num := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(p), "rank-"), ".amtr")
		if r, err := strconv.ParseUint(num, 10, 32); err != nil || uint32(r) != f.Defs.Rank {
			return nil, fmt.Errorf("%s: %w: header says rank %d", p, ErrFormat, f.Defs.Rank)
		}
		files = append(files, f)
	}
	t, err := NewTrace(files)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	return t, nil
}
