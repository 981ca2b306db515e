package conntrack

import (
	"testing"

	"github.com/vipd/vipd/lb/lbtest/nstest"
)

// TestMain runs the root tests in a private network namespace.
func TestMain(m *testing.M) { nstest.Main(m) }
