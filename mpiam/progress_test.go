package mpiam

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A message that waits unexpected at the receiver must not stop its sender:
// the sender starts more sends (MPI-4.1 §3.7: starting a nonblocking send is
// local) and completes a rendezvous that the receiver waits for, while the
// first message is still unreceived. Regression: the receiver kept unexpected
// eager data in the sender's ring-allocated space, which pinned the ring.
func TestUnexpectedMessageDoesNotStallSender_MPI41_3_7(t *testing.T) {
	eachNetwork(t, 2, func(r *rk, w *Comm) {
		const small = 200
		big := 3 * r.eagerLimit(w)
		switch w.Rank() {
		case 0:
			var reqs []Request
			req, err := Isend(w, patterned(8, 1), 1, 1) // waits unexpected
			r.NoError(err)
			reqs = append(reqs, req)
			for i := range small { // far more than the per-peer buffer
				req, err := Isend(w, patterned(1000, 100+i), 1, 2)
				r.NoError(err)
				reqs = append(reqs, req)
			}
			req, err = Isend(w, patterned(big, 2), 1, 3) // rendezvous, received first
			r.NoError(err)
			reqs = append(reqs, req)
			r.NoError(Waitall(reqs, nil))
		case 1:
			buf := make([]byte, big)
			_, err := Recv(w, buf, 0, 3)
			r.NoError(err)
			r.NoError(checkPattern(buf, 2))
			for i := range small {
				st, err := Recv(w, buf, 0, 2)
				r.NoError(err)
				r.NoError(checkPattern(buf[:st.Bytes], 100+i))
			}
			st, err := Recv(w, buf, 0, 1)
			r.NoError(err)
			r.NoError(checkPattern(buf[:st.Bytes], 1))
		}
	})
}

// Both ranks start many small sends to each other before posting any
// receive: every Isend returns (MPI-4.1 §3.7), then the receives complete.
func TestIsendIsLocal_MPI41_3_7(t *testing.T) {
	const n = 2000
	eachNetwork(t, 2, func(r *rk, w *Comm) {
		peer := 1 - w.Rank()
		reqs := make([]Request, 0, 2*n)
		for i := range n {
			req, err := Isend(w, []int64{int64(i)}, peer, 5)
			r.NoError(err)
			reqs = append(reqs, req)
		}
		got := make([]int64, n)
		for i := range n {
			req, err := Irecv(w, got[i:i+1], peer, 5)
			r.NoError(err)
			reqs = append(reqs, req)
		}
		r.NoError(Waitall(reqs, nil))
		for i := range n {
			r.Equal(int64(i), got[i])
		}
	})
}

// A job's ranks close promptly. Regression of an am bug (fixed in 1bc6c3f):
// an endpoint returned credit for requests answered without a reply only
// after idling in Poll, and Close sent none of those pending returns, so each
// peer's Close waited a full second: RunLocal of two ranks exchanging one
// message took over 2 s.
func TestRunLocalReturnsPromptly(t *testing.T) {
	start := time.Now()
	require.NoError(t, RunLocal(2, Config{}, func(w *Comm) error {
		if w.Rank() == 0 {
			return Send(w, []byte{1}, 1, 1)
		}
		_, err := Recv(w, make([]byte, 1), 0, 1)
		return err
	}))
	require.Less(t, time.Since(start), 1500*time.Millisecond, "RunLocal of two ranks")
}

// A send freed while active still completes, and MPI_Finalize completes it
// (MPI-4.1 §3.7.3 MPI_Request_free, §11.2.2: "MPI_FINALIZE [...] will
// complete the send"): a rank that starts a rendezvous send, frees it and
// returns must not leave its receiver waiting (MPICH rqfree).
func TestFinalizeCompletesFreedSend_MPI41_11_2_2(t *testing.T) {
	eachNetwork(t, 2, func(r *rk, w *Comm) {
		n := 3 * r.eagerLimit(w)
		if w.Rank() == 0 {
			req, err := Isend(w, patterned(n, 4), 1, 1)
			r.NoError(err)
			r.NoError(req.Free())
			return // finalize follows
		}
		time.Sleep(20 * time.Millisecond) // rank 0 is in finalize by now
		buf := make([]byte, n)
		_, err := Recv(w, buf, 0, 1)
		r.NoError(err)
		r.NoError(checkPattern(buf, 4))
	})
}
