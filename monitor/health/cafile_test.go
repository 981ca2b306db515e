package health

import (
	"net/netip"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestHTTPCheckReadsNoFile builds https checks whose CAFile names a FIFO
// and /dev/zero: NewProber, which the manager calls in the daemon's main
// loop, must return at once without reading them (the configuration
// reads the file, into HTTPOptions.CA).
func TestHTTPCheckReadsNoFile(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "ca.pem")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, file := range []string{fifo, "/dev/zero"} {
		done := make(chan error, 1)
		go func() {
			_, err := NewProber(Spec{Kind: KindHTTPS, HTTP: HTTPOptions{CAFile: file}}, netip.MustParseAddrPort("127.0.0.1:443"))
			done <- err
		}()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), "not read with the configuration") {
				t.Errorf("%s: NewProber: %v, want an error saying the file was not read with the configuration", file, err)
			}
		case <-time.After(3 * time.Second):
			t.Fatalf("%s: NewProber blocked for 3 s", file)
		}
	}
}
