//go:build race

package match

// raceEnabled shortens the randomized model test under the race detector,
// which slows it about eightfold.
const raceEnabled = true
