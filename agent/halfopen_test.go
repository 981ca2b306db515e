package agent

import (
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/config"
)

// TestCanRunChecksHalfOpen: a configuration with half-open tcp checks is
// refused, naming its file and the capability, when vipd cannot open a
// raw socket (here: a thread without CAP_NET_RAW, or not root).
func TestCanRunChecksHalfOpen(t *testing.T) {
	cfg, err := config.Parse("h.toml", []byte(`[[service]]
name = "s"
vip = "192.0.2.10"
port = 80
backend = [{ address = "10.0.0.1" }]
[service.check]
type = "tcp"
half_open = true
`))
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		// Capabilities are a thread's: this one drops CAP_NET_RAW and
		// dies with the goroutine.
		runtime.LockOSThread()
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err == nil {
			data[0].Effective &^= 1 << unix.CAP_NET_RAW
			_ = unix.Capset(&hdr, &data[0])
		}
		errc <- canRunChecks(cfg)
	}()
	err = <-errc
	if err == nil || !strings.HasPrefix(err.Error(), "h.toml: half_open tcp checks: ") || !strings.Contains(err.Error(), "CAP_NET_RAW") {
		t.Fatalf("canRunChecks without CAP_NET_RAW: %v, want a refusal naming the file and CAP_NET_RAW", err)
	}
	t.Log(err)
}
