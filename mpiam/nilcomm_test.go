package mpiam

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The communicator that Split(Undefined, ...) returns is nil (MPI_COMM_NULL).
// Every call on it reports ErrComm (class MPI_ERR_COMM) instead of panicking;
// Rank and Size, which have no error, answer Undefined and 0.
func TestNilCommReportsErrComm(t *testing.T) {
	var c *Comm
	buf := make([]int32, 4)
	op := Sum[int32]()
	require.Equal(t, Undefined, c.Rank())
	require.Equal(t, 0, c.Size())
	require.Equal(t, uint32(0), c.Context())

	errs := map[string]func() error{
		"Barrier":            c.Barrier,
		"Free":               c.Free,
		"Abort":              func() error { return c.Abort(3) },
		"Dup":                func() error { _, err := c.Dup(); return err },
		"Split":              func() error { _, err := c.Split(0, 0); return err },
		"Create":             func() error { _, err := c.Create(Group{}); return err },
		"Group":              func() error { _, err := c.Group(); return err },
		"Compare":            func() error { _, err := c.Compare(c); return err },
		"Iprobe":             func() error { _, _, err := c.Iprobe(0, 0); return err },
		"Probe":              func() error { _, err := c.Probe(0, 0); return err },
		"Improbe":            func() error { _, _, _, err := c.Improbe(0, 0); return err },
		"Mprobe":             func() error { _, _, err := c.Mprobe(0, 0); return err },
		"Ibarrier":           func() error { _, err := c.Ibarrier(); return err },
		"BufferAttach":       func() error { return c.BufferAttach(make([]byte, 64)) },
		"BufferDetach":       func() error { _, err := c.BufferDetach(); return err },
		"QueryThread":        func() error { _, err := c.QueryThread(); return err },
		"IsThreadMain":       func() error { _, err := c.IsThreadMain(); return err },
		"AddTool":            func() error { return c.AddTool(nil) },
		"Send":               func() error { return Send(c, buf, 0, 0) },
		"Bsend":              func() error { return Bsend(c, buf, 0, 0) },
		"Ssend":              func() error { return Ssend(c, buf, 0, 0) },
		"Rsend":              func() error { return Rsend(c, buf, 0, 0) },
		"Isend":              func() error { _, err := Isend(c, buf, 0, 0); return err },
		"Ibsend":             func() error { _, err := Ibsend(c, buf, 0, 0); return err },
		"Issend":             func() error { _, err := Issend(c, buf, 0, 0); return err },
		"Irsend":             func() error { _, err := Irsend(c, buf, 0, 0); return err },
		"Recv":               func() error { _, err := Recv(c, buf, 0, 0); return err },
		"Irecv":              func() error { _, err := Irecv(c, buf, 0, 0); return err },
		"SendInit":           func() error { _, err := SendInit(c, buf, 0, 0, Standard); return err },
		"RecvInit":           func() error { _, err := RecvInit(c, buf, 0, 0); return err },
		"Sendrecv":           func() error { _, err := Sendrecv(c, buf, 0, 0, buf, 0, 0); return err },
		"SendrecvReplace":    func() error { _, err := SendrecvReplace(c, buf, 0, 0, 0, 0); return err },
		"Bcast":              func() error { return Bcast(c, buf, 0) },
		"Reduce":             func() error { return Reduce(c, buf, buf, op, 0) },
		"Allreduce":          func() error { return Allreduce(c, buf, buf, op) },
		"Gather":             func() error { return Gather(c, buf, buf, 0) },
		"Gatherv":            func() error { return Gatherv(c, buf, buf, nil, nil, 0) },
		"Scatter":            func() error { return Scatter(c, buf, buf, 0) },
		"Scatterv":           func() error { return Scatterv(c, buf, nil, nil, buf, 0) },
		"Allgather":          func() error { return Allgather(c, buf, buf) },
		"Allgatherv":         func() error { return Allgatherv(c, buf, buf, nil, nil) },
		"Alltoall":           func() error { return Alltoall(c, buf, buf) },
		"Alltoallv":          func() error { return Alltoallv(c, buf, nil, nil, buf, nil, nil) },
		"ReduceScatterBlock": func() error { return ReduceScatterBlock(c, buf, buf, op) },
		"Scan":               func() error { return Scan(c, buf, buf, op) },
		"Exscan":             func() error { return Exscan(c, buf, buf, op) },
		"Ibcast":             func() error { _, err := Ibcast(c, buf, 0); return err },
		"Ireduce":            func() error { _, err := Ireduce(c, buf, buf, op, 0); return err },
		"Iallreduce":         func() error { _, err := Iallreduce(c, buf, buf, op); return err },
		"Iallgather":         func() error { _, err := Iallgather(c, buf, buf); return err },
		"Ialltoall":          func() error { _, err := Ialltoall(c, buf, buf); return err },
	}
	for name, call := range errs {
		t.Run(name, func(t *testing.T) {
			var err error
			require.NotPanics(t, func() { err = call() })
			require.ErrorIs(t, err, ErrComm)
			require.Equal(t, ClassComm, ErrorClass(err))
		})
	}
}
