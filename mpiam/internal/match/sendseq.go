package match

// SendSeq is the sending side's sequence counters: one per (context,
// destination), starting at 0. The sender takes the next number when a send is
// initiated, under the same lock that orders initiations, and puts it in the
// envelope; the receiving Engine matches in that order whatever order the
// messages arrive in (MPI-4.1 §3.5; ob1 send_sequence).
//
// It is separate from Engine because sending need not take the lock that
// guards matching. The zero value is ready to use; like Engine it is not safe
// for concurrent use.
type SendSeq struct {
	next map[uint64]uint32 // by ctx<<32 | dest
}

// Next returns the sequence number for the next message to dest on context
// ctx and advances the counter; it wraps after 2^32 messages.
func (s *SendSeq) Next(ctx uint32, dest int32) uint32 {
	if s.next == nil {
		s.next = make(map[uint64]uint32)
	}
	k := uint64(ctx)<<32 | uint64(uint32(dest))
	n := s.next[k]
	s.next[k] = n + 1
	return n
}

// Forget drops the counters of context ctx, for when its communicator is
// freed; the receivers drop theirs with Engine.DropContext.
func (s *SendSeq) Forget(ctx uint32) {
	for k := range s.next {
		if uint32(k>>32) == ctx {
			delete(s.next, k)
		}
	}
}
