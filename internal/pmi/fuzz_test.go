package pmi

import (
	"testing"
)

// FuzzParseLine checks that ParseLine never panics and that whatever it
// accepts formats back to text that parses to the same Line.
func FuzzParseLine(f *testing.F) {
	for _, s := range []string{
		"cmd=init pmi_version=1 pmi_subversion=1\n",
		"cmd=get_result rc=0 value=a\\ b\n",
		"cmd=x endcmd e=\n",
		"cmd=x v=tail\\",
		"garbage",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		l, err := ParseLine(s)
		if err != nil {
			return
		}
		out, err := FormatLine(l)
		if err != nil {
			// Only an over-long re-escaped line may fail to format.
			if len(s) < MaxLine/2 {
				t.Fatalf("ParseLine(%q) = %+v, FormatLine: %v", s, l, err)
			}
			return
		}
		l2, err := ParseLine(out)
		if err != nil {
			t.Fatalf("ParseLine(FormatLine(%+v)) = %v (text %q)", l, err, out)
		}
		if l2.Cmd != l.Cmd || len(l2.Attrs) != len(l.Attrs) {
			t.Fatalf("round trip %q -> %q: %+v != %+v", s, out, l2, l)
		}
		for i := range l.Attrs {
			if l.Attrs[i] != l2.Attrs[i] {
				t.Fatalf("round trip %q -> %q: %+v != %+v", s, out, l2, l)
			}
		}
	})
}
