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
