// Package trace records the MPI events of every rank of an amgo job with the
// record kinds of OTF2 (Send, Isend, IsendComplete, Recv, IrecvRequest, Irecv,
// RequestCancelled, plus call regions and collectives), stores them in a
// compact binary file per rank, turns each rank's records into ordered lists of
// sent and received messages (Messages: the rule by which OTF2 readers process
// nonblocking MPI records, "OTF2 Knowledge: How to Process Non-Blocking MPI
// Messages", 2015), matches sends to receives across ranks
// (Match) and exports the result as Chrome trace / Perfetto JSON with a flow
// arrow from every send to its receive (WriteChromeJSON).
//
// The file format, the algorithm and the command-line tool cmd/amtrace are
// described in docs/tools.md, section "Traces".
package trace

import (
	"fmt"
	"time"
)

// Kind is the type of a Record. The numeric values are the record tags of the
// file format and never change.
type Kind uint8

// The record kinds. The first seven are OTF2's MPI point-to-point records with
// OTF2's names and fields.
const (
	// KindSend: a blocking send was started (MPI_Send and its modes).
	// Fields: Peer = receiver's rank in Comm, Comm, Tag, Length.
	KindSend Kind = 1
	// KindIsend: a nonblocking send was started. Fields: Peer (receiver), Comm,
	// Tag, Length, Request.
	KindIsend Kind = 2
	// KindIsendComplete: a Wait/Test call found the Isend Request complete (or
	// the request was released). Fields: Request.
	KindIsendComplete Kind = 3
	// KindRecv: a blocking receive completed. Fields: Peer = sender's rank in
	// Comm, Comm, Tag, Length (the actual envelope and size).
	KindRecv Kind = 4
	// KindIrecvRequest: a nonblocking receive was posted; the envelope is not
	// known yet. Fields: Request.
	KindIrecvRequest Kind = 5
	// KindIrecv: a nonblocking receive completed. Fields: Peer (sender), Comm,
	// Tag, Length (actual envelope), Request.
	KindIrecv Kind = 6
	// KindRequestCancelled: a request was cancelled (an Isend, an
	// IrecvRequest, or a request that was not recorded). Fields: Request.
	KindRequestCancelled Kind = 7
	// KindEnter: an MPI call begins. Fields: Region (id of the call's name).
	KindEnter Kind = 8
	// KindLeave: an MPI call ends. Fields: Region.
	KindLeave Kind = 9
	// KindCollectiveBegin: this rank enters the communication of a collective
	// operation. No fields besides Time.
	KindCollectiveBegin Kind = 10
	// KindCollectiveEnd: the collective operation ends on this rank. Fields:
	// Region (id of the operation's name, e.g. "Allreduce"), Comm, Peer = root
	// rank in Comm (NoRoot if the operation has none), Length = bytes sent by
	// this rank, Received = bytes received by this rank.
	KindCollectiveEnd Kind = 11
)

// NoRoot is the Peer of a KindCollectiveEnd record whose operation has no
// root (OTF2_UNDEFINED_UINT32).
const NoRoot = ^uint32(0)

var kindNames = [...]string{
	KindSend:             "Send",
	KindIsend:            "Isend",
	KindIsendComplete:    "IsendComplete",
	KindRecv:             "Recv",
	KindIrecvRequest:     "IrecvRequest",
	KindIrecv:            "Irecv",
	KindRequestCancelled: "RequestCancelled",
	KindEnter:            "Enter",
	KindLeave:            "Leave",
	KindCollectiveBegin:  "CollectiveBegin",
	KindCollectiveEnd:    "CollectiveEnd",
}

