package trace

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"time"
)

// RankMessages is the output of Messages for one world rank.
type RankMessages struct {
	// Rank is the world rank that sent and received these messages.
	Rank uint32
	// Sent and Received are the lists Messages returned for this rank.
	Sent     []SentMessage
	Received []ReceivedMessage
	// Comms, if not nil, are this rank's communicator definitions
	// (Definitions.Comms), used instead of Match's comms argument for this
	// rank's messages.
	Comms map[uint32][]uint32
}

// Message is a send matched with its receive.
type Message struct {
	// ID is the message's index in Matching.Messages; WriteChromeJSON uses it
	// as the flow id.
	ID int
	// Comm and Tag are the communicator id and tag of the message.
	Comm, Tag uint32
	// Src and Dst are the world ranks of the sender and the receiver.
	Src, Dst uint32
	// SendTime and RecvTime are the time stamps (ns) of the send and of the
	// receive's completion, on the common time line of the input.
	SendTime, RecvTime uint64
	// SendLength and RecvLength are the sizes in bytes recorded by each side
	// (equal in a consistent trace).
	SendLength, RecvLength uint64
	// SendIndex and RecvIndex are the positions of the send's and the
	// receive's records in the sender's and the receiver's record lists.
	SendIndex, RecvIndex int
	// Seq is the message's position (from 0) in its channel (Comm, Src, Dst,
	// Tag).
	Seq int
}

// Latency is RecvTime - SendTime: how long the message took at most, from
// the earliest moment it could leave to the latest it could arrive. It is
// negative only if the ranks' clocks disagree.
func (m *Message) Latency() time.Duration {
	return time.Duration(int64(m.RecvTime) - int64(m.SendTime))
}

// UnmatchedSend is a send no receive matched.
type UnmatchedSend struct {
	Src uint32 // world rank of the sender
	Dst int    // world rank of the receiver, -1 if it could not be translated
	SentMessage
}

// UnmatchedReceive is a receive no send matched.
type UnmatchedReceive struct {
	Dst uint32 // world rank of the receiver
	Src int    // world rank of the sender, -1 if it could not be translated
	ReceivedMessage
}

// PairStats sums up the matched messages from world rank Src to world rank
// Dst, over all communicators and tags.
type PairStats struct {
	// Src and Dst are world ranks.
	Src, Dst uint32
	// Count is the number of messages; Bytes the sum of their send lengths.
	Count int
	Bytes uint64
	// Mean, Min and Max are statistics of Message.Latency.
	Mean, Min, Max time.Duration
}

// Matching is the result of Match.
type Matching struct {
	// Messages are the matched messages ordered by SendTime, then Src, then
	// the sender's record order. Messages[i].ID == i.
	Messages []Message
	// UnmatchedSends and UnmatchedReceives are in rank order, then record
	// order.
	UnmatchedSends    []UnmatchedSend
	UnmatchedReceives []UnmatchedReceive
	// Pairs are ordered by Src, then Dst.
	Pairs []PairStats
}

// The problems Match reports, wrapped in a *MessageError.
var (
	// ErrUnknownComm: the message's communicator has no definition.
	ErrUnknownComm = errors.New("trace: communicator not defined")
	// ErrRankRange: the peer's rank is not below the communicator's size.
	ErrRankRange = errors.New("trace: peer rank outside the communicator")
	// ErrNotMember: the recording rank is not in the communicator's group.
	ErrNotMember = errors.New("trace: recording rank is not a member of the communicator")
	// ErrLengthMismatch: a matched send and receive disagree on the size.
	ErrLengthMismatch = errors.New("trace: matched send and receive have different lengths")
)

// MessageError is a problem with one message found by Match.
type MessageError struct {
	Rank  uint32 // world rank whose records hold the message
	Index int    // position of the Send/Isend or Recv/Irecv record
	Send  bool   // true for a sent message, false for a received one
	Err   error  // one of ErrUnknownComm, ErrRankRange, ErrNotMember, ErrLengthMismatch
}

