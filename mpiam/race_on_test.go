//go:build race

package mpiam

const raceEnabled = true
