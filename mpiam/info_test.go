package mpiam

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestVersionAndNames(t *testing.T) {
	v, s := GetVersion()
	require.Equal(t, 4, v)
	require.Equal(t, 1, s)
	lib := GetLibraryVersion()
	require.True(t, strings.HasPrefix(lib, "amgo "), lib)
	require.Contains(t, lib, "go1")
	host, err := os.Hostname()
	require.NoError(t, err)
	name, err := GetProcessorName()
	require.NoError(t, err)
	require.Equal(t, host, name)

	runJob(t, "loop", 2, Config{}, func(r *rk, w *Comm) {
		n, err := w.Name()
		r.NoError(err)
		r.Equal("MPI_COMM_WORLD", n)
		d, err := w.Dup()
		r.NoError(err)
		n, err = d.Name()
		r.NoError(err)
		r.Empty(n)
		r.NoError(d.SetName("halo ☃ exchange"))
		n, err = d.Name()
		r.NoError(err)
		r.Equal("halo ☃ exchange", n)
		r.NoError(w.SetName("mine"))
		n, _ = w.Name()
		r.Equal("mine", n)
		r.NoError(d.Free())
		r.ErrorIs(d.SetName("x"), ErrComm)
		_, err = d.Name()
		r.ErrorIs(err, ErrComm)
		var nilComm *Comm
		_, err = nilComm.Name()
		r.ErrorIs(err, ErrComm)
	})
}
