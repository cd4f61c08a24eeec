package trace

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

// Record builders for the known-answer tests (communicator 0 unless given).
func send(t uint64, to, tag uint32, n uint64) Record {
	return Record{Kind: KindSend, Time: t, Peer: to, Tag: tag, Length: n}
}
func isend(t uint64, to, tag uint32, n, req uint64) Record {
	return Record{Kind: KindIsend, Time: t, Peer: to, Tag: tag, Length: n, Request: req}
}
func isendComplete(t, req uint64) Record {
	return Record{Kind: KindIsendComplete, Time: t, Request: req}
}
func recv(t uint64, from, tag uint32, n uint64) Record {
	return Record{Kind: KindRecv, Time: t, Peer: from, Tag: tag, Length: n}
}
func irecvRequest(t, req uint64) Record { return Record{Kind: KindIrecvRequest, Time: t, Request: req} }
func irecv(t uint64, from, tag uint32, n, req uint64) Record {
	return Record{Kind: KindIrecv, Time: t, Peer: from, Tag: tag, Length: n, Request: req}
}
func cancelled(t, req uint64) Record {
	return Record{Kind: KindRequestCancelled, Time: t, Request: req}
}

// sentTags and recvTags reduce message lists to (time, tag) pairs, the
// known answers of the tests below.
type tt struct{ Time, Tag uint64 }

func sentTT(ms []SentMessage) []tt {
	out := []tt{}
	for _, m := range ms {
		out = append(out, tt{m.Time, uint64(m.Tag)})
	}
	return out
}

func recvTT(ms []ReceivedMessage) []tt {
	out := []tt{}
	for _, m := range ms {
		out = append(out, tt{m.Time, uint64(m.Tag)})
	}
	return out
}

func TestSendWithNoPendingIsendIsRecordedAtOnce(t *testing.T) {
	sent, recvd, err := Messages([]Record{send(5, 1, 7, 8), send(6, 2, 8, 16)})
	require.NoError(t, err)
	require.Empty(t, recvd)
	require.Equal(t, []SentMessage{
		{Time: 5, Receiver: 1, Tag: 7, Length: 8, Index: 0},
		{Time: 6, Receiver: 2, Tag: 8, Length: 16, Index: 1},
	}, sent)
}

func TestSendBehindIncompleteIsendIsRecordedAfterTheIsend(t *testing.T) {
	recs := []Record{
		isend(10, 1, 1, 8, 100),
		send(20, 1, 2, 8),
		isendComplete(30, 100),
	}
	sent, _, err := Messages(recs)
	require.NoError(t, err)
	// The Isend keeps its own time (10), not the completion's (30).
	require.Equal(t, []tt{{10, 1}, {20, 2}}, sentTT(sent))
	require.Equal(t, 0, sent[0].Index)
	require.Equal(t, 1, sent[1].Index)

	// Until the Isend completes, the Send stays queued behind it: cut the
	// records before the completion and the Isend is reported pending, the
	// Send released at the end.
	sent, _, err = Messages(recs[:2])
	require.ErrorIs(t, err, ErrPendingRequest)
	require.Equal(t, []tt{{20, 2}}, sentTT(sent))
}

func TestIsendsCompletedOutOfOrderKeepIssueOrder(t *testing.T) {
	recs := []Record{
		isend(10, 1, 1, 8, 1), // A
		isend(20, 1, 2, 8, 2), // B
		send(25, 1, 3, 8),     // C, queued behind B
		isendComplete(30, 2),  // B completes first: B and C move behind A
		send(35, 1, 4, 8),     // D, queued behind A
		isendComplete(40, 1),  // A: A, then B, C, D
	}
	sent, _, err := Messages(recs)
	require.NoError(t, err)
	require.Equal(t, []tt{{10, 1}, {20, 2}, {25, 3}, {35, 4}}, sentTT(sent))

	// Three Isends completed C, A, B.
	recs = []Record{
		isend(1, 1, 1, 0, 11), isend(2, 1, 2, 0, 12), isend(3, 1, 3, 0, 13),
		isendComplete(4, 13), isendComplete(5, 11), isendComplete(6, 12),
	}
	sent, _, err = Messages(recs)
	require.NoError(t, err)
	require.Equal(t, []tt{{1, 1}, {2, 2}, {3, 3}}, sentTT(sent))
}

