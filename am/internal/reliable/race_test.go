//go:build race

package reliable

func init() { raceEnabled = true }
