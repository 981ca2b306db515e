package agent

import (
	"testing"

	"github.com/vipd/vipd/lb/lbtest/nstest"
)

// TestMain runs the tests in a private network namespace when root, so
// that the root tests (links, a BGP router) change links that exist
// nowhere else; the others use the fake kernel and loopback only.
func TestMain(m *testing.M) { nstest.Main(m) }
