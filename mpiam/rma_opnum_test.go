package mpiam

import "testing"

func TestRMAOpNumbersMatchNames(t *testing.T) {
	for i, n := range rmaOpNames {
		if rmaOpNumber(n) != i {
			t.Fatalf("%s: %d, want %d", n, rmaOpNumber(n), i)
		}
	}
	if rmaOpNumber("maxloc") != -1 {
		t.Fatal("maxloc")
	}
}
