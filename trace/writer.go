package trace

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"
	"unicode/utf8"
)

// File format constants (docs/tools.md, "File format").
const (
	// Magic is the first four bytes of every trace file.
	Magic = "AMTR"
	// Version is the format version this package writes and reads.
	Version = 1
	// HeaderSize is the size in bytes of the fixed header.
	HeaderSize = 32
	// MaxNameLen is the longest region name in bytes.
	MaxNameLen = 4096

	tagDefRegion = 0x40
	tagDefComm   = 0x41
	tagEnd       = 0xFF

	// maxRecordSize bounds one encoded event record: a tag byte and at most
	// six varints of at most 10 bytes.
	maxRecordSize = 1 + 6*binary.MaxVarintLen64
)

// ErrInvalid is wrapped by the errors of a Writer for arguments that cannot be
// written (a bad kind, a time stamp above math.MaxInt64, a bad definition).
var ErrInvalid = errors.New("trace: invalid argument")

// ErrClosed is returned by a Writer's methods after Close.
var ErrClosed = errors.New("trace: writer closed")

// FileName returns the name of rank's file in a trace directory:
// "rank-<rank>.amtr".
func FileName(rank uint32) string { return fmt.Sprintf("rank-%d.amtr", rank) }

// Writer writes one rank's trace file. It buffers its output; Close (or
// Flush) writes the buffer out. All methods are safe for concurrent use by
// several goroutines of one rank (one mutex orders the records), and writing
// a record allocates nothing. The first error of the underlying writer is
// sticky: every later call returns it.
type Writer struct {
	mu      sync.Mutex
	bw      *bufio.Writer
	closer  io.Closer // the file of Create, nil for NewWriter
	start   time.Time // time stamp 0, for Now
	defs    Definitions
	names   map[string]uint32 // region name -> id, for Region
	prev    uint64            // time of the previous event record
	n       uint64            // event records written
	err     error
	closed  bool
	scratch [maxRecordSize]byte
}

// NewWriter writes the header for d and the communicators and regions already
// in d to w and returns a Writer for the records. d.Size must be at least 1
// and d.Rank below it. A zero d.Clock.Epoch is set to the current time and a
// zero d.Clock.Resolution to 1 ns. The Writer does not close w.
func NewWriter(w io.Writer, d Definitions) (*Writer, error) {
	if d.Size == 0 || d.Rank >= d.Size {
		return nil, fmt.Errorf("%w: rank %d of size %d", ErrInvalid, d.Rank, d.Size)
	}
	now := time.Now()
	tw := &Writer{
		bw:    bufio.NewWriterSize(w, 64<<10),
		start: now,
		names: map[string]uint32{},
	}
	if d.Clock.Epoch == 0 {
		d.Clock.Epoch = now.UnixNano()
	} else {
		tw.start = time.Unix(0, d.Clock.Epoch)
	}
	if d.Clock.Resolution == 0 {
		d.Clock.Resolution = 1
	}
	tw.defs = Definitions{Rank: d.Rank, Size: d.Size, Clock: d.Clock,
		Comms: map[uint32][]uint32{}, Regions: map[uint32]string{}}
	var h [HeaderSize]byte
	copy(h[0:4], Magic)
	binary.LittleEndian.PutUint16(h[4:6], Version)
	binary.LittleEndian.PutUint16(h[6:8], 0) // flags, reserved
	binary.LittleEndian.PutUint32(h[8:12], d.Rank)
	binary.LittleEndian.PutUint32(h[12:16], d.Size)
	binary.LittleEndian.PutUint64(h[16:24], d.Clock.Resolution)
	binary.LittleEndian.PutUint64(h[24:32], uint64(d.Clock.Epoch))
	if _, err := tw.bw.Write(h[:]); err != nil {
		return nil, err
	}
	for _, id := range sortedKeys(d.Regions) {
		if err := tw.DefineRegion(id, d.Regions[id]); err != nil {
			return nil, err
		}
	}
	for _, id := range sortedKeys(d.Comms) {
		if err := tw.DefineComm(id, d.Comms[id]); err != nil {
			return nil, err
		}
	}
	return tw, nil
}

