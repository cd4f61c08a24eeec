package mpiam

import (
	"unsafe"
)

// Special ranks and tags (MPI-4.1 §3.2.4, §3.5, §4.10).
const (
	// AnySource as a receive's source matches a message from any rank.
	AnySource = -1
	// AnyTag as a receive's tag matches any tag.
	AnyTag = -1
	// ProcNull as a source or destination makes the operation a no-op that
	// completes at once (MPI-4.1 §4.10).
	ProcNull = -2
	// TagUB is the largest valid tag (MPI_TAG_UB; the standard requires at least 32767).
	TagUB = 1<<30 - 1
	// Undefined is MPI_UNDEFINED: a count that is not a whole number of elements,
	// the index from Waitany when no request was active.
	Undefined = -32766
)

// Elem is the set of element types a buffer may hold: Go's fixed-size numeric
// types (MPI's basic datatypes). Buffers are sent as their in-memory bytes,
// without a copy; sender and receiver must agree on the type (as in MPI, where
// the type signatures must match).
type Elem interface {
	~byte | ~int8 | ~int16 | ~uint16 | ~int32 | ~uint32 | ~int64 | ~uint64 | ~int | ~uint |
		~float32 | ~float64 | ~complex64 | ~complex128
}

// bytesOf views buf's memory as bytes, without copying.
func bytesOf[T Elem](buf []T) []byte {
	if len(buf) == 0 {
		return nil
	}
	var z T
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(buf))), len(buf)*int(unsafe.Sizeof(z)))
}

// sizeOf is the size of one element of T in bytes.
func sizeOf[T Elem]() int {
	var z T
	return int(unsafe.Sizeof(z))
}

// Status describes a completed receive or probe (MPI_Status).
type Status struct {
	// Source is the sender's rank in the communicator (ProcNull for a receive
	// from ProcNull, AnySource for an empty status).
	Source int
	// Tag is the message's tag (AnyTag for an empty status).
	Tag int
	// Err is the operation's error: nil, or for example ErrTruncate. It is
	// set by every completion call (MPI sets MPI_ERROR only in the multiple
	// completion functions; amgo always fills it).
	Err error
	// Bytes is the number of bytes received (for a probe: the message's size).
	Bytes int
	// Cancelled reports that the request was cancelled (MPI_Test_cancelled).
	Cancelled bool
	// Piggyback is the tool value that arrived with the message, when
	// HasPiggyback: for a receive, the sender's
	// value; for a rendezvous send, the receiver's value from the handshake;
	// for a collective, the largest value among the messages this rank received
	// in it.
	Piggyback    uint64
	HasPiggyback bool
}

// emptyStatus is the status of a null or inactive request (MPI-4.1 §3.7.3):
// source AnySource, tag AnyTag, count 0.
var emptyStatus = Status{Source: AnySource, Tag: AnyTag}

// TestCancelled reports whether the request the status describes was cancelled.
func (s Status) TestCancelled() bool { return s.Cancelled }

// GetCount returns the number of elements of type T received (MPI_Get_count):
// Bytes divided by the size of T, or Undefined if Bytes is not a whole number of
// elements.
func GetCount[T Elem](s Status) int {
	n := sizeOf[T]()
	if s.Bytes%n != 0 {
		return Undefined
	}
	return s.Bytes / n
}