func TestCancelledIsendIsDroppedAndReleasesItsQueue(t *testing.T) {
	// The earliest Isend cancelled: the Send behind it is recorded.
	sent, _, err := Messages([]Record{
		isend(10, 1, 1, 8, 1),
		send(20, 1, 2, 8),
		cancelled(30, 1),
	})
	require.NoError(t, err)
	require.Equal(t, []tt{{20, 2}}, sentTT(sent))

	// A later Isend cancelled: its queue moves behind the previous Isend.
	sent, _, err = Messages([]Record{
		isend(10, 1, 1, 8, 1),
		isend(20, 1, 2, 8, 2),
		send(25, 1, 3, 8),
		cancelled(30, 2),
		isendComplete(40, 1),
	})
	require.NoError(t, err)
	require.Equal(t, []tt{{10, 1}, {25, 3}}, sentTT(sent))
}

func TestCancelledIrecvRequestIsDroppedAndReleasesItsQueue(t *testing.T) {
	recvd := func(recs ...Record) []tt {
		sent, r, err := Messages(recs)
		require.NoError(t, err)
		require.Empty(t, sent)
		return recvTT(r)
	}
	// Recv queued behind an IrecvRequest that gets cancelled.
	require.Equal(t, []tt{{20, 2}}, recvd(
		irecvRequest(10, 5),
		recv(20, 0, 2, 8),
		cancelled(30, 5),
	))
	// The later of two requests cancelled: its queue goes behind the first.
	require.Equal(t, []tt{{50, 1}, {25, 3}}, recvd(
		irecvRequest(10, 5),
		irecvRequest(20, 6),
		recv(25, 0, 3, 8),
		cancelled(30, 6),
		irecv(50, 0, 1, 8, 5),
	))
	// A cancel of an id that was never recorded is legal and ignored.
	require.Equal(t, []tt{{5, 1}}, recvd(cancelled(1, 77), recv(5, 0, 1, 0)))
}

func TestIrecvsCompletedByWaitsomeAtOneTimeKeepPostingOrder(t *testing.T) {
	// Three receives posted, then one Waitsome reports all three at t=50 in
	// the order 3, 1, 2. The envelope is only known at completion.
	recs := []Record{
		irecvRequest(10, 1),
		irecvRequest(11, 2),
		irecvRequest(12, 3),
		irecv(50, 0, 30, 3, 3),
		irecv(50, 2, 10, 1, 1),
		irecv(50, 1, 20, 2, 2),
	}
	_, recvd, err := Messages(recs)
	require.NoError(t, err)
	require.Equal(t, []ReceivedMessage{
		{Time: 50, Sender: 2, Tag: 10, Length: 1, Index: 4},
		{Time: 50, Sender: 1, Tag: 20, Length: 2, Index: 5},
		{Time: 50, Sender: 0, Tag: 30, Length: 3, Index: 3},
	}, recvd)
}

func TestReceiveTakesCompletionTimeAndEnvelope(t *testing.T) {
	_, recvd, err := Messages([]Record{
		irecvRequest(10, 9),
		{Kind: KindIrecv, Time: 99, Peer: 3, Comm: 4, Tag: 5, Length: 6, Request: 9},
	})
	require.NoError(t, err)
	require.Equal(t, []ReceivedMessage{{Time: 99, Sender: 3, Comm: 4, Tag: 5, Length: 6, Index: 1}}, recvd)
}

