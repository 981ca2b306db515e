// Package ledger keeps vipd's record of the IPVS services it owns in a
// small file, so that a restarted vipd can tell its own services from
// foreign ones even when no VIP on its dummy interface marks them
// (NodePort-style and firewall-mark services). Its WriteFile is how vipd
// writes every file of its state directory.
package ledger

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"

	"github.com/vipd/vipd/lb"
)

// FileName is the ledger's name in vipd's state directory.
const FileName = "owned.json"

// Path returns the ledger's path in the state directory dir.
func Path(dir string) string { return filepath.Join(dir, FileName) }

// File is a ledger stored as JSON at a path. It implements lb.Ledger.
type File struct {
	path string
}

// New returns the ledger at path. The file is created on first Store.
func New(path string) *File { return &File{path: path} }

// entry is the stored form of one lb.ServiceKey.
type entry struct {
	Family uint8      `json:"family"`
	Proto  string     `json:"proto,omitempty"`
	Addr   netip.Addr `json:"addr,omitzero"`
	Port   uint16     `json:"port,omitempty"`
	FWMark uint32     `json:"fwmark,omitempty"`
}

// version is the document version Store writes and Load accepts.
const version = 1

type document struct {
	Version  int     `json:"version"`
	Services []entry `json:"services"`
}

// CorruptError reports a state file that exists but cannot be trusted:
// empty, truncated, not the document vipd writes, or holding a value
// vipd never stores.
type CorruptError struct {
	Path string
	Err  error
}

func (e *CorruptError) Error() string { return fmt.Sprintf("%s is corrupt: %v", e.Path, e.Err) }

func (e *CorruptError) Unwrap() error { return e.Err }

// Load implements lb.Ledger. A missing file is an empty ledger; a file
// that is not a complete ledger of this version is a *CorruptError.
func (f *File) Load() (map[lb.ServiceKey]struct{}, error) {
	out := map[lb.ServiceKey]struct{}{}
	data, err := os.ReadFile(f.path)
	if errors.Is(err, fs.ErrNotExist) {
		return out, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read ledger: %w", err)
	}
	corrupt := func(err error) error { return &CorruptError{Path: f.path, Err: err} }
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, corrupt(errors.New("the file is empty"))
	}
	var doc document
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, corrupt(err)
	}
	if doc.Version != version {
		return nil, corrupt(fmt.Errorf("version %d, want %d", doc.Version, version))
	}
	for i, e := range doc.Services {
		k, err := e.key()
		if err != nil {
			return nil, corrupt(fmt.Errorf("service %d: %w", i+1, err))
		}
		out[k] = struct{}{}
	}
	return out, nil
}

// key checks a stored entry and returns its key.
func (e entry) key() (lb.ServiceKey, error) {
	k := lb.ServiceKey{Family: lb.Family(e.Family), Addr: e.Addr, Port: e.Port, FWMark: e.FWMark}
	if k.Family != lb.IPv4 && k.Family != lb.IPv6 {
		return k, fmt.Errorf("family %d", e.Family)
	}
	if e.FWMark != 0 {
		if e.Proto != "" || e.Addr.IsValid() || e.Port != 0 {
			return k, fmt.Errorf("firewall mark %d with an address, protocol or port", e.FWMark)
		}
		return k, nil
	}
	if !e.Addr.IsValid() || lb.FamilyOf(e.Addr) != k.Family {
		return k, fmt.Errorf("address %q is not an IPv%d address", e.Addr, e.Family)
	}
	p, err := lb.ParseProto(e.Proto)
	if err != nil {
		return k, err
	}
	k.Proto = p
	return k, nil
}

// Store implements lb.Ledger. It replaces the file atomically and
// durably (see WriteFile).
func (f *File) Store(owned map[lb.ServiceKey]struct{}) error {
	keys := make([]lb.ServiceKey, 0, len(owned))
	for k := range owned {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, lb.ServiceKey.Compare)
	doc := document{Version: version, Services: make([]entry, 0, len(keys))}
	for _, k := range keys {
		e := entry{Family: uint8(k.Family), Addr: k.Addr, Port: k.Port, FWMark: k.FWMark}
		if k.Proto != 0 {
			e.Proto = k.Proto.String()
		}
		doc.Services = append(doc.Services, e)
	}
	data, err := json.Marshal(doc)
	if err != nil {
		return fmt.Errorf("encode ledger: %w", err)
	}
	if err := WriteFile(f.path, data, 0o600); err != nil {
		return fmt.Errorf("store ledger: %w", err)
	}
	return nil
}

// WriteFile replaces the file at path with data so that a crash or a
// power loss at any moment leaves either the old file or the new one,
// whole: it writes a temporary file in the same directory, syncs it,
// renames it over path and syncs the directory. On failure the old file
// is intact and the temporary file is gone. The directory is created if
// missing.
func WriteFile(path string, data []byte, perm fs.FileMode) error {
	return writeFile(path, perm, func(f *os.File) error {
		_, err := f.Write(data)
		return err
	})
}

// writeFile is WriteFile with the temporary file's content written by
// write.
func writeFile(path string, perm fs.FileMode, write func(*os.File) error) (err error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err := write(tmp); err != nil {
		return fmt.Errorf("write %s: %w", tmp.Name(), err)
	}
	if err := tmp.Chmod(perm); err != nil {
		return err
	}
	if err := tmp.Sync(); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	// The rename is durable once the directory is.
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}
