//go:build race

package mpiam

import (
	"fmt"
	"reflect"
)

// checkCold: race builds (the test suite's race run) check at every reset
// of a request state that its reqCold part is zero unless useCold was
// called, so that a write that forgot useCold fails the tests instead of
// leaving a stale field to a later operation.
const checkCold = true

func checkColdZero(r *reqState) {
	if !reflect.ValueOf(&r.reqCold).Elem().IsZero() {
		panic(fmt.Sprintf("mpiam: request state (kind %d) has reqCold fields set without useCold: %+v", r.kind, r.reqCold))
	}
}
