package mpiam

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSmokePingPong(t *testing.T) {
	err := RunLocal(2, Config{}, func(w *Comm) error {
		for _, n := range []int{0, 8, 20000, 1 << 20} {
			buf := make([]byte, n)
			if w.Rank() == 0 {
				for i := range buf {
					buf[i] = byte(i)
				}
				require.NoError(t, Send(w, buf, 1, 5))
				st, err := Recv(w, buf, 1, 6)
				require.NoError(t, err)
				require.Equal(t, n, st.Bytes)
			} else {
				st, err := Recv(w, buf, 0, 5)
				require.NoError(t, err)
				require.Equal(t, Status{Source: 0, Tag: 5, Bytes: n}, st)
				for i := range buf {
					require.Equal(t, byte(i), buf[i])
				}
				require.NoError(t, Send(w, buf, 0, 6))
			}
		}
		return nil
	})
	require.NoError(t, err)
}

// Comm.Network names the network that reaches a peer, through a
// sub-communicator's numbering too; "" for a rank out of range or the nil
// communicator.
func TestCommNetwork(t *testing.T) {
	for _, nw := range []string{"loop", "shm", "tcp"} {
		t.Run(nw, func(t *testing.T) {
			runJob(t, nw, 2, Config{}, func(r *rk, w *Comm) {
				r.Equal(nw, w.Network(1-w.Rank()))
				r.Empty(w.Network(2))
				r.Empty(w.Network(-1))
				rev, err := w.Split(0, -w.Rank()) // the other order
				r.NoError(err)
				r.Equal(nw, rev.Network(1-rev.Rank()))
				r.NoError(rev.Free())
			})
		})
	}
	var c *Comm
	require.Empty(t, c.Network(0))
}
