package mpiam

import (
	"errors"
	"reflect"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCopyStatusEveryField guards copyStatus (and the composite literals of
// Recv and Wait that follow it) against a field added to Status and not to
// the copy: every field set, copied, compared.
func TestCopyStatusEveryField(t *testing.T) {
	var src Status
	v := reflect.ValueOf(&src).Elem()
	for i := 0; i < v.NumField(); i++ {
		f := v.Field(i)
		switch f.Kind() {
		case reflect.Int:
			f.SetInt(int64(i + 3))
		case reflect.Uint64:
			f.SetUint(uint64(i + 7))
		case reflect.Bool:
			f.SetBool(true)
		case reflect.Interface:
			f.Set(reflect.ValueOf(errors.New("x")))
		default:
			t.Fatalf("Status.%s: kind %v not covered by this test", v.Type().Field(i).Name, f.Kind())
		}
	}
	var dst Status
	copyStatus(&dst, &src)
	require.Equal(t, src, dst)
	lit := Status{Source: src.Source, Tag: src.Tag, Err: src.Err, Bytes: src.Bytes,
		Cancelled: src.Cancelled, Piggyback: src.Piggyback, HasPiggyback: src.HasPiggyback}
	require.Equal(t, src, lit, "Recv's and Wait's literal")
}
