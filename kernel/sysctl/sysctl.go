// Package sysctl is the adapter between vipd's core and kernel parameters:
// it implements lb.Sysctls on the files below /proc/sys.
//
// Values below /proc/sys/net belong to the network namespace of the thread
// that opens them; the adapter opens each file on the calling goroutine's
// thread.
package sysctl

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/vipd/vipd/lb"
)

// DefaultRoot is where the kernel shows its parameters.
const DefaultRoot = "/proc/sys"

// Options configure a Sysctls adapter.
type Options struct {
	// Root is the directory the paths are relative to; empty means
	// DefaultRoot. Tests point it at a temporary directory.
	Root string
}

// Sysctls reads and writes kernel parameters by their path below Root,
// such as "net/ipv4/ip_forward". It keeps no state and is safe for
// concurrent use.
type Sysctls struct {
	root string
}

var _ lb.Sysctls = (*Sysctls)(nil)

// New returns a Sysctls adapter for opts.
func New(opts Options) *Sysctls {
	root := opts.Root
	if root == "" {
		root = DefaultRoot
	}
	return &Sysctls{root: root}
}

// Get implements lb.Sysctls: it returns the value with surrounding
// whitespace (the kernel's newline, the tabs between values of
// multi-valued parameters at the ends) trimmed.
func (s *Sysctls) Get(path string) (string, error) {
	file, err := s.file(path)
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", s.explain("read", path, err)
	}
	return strings.TrimSpace(string(b)), nil
}

// Set implements lb.Sysctls. It never creates a file: setting a parameter
// the kernel does not have fails with an error that matches
// fs.ErrNotExist.
func (s *Sysctls) Set(path, value string) error {
	file, err := s.file(path)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return s.explain("set", path, err)
	}
	_, err = f.WriteString(value)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("set %s=%s: %w", path, value, err)
	}
	return nil
}

// file returns the file of a parameter path, refusing paths that leave
// the root.
func (s *Sysctls) file(path string) (string, error) {
	clean := filepath.Clean(path)
	if path == "" || filepath.IsAbs(path) || clean != path || !filepath.IsLocal(path) {
		return "", fmt.Errorf("sysctl path %q: want a clean relative path such as net/ipv4/ip_forward", path)
	}
	return filepath.Join(s.root, path), nil
}

func (s *Sysctls) explain(verb, path string, err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return &notExistError{path: path}
	}
	return fmt.Errorf("%s %s: %w", verb, path, err)
}

// notExistError reports a parameter the kernel does not have.
type notExistError struct {
	path string
}

func (e *notExistError) Error() string {
	return fmt.Sprintf("%s: no such sysctl%s", e.path, hint(e.path))
}

// Unwrap makes the error match fs.ErrNotExist.
func (e *notExistError) Unwrap() error { return fs.ErrNotExist }

// hint guesses why a parameter is missing.
func hint(path string) string {
	parts := strings.Split(path, "/")
	switch {
	case strings.HasPrefix(path, "net/ipv4/vs/"):
		return " (is ip_vs loaded?)"
	case len(parts) > 4 && parts[0] == "net" && parts[2] == "conf" && parts[3] != "all" && parts[3] != "default":
		return fmt.Sprintf(" (is there an interface %s?)", parts[3])
	case strings.HasPrefix(path, "net/ipv6/"):
		return " (is IPv6 disabled?)"
	}
	return ""
}
