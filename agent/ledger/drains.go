package ledger

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
)

// DrainsFileName is the name of the admin drains' file in vipd's state
// directory.
const DrainsFileName = "drained.json"

// DrainsPath returns the admin drains' path in the state directory dir.
func DrainsPath(dir string) string { return filepath.Join(dir, DrainsFileName) }

// Drain is a backend an operator drained (vipd drain), in one service or,
// with Service "", in every service that has it.
type Drain struct {
	Service string         `json:"service,omitempty"`
	Backend netip.AddrPort `json:"backend"`
}

// LoadDrains reads the admin drains stored at path, which survive reloads
// and restarts until undone. A missing file holds none; a file that
// cannot be trusted is a *CorruptError.
func LoadDrains(path string) ([]Drain, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read drains: %w", err)
	}
	// The file is the JSON array StoreDrains writes, or corrupt.
	corrupt := func(err error) error { return &CorruptError{Path: path, Err: err} }
	text := bytes.TrimSpace(data)
	if len(text) == 0 {
		return nil, corrupt(errors.New("the file is empty"))
	}
	var drains []Drain
	if err := json.Unmarshal(text, &drains); err != nil {
		return nil, corrupt(err)
	}
	if text[0] != '[' {
		return nil, corrupt(errors.New("not a list of drains"))
	}
	for i, d := range drains {
		if !d.Backend.IsValid() {
			return nil, corrupt(fmt.Errorf("drain %d has no backend", i+1))
		}
	}
	return drains, nil
}

// StoreDrains replaces the admin drains stored at path with drains, in
// a stable order, atomically (see WriteFile).
func StoreDrains(path string, drains []Drain) error {
	drains = slices.Clone(drains)
	slices.SortFunc(drains, func(x, y Drain) int {
		return cmp.Or(cmp.Compare(x.Service, y.Service), x.Backend.Compare(y.Backend))
	})
	if drains == nil {
		drains = []Drain{}
	}
	data, err := json.MarshalIndent(drains, "", "  ")
	if err != nil {
		return err
	}
	if err := WriteFile(path, data, 0o640); err != nil {
		return fmt.Errorf("store drains: %w", err)
	}
	return nil
}
