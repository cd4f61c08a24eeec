package jobsecret

import (
	"encoding/hex"
	"sync"
	"testing"

	"github.com/amgo-hpc/amgo/am/transport/transporttest"
	"github.com/stretchr/testify/require"
)

func TestSecretFromEnvironment(t *testing.T) {
	t.Setenv("AMGO_JOB_SECRET", "00112233445566778899aabbccddeeff")
	s, err := Before(transporttest.NewBootstraps(1, "js-env")[0], nil, "k")
	require.NoError(t, err)
	require.Equal(t, "00112233445566778899aabbccddeeff", hex.EncodeToString(s))
	for _, bad := range []string{"zz", "0011"} {
		_, err = Before(transporttest.NewBootstraps(1, "js-bad")[0], map[string]string{"secret": bad}, "k")
		require.ErrorIs(t, err, ErrBad)
	}
}

// Without AMGO_JOB_SECRET rank 0 draws one and every rank ends with it.
func TestSecretSharedByRankZero(t *testing.T) {
	t.Setenv("AMGO_JOB_SECRET", "")
	boots := transporttest.NewBootstraps(3, "js-share")
	got := make([][]byte, 3)
	var wg sync.WaitGroup
	for i, b := range boots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := Before(b, nil, "amgo.test.secret")
			require.NoError(t, err)
			require.NoError(t, b.Fence())
			if s == nil {
				s, err = After(b, "amgo.test.secret")
				require.NoError(t, err)
			}
			got[i] = s
		}()
	}
	wg.Wait()
	require.Len(t, got[0], MinLen)
	require.Equal(t, got[0], got[1])
	require.Equal(t, got[0], got[2])
}
