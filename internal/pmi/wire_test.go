package pmi

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseLine(t *testing.T) {
	cases := []struct {
		in   string
		want Line
	}{
		{"cmd=barrier_out\n", Line{Cmd: "barrier_out"}},
		{"cmd=barrier_out", Line{Cmd: "barrier_out"}},
		{"cmd=response_to_init rc=0 pmi_version=1 pmi_subversion=2\n",
			NewLine("response_to_init", "rc", "0", "pmi_version", "1", "pmi_subversion", "2")},
		{"cmd=get_result rc=-1 msg=key_x_not_found value=unknown",
			NewLine("get_result", "rc", "-1", "msg", "key_x_not_found", "value", "unknown")},
		{"cmd=put  kvsname=k   key=a\\ b value=c\\\\d\\=e  ",
			NewLine("put", "kvsname", "k", "key", "a b", "value", "c\\d=e")},
		{"cmd=x v=tail\\", NewLine("x", "v", "tail\\")},
		{"cmd=x v=", NewLine("x", "v", "")},
		{"cmd=x v=a=b", NewLine("x", "v", "a=b")},
		{"cmd=x endcmd", Line{Cmd: "x", Attrs: []Attr{{Key: "endcmd", Bare: true}}}},
		{"cmd=a\\ b", Line{Cmd: "a b"}},
	}
	for _, c := range cases {
		got, err := ParseLine(c.in)
		require.NoError(t, err, c.in)
		require.Equal(t, c.want, got, c.in)
	}
}

func TestParseLineErrors(t *testing.T) {
	for _, in := range []string{
		"", "\n", "garbage", " cmd=x", "cmd=", "cmd= x=1", "cmd", "cmd=x =1", "cmd=x a\\b=1",
		"cmd=x\ncmd=y", "cmd=x a=\x00", "cmd=x cmd=y", "cmd=x cmd", "mcmd=spawn",
		"cmd=" + strings.Repeat("a", MaxLine),
	} {
		_, err := ParseLine(in)
		require.ErrorIs(t, err, ErrMalformed, "%q", in)
	}
}

func TestFormatLine(t *testing.T) {
	s, err := FormatLine(NewLine("put", "kvsname", "kvs_1", "key", "k", "value", "a b\\c=d"))
	require.NoError(t, err)
	require.Equal(t, "cmd=put kvsname=kvs_1 key=k value=a\\ b\\\\c=d\n", s)
	s, err = FormatLine(Line{Cmd: "x", Attrs: []Attr{{Key: "endcmd", Bare: true}, {Key: "e", Value: ""}}})
	require.NoError(t, err)
	require.Equal(t, "cmd=x endcmd e=\n", s)
	require.Equal(t, "cmd=barrier_in", NewLine("barrier_in").String())

	for _, l := range []Line{
		{}, NewLine("a\nb"), NewLine("x", "", "v"), NewLine("x", "a b", "v"), NewLine("x", "a=b", "v"),
		NewLine("x", "cmd", "v"), NewLine("x", "k", "a\nb"), NewLine("x", "k", "a\x00"),
		NewLine("x", "k", strings.Repeat("v", MaxLine)),
	} {
		_, err := FormatLine(l)
		require.ErrorIs(t, err, ErrMalformed, "%+v", l)
	}
}

func TestRoundTrip(t *testing.T) {
	for _, v := range []string{"", " ", "\\", "a b c", "x\\ y", "=", "tail\\", "\t\r", "ünïcode"} {
		s, err := FormatLine(NewLine("put", "key", "k", "value", v))
		require.NoError(t, err)
		l, err := ParseLine(s)
		require.NoError(t, err)
		got, ok := l.Get("value")
		require.True(t, ok)
		require.Equal(t, v, got)
	}
}
