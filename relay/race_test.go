//go:build race

package relay

const raceEnabled = true
