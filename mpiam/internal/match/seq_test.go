package match

// sendSeq hands out the senders' sequence numbers in the tests: one counter
// per (context, destination), from 0, as mpiam's Comm.sendSeq does.
type sendSeq struct {
	next map[uint64]uint32 // by ctx<<32 | dest
}

// Next returns the next sequence number for dest on context ctx.
func (s *sendSeq) Next(ctx uint32, dest int32) uint32 {
	if s.next == nil {
		s.next = make(map[uint64]uint32)
	}
	k := uint64(ctx)<<32 | uint64(uint32(dest))
	n := s.next[k]
	s.next[k] = n + 1
	return n
}

// Forget drops the counters of context ctx.
func (s *sendSeq) Forget(ctx uint32) {
	for k := range s.next {
		if uint32(k>>32) == ctx {
			delete(s.next, k)
		}
	}
}
