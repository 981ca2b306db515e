//go:build !linux

package health

// newSleeper returns the scheduler's sleeper on c.
func newSleeper(c Clock) sleeper { return newChanSleeper(c) }
