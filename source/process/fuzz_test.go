package process

import (
	"bytes"
	"testing"

	"github.com/vipd/vipd/source"
)

// FuzzWire reads what a provider could send: the reader refuses or takes
// a frame without panicking, and a publish it takes becomes a snapshot
// or an error, whole or as a delta.
func FuzzWire(f *testing.F) {
	whole, _ := PublishOf(1, bigSnapshot(2, 2), nil, false)
	next := bigSnapshot(2, 2)
	next.Changed = []string{next.Services[0].Name}
	delta, _ := PublishOf(2, next, nil, true)
	for _, m := range []*Message{{Type: TypePublish, Publish: whole}, {Type: TypePublish, Publish: delta}, hello(),
		{Type: TypeReport, Report: &Result{Error: "x"}}} {
		var buf bytes.Buffer
		NewConn(nil, &buf, 0).Write(m)
		f.Add(buf.Bytes())
	}
	f.Add(rawFrame(`{"type":"publish","publish":{"seq":1,"delta":true,"services":[{"name":"k8s/a"}],"changed":["k8s/a"]}}`))
	base, _ := whole.Snapshot(nil, nil)
	index := map[string]int{}
	for i, vs := range base.Services {
		index[vs.Name] = i
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c := NewConn(bytes.NewReader(data), nil, 1<<20)
		for {
			m, err := c.Read()
			if err != nil {
				return
			}
			if m.Type != TypePublish {
				continue
			}
			for _, b := range []*source.Snapshot{nil, &base} {
				snap, err := m.Publish.Snapshot(b, index)
				if err == nil && m.Publish.Delta && len(snap.Services) != len(base.Services) {
					t.Fatalf("a delta of %d services on %d", len(snap.Services), len(base.Services))
				}
			}
		}
	})
}