// Create creates (or truncates) the file FileName(d.Rank) in dir, creating
// dir if needed, and returns a Writer on it; Close closes the file.
func Create(dir string, d Definitions) (*Writer, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if d.Size == 0 || d.Rank >= d.Size {
		return nil, fmt.Errorf("%w: rank %d of size %d", ErrInvalid, d.Rank, d.Size)
	}
	f, err := os.Create(filepath.Join(dir, FileName(d.Rank)))
	if err != nil {
		return nil, err
	}
	w, err := NewWriter(f, d)
	if err != nil {
		f.Close()
		return nil, err
	}
	w.closer = f
	return w, nil
}

func sortedKeys[V any](m map[uint32]V) []uint32 {
	keys := make([]uint32, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// Now returns the current time stamp of this Writer's clock: nanoseconds
// since Definitions.Clock.Epoch (monotonic when the Writer chose the epoch).
func (w *Writer) Now() uint64 {
	d := time.Since(w.start)
	if d < 0 {
		return 0
	}
	return uint64(d)
}

// usable reports the sticky error or ErrClosed. w.mu must be held.
func (w *Writer) usable() error {
	if w.closed {
		return ErrClosed
	}
	return w.err
}

// Write appends one event record. It returns an error wrapping ErrInvalid if
// r.Kind is not a record kind or r.Time exceeds math.MaxInt64, ErrClosed
// after Close, or the underlying writer's error.
func (w *Writer) Write(r Record) error {
	if !r.Kind.Valid() {
		return fmt.Errorf("%w: record kind %d", ErrInvalid, uint8(r.Kind))
	}
	if r.Time > math.MaxInt64 {
		return fmt.Errorf("%w: time stamp %d above MaxInt64", ErrInvalid, r.Time)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.usable(); err != nil {
		return err
	}
	b := appendRecord(w.scratch[:0], w.prev, r)
	w.prev = r.Time
	w.n++
	if _, err := w.bw.Write(b); err != nil {
		w.err = err
	}
	return w.err
}

// appendRecord encodes r after the previous record's time prev.
func appendRecord(b []byte, prev uint64, r Record) []byte {
	b = append(b, byte(r.Kind))
	b = binary.AppendVarint(b, int64(r.Time)-int64(prev))
	switch r.Kind {
	case KindSend, KindRecv:
		b = binary.AppendUvarint(b, uint64(r.Peer))
		b = binary.AppendUvarint(b, uint64(r.Comm))
		b = binary.AppendUvarint(b, uint64(r.Tag))
		b = binary.AppendUvarint(b, r.Length)
	case KindIsend, KindIrecv:
		b = binary.AppendUvarint(b, uint64(r.Peer))
		b = binary.AppendUvarint(b, uint64(r.Comm))
		b = binary.AppendUvarint(b, uint64(r.Tag))
		b = binary.AppendUvarint(b, r.Length)
		b = binary.AppendUvarint(b, r.Request)
	case KindIsendComplete, KindIrecvRequest, KindRequestCancelled:
		b = binary.AppendUvarint(b, r.Request)
	case KindEnter, KindLeave:
		b = binary.AppendUvarint(b, uint64(r.Region))
	case KindCollectiveBegin:
	case KindCollectiveEnd:
		b = binary.AppendUvarint(b, uint64(r.Region))
		b = binary.AppendUvarint(b, uint64(r.Comm))
		b = binary.AppendUvarint(b, uint64(r.Peer+1)) // NoRoot -> 0
		b = binary.AppendUvarint(b, r.Length)
		b = binary.AppendUvarint(b, r.Received)
	}
	return b
}

// Send records a blocking send of length bytes to rank receiver of comm at
// time t (ns).
func (w *Writer) Send(t uint64, receiver, comm, tag uint32, length uint64) error {
	return w.Write(Record{Kind: KindSend, Time: t, Peer: receiver, Comm: comm, Tag: tag, Length: length})
}

// Isend records the start of a nonblocking send with request id req.
func (w *Writer) Isend(t uint64, receiver, comm, tag uint32, length, req uint64) error {
	return w.Write(Record{Kind: KindIsend, Time: t, Peer: receiver, Comm: comm, Tag: tag, Length: length, Request: req})
}

// IsendComplete records that the Isend with request id req completed.
func (w *Writer) IsendComplete(t, req uint64) error {
	return w.Write(Record{Kind: KindIsendComplete, Time: t, Request: req})
}

// Recv records a completed blocking receive of length bytes from rank sender
// of comm.
func (w *Writer) Recv(t uint64, sender, comm, tag uint32, length uint64) error {
	return w.Write(Record{Kind: KindRecv, Time: t, Peer: sender, Comm: comm, Tag: tag, Length: length})
}

// IrecvRequest records that a nonblocking receive with request id req was
// posted.
func (w *Writer) IrecvRequest(t, req uint64) error {
	return w.Write(Record{Kind: KindIrecvRequest, Time: t, Request: req})
}

// Irecv records the completion of the nonblocking receive req with the
// envelope of the message it received.
func (w *Writer) Irecv(t uint64, sender, comm, tag uint32, length, req uint64) error {
	return w.Write(Record{Kind: KindIrecv, Time: t, Peer: sender, Comm: comm, Tag: tag, Length: length, Request: req})
}

// RequestCancelled records that request req was cancelled.
func (w *Writer) RequestCancelled(t, req uint64) error {
	return w.Write(Record{Kind: KindRequestCancelled, Time: t, Request: req})
}

// Enter records the start of an MPI call; region is the id of its name (see
// Region and DefineRegion).
func (w *Writer) Enter(t uint64, region uint32) error {
	return w.Write(Record{Kind: KindEnter, Time: t, Region: region})
}

// Leave records the end of an MPI call.
func (w *Writer) Leave(t uint64, region uint32) error {
	return w.Write(Record{Kind: KindLeave, Time: t, Region: region})
}

// CollectiveBegin records that this rank starts the communication of a
// collective operation.
func (w *Writer) CollectiveBegin(t uint64) error {
	return w.Write(Record{Kind: KindCollectiveBegin, Time: t})
}

// CollectiveEnd records the end of a collective operation: op is the region
// id of its name, root its root's rank in comm (NoRoot if none), sent and
// received the bytes this rank sent and received.
func (w *Writer) CollectiveEnd(t uint64, op, comm, root uint32, sent, received uint64) error {
	return w.Write(Record{Kind: KindCollectiveEnd, Time: t, Region: op, Comm: comm, Peer: root, Length: sent, Received: received})
}

// DefineRegion defines region id as name (at most MaxNameLen bytes of UTF-8).
// Defining an id again with the same name does nothing; with another name it
// is an error wrapping ErrInvalid.
func (w *Writer) DefineRegion(id uint32, name string) error {
	if len(name) > MaxNameLen || !utf8.ValidString(name) {
		return fmt.Errorf("%w: region name %q (must be UTF-8 of at most %d bytes)", ErrInvalid, name, MaxNameLen)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.defineRegionLocked(id, name)
}

func (w *Writer) defineRegionLocked(id uint32, name string) error {
	if err := w.usable(); err != nil {
		return err
	}
	if old, ok := w.defs.Regions[id]; ok {
		if old != name {
			return fmt.Errorf("%w: region %d is %q, cannot redefine it as %q", ErrInvalid, id, old, name)
		}
		return nil
	}
	w.defs.Regions[id] = name
	if _, ok := w.names[name]; !ok {
		w.names[name] = id
	}
	b := append(w.scratch[:0], tagDefRegion)
	b = binary.AppendUvarint(b, uint64(id))
	b = binary.AppendUvarint(b, uint64(len(name)))
	if _, err := w.bw.Write(b); err != nil {
		w.err = err
		return err
	}
	if _, err := w.bw.WriteString(name); err != nil {
		w.err = err
	}
	return w.err
}

// Region returns the id of the region called name, defining it with the
// smallest unused id the first time. Later calls with the same name allocate
// nothing.
func (w *Writer) Region(name string) (uint32, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if id, ok := w.names[name]; ok {
		return id, nil
	}
	if len(name) > MaxNameLen || !utf8.ValidString(name) {
		return 0, fmt.Errorf("%w: region name %q (must be UTF-8 of at most %d bytes)", ErrInvalid, name, MaxNameLen)
	}
	id := uint32(len(w.defs.Regions))
	for {
		if _, used := w.defs.Regions[id]; !used {
			break
		}
		id++
	}
	return id, w.defineRegionLocked(id, name)
}

// DefineComm defines communicator id: worldRanks[r] is the world rank of its
// rank r. The list must be non-empty, of distinct ranks below the job size.
// Defining an id again with the same list does nothing; with another list it
// is an error wrapping ErrInvalid.
func (w *Writer) DefineComm(id uint32, worldRanks []uint32) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.usable(); err != nil {
		return err
	}
	if err := checkGroup(worldRanks, w.defs.Size); err != nil {
		return fmt.Errorf("%w: communicator %d: %v", ErrInvalid, id, err)
	}
	if old, ok := w.defs.Comms[id]; ok {
		if !slices.Equal(old, worldRanks) {
			return fmt.Errorf("%w: communicator %d is %v, cannot redefine it as %v", ErrInvalid, id, old, worldRanks)
		}
		return nil
	}
	w.defs.Comms[id] = slices.Clone(worldRanks)
	b := append(w.scratch[:0], tagDefComm)
	b = binary.AppendUvarint(b, uint64(id))
	b = binary.AppendUvarint(b, uint64(len(worldRanks)))
	if _, err := w.bw.Write(b); err != nil {
		w.err = err
		return err
	}
	for _, r := range worldRanks {
		b = binary.AppendUvarint(w.scratch[:0], uint64(r))
		if _, err := w.bw.Write(b); err != nil {
			w.err = err
			return err
		}
	}
	return nil
}

// checkGroup validates a communicator's list of world ranks.
func checkGroup(ranks []uint32, size uint32) error {
	if len(ranks) == 0 || uint64(len(ranks)) > uint64(size) {
		return fmt.Errorf("%d members in a job of %d ranks", len(ranks), size)
	}
	seen := make(map[uint32]bool, len(ranks))
	for _, r := range ranks {
		if r >= size {
			return fmt.Errorf("world rank %d out of range [0,%d)", r, size)
		}
		if seen[r] {
			return fmt.Errorf("world rank %d twice", r)
		}
		seen[r] = true
	}
	return nil
}

// Flush writes the buffered records to the underlying writer.
func (w *Writer) Flush() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.usable(); err != nil {
		return err
	}
	if err := w.bw.Flush(); err != nil {
		w.err = err
	}
	return w.err
}

// Close writes the end record (with the number of event records, so that a
// reader detects a truncated file), flushes, and closes the file if the
// Writer was made by Create. Calling Close again returns ErrClosed.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return ErrClosed
	}
	w.closed = true
	err := w.err
	if err == nil {
		b := append(w.scratch[:0], tagEnd)
		b = binary.AppendUvarint(b, w.n)
		if _, err = w.bw.Write(b); err == nil {
			err = w.bw.Flush()
		}
	}
	if w.closer != nil {
		if cerr := w.closer.Close(); err == nil {
			err = cerr
		}
	}
	return err
}
