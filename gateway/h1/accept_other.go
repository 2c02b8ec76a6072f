//go:build !unix

package h1

// resourceShortage reports false: outside Unix only timeouts are retried.
func resourceShortage(err error) bool { return false }
