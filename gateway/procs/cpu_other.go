//go:build !unix

package procs

import "time"

// processCPU reports no reading: getrusage(2) is Unix's, and memcgate
// does not support the other platforms (Windows among them); this only
// lets the package compile there. Without readings the Fitter leaves the
// runtime's default processors alone.
func processCPU() (time.Duration, bool) { return 0, false }
