package trace

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func onComm(r Record, comm uint32) Record { r.Comm = comm; return r }

func TestMatchTranslatesCommRanksAcrossThreeRanksAndTwoComms(t *testing.T) {
	// comm 0 is the world; comm 9 holds world ranks 2 and 0, in that order:
	// its rank 0 is world 2, its rank 1 is world 0.
	comms := map[uint32][]uint32{0: {0, 1, 2}, 9: {2, 0}}
	r0 := []Record{
		onComm(send(100, 0, 1, 10), 9), // to comm-9 rank 0 = world 2
		send(110, 2, 1, 20),
		send(120, 1, 3, 5),            // never received
		onComm(recv(300, 0, 4, 7), 9), // from comm-9 rank 0 = world 2
	}
	r1 := []Record{
		send(105, 2, 1, 30),
		recv(400, 0, 8, 1), // never sent
	}
	r2 := []Record{
		onComm(recv(200, 1, 1, 10), 9), // from comm-9 rank 1 = world 0
		recv(210, 0, 1, 20),
		recv(220, 1, 1, 30),
		onComm(send(250, 1, 4, 7), 9), // to world 0
	}
	var rms []RankMessages
	for r, recs := range [][]Record{r0, r1, r2} {
		s, rv, err := Messages(recs)
		require.NoError(t, err)
		rms = append(rms, RankMessages{Rank: uint32(r), Sent: s, Received: rv})
	}
	m, err := Match(rms, comms)
	require.NoError(t, err)
	require.Equal(t, []Message{
		{ID: 0, Comm: 9, Tag: 1, Src: 0, Dst: 2, SendTime: 100, RecvTime: 200, SendLength: 10, RecvLength: 10, SendIndex: 0, RecvIndex: 0},
		{ID: 1, Comm: 0, Tag: 1, Src: 1, Dst: 2, SendTime: 105, RecvTime: 220, SendLength: 30, RecvLength: 30, SendIndex: 0, RecvIndex: 2},
		{ID: 2, Comm: 0, Tag: 1, Src: 0, Dst: 2, SendTime: 110, RecvTime: 210, SendLength: 20, RecvLength: 20, SendIndex: 1, RecvIndex: 1},
		{ID: 3, Comm: 9, Tag: 4, Src: 2, Dst: 0, SendTime: 250, RecvTime: 300, SendLength: 7, RecvLength: 7, SendIndex: 3, RecvIndex: 3},
	}, m.Messages)
	require.Equal(t, []UnmatchedSend{{Src: 0, Dst: 1, SentMessage: SentMessage{Time: 120, Receiver: 1, Tag: 3, Length: 5, Index: 2}}}, m.UnmatchedSends)
	require.Equal(t, []UnmatchedReceive{{Dst: 1, Src: 0, ReceivedMessage: ReceivedMessage{Time: 400, Sender: 0, Tag: 8, Length: 1, Index: 1}}}, m.UnmatchedReceives)
	require.Equal(t, []PairStats{
		{Src: 0, Dst: 2, Count: 2, Bytes: 30, Mean: 100, Min: 100, Max: 100},
		{Src: 1, Dst: 2, Count: 1, Bytes: 30, Mean: 115, Min: 115, Max: 115},
		{Src: 2, Dst: 0, Count: 1, Bytes: 7, Mean: 50, Min: 50, Max: 50},
	}, m.Pairs)
	require.Equal(t, 100*time.Nanosecond, m.Messages[0].Latency())
}

func TestMatchIsFIFOPerChannel(t *testing.T) {
	// Three messages on one channel: the k-th send matches the k-th receive,
	// whatever the lengths or times.
	s, _, err := Messages([]Record{send(1, 1, 5, 1), send(2, 1, 5, 2), send(3, 1, 5, 3)})
	require.NoError(t, err)
	_, rv, err := Messages([]Record{recv(10, 0, 5, 1), recv(20, 0, 5, 2), recv(30, 0, 5, 3)})
	require.NoError(t, err)
	m, err := Match([]RankMessages{{Rank: 0, Sent: s}, {Rank: 1, Received: rv}}, map[uint32][]uint32{0: {0, 1}})
	require.NoError(t, err)
	require.Len(t, m.Messages, 3)
	for k, x := range m.Messages {
		require.Equal(t, k, x.Seq)
		require.Equal(t, uint64(k+1), x.RecvLength)
		require.Equal(t, uint64(k+1), x.SendLength)
	}
	require.Equal(t, PairStats{Src: 0, Dst: 1, Count: 3, Bytes: 6, Mean: 18, Min: 9, Max: 27}, m.Pairs[0])
}