// String returns the OTF2-style name of the kind ("Isend", "IrecvRequest",
// ...), or "Kind(n)" for a value that is not a record kind.
func (k Kind) String() string {
	if k.Valid() {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Valid reports whether k is one of the record kinds above.
func (k Kind) Valid() bool { return k >= KindSend && k <= KindCollectiveEnd }

// Record is one event of one rank. Which fields are meaningful depends on
// Kind (see the Kind constants); the others are zero. Record is a plain value:
// writing and reading records allocates nothing.
type Record struct {
	Kind Kind
	// Time is the time stamp in nanoseconds since the rank's clock epoch
	// (Definitions.Clock.Epoch). It must not exceed math.MaxInt64.
	Time uint64
	// Peer is the other side's rank in Comm: the receiver of a Send or Isend,
	// the sender of a Recv or Irecv, the root of a CollectiveEnd.
	Peer uint32
	// Comm is the communicator's id (see Definitions.Comms).
	Comm uint32
	// Tag is the message tag.
	Tag uint32
	// Length is the message size in bytes; for a CollectiveEnd, the bytes
	// this rank sent.
	Length uint64
	// Request is the request id that links an Isend to its IsendComplete and
	// an IrecvRequest to its Irecv, and names the request of a
	// RequestCancelled. Ids are unique among the pending requests of a rank
	// and may be reused after completion.
	Request uint64
	// Region is the id of a name in Definitions.Regions: the MPI call of an
	// Enter or Leave, the operation of a CollectiveEnd.
	Region uint32
	// Received is the number of bytes this rank received in a collective
	// (CollectiveEnd only).
	Received uint64
}

// String formats the record's meaningful fields, for messages and debugging.
func (r Record) String() string {
	switch r.Kind {
	case KindSend, KindRecv:
		return fmt.Sprintf("%v@%d{peer %d comm %d tag %d len %d}", r.Kind, r.Time, r.Peer, r.Comm, r.Tag, r.Length)
	case KindIsend, KindIrecv:
		return fmt.Sprintf("%v@%d{peer %d comm %d tag %d len %d req %d}", r.Kind, r.Time, r.Peer, r.Comm, r.Tag, r.Length, r.Request)
	case KindIsendComplete, KindIrecvRequest, KindRequestCancelled:
		return fmt.Sprintf("%v@%d{req %d}", r.Kind, r.Time, r.Request)
	case KindEnter, KindLeave:
		return fmt.Sprintf("%v@%d{region %d}", r.Kind, r.Time, r.Region)
	case KindCollectiveBegin:
		return fmt.Sprintf("%v@%d", r.Kind, r.Time)
	case KindCollectiveEnd:
		return fmt.Sprintf("%v@%d{op %d comm %d root %d sent %d received %d}", r.Kind, r.Time, r.Region, r.Comm, int64(int32(r.Peer)), r.Length, r.Received)
	}
	return fmt.Sprintf("%v@%d", r.Kind, r.Time)
}

// Clock describes the clock of a rank's time stamps.
type Clock struct {
	// Resolution is the granularity of the clock that produced the time
	// stamps, in nanoseconds (1 for Go's monotonic clock on Linux). Time
	// stamps are always in nanoseconds; Resolution only says how precise they
	// are. It must be at least 1.
	Resolution uint64
	// Epoch is the wall-clock time (Unix nanoseconds) of time stamp 0. Tools
	// put the ranks on one time line by adding Epoch to every time stamp, so
	// ranks of one job should either share an epoch or have synchronized
	// clocks.
	Epoch int64
}

// EpochTime returns Epoch as a time.Time.
func (c Clock) EpochTime() time.Time { return time.Unix(0, c.Epoch) }

// Definitions is the definition part of one rank's file: who wrote it, its
// clock, the communicators and the names of regions.
type Definitions struct {
	// Rank is the writer's rank in the world communicator; Size is the number
	// of ranks of the job. Rank < Size.
	Rank, Size uint32
	// Clock is the clock of the time stamps.
	Clock Clock
	// Comms maps a communicator id to its group: Comms[id][r] is the world
	// rank of the communicator's rank r. Every rank that records traffic on a
	// communicator defines it with the same id and the same group.
	Comms map[uint32][]uint32
	// Regions maps a region id to its name ("MPI_Send", "Allreduce", ...).
	Regions map[uint32]string
}

// RegionName returns the name of region id, or "region <id>" if it is not
// defined.
func (d *Definitions) RegionName(id uint32) string {
	if n, ok := d.Regions[id]; ok {
		return n
	}
	return fmt.Sprintf("region %d", id)
}
