//go:build !race

package mpiam

// checkCold is false outside race builds: see coldcheck_race.go.
const checkCold = false

func checkColdZero(*reqState) {}
