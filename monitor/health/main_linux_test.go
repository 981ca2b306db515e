package health

import (
	"testing"

	"github.com/vipd/vipd/lb/lbtest/nstest"
)

// runTests runs the tests, as root in a private network namespace.
func runTests(m *testing.M) { nstest.Main(m) }
