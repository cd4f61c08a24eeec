package pmi

import (
	"errors"
	"fmt"
	"strings"
)

// ErrMalformed is wrapped by every error ParseLine and FormatLine return for a
// line or attribute that is not valid PMI-1 text.
var ErrMalformed = errors.New("pmi: malformed PMI-1 line")

// MaxLine is the longest PMI-1 line, in bytes including the trailing newline,
// that the client and the server read; a longer line is an error wrapping
// ErrMalformed. It leaves room for a fully escaped value of vallen_max bytes.
const MaxLine = 8192

// Attr is one key=value pair of a PMI-1 line, value unescaped.
type Attr struct {
	// Key is the attribute name: one or more bytes, none of them a space,
	// '=', newline or NUL.
	Key string
	// Value is the unescaped value. It may be empty and may contain any byte
	// except newline and NUL (spaces and backslashes are escaped on the wire).
	Value string
	// Bare marks a key sent without "=value" (MPICH accepts such tokens, e.g.
	// "endcmd"); Value is then empty.
	Bare bool
}

// Line is one PMI-1 message: "cmd=<Cmd>" followed by attributes in wire order.
type Line struct {
	// Cmd is the command name (the value of the leading cmd= attribute).
	Cmd string
	// Attrs are the remaining attributes in the order they appear on the wire.
	Attrs []Attr
}

// Get returns the value of the first attribute named key and whether it was
// present.
func (l Line) Get(key string) (string, bool) {
	for _, a := range l.Attrs {
		if a.Key == key {
			return a.Value, true
		}
	}
	return "", false
}

// NewLine builds a Line from a command name and alternating key, value
// strings; a trailing odd key is ignored.
func NewLine(cmd string, kv ...string) Line {
	l := Line{Cmd: cmd}
	for i := 0; i+1 < len(kv); i += 2 {
		l.Attrs = append(l.Attrs, Attr{Key: kv[i], Value: kv[i+1]})
	}
	return l
}

// String formats l like FormatLine but without the trailing newline; invalid
// lines are rendered with %q so that they can still be logged.
func (l Line) String() string {
	s, err := FormatLine(l)
	if err != nil {
		return fmt.Sprintf("invalid line %q %+v", l.Cmd, l.Attrs)
	}
	return strings.TrimSuffix(s, "\n")
}

// ParseLine parses one PMI-1 line as MPICH's parser does (pmi_wire.c
// parse_v1): it must start with "cmd=", then space-separated key=value or bare
// key tokens follow; runs of spaces separate tokens; in a value "\x" stands for
// x (so "\ " embeds a space and "\\" a backslash) and a final lone backslash is
// kept. One trailing "\n" is allowed. Unlike MPICH, an empty value ("key=") is
// accepted as the empty string. Errors wrap ErrMalformed: a missing "cmd=",
// an empty command name, a repeated cmd key, an empty key, a key containing
// '\', an embedded newline or NUL, or a line longer than MaxLine bytes.
func ParseLine(s string) (Line, error) {
	if len(s) > MaxLine {
		return Line{}, fmt.Errorf("%w: line of %d bytes exceeds %d", ErrMalformed, len(s), MaxLine)
	}
	s = strings.TrimSuffix(s, "\n")
	if i := strings.IndexAny(s, "\n\x00"); i >= 0 {
		return Line{}, fmt.Errorf("%w: embedded newline or NUL at byte %d", ErrMalformed, i)
	}
	if !strings.HasPrefix(s, "cmd=") {
		return Line{}, fmt.Errorf("%w: line does not start with \"cmd=\": %q", ErrMalformed, clip(s))
	}
	var l Line
	haveCmd := false
	p := 0
	for {
		for p < len(s) && s[p] == ' ' {
			p++
		}
		if p >= len(s) {
			break
		}
		k0 := p
		for p < len(s) && s[p] != ' ' && s[p] != '=' {
			p++
		}
		key := s[k0:p]
		if key == "" {
			return Line{}, fmt.Errorf("%w: empty key at byte %d", ErrMalformed, k0)
		}
		if strings.IndexByte(key, '\\') >= 0 {
			return Line{}, fmt.Errorf("%w: backslash in key %q", ErrMalformed, clip(key))
		}
		if p >= len(s) || s[p] == ' ' {
			if key == "cmd" {
				return Line{}, fmt.Errorf("%w: cmd without a value", ErrMalformed)
			}
			l.Attrs = append(l.Attrs, Attr{Key: key, Bare: true})
			continue
		}
		p++ // '='
		var val strings.Builder
		for p < len(s) && s[p] != ' ' {
			if s[p] == '\\' && p+1 < len(s) {
				val.WriteByte(s[p+1])
				p += 2
				continue
			}
			val.WriteByte(s[p])
			p++
		}
		if key == "cmd" {
			if haveCmd {
				return Line{}, fmt.Errorf("%w: cmd given twice", ErrMalformed)
			}
			if val.Len() == 0 {
				return Line{}, fmt.Errorf("%w: empty command name", ErrMalformed)
			}
			haveCmd = true
			l.Cmd = val.String()
			continue
		}
		l.Attrs = append(l.Attrs, Attr{Key: key, Value: val.String()})
	}
	return l, nil
}

// FormatLine renders l as one PMI-1 line ending in "\n": "cmd=<Cmd>" then
// " key=value" per attribute in order (" key" for a Bare one), with spaces and
// backslashes in values (and the command name) escaped by a backslash. Values
// without those bytes are written verbatim, exactly as MPICH writes them.
// Errors wrap ErrMalformed: an empty command, an empty key, a key containing
// a space, '=', '\', newline or NUL, a key named "cmd", a value containing a
// newline or NUL, or a result longer than MaxLine bytes.
func FormatLine(l Line) (string, error) {
	if l.Cmd == "" {
		return "", fmt.Errorf("%w: empty command name", ErrMalformed)
	}
	if err := checkValue(l.Cmd); err != nil {
		return "", fmt.Errorf("command name: %w", err)
	}
	var b strings.Builder
	b.WriteString("cmd=")
	escapeTo(&b, l.Cmd)
	for _, a := range l.Attrs {
		if a.Key == "" || strings.ContainsAny(a.Key, " =\\\n\x00") {
			return "", fmt.Errorf("%w: invalid key %q", ErrMalformed, clip(a.Key))
		}
		if a.Key == "cmd" {
			return "", fmt.Errorf("%w: attribute named cmd", ErrMalformed)
		}
		b.WriteByte(' ')
		b.WriteString(a.Key)
		if a.Bare {
			continue
		}
		if err := checkValue(a.Value); err != nil {
			return "", fmt.Errorf("value of %s: %w", a.Key, err)
		}
		b.WriteByte('=')
		escapeTo(&b, a.Value)
	}
	b.WriteByte('\n')
	if b.Len() > MaxLine {
		return "", fmt.Errorf("%w: line of %d bytes exceeds %d", ErrMalformed, b.Len(), MaxLine)
	}
	return b.String(), nil
}

func checkValue(v string) error {
	if strings.ContainsAny(v, "\n\x00") {
		return fmt.Errorf("%w: value contains a newline or NUL", ErrMalformed)
	}
	return nil
}

func escapeTo(b *strings.Builder, v string) {
	for i := 0; i < len(v); i++ {
		if v[i] == ' ' || v[i] == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(v[i])
	}
}

// clip shortens s for error messages.
func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}
