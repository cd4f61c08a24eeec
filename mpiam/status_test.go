package mpiam

import (
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"reflect"
	"strings"
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

// TestStatusCopyLiteralsEveryField guards the Status literals that copy
// another status field by field (Recv, Wait, Test, RecvTyped, the Sendrecv
// forms: a literal rather than a helper, whose inlined return would copy
// the struct again): each must name every field of Status, so that a field
// added to Status is not dropped at one of them. A literal is such a copy
// when every value is a selector of the same name as its key (st.Tag for
// Tag); literals that set a few fields (a ProcNull status) are not copies.
func TestStatusCopyLiteralsEveryField(t *testing.T) {
	var fields []string
	st := reflect.TypeOf(Status{})
	for i := range st.NumField() {
		fields = append(fields, st.Field(i).Name)
	}
	fset := token.NewFileSet()
	pkgs, err := filepath.Glob("*.go")
	require.NoError(t, err)
	copies := 0
	for _, name := range pkgs {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		require.NoError(t, err)
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.CompositeLit)
			if !ok || len(lit.Elts) == 0 {
				return true
			}
			if id, ok := lit.Type.(*ast.Ident); !ok || id.Name != "Status" {
				return true
			}
			var keys []string
			for _, e := range lit.Elts {
				kv, ok := e.(*ast.KeyValueExpr)
				if !ok {
					return true
				}
				key, ok := kv.Key.(*ast.Ident)
				sel, ok2 := kv.Value.(*ast.SelectorExpr)
				if !ok || !ok2 || sel.Sel.Name != key.Name {
					return true // not a field-by-field copy
				}
				keys = append(keys, key.Name)
			}
			copies++
			require.ElementsMatch(t, fields, keys, "the Status literal at %s", fset.Position(lit.Pos()))
			return true
		})
	}
	require.GreaterOrEqual(t, copies, 9, "field-by-field Status copies found")
}
