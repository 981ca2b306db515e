package config

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/monitor/health"
)

// testCAPEM returns a self-signed certificate in PEM.
func testCAPEM(t *testing.T) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// httpsService is a service with an https check whose ca_file is on line
// 7 of its text.
func httpsService(name, caFile string) string {
	return "[[service]]\nname = \"" + name + "\"\nvip = \"192.0.2.10\"\nport = 443\nbackend = [{ address = \"10.0.0.1\" }]\n" +
		"[service.check]\nca_file = \"" + caFile + "\"\ntype = \"https\"\n"
}

// loadWithin loads path, failing the test if that takes more than a few
// seconds (a read that blocks).
func loadWithin(t *testing.T, path string) (*Config, error) {
	t.Helper()
	type result struct {
		cfg *Config
		err error
	}
	done := make(chan result, 1)
	go func() {
		cfg, err := Load(path)
		done <- result{cfg, err}
	}()
	select {
	case r := <-done:
		return r.cfg, r.err
	case <-time.After(5 * time.Second):
		t.Fatalf("Load(%s) blocked for 5 s", path)
		return nil, nil
	}
}

// TestCAFile reads an https check's ca_file when the configuration is
// loaded, into the check's spec: the prober reads no file.
func TestCAFile(t *testing.T) {
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.pem")
	writeFile(t, ca, string(testCAPEM(t)))
	main := filepath.Join(dir, "vipd.toml")
	writeFile(t, main, httpsService("web", ca))
	cfg, err := loadWithin(t, main)
	if err != nil {
		t.Fatal(err)
	}
	spec := cfg.Health["web"].Checks[netip.MustParseAddrPort("10.0.0.1:443")]
	if spec.HTTP.CA == nil || spec.HTTP.CA.File != ca {
		t.Fatalf("spec.HTTP.CA = %+v, want the bundle of %s", spec.HTTP.CA, ca)
	}
	// The file is gone: the prober still builds, from what was read.
	if err := os.Remove(ca); err != nil {
		t.Fatal(err)
	}
	if _, err := health.NewProber(*spec, netip.MustParseAddrPort("10.0.0.1:443")); err != nil {
		t.Errorf("NewProber after the file was removed: %v", err)
	}
}

// TestCAFileRefused refuses a ca_file that is not a small regular file of
// PEM certificates, at once (a FIFO never blocks the load), with the
// file, the line and the key, in the main file and in an included one.
func TestCAFileRefused(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo.pem")
	mkfifo(t, fifo)
	large := filepath.Join(dir, "large.pem")
	ca := string(testCAPEM(t))
	big := strings.Repeat(ca, MaxCAFileSize/len(ca)+1)
	writeFile(t, large, big)
	notPEM := filepath.Join(dir, "not.pem")
	writeFile(t, notPEM, "just some text\n")
	cases := []struct{ name, file, want string }{
		{"/dev/zero", "/dev/zero", "not a regular file (a character device)"},
		{"fifo", fifo, "not a regular file (a FIFO)"},
		{"directory", dir, "not a regular file (a directory)"},
		{"too large", large, "too large"},
		{"not pem", notPEM, "holds no PEM certificate"},
		{"missing", filepath.Join(dir, "missing.pem"), "no such file"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			main := filepath.Join(t.TempDir(), "vipd.toml")
			writeFile(t, main, httpsService("web", c.file))
			_, err := loadWithin(t, main)
			if err == nil {
				t.Fatal("loaded")
			}
			for _, want := range []string{main + ":7: ", "ca_file", c.file, c.want} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not contain %q", err, want)
				}
			}
		})
		t.Run(c.name+" included", func(t *testing.T) {
			d := t.TempDir()
			main := filepath.Join(d, "vipd.toml")
			writeFile(t, main, "include = [\"services.d/*.toml\"]\n")
			incl := filepath.Join(d, "services.d", "web.toml")
			writeFile(t, incl, "# web\n"+httpsService("web", c.file))
			_, err := loadWithin(t, main)
			if err == nil {
				t.Fatal("loaded")
			}
			for _, want := range []string{incl + ":8: ", "ca_file", c.file, c.want} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not contain %q", err, want)
				}
			}
		})
	}
}

// TestCAFileOffline reads no ca_file offline, and says so.
func TestCAFileOffline(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo.pem")
	mkfifo(t, fifo)
	main := filepath.Join(dir, "vipd.toml")
	writeFile(t, main, httpsService("web", fifo))
	cfg, err := LoadWith(main, LoadOptions{Offline: true})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{`ca_file "` + fifo + `" of service "web" is a readable file of PEM certificates`}
	if got := cfg.Unchecked(); !slices.Equal(got, want) {
		t.Errorf("Unchecked() = %q, want %q", got, want)
	}
	if _, err := LoadWith(main, LoadOptions{}); err == nil {
		t.Error("LoadWith online read the FIFO as a CA file")
	}
}

// TestCAFileReload reads the ca_file of a service an edit adds, refuses
// a bad one at its line, and keeps what the other services read.
func TestCAFileReload(t *testing.T) {
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.pem")
	writeFile(t, ca, string(testCAPEM(t)))
	fifo := filepath.Join(dir, "fifo.pem")
	mkfifo(t, fifo)
	main := filepath.Join(dir, "vipd.toml")
	writeFile(t, main, "include = [\"services.d/*.toml\"]\n"+httpsService("web", ca))
	incl := filepath.Join(dir, "services.d", "api.toml")
	writeFile(t, incl, "")
	base, err := loadWithin(t, main)
	if err != nil {
		t.Fatal(err)
	}
	api := strings.ReplaceAll(httpsService("api", fifo), "192.0.2.10", "192.0.2.11")
	if _, _, err := ParseFrom(base, incl, []byte(api)); err == nil || !strings.Contains(err.Error(), incl+":7: ") || !strings.Contains(err.Error(), "a FIFO") {
		t.Errorf("ParseFrom with a FIFO ca_file: %v, want it refused at %s:7", err, incl)
	}
	api = strings.ReplaceAll(httpsService("api", ca), "192.0.2.10", "192.0.2.11")
	cfg, d, err := ParseFrom(base, incl, []byte(api))
	if err != nil {
		t.Fatal(err)
	}
	if d.Full {
		t.Errorf("delta %+v, want a partial one", d)
	}
	for name, be := range map[string]string{"web": "10.0.0.1:443", "api": "10.0.0.1:443"} {
		if spec := cfg.Health[name].Checks[netip.MustParseAddrPort(be)]; spec.HTTP.CA == nil {
			t.Errorf("service %s: no CA bundle", name)
		}
	}
}