func TestMixedBlockingAndNonblockingOnBothSidesMatchInOrder(t *testing.T) {
	// Rank 0: Isend (tag 0), Send (tag 0), Wait for the Isend.
	r0 := []Record{
		isend(10, 1, 0, 8, 1),
		send(20, 1, 0, 16),
		isendComplete(30, 1),
		// then a blocking receive and a nonblocking one from rank 1
		recv(60, 1, 9, 4),
		irecvRequest(61, 2),
		irecv(80, 1, 9, 4, 2),
	}
	// Rank 1: Irecv posted first, then a blocking Recv, which completes
	// (t=25) before the Irecv's Wait (t=40): the Irecv took the first message.
	r1 := []Record{
		irecvRequest(5, 7),
		recv(25, 0, 0, 16),
		irecv(40, 0, 0, 8, 7),
		isend(50, 0, 9, 4, 8),
		send(55, 0, 9, 4),
		isendComplete(70, 8),
	}
	s0, rv0, err := Messages(r0)
	require.NoError(t, err)
	s1, rv1, err := Messages(r1)
	require.NoError(t, err)
	// Receives are in completion order of the queue, not chronological.
	require.Equal(t, []tt{{40, 0}, {25, 0}}, recvTT(rv1))
	require.Equal(t, []tt{{50, 9}, {55, 9}}, sentTT(s1))

	m, err := Match([]RankMessages{{Rank: 0, Sent: s0, Received: rv0}, {Rank: 1, Sent: s1, Received: rv1}}, map[uint32][]uint32{0: {0, 1}})
	require.NoError(t, err)
	require.Len(t, m.Messages, 4)
	type sr struct {
		Src, Dst         uint32
		SendT, RecvT, Ln uint64
	}
	var got []sr
	for _, x := range m.Messages {
		require.Equal(t, x.SendLength, x.RecvLength)
		got = append(got, sr{x.Src, x.Dst, x.SendTime, x.RecvTime, x.SendLength})
	}
	require.Equal(t, []sr{
		{0, 1, 10, 40, 8},  // Isend -> Irecv
		{0, 1, 20, 25, 16}, // Send -> Recv
		{1, 0, 50, 60, 4},  // Isend -> Recv
		{1, 0, 55, 80, 4},  // Send -> Irecv
	}, got)
	require.Empty(t, m.UnmatchedSends)
	require.Empty(t, m.UnmatchedReceives)
}

func TestUnknownRequestIdsAreReportedNotPanicking(t *testing.T) {
	sent, recvd, err := Messages([]Record{
		isendComplete(1, 42),   // nothing to complete
		irecv(2, 3, 4, 5, 43),  // received without a posted request: kept
		cancelled(3, 44),       // legal: cancelling an unrecorded request
		isend(4, 1, 1, 1, 50),  //
		isend(5, 1, 2, 1, 50),  // duplicate pending id
		irecvRequest(6, 50),    // same id as pending Isends
		cancelled(7, 50),       // both an Isend and an IrecvRequest
		isendComplete(8, 50),   // the second Isend 50
		irecvRequest(9, 60),    // never completed
		recv(10, 0, 9, 1),      // queued behind 60, released at the end
		isendComplete(11, 999), //
	})
	require.Error(t, err)
	var res []error
	var re *RecordError
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		require.ErrorAs(t, e, &re)
		res = append(res, re.Err)
	}
	require.Equal(t, []error{ErrUnknownRequest, ErrUnknownRequest, ErrDuplicateRequest, ErrDuplicateRequest,
		ErrAmbiguousRequest, ErrUnknownRequest, ErrPendingRequest}, res)
	require.ErrorIs(t, err, ErrUnknownRequest)
	require.Equal(t, []tt{{5, 2}}, sentTT(sent)) // first Isend 50 cancelled, second completed
	require.Equal(t, []tt{{2, 4}, {10, 9}}, recvTT(recvd))
	require.Contains(t, err.Error(), "record 0 IsendComplete@1{req 42}")
}

func TestMessagesIgnoresRegionAndCollectiveRecords(t *testing.T) {
	sent, recvd, err := Messages([]Record{
		{Kind: KindEnter, Time: 1, Region: 1},
		{Kind: KindCollectiveBegin, Time: 2},
		{Kind: KindCollectiveEnd, Time: 3, Region: 2, Peer: NoRoot, Length: 8, Received: 8},
		{Kind: KindLeave, Time: 4, Region: 1},
	})
	require.NoError(t, err)
	require.Empty(t, sent)
	require.Empty(t, recvd)
}

func TestManyProblemsAreCapped(t *testing.T) {
	var recs []Record
	for i := range 250 {
		recs = append(recs, isendComplete(uint64(i), uint64(i)))
	}
	_, _, err := Messages(recs)
	errs := err.(interface{ Unwrap() []error }).Unwrap()
	require.Len(t, errs, maxProblems+1)
	require.Contains(t, errs[maxProblems].Error(), "150 more problems")
	require.True(t, errors.Is(err, ErrUnknownRequest))
}
