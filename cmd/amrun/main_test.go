package main

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRun(t *testing.T) {
	var out, errb bytes.Buffer
	code := run([]string{"-n", "2", "--tag-output", "sh", "-c", "echo $PMI_RANK/$PMI_SIZE ${AMGO_TRANSPORT-unset}"}, &out, &errb)
	require.Equal(t, 0, code, errb.String())
	require.Contains(t, out.String(), "[0] 0/2 unset\n", "no network forced: each rank chooses per peer")
	require.Contains(t, out.String(), "[1] 1/2 unset\n")

	out.Reset()
	code = run([]string{"-n", "2", "--transport", "tcp", "--iface", "lo", "sh", "-c",
		`echo "$AMGO_TRANSPORT $AMGO_IFACE ${#AMGO_JOB_SECRET}"`}, &out, &errb)
	require.Equal(t, 0, code, errb.String())
	require.Equal(t, "tcp lo 32\ntcp lo 32\n", out.String())

	errb.Reset()
	code = run([]string{"-n", "3", "--jobdir", t.TempDir(), "sh", "-c", `[ "$PMI_RANK" = 1 ] && exit 3; exec sleep 30`}, &out, &errb)
	require.Equal(t, 3, code)
	require.Equal(t, "amrun: rank 1 exited with status 3\n", errb.String())

	errb.Reset()
	code = run([]string{"-n", "1", "--timeout", "100ms", "sleep", "30"}, &out, &errb)
	require.Equal(t, 124, code)
	require.Contains(t, errb.String(), "timed out after 100ms")

	require.Equal(t, 2, run([]string{"-n", "2"}, &out, &errb))
	require.Equal(t, 2, run([]string{"--bogus", "true"}, &out, &errb))
	errb.Reset()
	require.Equal(t, 2, run([]string{"-n", "3", "--transport", "foo", "true"}, &out, &errb))
	require.Equal(t, "amrun: unknown network \"foo\" for --transport (have loop, shm, sim, tcp, udp, xdp)\n", errb.String())
	require.Equal(t, 2, run([]string{"-n", "0", "true"}, &out, &errb))
	require.Equal(t, 127, run([]string{"-n", "1", "/no/such/prog"}, &out, &errb))
}
