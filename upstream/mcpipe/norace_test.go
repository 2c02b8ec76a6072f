//go:build !race

package mcpipe

const raceEnabled = false
