package mpiam

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestThreadLevelDeclared(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want ThreadLevel
	}{
		{Config{}, ThreadSingle}, // MPI_Init's level
		{Config{Thread: ThreadFunneled}, ThreadFunneled},
		{Config{Thread: ThreadSerialized}, ThreadSerialized},
		{Config{Thread: ThreadMultiple}, ThreadMultiple},
	} {
		t.Run(tc.want.String(), func(t *testing.T) {
			err := RunLocal(2, tc.cfg, func(w *Comm) error {
				got, err := w.QueryThread()
				require.NoError(t, err)
				require.Equal(t, tc.want, got)
				d, err := w.Dup()
				require.NoError(t, err)
				got, err = d.QueryThread() // any communicator of the rank
				require.NoError(t, err)
				require.Equal(t, tc.want, got)
				return d.Free()
			})
			require.NoError(t, err)
		})
	}
}

func TestIsThreadMain(t *testing.T) {
	err := RunLocal(2, Config{Thread: ThreadFunneled}, func(w *Comm) error {
		main, err := w.IsThreadMain()
		require.NoError(t, err)
		require.True(t, main, "the goroutine running the rank's function")
		other := make(chan error)
		go func() {
			m, err := w.IsThreadMain()
			if err == nil && m {
				err = errors.New("IsThreadMain is true on a goroutine the rank started")
			}
			other <- err
		}()
		require.NoError(t, <-other)
		return nil
	})
	require.NoError(t, err)
}

func TestThreadLevelInvalid(t *testing.T) {
	for _, l := range []ThreadLevel{-1, ThreadMultiple + 1, 42} {
		err := RunLocal(2, Config{Thread: l}, func(*Comm) error {
			t.Error("ranks ran with an invalid thread level")
			return nil
		})
		require.ErrorIs(t, err, ErrArg)
		require.Equal(t, ClassArg, ErrorClass(err))

		err = Run(Config{Thread: l}, func(*Comm) error { return errors.New("ran") })
		require.ErrorIs(t, err, ErrArg)

		w, provided, err := InitThread(Config{}, l) // refused before the network is opened
		require.ErrorIs(t, err, ErrArg)
		require.Nil(t, w)
		require.Equal(t, ThreadSingle, provided)
		_, err = Init(Config{Thread: l})
		require.ErrorIs(t, err, ErrArg)
	}
	require.Equal(t, "ThreadLevel(42)", ThreadLevel(42).String())
	require.Equal(t, []string{"single", "funneled", "serialized", "multiple"},
		[]string{ThreadSingle.String(), ThreadFunneled.String(), ThreadSerialized.String(), ThreadMultiple.String()})
}

func TestThreadNilComm(t *testing.T) {
	var c *Comm
	_, err := c.QueryThread()
	require.ErrorIs(t, err, ErrComm)
	_, err = c.IsThreadMain()
	require.ErrorIs(t, err, ErrComm)
}

func TestGoroutineID(t *testing.T) {
	a := goroutineID()
	require.NotZero(t, a)
	require.Equal(t, a, goroutineID())
	b := make(chan uint64)
	go func() { b <- goroutineID() }()
	require.NotEqual(t, a, <-b)
}