// Error implements error.
func (e *MessageError) Error() string {
	what := "received"
	if e.Send {
		what = "sent"
	}
	return fmt.Sprintf("rank %d record %d (%s message): %v", e.Rank, e.Index, what, e.Err)
}

// Unwrap returns e.Err.
func (e *MessageError) Unwrap() error { return e.Err }

type channel struct {
	comm, src, dst, tag uint32
}

type sendRef struct {
	rank uint32
	m    SentMessage
}

type recvRef struct {
	rank uint32
	m    ReceivedMessage
}

// Match matches the sends to the receives of a job. ranks holds the output
// of Messages for each world rank (times on one common time line); comms maps
// communicator ids to their groups of world ranks (Definitions.Comms), for
// the ranks whose RankMessages.Comms is nil. Each message's peer rank is
// translated to a world rank through the group of its communicator as the
// recording rank defined it: one id may name several communicators with
// disjoint groups (mpiam gives all the communicators made by one Split the
// same context id), and each rank knows the one it belongs to. Then, per
// channel (communicator, source world rank,
// destination world rank, tag), the k-th send in the sender's order matches
// the k-th receive in the receiver's order (MPI's non-overtaking rule; the
// recorded receives carry their actual source and tag, so wildcards need no
// special handling).
//
// Match never fails: err, if not nil, joins a *MessageError for each message
// that could not be translated (it is then unmatched with peer -1) and each
// matched pair whose lengths differ; the Matching is complete despite them.
func Match(ranks []RankMessages, comms map[uint32][]uint32) (*Matching, error) {
	var problems []error
	report := func(rank uint32, index int, send bool, e error) {
		problems = append(problems, &MessageError{Rank: rank, Index: index, Send: send, Err: e})
	}
	var (
		groups  map[uint32][]uint32 // the current rank's definitions
		members map[uint32]bool     // comm -> current rank is a member
	)
	// translate returns the world rank of peer in comm for the message at
	// (rank, index), or -1 after reporting why not.
	translate := func(rank uint32, index int, send bool, comm, peer uint32) int {
		g, ok := groups[comm]
		if ok {
			if _, known := members[comm]; !known {
				members[comm] = slices.Contains(g, rank)
			}
		}
		switch {
		case !ok:
			report(rank, index, send, ErrUnknownComm)
		case uint64(peer) >= uint64(len(g)):
			report(rank, index, send, ErrRankRange)
		case !members[comm]:
			report(rank, index, send, ErrNotMember)
		default:
			return int(g[peer])
		}
		return -1
	}

	res := &Matching{}
	sends := map[channel][]sendRef{}
	recvs := map[channel][]recvRef{}
	var order []channel // channels in first-seen order, for determinism
	seen := map[channel]bool{}
	note := func(c channel) {
		if !seen[c] {
			seen[c] = true
			order = append(order, c)
		}
	}
	for _, rm := range ranks {
		groups, members = rm.Comms, map[uint32]bool{}
		if groups == nil {
			groups = comms
		}
		for _, m := range rm.Sent {
			dst := translate(rm.Rank, m.Index, true, m.Comm, m.Receiver)
			if dst < 0 {
				res.UnmatchedSends = append(res.UnmatchedSends, UnmatchedSend{Src: rm.Rank, Dst: -1, SentMessage: m})
				continue
			}
			c := channel{m.Comm, rm.Rank, uint32(dst), m.Tag}
			note(c)
			sends[c] = append(sends[c], sendRef{rm.Rank, m})
		}
		for _, m := range rm.Received {
			src := translate(rm.Rank, m.Index, false, m.Comm, m.Sender)
			if src < 0 {
				res.UnmatchedReceives = append(res.UnmatchedReceives, UnmatchedReceive{Dst: rm.Rank, Src: -1, ReceivedMessage: m})
				continue
			}
			c := channel{m.Comm, uint32(src), rm.Rank, m.Tag}
			note(c)
			recvs[c] = append(recvs[c], recvRef{rm.Rank, m})
		}
	}
	for _, c := range order {
		ss, rs := sends[c], recvs[c]
		n := min(len(ss), len(rs))
		for k := 0; k < n; k++ {
			s, r := ss[k].m, rs[k].m
			if s.Length != r.Length {
				report(c.dst, r.Index, false, ErrLengthMismatch)
			}
			res.Messages = append(res.Messages, Message{
				Comm: c.comm, Tag: c.tag, Src: c.src, Dst: c.dst,
				SendTime: s.Time, RecvTime: r.Time,
				SendLength: s.Length, RecvLength: r.Length,
				SendIndex: s.Index, RecvIndex: r.Index, Seq: k,
			})
		}
		for _, s := range ss[n:] {
			res.UnmatchedSends = append(res.UnmatchedSends, UnmatchedSend{Src: c.src, Dst: int(c.dst), SentMessage: s.m})
		}
		for _, r := range rs[n:] {
			res.UnmatchedReceives = append(res.UnmatchedReceives, UnmatchedReceive{Dst: c.dst, Src: int(c.src), ReceivedMessage: r.m})
		}
	}
	slices.SortStableFunc(res.Messages, func(a, b Message) int {
		return cmp.Or(cmp.Compare(a.SendTime, b.SendTime), cmp.Compare(a.Src, b.Src), cmp.Compare(a.SendIndex, b.SendIndex))
	})
	for i := range res.Messages {
		res.Messages[i].ID = i
	}
	slices.SortStableFunc(res.UnmatchedSends, func(a, b UnmatchedSend) int {
		return cmp.Or(cmp.Compare(a.Src, b.Src), cmp.Compare(a.Index, b.Index))
	})
	slices.SortStableFunc(res.UnmatchedReceives, func(a, b UnmatchedReceive) int {
		return cmp.Or(cmp.Compare(a.Dst, b.Dst), cmp.Compare(a.Index, b.Index))
	})
	res.Pairs = pairStats(res.Messages)
	return res, joinCapped(problems)
}