func TestMatchReportsUntranslatableMessagesAsUnmatched(t *testing.T) {
	comms := map[uint32][]uint32{0: {0, 1}, 1: {1}}
	s0, _, _ := Messages([]Record{
		onComm(send(1, 0, 0, 1), 7), // undefined communicator
		send(2, 5, 0, 1),            // rank 5 in a 2-rank communicator
		onComm(send(3, 0, 0, 1), 1), // world 0 is not in comm 1
		send(4, 1, 0, 8),            // received with another length
	})
	_, r1, _ := Messages([]Record{
		onComm(recv(5, 3, 0, 1), 0), // rank 3 in a 2-rank communicator
		recv(6, 0, 0, 9),
	})
	m, err := Match([]RankMessages{{Rank: 0, Sent: s0}, {Rank: 1, Received: r1}}, comms)
	require.ErrorIs(t, err, ErrUnknownComm)
	require.ErrorIs(t, err, ErrRankRange)
	require.ErrorIs(t, err, ErrNotMember)
	require.ErrorIs(t, err, ErrLengthMismatch)
	var me *MessageError
	require.ErrorAs(t, err, &me)
	require.Equal(t, &MessageError{Rank: 0, Index: 0, Send: true, Err: ErrUnknownComm}, me)
	require.Contains(t, err.Error(), "rank 1 record 0 (received message): trace: peer rank outside the communicator")
	require.Len(t, m.Messages, 1)
	require.Len(t, m.UnmatchedSends, 3)
	for _, u := range m.UnmatchedSends {
		require.Equal(t, -1, u.Dst)
	}
	require.Equal(t, []UnmatchedReceive{{Dst: 1, Src: -1, ReceivedMessage: r1[0]}}, m.UnmatchedReceives)
}

func TestMatchOfNothingIsEmpty(t *testing.T) {
	m, err := Match(nil, nil)
	require.NoError(t, err)
	require.Empty(t, m.Messages)
	require.Empty(t, m.Pairs)
}

func TestOneCommIDForDisjointGroupsOfASplitIsTranslatedPerRank(t *testing.T) {
	// A Split into two colors gives communicator 3 to world ranks {0, 2} and
	// to {1, 3}: each rank defines the group it is in.
	even, odd := []uint32{0, 2}, []uint32{1, 3}
	file := func(rank uint32, g []uint32, recs ...Record) *File {
		return &File{Defs: Definitions{Rank: rank, Size: 4, Clock: Clock{Resolution: 1},
			Comms: map[uint32][]uint32{3: g}}, Records: recs}
	}
	tr, err := NewTrace([]*File{
		file(0, even, onComm(send(1, 1, 0, 10), 3)), // comm rank 1 = world 2
		file(1, odd, onComm(send(2, 1, 0, 20), 3)),  // comm rank 1 = world 3
		file(2, even, onComm(recv(5, 0, 0, 10), 3)), // from world 0
		file(3, odd, onComm(recv(6, 0, 0, 20), 3)),  // from world 1
	})
	require.NoError(t, err)
	m, err := tr.Messages()
	require.NoError(t, err)
	require.Len(t, m.Messages, 2)
	require.Equal(t, [2]uint32{0, 2}, [2]uint32{m.Messages[0].Src, m.Messages[0].Dst})
	require.Equal(t, [2]uint32{1, 3}, [2]uint32{m.Messages[1].Src, m.Messages[1].Dst})
	require.Empty(t, m.UnmatchedSends)
	require.Empty(t, m.UnmatchedReceives)

	// Overlapping different groups under one id are inconsistent.
	_, err = NewTrace([]*File{file(0, []uint32{0, 1}, nil...), file(1, []uint32{1, 2}), file(2, even), file(3, odd)})
	require.ErrorIs(t, err, ErrFormat)
	require.ErrorContains(t, err, "equal or disjoint")
}
