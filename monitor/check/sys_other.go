//go:build !linux

package check

// socketOptionsSupported says whether probes can set a mark or bind to a
// device on this system.
const socketOptionsSupported = false
