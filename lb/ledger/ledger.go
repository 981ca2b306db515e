// Package ledger keeps vipd's record of the IPVS services it owns in a
// small file, so that a restarted vipd can tell its own services from
// foreign ones even when no VIP on its dummy interface marks them
// (NodePort-style and firewall-mark services).
package ledger

import (
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

type document struct {
	Version  int     `json:"version"`
	Services []entry `json:"services"`
}

// Load implements lb.Ledger. A missing file is an empty ledger.
func (f *File) Load() (map[lb.ServiceKey]struct{}, error) {
	out := map[lb.ServiceKey]struct{}{}
	data, err := os.ReadFile(f.path)
	if errors.Is(err, fs.ErrNotExist) {
		return out, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read ledger: %w", err)
	}
	var doc document
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("read ledger %s: %w", f.path, err)
	}
	for _, e := range doc.Services {
		k := lb.ServiceKey{Family: lb.Family(e.Family), Addr: e.Addr, Port: e.Port, FWMark: e.FWMark}
		if e.Proto != "" {
			p, err := lb.ParseProto(e.Proto)
			if err != nil {
				return nil, fmt.Errorf("read ledger %s: %w", f.path, err)
			}
			k.Proto = p
		}
		out[k] = struct{}{}
	}
	return out, nil
}

// Store implements lb.Ledger. It replaces the file atomically.
func (f *File) Store(owned map[lb.ServiceKey]struct{}) error {
	keys := make([]lb.ServiceKey, 0, len(owned))
	for k := range owned {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, lb.ServiceKey.Compare)
	doc := document{Version: 1, Services: make([]entry, 0, len(keys))}
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
	if err := os.MkdirAll(filepath.Dir(f.path), 0o750); err != nil {
		return fmt.Errorf("store ledger: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(f.path), ".ledger-*")
	if err != nil {
		return fmt.Errorf("store ledger: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("store ledger: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("store ledger: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("store ledger: %w", err)
	}
	if err := os.Rename(tmp.Name(), f.path); err != nil {
		return fmt.Errorf("store ledger: %w", err)
	}
	return nil
}