func pairStats(msgs []Message) []PairStats {
	type acc struct {
		PairStats
		sum float64
	}
	byPair := map[[2]uint32]*acc{}
	for i := range msgs {
		m := &msgs[i]
		k := [2]uint32{m.Src, m.Dst}
		a := byPair[k]
		l := m.Latency()
		if a == nil {
			a = &acc{PairStats: PairStats{Src: m.Src, Dst: m.Dst, Min: l, Max: l}}
			byPair[k] = a
		}
		a.Count++
		a.Bytes += m.SendLength
		a.sum += float64(l)
		a.Min = min(a.Min, l)
		a.Max = max(a.Max, l)
	}
	out := make([]PairStats, 0, len(byPair))
	for _, a := range byPair {
		a.Mean = time.Duration(a.sum / float64(a.Count))
		out = append(out, a.PairStats)
	}
	slices.SortFunc(out, func(a, b PairStats) int {
		return cmp.Or(cmp.Compare(a.Src, b.Src), cmp.Compare(a.Dst, b.Dst))
	})
	return out
}

// Messages runs Messages on every rank with its time stamps moved to the
// common time line (adding Offset), then Match with each rank's own
// communicator definitions. The Matching is always returned; err joins the problems of
// both steps (each *RecordError wrapped with its rank), and is nil for a
// consistent trace.
func (t *Trace) Messages() (*Matching, error) {
	var problems []error
	rms := make([]RankMessages, len(t.Ranks))
	for r, f := range t.Ranks {
		sent, recv, err := Messages(f.Records)
		if err != nil {
			problems = append(problems, fmt.Errorf("rank %d: %w", r, err))
		}
		off := t.Offset(r)
		for i := range sent {
			sent[i].Time += off
		}
		for i := range recv {
			recv[i].Time += off
		}
		rms[r] = RankMessages{Rank: uint32(r), Sent: sent, Received: recv, Comms: f.Defs.Comms}
	}
	m, err := Match(rms, nil)
	if err != nil {
		problems = append(problems, err)
	}
	return m, errors.Join(problems...)
}
