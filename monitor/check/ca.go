package check

import (
	"crypto/sha256"
	"crypto/x509"
	"fmt"
)

// CABundle is the content of an https check's CA file, read and parsed
// when the configuration is loaded: a check built from it reads no file,
// so that nothing a file holds (a FIFO, a device, a huge file) can block
// or exhaust the loop that builds checks. It is immutable and shared by
// every check that names the same file.
type CABundle struct {
	// File is the file the bundle was read from, for messages.
	File string
	// Sum is the SHA-256 of the file's content: checks of a file whose
	// content changed ask another question (see monitor/health's keyOf).
	Sum [sha256.Size]byte

	pool *x509.CertPool
}

// Pool returns the bundle's certificates.
func (b *CABundle) Pool() *x509.CertPool { return b.pool }

// NewCABundle parses data, the content of file, as PEM certificates. It
// refuses data that holds no certificate.
func NewCABundle(file string, data []byte) (*CABundle, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("%s holds no PEM certificate", file)
	}
	return &CABundle{File: file, Sum: sha256.Sum256(data), pool: pool}, nil
}
